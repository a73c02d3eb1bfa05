"""CIFAR-10 and CIFAR-100 in their official binary versions: fixed-size records, no pickles.

Each record is the label byte(s) then 3,072 pixel bytes: the red, green and blue 32x32 planes, row by row.
CIFAR-10 (``cifar-10-binary.tar.gz``, folder ``cifar-10-batches-bin/``): 1 label byte, training records in
``data_batch_1.bin`` .. ``data_batch_5.bin``, test records in ``test_batch.bin``. CIFAR-100
(``cifar-100-binary.tar.gz``, folder ``cifar-100-binary/``): 2 label bytes (coarse: 20 superclasses, then fine: 100
classes), ``train.bin`` and ``test.bin``.

A data folder may hold the archive as downloaded or the extracted folder (``graphfed data fetch`` leaves both; a
torchvision-style root with the binary folder works too). Members are read straight out of the archive by their
expected names; nothing is extracted. Every file's length must be a whole number of records and every label in
range, or the load stops with one line naming the file. Images come out train first, then test, in record order:
float32 ``[N, 3, 32, 32]`` in ``[0, 1]``, like the other image loaders.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphfed.data.datasets import missing_data
from graphfed.data.datasets.idx import ImageSet
from graphfed.errors import DataError

PIXELS = 3 * 32 * 32


@dataclass(frozen=True)
class BinaryLayout:
    """Where one CIFAR version keeps its records and how long a record's label is."""

    folder: str  #: under the data directory
    archive: str
    members: str  #: the folder inside the archive
    train: tuple[str, ...]
    test: tuple[str, ...]
    label_bytes: int
    classes: int  #: fine classes


CIFAR10 = BinaryLayout("cifar10", "cifar-10-binary.tar.gz", "cifar-10-batches-bin",
                       tuple(f"data_batch_{i}.bin" for i in range(1, 6)), ("test_batch.bin",), 1, 10)
CIFAR100 = BinaryLayout("cifar100", "cifar-100-binary.tar.gz", "cifar-100-binary", ("train.bin",), ("test.bin",),
                        2, 100)
COARSE_CLASSES = 20


def parse_records(raw: bytes, layout: BinaryLayout, where: str, coarse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [n, 3, 32, 32], labels int64 [n])`` of one file's bytes; DataError for a malformed file."""
    record = layout.label_bytes + PIXELS
    if not raw or len(raw) % record:
        raise DataError(f"{where}: {len(raw):,} bytes is not a whole number of {record}-byte CIFAR records")
    table = np.frombuffer(raw, dtype=np.uint8).reshape(-1, record)
    label_column = 0 if (coarse or layout.label_bytes == 1) else 1
    labels = table[:, label_column].astype(np.int64)
    limit = COARSE_CLASSES if coarse else layout.classes
    if labels.max() >= limit:
        raise DataError(f"{where}: label {int(labels.max())} outside 0..{limit - 1}")
    return table[:, layout.label_bytes:].reshape(-1, 3, 32, 32), labels


def _read_members(data_dir: Path, layout: BinaryLayout) -> dict[str, bytes]:
    """Each expected file's bytes, from the extracted folder when present, else straight from the archive."""
    names = (*layout.train, *layout.test)
    root = data_dir / layout.folder
    for extracted in (root / layout.members, data_dir / layout.members):
        if extracted.is_dir():
            missing = [name for name in names if not (extracted / name).is_file()]
            if missing:
                raise missing_data(f"CIFAR file {missing[0]}", extracted / missing[0], layout.folder)
            return {name: (extracted / name).read_bytes() for name in names}
    archive = root / layout.archive
    if not archive.is_file():
        raise missing_data(f"{layout.archive} (or its extracted {layout.members}/)", archive, layout.folder,
                           f" (graphfed data fetch {layout.folder})")
    try:
        with tarfile.open(archive) as tar:
            out = {}
            for name in names:
                member = tar.getmember(f"{layout.members}/{name}")
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is None:
                    raise DataError(f"{archive}: {layout.members}/{name} is not a regular file")
                with handle:
                    out[name] = handle.read()
            return out
    except KeyError as error:
        raise DataError(f"{archive}: no member {error.args[0]} (not the official binary archive?)") from None
    except (tarfile.TarError, EOFError, OSError) as error:
        raise DataError(f"{archive}: not a readable tar archive ({error})") from None


def load_cifar_binary(data_dir: Path | str, layout: BinaryLayout, coarse: bool = False) -> ImageSet:
    """Train and test pooled (train rows first) as float32 ``[N, 3, 32, 32]`` in ``[0, 1]`` with int64 labels
    (CIFAR-100: fine labels, or the 20 coarse ones with ``coarse``)."""
    data_dir = Path(data_dir)
    raw = _read_members(data_dir, layout)
    parts = [parse_records(raw[name], layout, str(data_dir / layout.folder / name), coarse)
             for name in (*layout.train, *layout.test)]
    images = np.concatenate([images for images, _ in parts]).astype(np.float32)
    images /= np.float32(255.0)
    return ImageSet(images, np.concatenate([labels for _, labels in parts]),
                    COARSE_CLASSES if coarse else layout.classes)
