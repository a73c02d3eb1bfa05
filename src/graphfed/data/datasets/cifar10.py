"""CIFAR-10 shipped as JPEG files in one tarball, decoded once with Pillow into a cached ``.npz``.

The tarball (``cifar10-jpeg/cifar10_jpeg_images.tar.gz`` under the data directory) holds
``train/<class>/*.jpg`` (5000 per class) and ``test/<class>/*.jpg`` (1000 per class), 32x32 RGB, re-encoded at
JPEG quality about 75, so results are close to, not identical with, papers' CIFAR-10 ("CIFAR-10 (JPEG)").
Other files in the archive (its README) are skipped; an image anywhere else than ``<part>/<class>/`` is an error.

Decoding 60k JPEGs takes about half a minute, so the decoded pixels are cached as uint8 ``[N, H, W, 3]`` with
labels, class names and a fingerprint of the tarball. The cache goes next to the tarball
(``cifar10-jpeg/cifar10_decoded.npz``) when that folder is writable, otherwise into the user cache folder
(``$GRAPHFED_CACHE``, default ``~/.cache/graphfed/``). A cache whose fingerprint no longer matches the tarball,
or that cannot be read, is rebuilt.

Samples are ordered train first, then test; within a part by class, then by member name, so the arrays do not
depend on the order in which the archive was packed. Classes are the sorted class folder names, which for
CIFAR-10 is exactly its standard label order (airplane=0 ... truck=9). :func:`load_cifar10` returns float32
``[N, 3, H, W]`` in ``[0, 1]`` (pixel / 255, no per-channel normalisation, like the MNIST loaders).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import stat
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from graphfed.data.datasets.idx import ImageSet, missing_image_file
from graphfed.paths import user_cache_dir

__all__ = [
    "CACHE_NAME",
    "CIFAR10_CLASSES",
    "FOLDER",
    "TARBALL",
    "DecodedImages",
    "cache_paths",
    "decode_tarball",
    "load_cifar10",
    "load_cifar10_arrays",
    "tarball_fingerprint",
    "user_cache_dir",
]

log = logging.getLogger(__name__)

FOLDER = "cifar10-jpeg"  # under the data directory
TARBALL = "cifar10_jpeg_images.tar.gz"
CACHE_NAME = "cifar10_decoded.npz"
# CIFAR-10's standard label order; it is also alphabetical, so sorting the class folders reproduces it.
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
PARTS = ("train", "test")  # pooled in this order
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
# Bump when the cached arrays change meaning (order, dtype, fields) so old caches are rebuilt, not misread.
_CACHE_VERSION = 1
_FINGERPRINT_CHUNK = 1 << 20


@dataclass(frozen=True)
class DecodedImages:
    """The decoded archive: what the cache stores."""

    images: np.ndarray  # [N, H, W, 3] uint8, train rows first
    labels: np.ndarray  # [N] int64, index into class_names
    class_names: tuple[str, ...]
    num_train: int  # rows [0, num_train) come from train/, the rest from test/


def tarball_fingerprint(path: Path | str) -> str:
    """Size plus SHA-256 of the first and last MiB.

    The last MiB of a gzip file ends with the CRC-32 and length of the whole uncompressed stream, so this
    catches any change of content while reading 2 MiB instead of 20; unlike an mtime it survives copying.
    """
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        digest.update(fh.read(_FINGERPRINT_CHUNK))
        if size > _FINGERPRINT_CHUNK:
            fh.seek(max(size - _FINGERPRINT_CHUNK, _FINGERPRINT_CHUNK))
            digest.update(fh.read())
    return f"v{_CACHE_VERSION}:{size}:{digest.hexdigest()}"


def _member_location(name: str) -> tuple[str, str] | None:
    """(part, class) of an image member named ``[prefix/]<part>/<class>/<file>``; None for other images."""
    parts = PurePosixPath(name).parts
    if len(parts) >= 3 and parts[-3] in PARTS:
        return parts[-3], parts[-2]
    return None


def _decode_image(data: bytes, tarball: Path, member: str) -> np.ndarray:
    from PIL import Image  # local import: only a cache miss needs Pillow

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()  # Image.open is lazy; truncated data only fails here
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            return np.asarray(rgb, dtype=np.uint8)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:  # UnidentifiedImageError is OSError
        raise ValueError(f"{tarball}: member {member!r} is not a readable image ({err})") from None


def decode_tarball(tarball: Path | str, limit: int | None = None) -> DecodedImages:
    """Decode every image of the archive (or, with ``limit``, the first ``limit`` in archive order).

    Raises ValueError naming the archive and the member for an unreadable archive, an image that does not
    decode, an image outside ``train/<class>/`` or ``test/<class>/``, images of different sizes, or (full
    decode only) train and test parts with different classes.
    """
    tarball = Path(tarball)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    keys: list[tuple[int, str, str]] = []  # (part index, class, member name): the sort order
    pixels: list[np.ndarray] = []
    where = "the archive header"  # what was being read when the stream broke
    try:
        # Streaming mode ("r|gz") reads the archive front to back once, without the index pass of "r:gz".
        with tarfile.open(tarball, "r|gz") as archive:
            for info in archive:
                where = f"member {info.name!r}"
                if not info.isfile() or not info.name.lower().endswith(IMAGE_SUFFIXES):
                    continue
                location = _member_location(info.name)
                if location is None:
                    raise ValueError(f"{tarball}: image member {info.name!r} is not under train/<class>/ or "
                                     f"test/<class>/")
                handle = archive.extractfile(info)
                if handle is None:  # unreachable for a regular file; keeps the type checker honest
                    raise ValueError(f"{tarball}: member {info.name!r} has no data")
                image = _decode_image(handle.read(), tarball, info.name)
                if pixels and image.shape != pixels[0].shape:
                    raise ValueError(f"{tarball}: member {info.name!r} is {image.shape[1]}x{image.shape[0]} but "
                                     f"earlier images are {pixels[0].shape[1]}x{pixels[0].shape[0]}")
                keys.append((PARTS.index(location[0]), location[1], info.name))
                pixels.append(image)
                if limit is not None and len(pixels) >= limit:
                    break
                where = f"the member after {info.name!r}"
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{tarball}: not a readable .tar.gz archive (failed reading {where}: {err})") from None
    if not pixels:
        raise ValueError(f"{tarball}: no images under train/<class>/ or test/<class>/")

    train_classes = {cls for part, cls, _ in keys if part == 0}
    test_classes = {cls for part, cls, _ in keys if part == 1}
    if limit is None and train_classes != test_classes:
        raise ValueError(f"{tarball}: train/ and test/ hold different classes "
                         f"({sorted(train_classes ^ test_classes)} only in one of them)")
    class_names = tuple(sorted(train_classes | test_classes))
    class_index = {name: i for i, name in enumerate(class_names)}
    order = sorted(range(len(keys)), key=keys.__getitem__)
    images = np.stack([pixels[i] for i in order])
    labels = np.array([class_index[keys[i][1]] for i in order], dtype=np.int64)
    return DecodedImages(images, labels, class_names, num_train=sum(1 for part, _, _ in keys if part == 0))


# --- the decoded-image cache ------------------------------------------------------------------------------


def cache_paths(tarball: Path | str) -> tuple[Path, Path]:
    """(cache next to the tarball, cache in the user cache folder), tried in that order.

    The user-cache name carries a hash of the tarball's absolute path: one cache folder serves several data
    directories, and a changed tarball then overwrites its own stale cache instead of piling up new files.
    """
    tarball = Path(tarball)
    key = hashlib.sha256(str(tarball.resolve()).encode()).hexdigest()[:16]
    return tarball.parent / CACHE_NAME, user_cache_dir() / f"cifar10_decoded-{key}.npz"


def _folder_writable(folder: Path) -> bool:
    # root passes os.access for every folder; a folder whose mode grants nobody write access (the shared
    # read-only data folder) is meant to stay untouched, so it counts as read-only for root too.
    try:
        mode = stat.S_IMODE(folder.stat().st_mode)
    except OSError:
        return False
    return bool(mode & 0o222) and os.access(folder, os.W_OK)


def _read_cache(path: Path, fingerprint: str) -> DecodedImages | None:
    """The cached arrays, or None (with a log line saying why) when absent, stale or unreadable."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as cache:
            cached_fingerprint = str(cache["fingerprint"])
            if cached_fingerprint != fingerprint:
                log.info("CIFAR-10 cache %s is stale (the tarball changed); rebuilding it", path)
                return None
            images = cache["images"]
            labels = cache["labels"].astype(np.int64)
            class_names = tuple(str(name) for name in cache["class_names"])
            num_train = int(cache["num_train"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        log.warning("CIFAR-10 cache %s is unreadable (%s); rebuilding it", path, err)
        return None
    valid = (images.dtype == np.uint8 and images.ndim == 4 and images.shape[-1] == 3
             and labels.shape == (len(images),) and 0 <= num_train <= len(images)
             and (len(labels) == 0 or 0 <= labels.min() <= labels.max() < len(class_names)))
    if not valid:
        log.warning("CIFAR-10 cache %s holds inconsistent arrays; rebuilding it", path)
        return None
    return DecodedImages(images, labels, class_names, num_train)


def _write_cache(path: Path, decoded: DecodedImages, fingerprint: str) -> None:
    """Write atomically: a reader (or a concurrent run) sees the old cache or the complete new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            # Uncompressed: decoded JPEG pixels barely compress, and loading 180 MB raw takes well under a second.
            np.savez(fh, images=decoded.images, labels=decoded.labels, class_names=np.array(decoded.class_names),
                     num_train=np.int64(decoded.num_train), fingerprint=np.array(fingerprint))
        # mkstemp creates the file owner-only; the cache holds public data that other users may share.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_cifar10_arrays(folder: Path | str, limit: int | None = None) -> DecodedImages:
    """The decoded archive ``folder/cifar10_jpeg_images.tar.gz``, from the cache when it is current.

    ``limit`` decodes only the first ``limit`` images in archive order (a quick look, e.g. in tests); such a
    partial decode bypasses the cache in both directions, so it can never pass for the full set.
    """
    tarball = Path(folder) / TARBALL
    if not tarball.is_file():
        raise missing_image_file(tarball, [tarball])
    if limit is not None:
        return decode_tarball(tarball, limit)
    fingerprint = tarball_fingerprint(tarball)
    beside, user = cache_paths(tarball)
    for path in (beside, user):
        cached = _read_cache(path, fingerprint)
        if cached is not None:
            return cached
    log.info("decoding %s with Pillow (once; takes about half a minute for CIFAR-10)", tarball)
    decoded = decode_tarball(tarball)
    for path in ([beside] if _folder_writable(beside.parent) else []) + [user]:
        try:
            _write_cache(path, decoded, fingerprint)
        except OSError as err:  # e.g. a read-only mount whose mode bits still say writable
            log.warning("cannot write the CIFAR-10 cache %s (%s)", path, err)
            continue
        log.info("cached the decoded CIFAR-10 images in %s", path)
        break
    else:
        log.warning("no CIFAR-10 cache written, the next load decodes again; set GRAPHFED_CACHE to a writable folder")
    return decoded


def load_cifar10(folder: Path | str, limit: int | None = None) -> ImageSet:
    """Train and test pooled (train rows first) as float32 ``[N, 3, H, W]`` in ``[0, 1]`` with int64 labels."""
    decoded = load_cifar10_arrays(folder, limit)
    # order="C": a plain astype would keep the channels-last memory layout behind the transposed view.
    x = decoded.images.transpose(0, 3, 1, 2).astype(np.float32, order="C")
    x /= np.float32(255.0)  # in place: no second full-size temporary
    return ImageSet(x, decoded.labels, len(decoded.class_names))
