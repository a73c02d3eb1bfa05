"""A run's trained models out: each client's personalised network, and what turns a raw row into its answer.

``models/best.pt`` (written by the simulator) holds every client's weights at the selected round, with the model
record that rebuilds the network and what lies between a raw row and the network (``inputs``: the feature scaling
``dataset.standardize`` fitted, the features' names) and between the network and the answer (``outputs``: the
task, the class names, the declared target scale and units). From it: :func:`client_model` rebuilds one client's
network (``graphfed.models``' own class, loaded with its weights: the model that produced that client's reported
score, reading rows as the run stored them), :func:`deployed_model` wraps it in a :class:`DeployedModel` that takes
raw rows and answers in the data's own terms, :func:`export_client` writes one client's weights with everything
its deployed model needs, :func:`load_exported` reads such a file back as a :class:`DeployedModel`, and
:func:`predict` runs rows through a network.
"""

from __future__ import annotations

import csv
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
from graphfed.runs import CONFIG, SUMMARY, atomic_write_bytes, load_models, read_result, read_status

FORMAT = "graphfed-client-model"
#: 2: the file carries ``inputs`` (feature scaling, feature names) and ``outputs`` (task, classes, target units)
FORMAT_VERSION = 2


def rebuild(model: dict[str, Any], state: dict[str, torch.Tensor]) -> TargetModel:
    """The network a model record describes, loaded with ``state``, in eval mode."""
    shape = SimpleNamespace(name=model.get("dataset", "export"), task=model["task"],
                            input_shape=tuple(model["input_shape"]), output_dim=int(model["output_dim"]))
    network = build_model(model["name"], shape, model.get("options") or {})  # type: ignore[arg-type]
    missing = set(dict(network.named_parameters())) ^ set(state)
    if missing:
        raise UntrustedInputError(f"the saved parameters do not fit model {model['name']!r}: {sorted(missing)[:3]}")
    network.load_state_dict(state, strict=False)  # parameters only: graphfed's models keep no buffers that train
    base_names = getattr(network, "base_names", ())
    if base_names:  # an adapter's frozen base, saved once beside every client's adapter
        base = model.get("base_state")
        if not (isinstance(base, dict) and set(base) == set(base_names)
                and all(isinstance(v, torch.Tensor) and v.shape == network.get_buffer(k).shape
                        and bool(torch.isfinite(v).all()) for k, v in base.items())):
            raise UntrustedInputError(f"the saved model holds no base for its adapter (model {model['name']!r}: "
                                      f"its base_state is missing or does not fit)")
        with torch.no_grad():
            for name, value in base.items():
                network.get_buffer(name).copy_(value)
    return network.eval()


class DeployedModel(torch.nn.Module):
    """One client's model as a user deploys it: raw rows in, the answer out.

    ``forward(rows)`` takes rows as the data hold them (``[B, *input_shape]``, or ``[B, F]`` flat; before any
    ``dataset.standardize``), scales them as the run scaled that client's inputs, runs :attr:`network` and returns
    each class's probability (``[B, C]``, classification; :attr:`class_names` names column k where the federation
    names its classes) or the regression outputs in the federation's declared units (``[B, *target]``, multiplied
    by :attr:`target_scale`; :attr:`target_units` names them). :meth:`scale` and :attr:`network` expose the two
    halves (``network`` reads scaled rows and returns logits or stored-unit outputs, as the run scored it).
    """

    def __init__(self, network: TargetModel, task: str, input_shape: tuple[int, ...],
                 mean: torch.Tensor | None = None, spread: torch.Tensor | None = None, standardize: str = "none",
                 feature_names: list[str] | None = None, class_names: list[str] | None = None,
                 target_scale: float | None = None, target_units: str | None = None,
                 alphabet: str | None = None) -> None:
        super().__init__()
        self.network, self.task, self.input_shape, self.standardize = network, task, input_shape, standardize
        self.feature_names, self.class_names = feature_names, class_names
        self.target_scale, self.target_units = target_scale, target_units
        #: text models: the characters of the classes (``graphfed predict --prompt``); None otherwise
        self.alphabet = alphabet
        # float64 statistics, applied in float64 as the run applied them (data/__init__.py: standardized)
        self.register_buffer("feature_mean", None if mean is None else mean.to(torch.float64))
        self.register_buffer("feature_spread", None if spread is None else spread.to(torch.float64))
        self.eval()

    def scale(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` scaled as the run scaled this client's inputs (as they are for a run that scaled none), shaped
        to the network's input."""
        rows = torch.as_tensor(rows)
        dtype = rows.dtype if rows.is_floating_point() else torch.float32
        if self.feature_mean is None or self.feature_spread is None:
            return rows.to(dtype).reshape(len(rows), *self.input_shape)
        flat = (rows.reshape(len(rows), -1).to(torch.float64) - self.feature_mean) / self.feature_spread
        return flat.to(dtype).reshape(len(rows), *self.input_shape)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        outputs = self.network(self.scale(rows))
        if self.task == "classification":
            return outputs.softmax(dim=-1)
        return outputs * (self.target_scale or 1.0)


def client_state(run_dir: Path, client: str) -> tuple[dict[str, torch.Tensor], dict[str, Any], int]:
    """``(state_dict, model record, selected round)`` of ``client`` in the run's ``models/best.pt``; the record's
    ``inputs`` hold that client's own feature scaling (``[F]`` mean and spread)."""
    weights, names, selected, model = load_models(run_dir)
    if client not in names:
        raise DataError(f"no client {client!r} in {run_dir}; clients: {', '.join(names[:10])}"
                        + (", ..." if len(names) > 10 else ""))
    untrained_model_refusal(run_dir, client)
    index = names.index(client)
    flat = weights[index]
    state, offset = {}, 0
    for name, shape in zip(model["param_names"], model["param_shapes"], strict=True):
        size = math.prod(shape)
        state[name] = flat[offset:offset + size].reshape(shape).clone()
        offset += size
    inputs = model.get("inputs")
    if isinstance(inputs, dict) and isinstance(inputs.get("mean"), torch.Tensor):
        model = {**model, "inputs": {**inputs, "mean": inputs["mean"][index].clone(),
                                     "spread": inputs["spread"][index].clone()}}
    elif not isinstance(inputs, dict):  # a run saved before best.pt carried these: from its summary and data
        model = {**model, **older_run_records(run_dir, index)}
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
    """``client``'s personalised network, in eval mode, as the run scored it at its selected round: it reads rows
    as the run stored them (scaled by ``dataset.standardize``) and returns logits or stored-unit outputs. For raw
    rows in and the answer out, :func:`deployed_model`."""
    state, model, _ = client_state(Path(run_dir), client)
    return rebuild(model, state)


def deployed_model(run_dir: Path | str, client: str) -> DeployedModel:
    """``client``'s model as :func:`load_exported` gives it from an exported file: raw rows in, the answer out."""
    state, model, _ = client_state(Path(run_dir), client)
    return _deployed(model, state)


def export_client(run_dir: Path, client: str, out: Path) -> Path:
    """Write ``client``'s ``state_dict`` with the model record that rebuilds it and everything between a raw row and
    its answer (feature scaling and names, task, classes, target units): ``weights_only``-loadable."""
    state, model, selected = client_state(run_dir, client)
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "format_version": FORMAT_VERSION, "client": client, "round": selected,
                "model": model, "state_dict": state}, buffer)
    atomic_write_bytes(out, buffer.getvalue())
    return out


def load_exported(path: Path | str) -> DeployedModel:
    """The :class:`DeployedModel` an :func:`export_client` file describes (never unpickled): raw rows in, each
    class's probability (or the outputs in the declared units) out, as ``graphfed predict`` gives them."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UntrustedInputError(f"{path}: not an exported graphfed model ({type(error).__name__})") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT or not isinstance(saved.get("state_dict"), dict) \
            or not isinstance(saved.get("model"), dict):
        raise UntrustedInputError(f"{path}: not an exported graphfed model")
    model = saved["model"]
    if not isinstance(model.get("inputs"), dict):
        warnings.warn(f"{path} was exported by an older graphfed and holds no feature scaling: its model reads rows "
                      f"as the run stored them; re-export it with this graphfed if the run used dataset.standardize",
                      UserWarning, stacklevel=2)
    return _deployed(model, saved["state_dict"], str(path))


def _deployed(model: dict[str, Any], state: dict[str, torch.Tensor], where: str = "models/best.pt") -> DeployedModel:
    """The deployed model of a (client's) model record and weights, its ``inputs`` and ``outputs`` checked as
    untrusted input."""
    network = rebuild(model, state)
    width = math.prod(int(d) for d in model["input_shape"])
    inputs = model.get("inputs") if isinstance(model.get("inputs"), dict) else {}
    outputs = model.get("outputs") if isinstance(model.get("outputs"), dict) else {}
    mean, spread = inputs.get("mean"), inputs.get("spread")
    scaled = mean is not None or spread is not None
    if scaled and not (isinstance(mean, torch.Tensor) and isinstance(spread, torch.Tensor) and mean.shape == (width,)
                       and spread.shape == (width,) and bool(torch.isfinite(mean).all())
                       and bool(torch.isfinite(spread).all()) and bool((spread > 0).all())):
        raise UntrustedInputError(f"{where}: its feature scaling is not {width} finite means and positive spreads")
    names = inputs.get("feature_names")
    classes = outputs.get("class_names")
    scale = outputs.get("target_scale")
    units = outputs.get("target_units")
    if names is not None and not (isinstance(names, list) and len(names) == width
                                  and all(isinstance(n, str) for n in names)):
        raise UntrustedInputError(f"{where}: its feature names are not {width} names")
    if classes is not None and not (isinstance(classes, list) and len(classes) == int(model["output_dim"])
                                    and all(isinstance(c, str) for c in classes)):
        raise UntrustedInputError(f"{where}: its class names are not {model['output_dim']} names")
    if scale is not None and not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
        raise UntrustedInputError(f"{where}: its target scale {scale!r} is not a positive number")
    alphabet = outputs.get("alphabet")
    if alphabet is not None and not (isinstance(alphabet, str) and len(alphabet) == int(model["output_dim"])):
        raise UntrustedInputError(f"{where}: its alphabet is not {model['output_dim']} characters")
    return DeployedModel(network, str(model["task"]), tuple(int(d) for d in model["input_shape"]), mean, spread,
                         str(inputs.get("standardize", "none")), names, classes,
                         None if scale is None else float(scale), units if isinstance(units, str) else None, alphabet)


def generate(model: DeployedModel, prompt: str, length: int) -> str:
    """The ``length`` characters a text model writes after ``prompt``, each the most likely given the window of the
    characters before it (the prompt, then what it wrote). DataError for a model that does not read text."""
    alphabet = model.alphabet
    if not alphabet or len(model.input_shape) != 1:
        raise DataError("--prompt: this model does not read text (its federation has no alphabet); give --input rows")
    window = model.input_shape[0]
    index = {character: k for k, character in enumerate(alphabet)}
    codes = [index.get(character, index.get(" ", 0)) for character in prompt]
    if len(codes) < window:  # a short prompt is left-padded with spaces, as a role's text begins
        codes = [index.get(" ", 0)] * (window - len(codes)) + codes
    written = []
    with torch.no_grad():
        for _ in range(length):
            probabilities = model(torch.tensor([codes[-window:]], dtype=torch.float32))
            choice = int(probabilities[0].argmax())
            codes.append(choice)
            written.append(alphabet[choice])
    return "".join(written)


def older_run_records(run_dir: Path, index: int) -> dict[str, Any]:
    """The ``inputs`` and ``outputs`` records of client ``index`` of a run whose ``models/best.pt`` predates them: the
    declared target units from its summary and, for ``dataset.standardize``, the scaling rebuilt from the
    federation the run read (a relative ``data_dir`` from the folder the run was started in, as its ``status.json``
    records)."""
    from graphfed.config import load_config
    from graphfed.data import build_federation, feature_scaling

    result = read_result(run_dir) if (run_dir / SUMMARY).is_file() else None
    declared = result is not None and result.target_scale is not None and result.target_units is not None
    outputs = {"target_scale": result.target_scale, "target_units": result.target_units} if declared else {}
    config = load_config(run_dir / CONFIG)
    how = config.dataset.standardize
    if how == "none":
        return {"inputs": {"standardize": how}, "outputs": outputs}
    dataset = config.dataset.model_copy(update={"standardize": "none"})
    started_in = (read_status(run_dir) or {}).get("started_in")
    if dataset.data_dir and not Path(dataset.data_dir).expanduser().is_absolute() and isinstance(started_in, str):
        dataset = dataset.model_copy(update={"data_dir": str(Path(started_in) / dataset.data_dir)})
    raw = build_federation(dataset, config.seed)
    mean, spread = feature_scaling(raw, how)
    return {"inputs": {"standardize": how, "mean": mean[index], "spread": spread[index]}, "outputs": outputs}


def read_rows(path: Path, input_shape: tuple[int, ...], feature_names: list[str] | None = None) -> torch.Tensor:
    """Input rows from a CSV (a header line, then one row of numbers per example) or an ``.npz`` with ``x``;
    each row is reshaped to the model's input shape. With ``feature_names`` (the features the model was trained on),
    a CSV whose header names them all is read by name, in the model's order, and its other columns (an id, the
    label) are left out; a header that names some of them but not all is an error naming the missing ones."""
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
        columns = _csv_columns(path, feature_names)
        try:
            with warnings.catch_warnings():  # an empty body is reported below, in the user's terms
                warnings.simplefilter("ignore", UserWarning)
                rows = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32, ndmin=2, usecols=columns)
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


def _csv_columns(path: Path, feature_names: list[str] | None) -> list[int] | None:
    """The CSV's columns holding ``feature_names``, in that order; None (every column, in file order) when the model
    has no feature names or the header names none of them (a header of placeholders, e.g. x0, x1)."""
    if not feature_names:
        return None
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            header = [name.strip() for name in next(csv.reader(handle), [])]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"{path}: not a readable CSV ({type(error).__name__})") from None
    named = [name for name in feature_names if name in header]
    if not named:
        return None
    missing = [name for name in feature_names if name not in header]
    if missing:
        raise DataError(f"{path}: no column(s) {', '.join(missing)}; the model reads {', '.join(feature_names)}")
    return [header.index(name) for name in feature_names]


def predict(network: TargetModel, rows: torch.Tensor) -> torch.Tensor:
    """The network's outputs for ``rows`` (logits for classification)."""
    with torch.no_grad():
        return network(rows)
