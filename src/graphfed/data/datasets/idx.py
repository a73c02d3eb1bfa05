"""MNIST-style image sets stored as gzipped IDX files, read with numpy only (nothing is cached on disk).

An IDX file is a big-endian header followed by raw values: two zero bytes, a type code (``0x08`` =
unsigned byte), the number of dimensions, one ``uint32`` size per dimension, then ``prod(sizes)`` values.
Image files are ``[N, rows, cols]`` unsigned bytes (magic ``0x00000803``), label files ``[N]`` unsigned
bytes (magic ``0x00000801``).

A data folder holds ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
``t10k-images-idx3-ubyte.gz`` and ``t10k-labels-idx1-ubyte.gz``; the spelling with a dot before
``idx`` (``train-images.idx3-ubyte.gz``, as some MNIST mirrors ship it) is accepted as well.

The module also holds the client partition specific to these sets: FedAGHN's case study
(:func:`group_class_partition`); the generic iid / pathological / Dirichlet schemes live in
:mod:`graphfed.data.partition`.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from graphfed.data.datasets import missing_data
from graphfed.errors import DataMissingError

__all__ = [
    "CASESTUDY_GROUPS",
    "CASESTUDY_GROUP_FRACTION",
    "DEFAULT_NUM_CLIENTS",
    "IMAGES_MAGIC",
    "LABELS_MAGIC",
    "NUM_CLASSES",
    "GroupPartition",
    "ImageSet",
    "find_idx_file",
    "group_class_partition",
    "load_idx_images",
    "load_image_set",
    "missing_image_file",
    "read_idx",
]

IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension
NUM_CLASSES = 10  # MNIST and Fashion-MNIST
_UBYTE = 0x08
_HEADER = 4  # magic number bytes; each dimension adds 4 more

Part = Literal["train", "t10k"]


@dataclass(frozen=True)
class ImageSet:
    """Images and labels of one image data set (e.g. train and test pooled)."""

    x: np.ndarray  # [N, 1, rows, cols] float32 in [0, 1]
    y: np.ndarray  # [N] int64
    num_classes: int


def missing_image_file(path: Path, tried: list[Path]) -> DataMissingError:
    others = [str(p) for p in tried if p != path]
    also = f" (also tried {', '.join(others)})" if others else ""
    return missing_data("image data file", f"{path}{also}", path.parent.name)


def find_idx_file(folder: Path | str, part: Part, kind: Literal["images", "labels"]) -> Path:
    """Path of ``<part>-<kind>-idx?-ubyte.gz`` in ``folder`` (dash or dot spelling); FileNotFoundError if absent."""
    folder = Path(folder)
    dims = 3 if kind == "images" else 1
    tried = [folder / f"{part}-{kind}-idx{dims}-ubyte.gz", folder / f"{part}-{kind}.idx{dims}-ubyte.gz"]
    for path in tried:
        if path.is_file():
            return path
    raise missing_image_file(tried[0], tried)


def read_idx(path: Path | str, expected_magic: int) -> np.ndarray:
    """Decompress and parse one gzipped IDX file of unsigned bytes, validating header and length.

    Raises FileNotFoundError for a missing file and ValueError (naming the file and the problem) for a
    corrupt gzip stream, a wrong magic number, a zero-dimensional header, or a payload whose length does
    not match the sizes in the header (truncated or with trailing bytes).
    """
    path = Path(path)
    if not path.is_file():
        raise missing_image_file(path, [path])
    try:
        with gzip.open(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: not a readable gzip file ({err})") from None
    if len(raw) < _HEADER:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes, need at least {_HEADER})")
    magic = int.from_bytes(raw[:4], "big")
    if magic != expected_magic:
        raise ValueError(f"{path}: bad IDX magic number 0x{magic:08x}, expected 0x{expected_magic:08x}")
    if raw[2] != _UBYTE:  # unreachable while both expected magics say ubyte; kept for future callers
        raise ValueError(f"{path}: IDX type code 0x{raw[2]:02x} is not unsigned byte (0x08)")
    ndim = raw[3]
    header = _HEADER + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes, {ndim} dimensions need {header})")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=_HEADER))
    expected = int(np.prod(dims, dtype=np.int64))
    payload = len(raw) - header
    if payload != expected:
        problem = "truncated" if payload < expected else "has trailing bytes"
        raise ValueError(f"{path}: IDX payload {problem}: header sizes {dims} need {expected} bytes, "
                         f"file holds {payload}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_idx_images(folder: Path | str, part: Part) -> tuple[np.ndarray, np.ndarray]:
    """One part (``train`` or ``t10k``) as (images [N, 1, rows, cols] float32 in [0, 1], labels [N] int64)."""
    images_path = find_idx_file(folder, part, "images")
    labels_path = find_idx_file(folder, part, "labels")
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{images_path}: {images.shape[0]} images but {labels_path.name} has "
                         f"{labels.shape[0]} labels")
    if images.shape[0] == 0 or images.shape[1] == 0 or images.shape[2] == 0:
        raise ValueError(f"{images_path}: empty image array of shape {images.shape}")
    x = images.astype(np.float32)
    x /= np.float32(255.0)  # in place: no second full-size temporary
    return x[:, None], labels.astype(np.int64)


def load_image_set(folder: Path | str, num_classes: int = NUM_CLASSES) -> ImageSet:
    """Train and test parts of an MNIST-style folder pooled into one set (train rows first).

    Checks that both parts have the same image size and that every label lies in ``0..num_classes-1``.
    """
    folder = Path(folder)
    x_train, y_train = load_idx_images(folder, "train")
    x_test, y_test = load_idx_images(folder, "t10k")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ValueError(f"{folder}: train images are {x_train.shape[2:]} but t10k images are {x_test.shape[2:]}")
    y = np.concatenate([y_train, y_test])
    bad = (y < 0) | (y >= num_classes)
    if bad.any():
        raise ValueError(f"{folder}: label {int(y[bad][0])} outside 0..{num_classes - 1}")
    return ImageSet(np.concatenate([x_train, x_test]), y, num_classes)


# --- federations built from an image set --------------------------------------------------------------

DEFAULT_NUM_CLIENTS = 20
CASESTUDY_GROUPS = 5
CASESTUDY_GROUP_FRACTION = 0.8


@dataclass(frozen=True)
class GroupPartition:
    """Clients in groups that share dominant classes (FedAGHN's case study, after Xu et al. 2023)."""

    clients: list[np.ndarray]  # per client: sorted sample indices (its group part + its IID part)
    group_parts: list[np.ndarray]  # per client: sorted indices of its group-class part only
    client_groups: np.ndarray  # [N] int64 group of each client
    group_classes: list[np.ndarray]  # per group: the classes it owns


def group_class_partition(labels: np.ndarray, num_clients: int, num_groups: int, group_fraction: float,
                          rng: np.random.Generator) -> GroupPartition:
    """Sample ``group_fraction`` of all samples at random and give group ``g`` those of its classes, dealt
    evenly over its clients; deal the remaining samples IID over all clients.

    Classes are cut into ``num_groups`` contiguous near-equal blocks (10 classes, 5 groups: group ``g``
    owns ``{2g, 2g+1}``) and clients likewise (20 clients, 5 groups: group ``g`` is clients ``4g..4g+3``).
    Every sample goes to exactly one client.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {labels.shape}")
    classes = np.unique(labels)
    if not 1 <= num_groups <= len(classes):
        raise ValueError(f"num_groups must be in 1..{len(classes)} (the number of classes), got {num_groups}")
    if num_clients < num_groups:
        raise ValueError(f"{num_clients} clients cannot form {num_groups} groups")
    if not 0.0 <= group_fraction <= 1.0:
        raise ValueError(f"group_fraction must be in [0, 1], got {group_fraction}")
    group_classes = np.array_split(classes, num_groups)
    client_groups = np.concatenate([np.full(len(block), g, dtype=np.int64) for g, block in
                                    enumerate(np.array_split(np.arange(num_clients), num_groups))])
    perm = rng.permutation(len(labels))
    n_grouped = round(group_fraction * len(labels))
    grouped, rest = perm[:n_grouped], perm[n_grouped:]

    group_parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * num_clients
    for g, owned in enumerate(group_classes):
        members = np.flatnonzero(client_groups == g)
        pool = grouped[np.isin(labels[grouped], owned)]  # already in random order
        for client, chunk in zip(members, np.array_split(pool, len(members)), strict=True):
            group_parts[client] = np.sort(chunk)
    iid_parts = np.array_split(rest, num_clients)  # ``rest`` is a random order too
    clients = [np.sort(np.concatenate([gp, ip])) for gp, ip in zip(group_parts, iid_parts, strict=True)]
    if min(len(c) for c in clients) == 0:
        raise ValueError(f"a client got no samples ({len(labels)} samples over {num_clients} clients)")
    return GroupPartition(clients, group_parts, client_groups, group_classes)
