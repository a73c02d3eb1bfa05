"""A run's trained models out: each client's personalised network as a standalone PyTorch module.

``models/best.pt`` (written by the simulator) holds every client's weights at the selected round. From it:
:func:`client_model` rebuilds one client's network (``graphfed.models``' own class, loaded with its weights: the
model that produced that client's reported score), :func:`export_client` writes its ``state_dict`` with the
config that rebuilds it, :func:`load_exported` reads such a file back, and :func:`predict` runs rows through it.
"""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from graphfed.errors import DataError, UntrustedInputError
from graphfed.models import build_model
from graphfed.models.base import TargetModel
from graphfed.runs import CONFIG, SUMMARY, atomic_write_bytes, load_models, read_result

FORMAT = "graphfed-client-model"


def rebuild(model: dict[str, Any], state: dict[str, torch.Tensor]) -> TargetModel:
    """The network a model record describes, loaded with ``state``, in eval mode."""
    shape = SimpleNamespace(name=model.get("dataset", "export"), task=model["task"],
                            input_shape=tuple(model["input_shape"]), output_dim=int(model["output_dim"]))
    network = build_model(model["name"], shape, model.get("options") or {})  # type: ignore[arg-type]
    missing = set(dict(network.named_parameters())) ^ set(state)
    if missing:
        raise UntrustedInputError(f"the saved parameters do not fit model {model['name']!r}: {sorted(missing)[:3]}")
    network.load_state_dict(state, strict=False)  # parameters only: graphfed's models keep no buffers that train
    return network.eval()


def client_state(run_dir: Path, client: str) -> tuple[dict[str, torch.Tensor], dict[str, Any], int]:
    """``(state_dict, model record, selected round)`` of ``client`` in the run's ``models/best.pt``."""
    weights, names, selected, model = load_models(run_dir)
    if client not in names:
        raise DataError(f"no client {client!r} in {run_dir}; clients: {', '.join(names[:10])}"
                        + (", ..." if len(names) > 10 else ""))
    untrained_model_refusal(run_dir, client)
    flat = weights[names.index(client)]
    state, offset = {}, 0
    for name, shape in zip(model["param_names"], model["param_shapes"], strict=True):
        size = math.prod(shape)
        state[name] = flat[offset:offset + size].reshape(shape).clone()
        offset += size
    return state, model, selected


def untrained_model_refusal(run_dir: Path, client: str) -> None:
    """DataError when the run's method has no trained model for ``client`` (a novel client of Local): the saved row
    is an untrained network, never to be served."""
    if not (run_dir / SUMMARY).is_file():
        return
    result = read_result(run_dir)
    if client in (result.novel_clients or []) and result.novel_none_reason:
        raise DataError(f"client {client!r} never trained in this {result.method} run and {result.method} has no "
                        f"model for such a client ({result.novel_none_reason}); its saved row is an untrained "
                        f"network. Export a training client, or run a method with a shared model (e.g. fedavg, "
                        f"panacea) for novel clients")


def client_model(run_dir: Path | str, client: str) -> TargetModel:
    """``client``'s personalised network, in eval mode, as the run scored it at its selected round."""
    state, model, _ = client_state(Path(run_dir), client)
    return rebuild(model, state)


def export_client(run_dir: Path, client: str, out: Path) -> Path:
    """Write ``client``'s ``state_dict`` and the model config that rebuilds it (``weights_only``-loadable)."""
    state, model, selected = client_state(run_dir, client)
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "client": client, "round": selected, "model": model, "state_dict": state}, buffer)
    atomic_write_bytes(out, buffer.getvalue())
    return out


def load_exported(path: Path | str) -> TargetModel:
    """The module an :func:`export_client` file describes (never unpickled)."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UntrustedInputError(f"{path}: not an exported graphfed model ({type(error).__name__})") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT or not isinstance(saved.get("state_dict"), dict):
        raise UntrustedInputError(f"{path}: not an exported graphfed model")
    return rebuild(saved["model"], saved["state_dict"])


def read_rows(path: Path, input_shape: tuple[int, ...]) -> torch.Tensor:
    """Input rows from a CSV (a header line, then one row of numbers per example) or an ``.npz`` with ``x``;
    each row is reshaped to the model's input shape."""
    width = math.prod(input_shape)
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as archive:
                if "x" not in archive.files:
                    raise DataError(f"{path}: no array 'x' (arrays: {', '.join(archive.files)})")
                rows = np.asarray(archive["x"], dtype=np.float32)
        except (OSError, ValueError) as error:
            raise DataError(f"{path}: not a readable .npz ({error})") from None
    elif path.suffix == ".csv":
        try:
            with warnings.catch_warnings():  # an empty body is reported below, in the user's terms
                warnings.simplefilter("ignore", UserWarning)
                rows = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32, ndmin=2)
        except (OSError, ValueError) as error:
            raise DataError(f"{path}: not a CSV of numbers with a header line ({error})") from None
        if not rows.size:
            raise DataError(f"{path}: no rows after the first line (a CSV's first line is its header: column "
                            f"names, never read as a row)")
    else:
        raise DataError(f"{path}: give a .csv or an .npz file")
    per_row = rows.reshape(len(rows), -1).shape[1] if rows.size else 0
    if per_row != width:
        raise DataError(f"{path}: rows of {per_row} values; the model reads {width} per row (input shape "
                        f"{input_shape})")
    if not np.isfinite(rows).all():
        raise DataError(f"{path}: non-finite values")
    return torch.from_numpy(rows.reshape(len(rows), *input_shape))


def scaled_like_training(run_dir: Path, client: str, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` scaled as the run scaled ``client``'s inputs (``dataset.standardize``: the statistics of the client's
    own training rows, or the pooled ones, rebuilt from the data the run read); as they are for a run that did not
    scale its features."""
    from graphfed.config import load_config
    from graphfed.data import build_federation, feature_scaling

    config = load_config(run_dir / CONFIG)
    if config.dataset.standardize == "none":
        return rows
    raw = build_federation(config.dataset.model_copy(update={"standardize": "none"}), config.seed)
    mean, spread = feature_scaling(raw, config.dataset.standardize)
    index = raw.client_names.index(client)
    return ((rows.flatten(1).to(torch.float64) - mean[index]) / spread[index]).to(rows.dtype).view_as(rows)


def target_units(run_dir: Path) -> tuple[float, str | None]:
    """(data units per stored unit, their name) of a regression run's targets, as its federation declares them
    (``meta.yaml``'s ``target_scale`` and ``target_units``); ``(1.0, None)`` where it declares none."""
    if (run_dir / SUMMARY).is_file():
        result = read_result(run_dir)
        if result.target_scale is not None and result.target_units is not None:
            return result.target_scale, result.target_units
    return 1.0, None


def predict(network: TargetModel, rows: torch.Tensor) -> torch.Tensor:
    """The network's outputs for ``rows`` (logits for classification)."""
    with torch.no_grad():
        return network(rows)
