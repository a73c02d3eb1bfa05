"""FEMNIST the LEAF way: NIST Special Database 19 (``by_class.zip``, ``by_write.zip``) to LEAF's train/test shards.

LEAF's preprocessing (TalwalkarLab/leaf, ``data/femnist/preprocess`` and ``data/utils``), step by step:

1. every image under ``by_class/<hex class>/hsf_*/`` (the ``mit`` folders left out) is labelled with its class,
   every image under ``by_write/<part>/<writer>/<kind>/`` with its writer;
2. a writer's image takes the class of the by_class image with the same bytes (MD5; with duplicates, the first);
3. writers in by_write's order, 100 per ``all_data`` file; an image becomes grayscale, thumbnailed to 28x28,
   divided by 255 (white background 1.0) and flattened; classes 0-9 digits, 10-35 upper case, 36-61 lower case;
4. niid sampling (``--sf``): in each file the writers are shuffled by one ``random.Random(sampling seed)`` and
   taken until their samples reach ``fraction`` of the file's; the last one gives a shuffled prefix of its samples;
5. writers with fewer than ``min_samples`` samples are dropped (``-k``);
6. split by sample (``-t sample``, ``--tf``): a writer with at least 2 samples keeps ``max(1, int(tf * n))`` of them
   (1 when n = 2), drawn by one ``random.Random(split seed)``, for training (in their original order), the rest for
   testing; a writer with fewer is dropped.

The shards are what :mod:`graphfed.data.datasets.femnist` reads. Where LEAF follows the file system's listing
order (``os.listdir``), names are taken sorted, so a build is the same on every machine; LEAF's ``group_by_writer``
repeats the first image of every writer but the first, which is not repeated here. Nothing is extracted: images
are read from the archives, each within a size limit. Only the sampled writers' images are decoded.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from graphfed.errors import DataError

WRITERS_PER_FILE = 100  # LEAF's data_to_json.py: writers per all_data file
MAX_IMAGE_BYTES = 1 << 20  # an SD19 PNG is about 1-3 KB; anything far larger is not one
IMAGE_SIDE = 28


@dataclass(frozen=True)
class LeafOptions:
    """LEAF's ``preprocess.sh`` options; the defaults are its small FEMNIST (``-s niid --sf 0.05 -k 0 -t sample``)
    with the seeds of LEAF's paper experiments."""

    fraction: float = 0.05  #: --sf
    min_samples: int = 0  #: -k
    train_fraction: float = 0.9  #: --tf
    sampling_seed: int = 1549786595  #: --smplseed
    split_seed: int = 1549786796  #: --spltseed

    def label(self) -> str:
        """LEAF's file-name suffix, e.g. ``niid_05_keep_0`` (its ``str(fraction)[2:]``)."""
        return f"niid_{str(self.fraction)[2:]}_keep_{self.min_samples}"


def relabel_class(code: str) -> int:
    """A by_class folder's hex ASCII code as LEAF's class: '30'-'39' -> 0-9, '41'-'5a' -> 10-35, '61'-'7a' -> 36-61."""
    value = int(code, 16)
    if 0x30 <= value <= 0x39:
        return value - 0x30
    if 0x41 <= value <= 0x5A:
        return value - 0x41 + 10
    if 0x61 <= value <= 0x7A:
        return value - 0x61 + 36
    raise DataError(f"by_class folder {code!r} is not the hex code of a digit or a letter")


def _images(archive: zipfile.ZipFile, root: str, depth: int) -> Iterator[tuple[tuple[str, ...], zipfile.ZipInfo]]:
    """``(folders below root, member)`` of every file ``depth`` folders below ``root/``, in name order."""
    for member in sorted(archive.infolist(), key=lambda info: info.filename):
        if member.is_dir():
            continue
        parts = PurePosixPath(member.filename).parts
        if len(parts) != depth + 2 or parts[0] != root:
            continue
        if member.file_size > MAX_IMAGE_BYTES:
            raise DataError(f"{archive.filename}: member {member.filename!r} holds {member.file_size:,} bytes, not "
                            f"an SD19 image (at most {MAX_IMAGE_BYTES:,}); nothing was written")
        yield parts[1:-1], member


def classes_by_hash(by_class: zipfile.ZipFile) -> dict[str, int]:
    """MD5 of each hsf image's bytes -> its LEAF class (the first image in name order wins a duplicate)."""
    classes: dict[str, int] = {}
    for (code, folder), member in _images(by_class, "by_class", 2):
        if len(code) != 2 or "hsf" not in folder or "mit" in folder:
            continue
        digest = hashlib.md5(by_class.read(member), usedforsecurity=False).hexdigest()
        classes.setdefault(digest, relabel_class(code))
    return classes


def writers_with_classes(by_write: zipfile.ZipFile, classes: dict[str, int]
                         ) -> list[tuple[str, list[tuple[str, int]]]]:
    """``[(writer, [(member name, class)])]`` in by_write's order: each image labelled by its bytes' by_class twin
    (an image without one is left out, where LEAF would stop)."""
    writers: dict[str, list[tuple[str, int]]] = {}
    for (_part, writer, _kind), member in _images(by_write, "by_write", 3):
        digest = hashlib.md5(by_write.read(member), usedforsecurity=False).hexdigest()
        if digest in classes:
            writers.setdefault(writer, []).append((member.filename, classes[digest]))
    return list(writers.items())


def image_vector(data: bytes) -> list[float]:
    """LEAF's data_to_json.py: grayscale, thumbnail to 28x28 (antialiased), / 255, flattened row-major."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        gray = image.convert("L")
        gray.thumbnail((IMAGE_SIDE, IMAGE_SIDE), Image.Resampling.LANCZOS)
        pixels = np.asarray(gray, dtype=np.float64)
    if pixels.shape != (IMAGE_SIDE, IMAGE_SIDE):
        raise DataError(f"an SD19 image thumbnailed to {pixels.shape}, not 28x28: not a square 128x128 scan")
    return (pixels / 255).flatten().tolist()


Writer = tuple[str, list[tuple[str, int]]]


def sample_niid(files: list[list[Writer]], fraction: float, rng: random.Random) -> list[list[Writer]]:
    """LEAF's utils/sample.py (niid): per file, writers shuffled and taken until ``fraction`` of its samples; the
    last writer taken gives a shuffled prefix of its samples."""
    sampled = []
    for writers in files:
        wanted = int(fraction * sum(len(images) for _, images in writers))
        order = list(writers)
        rng.shuffle(order)
        taken: list[Writer] = []
        total = 0
        while total < wanted:
            writer, images = order[len(taken)]
            if total + len(images) > wanted:
                count = wanted - total
                images = [images[i] for i in rng.sample(range(count), count)]
            taken.append((writer, images))
            total += len(images)
        sampled.append(taken)
    return sampled


def split_by_sample(writers: list[Writer], train_fraction: float, rng: random.Random
                    ) -> tuple[list[Writer], list[Writer]]:
    """LEAF's utils/split_data.py (by sample): each writer's train samples (kept in order) and test samples."""
    train, test = [], []
    for writer, images in writers:
        n = len(images)
        if n < 2:
            continue
        num_train = 1 if n == 2 else max(1, int(train_fraction * n))
        chosen = set(rng.sample(range(n), num_train))
        train.append((writer, [image for j, image in enumerate(images) if j in chosen]))
        test.append((writer, [image for j, image in enumerate(images) if j not in chosen]))
    return train, test


def _write_shard(path: Path, writers: list[Writer], vectors: dict[str, list[float]]) -> None:
    payload = {"users": [writer for writer, _ in writers],
               "num_samples": [len(images) for _, images in writers],
               "user_data": {writer: {"x": [vectors[name] for name, _ in images], "y": [label for _, label in images]}
                             for writer, images in writers}}
    partial = path.with_name(path.name + ".part")
    with partial.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
        out.write(json.dumps(payload).encode())  # no name or time in the header: a build is the same bytes
    os.replace(partial, path)


def build_shards(by_class_zip: Path, by_write_zip: Path, folder: Path, options: LeafOptions = LeafOptions(),
                 echo: Callable[[str], None] = print) -> list[Path]:
    """FEMNIST's LEAF shards ``folder/train/*.json.gz`` and ``folder/test/*.json.gz`` from the two SD19 archives
    (see the module docstring); returns the shards written. Each shard appears whole (written, then renamed)."""
    try:
        with zipfile.ZipFile(by_class_zip) as by_class, zipfile.ZipFile(by_write_zip) as by_write:
            echo(f"hashing the class-labelled images of {by_class_zip.name}")
            classes = classes_by_hash(by_class)
            echo(f"matching {by_write_zip.name}'s images to {len(classes):,} labelled ones")
            writers = writers_with_classes(by_write, classes)
            if not writers:
                raise DataError(f"{by_write_zip}: no by_write image matches an image of {by_class_zip}")
            files = [writers[i:i + WRITERS_PER_FILE] for i in range(0, len(writers), WRITERS_PER_FILE)]
            sampled = sample_niid(files, options.fraction, random.Random(options.sampling_seed))
            kept = [[writer for writer in part if len(writer[1]) >= options.min_samples] for part in sampled]
            split_rng = random.Random(options.split_seed)
            splits = [split_by_sample(part, options.train_fraction, split_rng) for part in kept]
            if not any(train for train, _ in splits):
                raise DataError(f"the LEAF sample holds no writer with 2 or more samples: raise the fraction "
                                f"({options.fraction}) or lower min_samples ({options.min_samples})")
            names = sorted({name for part in kept for _, images in part for name, _ in images})
            echo(f"decoding {len(names):,} images of {sum(len(part) for part in kept)} writers")
            vectors = {name: image_vector(by_write.read(name)) for name in names}
    except (zipfile.BadZipFile, OSError) as error:
        raise DataError(f"not a readable SD19 archive ({error})") from None
    written = []
    label = f"{options.label()}"
    tf = str(options.train_fraction)[2:]
    for index, (train, test) in enumerate(splits):
        for part, writers_of_part in (("train", train), ("test", test)):
            (folder / part).mkdir(parents=True, exist_ok=True)
            path = folder / part / f"all_data_{index}_{label}_{part}_{tf}.json.gz"
            _write_shard(path, writers_of_part, vectors)
            written.append(path)
    return written


__all__ = ["LeafOptions", "build_shards", "classes_by_hash", "image_vector", "relabel_class", "sample_niid",
           "split_by_sample", "writers_with_classes"]
