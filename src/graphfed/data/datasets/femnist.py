"""FEMNIST from LEAF: handwritten digits and letters (62 classes), naturally split by writer.

A data folder holds ``train/*.json.gz`` and ``test/*.json.gz`` (plain ``*.json`` is read too), each shard in
LEAF's format ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats]], "y": [...]}}}``.
Every writer is one client, named by its LEAF writer id; a writer's rows all come from one shard per part and
never go to another client. Images are 28x28 row-major, returned as float32 ``[n, 1, 28, 28]``; LEAF already
stores them in ``[0, 1]`` (white background = 1.0, ink towards 0.0), which is checked and kept as is.

LEAF gives every writer a train and a test part. The test part is the client's test split; the validation split
is carved out of the writer's LEAF train part, ``split[1] / (split[0] + split[1])`` of it (``dataset.split``
(0.7, 0.1, 0.2) -> 12.5%), so the LEAF test rows stay untouched. ``split[2]`` plays no role: the test size is
LEAF's. The shared folder (LEAF niid, sf=0.05) has 105 writers, 14,708 train and 1,685 test samples.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphfed.config import DatasetConfig
from graphfed.data.datasets import missing_data
from graphfed.data.federation import ClientSplit, Federation
from graphfed.data.partition import SplitMode
from graphfed.data.registry import DatasetInfo, Streams, fixed_client_count
from graphfed.errors import DataMissingError

__all__ = [
    "FOLDER",
    "IMAGE_SIDE",
    "NUM_CLASSES",
    "NUM_WRITERS",
    "FemnistData",
    "carve_validation",
    "load_femnist",
    "make_femnist_clients",
    "read_leaf_part",
    "read_leaf_shard",
    "validation_fraction",
]

FOLDER = "femnist"  # under the data directory
NUM_CLASSES = 62  # 10 digits, 26 upper-case, 26 lower-case letters
IMAGE_SIDE = 28
NUM_WRITERS = 105  # in the shared LEAF sample; the registry pins dataset.num_clients to it
_PIXELS = IMAGE_SIDE * IMAGE_SIDE
_PARTS = ("train", "test")


@dataclass(frozen=True)
class FemnistData:
    """Both LEAF parts per writer, writers sorted by id (so shard file order does not matter)."""

    writers: list[str]
    train_x: list[np.ndarray]  # per writer [n, 1, 28, 28] float32 in [0, 1]
    train_y: list[np.ndarray]  # per writer [n] int64 in 0..61
    test_x: list[np.ndarray]
    test_y: list[np.ndarray]


def _missing(path: Path) -> DataMissingError:
    return missing_data("FEMNIST data", path, FOLDER, " with LEAF train/*.json.gz and test/*.json.gz shards")


def _shards(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise _missing(folder)
    shards = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json.gz", ".json")))
    if not shards:
        raise _missing(folder / "*.json.gz")
    return shards


def _writer_arrays(path: Path, writer: str, record: Any, declared: int | None) -> tuple[np.ndarray, np.ndarray]:
    """One writer's (images [n, 1, 28, 28] float32, labels [n] int64), validated."""
    where = f"{path}: writer {writer!r}"
    if not isinstance(record, dict) or "x" not in record or "y" not in record:
        raise ValueError(f"{where}: user_data entry needs keys 'x' and 'y'")
    try:
        # An empty list would become shape (0,); give it the row width so the emptiness check names it.
        raw_x = np.zeros((0, _PIXELS)) if record["x"] == [] else record["x"]
        x = np.asarray(raw_x, dtype=np.float32)
        y = np.asarray(record["y"])
    except (ValueError, TypeError) as err:  # ragged rows or non-numbers
        raise ValueError(f"{where}: x / y are not numeric arrays ({err})") from None
    if x.ndim != 2 or x.shape[1] != _PIXELS:
        raise ValueError(f"{where}: x must be rows of {_PIXELS} pixels, got shape {x.shape}")
    if y.shape != (len(x),):
        raise ValueError(f"{where}: {len(x)} images but y has shape {y.shape}")
    if declared is not None and declared != len(x):
        raise ValueError(f"{where}: num_samples says {declared} but user_data holds {len(x)}")
    if len(y) and y.dtype.kind not in "iu":
        raise ValueError(f"{where}: labels must be integers, got dtype {y.dtype}")
    if len(y) and (y.min() < 0 or y.max() >= NUM_CLASSES):
        raise ValueError(f"{where}: label outside 0..{NUM_CLASSES - 1}")
    if len(x) and not (np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0):
        raise ValueError(f"{where}: pixel values outside [0, 1]")
    return x.reshape(len(x), 1, IMAGE_SIDE, IMAGE_SIDE), y.astype(np.int64)


def read_leaf_shard(path: Path | str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Writer id -> (images, labels) of one LEAF shard; ValueError naming the file for anything malformed."""
    path = Path(path)
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                data = json.load(fh)
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _missing(path) from None
    except (OSError, EOFError, zlib.error, ValueError) as err:  # BadGzipFile is OSError, JSONDecodeError ValueError
        raise ValueError(f"{path}: not a readable LEAF JSON file ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a JSON object with 'users' and 'user_data'")
    for key in ("users", "user_data"):
        if key not in data:
            raise ValueError(f"{path}: missing LEAF key {key!r}")
    users, user_data, counts = data["users"], data["user_data"], data.get("num_samples")
    if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
        raise ValueError(f"{path}: 'users' must be a list of writer ids")
    if not isinstance(user_data, dict):
        raise ValueError(f"{path}: 'user_data' must map writer ids to {{x, y}}")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)
                               or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)):
        raise ValueError(f"{path}: 'num_samples' must list one non-negative integer count per user")
    if len(set(users)) != len(users):
        raise ValueError(f"{path}: 'users' lists a writer twice")
    writers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for i, writer in enumerate(users):
        if writer not in user_data:
            raise ValueError(f"{path}: writer {writer!r} is in 'users' but not in 'user_data'")
        declared = int(counts[i]) if counts is not None else None
        writers[writer] = _writer_arrays(path, writer, user_data[writer], declared)
    return writers


def read_leaf_part(folder: Path | str) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, Path]]:
    """All shards of one part folder: (writer -> (images, labels), writer -> the shard it came from).

    A writer in two shards of the same part is an error rather than merged: LEAF never splits a writer, so it
    means a shard was copied twice (and merging would duplicate that writer's samples).
    """
    writers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    sources: dict[str, Path] = {}
    for shard in _shards(Path(folder)):
        for writer, arrays in read_leaf_shard(shard).items():
            if writer in sources:
                raise ValueError(f"{shard}: writer {writer!r} also appears in {sources[writer]}")
            writers[writer] = arrays
            sources[writer] = shard
    return writers, sources


def load_femnist(folder: Path | str) -> FemnistData:
    """Read ``folder/train`` and ``folder/test``; every writer must have samples in both parts."""
    folder = Path(folder)
    if not folder.is_dir():
        raise _missing(folder)
    (train, train_src), (test, test_src) = (read_leaf_part(folder / part) for part in _PARTS)
    for have, have_src, lack, lack_part in ((train, train_src, test, "test"), (test, test_src, train, "train")):
        orphans = sorted(set(have) - set(lack))
        if orphans:
            raise ValueError(f"{have_src[orphans[0]]}: writer {orphans[0]!r} has no {lack_part} samples in "
                             f"{folder / lack_part} ({len(orphans)} such writer(s))")
    empty = [w for w in sorted(train) if len(train[w][1]) == 0 or len(test[w][1]) == 0]
    if empty:
        source = train_src[empty[0]] if len(train[empty[0]][1]) == 0 else test_src[empty[0]]
        raise ValueError(f"{source}: writer {empty[0]!r} has no samples")
    writers = sorted(train)
    return FemnistData(writers, [train[w][0] for w in writers], [train[w][1] for w in writers],
                       [test[w][0] for w in writers], [test[w][1] for w in writers])


def validation_fraction(split: Sequence[float]) -> float:
    """The share of a writer's LEAF train part that becomes validation: ``val / (train + val)``."""
    return float(split[1]) / (float(split[0]) + float(split[1]))


def carve_validation(n: int, fraction: float, rng: np.random.Generator,
                     mode: SplitMode = "random") -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` into (train, validation) with ``round(fraction * n)`` validation rows, keeping at
    least one train row. ``random`` draws them (sorted); ``chronological`` takes the last rows."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation fraction must be in [0, 1), got {fraction}")
    n_val = min(int(np.floor(fraction * n + 0.5)), max(n - 1, 0))  # half rounds up, unlike round()
    order = np.arange(n) if mode == "chronological" else rng.permutation(n)
    train, val = order[: n - n_val], order[n - n_val:]
    return np.sort(train), np.sort(val)


Clients = tuple[list[np.ndarray], list[np.ndarray]]  # per client (images, labels) of one split


def make_femnist_clients(cfg: DatasetConfig, rng: np.random.Generator,
                         ) -> tuple[FemnistData, Clients, Clients, Clients]:
    """The data plus per-writer (train, val, test): val carved from LEAF train by ``cfg.split``, test = LEAF test."""
    data = load_femnist(cfg.resolved_data_dir() / FOLDER)
    fraction = validation_fraction(cfg.split)
    train: Clients = ([], [])
    val: Clients = ([], [])
    for x, y in zip(data.train_x, data.train_y, strict=True):
        keep, held_out = carve_validation(len(y), fraction, rng, cfg.split_mode)
        train[0].append(x[keep])
        train[1].append(y[keep])
        val[0].append(x[held_out])
        val[1].append(y[held_out])
    return data, train, val, (data.test_x, data.test_y)


def build(cfg: DatasetConfig, streams: Streams) -> Federation:
    """LEAF fixes the test rows per writer, so the split is natural: only validation is carved (from train)."""
    leaf, *per_writer = make_femnist_clients(cfg, streams.split)
    # Checked against the writers actually read (105 in the shared sample), not a constant: any LEAF sample works,
    # and num_clients can only confirm its size.
    fixed_client_count(cfg, len(leaf.writers))
    train, val, test = (ClientSplit.from_lists(x, y, "classification") for x, y in per_writer)
    sizes = [int(split.counts.sum()) for split in (train, val, test)]
    description = (f"FEMNIST (LEAF): {len(leaf.writers)} writers as clients, {NUM_CLASSES} classes, "
                   f"{sizes[0]} train / {sizes[1]} val / {sizes[2]} test images; test = LEAF test, val = "
                   f"{validation_fraction(cfg.split):.1%} of each writer's LEAF train "
                   f"({cfg.split_mode}); natural split (dataset.partition is not used)")
    return Federation(name="femnist", task="classification", train=train, val=val, test=test,
                      input_shape=(1, IMAGE_SIDE, IMAGE_SIDE), output_dim=NUM_CLASSES, client_names=list(leaf.writers),
                      metric="accuracy", description=description)


REGISTRY = (DatasetInfo("femnist", "FEMNIST (LEAF) 28x28 digits and letters, 62 classes, natural split: one client "
                        "per writer (105); LEAF train/test per writer, val carved from the writer's train part by "
                        "dataset.split (dataset.partition is not used, no graph)", "classification", build),)
