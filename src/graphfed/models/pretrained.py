"""A base network pretrained centrally on public text, which a federated run starts from (``model.base: PATH``).

``graphfed pretrain CONFIG --out base.pt`` trains the config's model without its adapter on the text of plays no
client of the config's federation holds (:func:`public_plays`), Adam on the next-character loss (a causal
transformer's at every position of a window, as language models pretrain; an LSTM's at the last), and writes
:data:`FORMAT` (``torch.save`` of tensors, strings and numbers: it loads with ``weights_only=True``): the model's name
and options, its weights, and its provenance (the plays it read, the steps, the seed, the code). A run with
``model.base`` loads those weights into its network before anything trains: under an adapter they are the frozen
base every client shares; without one, every client's starting weights.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from graphfed.config import ConfigError, RunConfig, without_adapter
from graphfed.errors import UntrustedInputError
from graphfed.models import build_model
from graphfed.models.base import TargetModel

FORMAT = "graphfed-base"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_base(path: Path | str) -> dict[str, Any]:
    """A base file's contents, checked as untrusted input (never unpickled)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"model.base: {path} not found (graphfed pretrain writes a base)")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UntrustedInputError(f"model.base: {path} is not a graphfed base ({type(error).__name__})") from None
    if not (isinstance(saved, dict) and saved.get("format") == FORMAT and isinstance(saved.get("model"), dict)
            and isinstance(saved.get("state_dict"), dict)
            and all(isinstance(v, torch.Tensor) for v in saved["state_dict"].values())):
        raise UntrustedInputError(f"model.base: {path} is not a graphfed base (format, model, state_dict)")
    return saved


def load_base(model: TargetModel, path: Path | str, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Copy the base at ``path`` into ``model`` (its buffers under an adapter, else its parameters); returns what a
    run records of it (file, SHA-256, provenance). ConfigError when it is another model's."""
    saved = read_base(path)
    recorded = saved["model"]
    if recorded.get("name") != name or recorded.get("options", {}) != without_adapter(options):
        raise ConfigError(f"model.base: {path} is a base of {recorded.get('name')} {recorded.get('options')}; the "
                          f"run's model is {name} {without_adapter(options)}")
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    state = saved["state_dict"]
    wrong = sorted(set(state) ^ {key for key in tensors if ".lora_" not in key})
    if wrong:
        raise UntrustedInputError(f"model.base: {path} does not fit the model: {', '.join(wrong[:3])}")
    with torch.no_grad():
        for key, value in state.items():
            if value.shape != tensors[key].shape or not bool(torch.isfinite(value).all()):
                raise UntrustedInputError(f"model.base: {path}: {key} has shape {tuple(value.shape)} or non-finite "
                                          f"values; the model's is {tuple(tensors[key].shape)}")
            tensors[key].copy_(value)
    return {"path": str(path), "sha256": file_sha256(Path(path).expanduser()), **saved.get("provenance", {})}


def next_characters(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: for windows ``x [B, T]`` and the characters after them ``y [B]``, the character after each
    position (position t's is the window's t+1-th; the last position's is ``y``)."""
    return torch.cat([x[:, 1:].long(), y.long()[:, None]], dim=1)


def public_plays(config: RunConfig) -> list[str]:
    """The plays no client of ``config``'s federation holds: every play but ``dataset.plays`` and
    ``dataset.novel_plays`` (with no ``dataset.plays``, every play is the federation's: refused)."""
    from graphfed.data.datasets.shakespeare import FOLDER, read_plays

    if config.dataset.name != "shakespeare":
        raise ConfigError(f"graphfed pretrain: dataset.name is {config.dataset.name}; pretraining reads the plays "
                          f"outside a shakespeare federation")
    if config.dataset.plays is None:
        raise ConfigError("graphfed pretrain: dataset.plays is unset, so every play is the federation's and no "
                          "public text is left; name the federation's plays (dataset.plays)")
    held = set(config.dataset.plays) | set(config.dataset.novel_plays or ())
    return [play.name for play in read_plays(config.dataset.resolved_data_dir() / FOLDER) if play.name not in held]


def pretrain(config: RunConfig, out: Path, steps: int = 2000, batch: int = 64, lr: float = 3e-3,
             stride: int = 8, echo: Any = print) -> dict[str, Any]:
    """Train ``config``'s model (without adapter) on the public plays' windows; write the base to ``out``."""
    from graphfed.data.datasets.shakespeare import CHARACTERS, FOLDER, WINDOW, read_plays, roles_of, windows
    from graphfed.provenance import code_provenance
    from graphfed.runs import atomic_write_bytes

    plays_read = public_plays(config)
    plays = [play for play in read_plays(config.dataset.resolved_data_dir() / FOLDER) if play.name in plays_read]
    pairs = [windows(role.codes, stride) for role in roles_of(plays)]
    x = torch.from_numpy(np.concatenate([pair[0] for pair in pairs])).float()
    y = torch.from_numpy(np.concatenate([pair[1] for pair in pairs]))
    if not len(y):
        raise ConfigError("graphfed pretrain: the public plays hold no role with enough text")
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    shape = type("Shape", (), {"name": "shakespeare", "task": "classification", "input_shape": (WINDOW,),
                               "output_dim": len(CHARACTERS)})
    options = without_adapter(config.model.options)
    model = build_model(config.model.name, shape, options)  # type: ignore[arg-type]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    started, losses = time.perf_counter(), []
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:  # cosine decay from lr to lr / 10
            group["lr"] = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / max(1, steps))))
        rows = torch.randint(len(y), (batch,), generator=generator)
        if hasattr(model, "sequence_logits"):  # a causal model learns from every position's next character
            targets = next_characters(x[rows], y[rows])
            loss = F.cross_entropy(model.sequence_logits(x[rows]).flatten(0, 1), targets.flatten())
        else:
            loss = F.cross_entropy(model(x[rows]), y[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if (step + 1) % max(1, steps // 10) == 0:
            echo(f"step {step + 1}/{steps}: loss {np.mean(losses[-50:]):.3f}")
    model.eval()
    with torch.no_grad():
        held = torch.randint(len(y), (min(len(y), 4096),), generator=generator)
        accuracy = float((model(x[held]).argmax(-1) == y[held]).float().mean())
    provenance = {"pretrained_on": plays_read, "windows": len(y), "stride": stride, "steps": steps,
                  "batch": batch, "lr": lr, "seed": config.seed, "final_loss": float(np.mean(losses[-50:])),
                  "train_accuracy": accuracy, "seconds": round(time.perf_counter() - started, 1),
                  # plain strings (torch's version is its own str class, which weights_only loading refuses)
                  "code": json.loads(json.dumps(code_provenance()))}
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "model": {"name": config.model.name, "options": options},
                "state_dict": {key: value.detach().clone() for key, value in model.state_dict().items()},
                "provenance": provenance}, buffer)
    atomic_write_bytes(out, buffer.getvalue())
    return provenance
