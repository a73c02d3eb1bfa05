"""The simulator's checkpoint: its whole state behind a checksum, written atomically, never unpickled beyond
tensors and plain containers."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from graphfed.errors import CheckpointError
from graphfed.runs import CHECKPOINT, atomic_write_bytes

__all__ = ["CHECKPOINT", "CHECKPOINT_MAGIC", "CheckpointError", "load_checkpoint", "save_checkpoint"]


#: First line of a checkpoint: format version and the SHA-256 of the payload that follows it.
CHECKPOINT_MAGIC = b"GRAPHFED-CHECKPOINT 1 sha256="


def save_checkpoint(out_dir: Path, state: dict[str, Any]) -> None:
    """``state`` (tensors, numbers, strings, lists and dicts only) behind a checksummed header."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    header = CHECKPOINT_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n"
    atomic_write_bytes(out_dir / CHECKPOINT, header + payload)


def load_checkpoint(out_dir: Path, map_location: torch.device | str | None = None) -> dict[str, Any]:
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
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location=map_location)
    except Exception as err:  # torch raises several types for truncated, corrupt or code-carrying pickles
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"--resume: checkpoint {path} is not a readable graphfed checkpoint "
                              f"({type(err).__name__}: {reason[:200]})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"--resume: checkpoint {path} holds a {type(state).__name__}, not a graphfed "
                              f"checkpoint")
    return state
