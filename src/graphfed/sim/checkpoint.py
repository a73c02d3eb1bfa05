"""Run-directory I/O: atomic checkpoints, the per-round log and the summary. All file writes live here."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger("graphfed")

CHECKPOINT = "checkpoint.pt"
ROUNDS_LOG = "rounds.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.yaml"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used to resume (missing, corrupt, or from another config)."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


#: First line of a checkpoint: format version and the SHA-256 of the payload that follows it.
CHECKPOINT_MAGIC = b"GRAPHFED-CHECKPOINT 1 sha256="


def save_checkpoint(out_dir: Path, state: dict[str, Any]) -> None:
    """``state`` (tensors, numbers, strings, lists and dicts only) behind a checksummed header."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    header = CHECKPOINT_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n"
    atomic_write_bytes(out_dir / CHECKPOINT, header + payload)


def load_checkpoint(out_dir: Path) -> dict[str, Any]:
    """The state saved by :func:`save_checkpoint`, checked before use.

    A checkpoint may come from anywhere (a shared run folder, a downloaded suite), so it is never unpickled
    beyond tensors and plain containers (``weights_only=True``: no code runs), and its payload must match the
    checksum written with it (bit flips, truncation). Checkpoints of older graphfed versions have no header;
    they are still read with ``weights_only=True``.
    """
    path = out_dir / CHECKPOINT
    if not path.exists():
        raise CheckpointError(f"--resume: no checkpoint at {path}; start the run without --resume")
    data = path.read_bytes()
    payload = data
    if data.startswith(CHECKPOINT_MAGIC):
        header, _, payload = data.partition(b"\n")
        expected = header[len(CHECKPOINT_MAGIC):].decode("ascii", errors="replace")
        if hashlib.sha256(payload).hexdigest() != expected:
            raise CheckpointError(f"--resume: checkpoint {path} is corrupt (its checksum does not match its "
                                  f"contents); start a new run or restore the file")
    try:
        state = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as err:  # torch raises several types for truncated, corrupt or code-carrying pickles
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"--resume: checkpoint {path} is not a readable graphfed checkpoint "
                              f"({type(err).__name__}: {reason[:200]})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"--resume: checkpoint {path} holds a {type(state).__name__}, not a graphfed "
                              f"checkpoint")
    return state


class RoundLog:
    """``rounds.jsonl``: one JSON object per evaluated round, appended and flushed as it happens."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / ROUNDS_LOG

    def truncate_after(self, last_round: int) -> None:
        """Drop lines written after the checkpoint we resume from, so no round appears twice (and a last line
        torn by a crash mid-write)."""
        if not self.path.exists():
            return
        kept = [json.dumps(record) for record in self.read() if record["round"] <= last_round]
        atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))

    def reset(self) -> None:
        self.path.unlink(missing_ok=True)

    def append(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(finite_or_none(record), allow_nan=False) + "\n")
            handle.flush()

    def read(self) -> list[dict[str, Any]]:
        """The records in order. A last line without its newline is a write a crash interrupted: it is dropped.
        Anything else unreadable is an error naming the file and line."""
        if not self.path.exists():
            return []
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"{self.path}: not UTF-8 text; it was not written by graphfed") from None
        lines = text.split("\n")
        torn = lines.pop()  # "" after a final newline; otherwise a partial last record
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise CheckpointError(f"{self.path}: line {number} is not JSON ({err.msg}); fix or delete the "
                                      f"line, or start a new --out directory") from None
            if not isinstance(record, dict) or not isinstance(record.get("round"), int):
                raise CheckpointError(f"{self.path}: line {number} is not a round record")
            records.append(record)
        if torn.strip():
            log.warning("%s: dropped a torn last line (a write interrupted by a crash)", self.path)
        return records


GRAPHS_DIR = "graphs"


def save_graphs(out_dir: Path, completed_rounds: int, graphs: torch.Tensor, layer_names: list[str],
                clients: torch.Tensor | None = None, client_names: list[str] | None = None,
                novel: torch.Tensor | None = None) -> Path:
    """``graphs/round_XXXX.npz``: the method's collaboration graph(s) after ``completed_rounds`` rounds.

    ``matrices`` is ``[L, N, N]`` (one per layer; L = 1 for a single client graph), ``layers`` their names.
    With ``clients`` (large federations), only those clients' rows are saved: ``matrices`` is ``[L, R, N]`` and
    ``clients [R]`` says whose rows they are. ``client_names [N]`` and the ``novel [N]`` mask label the plots.
    """
    matrices = graphs.detach().cpu().numpy()
    if matrices.ndim == 2:
        matrices = matrices[None]
    buffer = io.BytesIO()
    extra = {} if clients is None else {"clients": clients.numpy()}
    if client_names is not None:
        extra["client_names"] = np.array(client_names, dtype=str)
    if novel is not None:
        extra["novel"] = novel.numpy()
    np.savez_compressed(buffer, matrices=matrices, layers=np.array(layer_names), round=completed_rounds, **extra)
    path = out_dir / GRAPHS_DIR / f"round_{completed_rounds:04d}.npz"
    atomic_write_bytes(path, buffer.getvalue())
    return path


def load_graphs(run_dir: Path) -> list[tuple[int, list[str], np.ndarray]]:
    """All saved collaboration graphs of a run, by round: ``(round, layer names, [L, N, N])``. Where only sampled
    clients' rows were saved, the square ``[L, R, R]`` graph among those clients."""
    found = []
    for path in sorted((run_dir / GRAPHS_DIR).glob("round_*.npz")):
        try:
            with np.load(path, allow_pickle=False) as data:
                matrices = data["matrices"]
                if "clients" in data:
                    matrices = matrices[:, :, data["clients"]]
                found.append((int(data["round"]), [str(n) for n in data["layers"]], matrices))
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"{path}: not a readable graph file ({err})") from None
    return found


def load_graph_clients(run_dir: Path) -> tuple[list[str], np.ndarray] | None:
    """The names and novel mask of the clients in a run's last saved graph (as :func:`load_graphs` orders them),
    or None for graphs saved without them."""
    paths = sorted((run_dir / GRAPHS_DIR).glob("round_*.npz"))
    if not paths:
        return None
    try:
        with np.load(paths[-1], allow_pickle=False) as data:
            if "client_names" not in data or "novel" not in data:
                return None
            names, novel = data["client_names"], data["novel"].astype(bool)
            if "clients" in data:
                names, novel = names[data["clients"]], novel[data["clients"]]
            return [str(name) for name in names], novel
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{paths[-1]}: not a readable graph file ({err})") from None


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN/Inf float replaced by None, recursively (strict JSON has no NaN/Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    return value


def write_summary(out_dir: Path, summary: dict[str, Any]) -> None:
    atomic_write_text(out_dir / SUMMARY, json.dumps(finite_or_none(summary), indent=2, allow_nan=False) + "\n")


def remove_stale_temporaries(out_dir: Path) -> list[Path]:
    """Delete temp files of atomic writes that a crash interrupted (``.NAME.XXXX.tmp``); return them."""
    stale = [path for path in out_dir.rglob(".*.tmp") if path.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def read_summary(out_dir: Path) -> dict[str, Any]:
    return json.loads((out_dir / SUMMARY).read_text())
