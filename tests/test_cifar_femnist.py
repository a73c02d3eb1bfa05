"""CIFAR-10 (JPEG) tarball decoding and its cache, FEMNIST (LEAF) writers as clients, and the LeNet model.

Most tests run on tiny archives generated here; the real files are used when the shared data folder exists.
The full real CIFAR decode (about 20-30 s on 2 cores) is marked slow and fills the user cache
(``$GRAPHFED_CACHE`` or ``~/.cache/graphfed``) the library uses anyway, so later runs only load that cache.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import logging
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.func import functional_call

from graphfed.config import ConfigError, DatasetConfig, load_config
from graphfed.data import DATASETS, build_federation
from graphfed.data.datasets import cifar10
from graphfed.data.datasets.cifar10 import (
    CACHE_NAME,
    CIFAR10_CLASSES,
    TARBALL,
    cache_paths,
    decode_tarball,
    load_cifar10,
    load_cifar10_arrays,
)
from graphfed.data.datasets.femnist import carve_validation, load_femnist
from graphfed.models import MODELS, build_model
from graphfed.models.base import TargetModel
from graphfed.models.cnn import PflCNN, SmallCNN
from graphfed.models.lenet import LeNet
from graphfed.sim.engine import run_config

SHARED_DATA = (Path(__file__).parents[1] / "../shared/data").resolve()
REAL_CIFAR = SHARED_DATA / "cifar10-jpeg"
REAL_FEMNIST = SHARED_DATA / "femnist"

needs_cifar = pytest.mark.skipif(not (REAL_CIFAR / TARBALL).is_file(), reason=f"real CIFAR-10 (JPEG) tarball not "
                                 f"found at {REAL_CIFAR / TARBALL} (the shared data folder is absent)")
needs_femnist = pytest.mark.skipif(not (REAL_FEMNIST / "train").is_dir(), reason=f"real FEMNIST LEAF shards not "
                                   f"found under {REAL_FEMNIST} (the shared data folder is absent)")

# One colour per CIFAR-10 class (by its standard index), far apart in RGB so a small CNN can tell them apart.
PALETTE = np.array([[40, 40, 40], [215, 40, 40], [40, 215, 40], [40, 40, 215], [215, 215, 40],
                    [215, 40, 215], [40, 215, 215], [215, 215, 215], [128, 128, 40], [40, 128, 215]], dtype=np.float64)


# --- CIFAR fixtures ----------------------------------------------------------------------------------------


def jpeg_bytes(pixels: np.ndarray, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def pillow_decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def add_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def write_cifar_tarball(folder: Path, classes: Sequence[str] = ("ship", "cat", "airplane"),
                        per_class: tuple[int, int] = (3, 2), seed: int = 0, size: int = 32,
                        extra: dict[str, bytes] | None = None) -> dict[tuple[int, str, str], np.ndarray]:
    """``folder/cifar10_jpeg_images.tar.gz`` with ``per_class`` (train, test) JPEGs per class, packed in reverse
    order (so decoding must sort). Train images are the class colour plus noise, test images flat. Returns
    (part index, class, member) -> the pixels Pillow decodes from the stored bytes."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    expected: dict[tuple[int, str, str], np.ndarray] = {}
    members: list[tuple[str, bytes]] = [("README.md", b"# CIFAR-10-images\n")]
    for part_index, (part, count) in enumerate(zip(("train", "test"), per_class, strict=True)):
        for cls in classes:
            noise = 20.0 if part == "train" else 0.0
            for i in range(count):
                colour = PALETTE[CIFAR10_CLASSES.index(cls)]
                pixels = np.clip(colour + rng.normal(0.0, noise, (size, size, 3)), 0, 255).astype(np.uint8)
                name = f"{part}/{cls}/{i:04d}.jpg"
                data = jpeg_bytes(pixels)
                members.append((name, data))
                expected[(part_index, cls, name)] = pillow_decode(data)
    with tarfile.open(folder / TARBALL, "w:gz") as archive:
        for name, data in [*reversed(members), *(extra or {}).items()]:
            add_member(archive, name, data)
    return expected


@pytest.fixture
def user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty GRAPHFED_CACHE, so no test touches the real user cache by accident."""
    path = tmp_path / "user-cache"
    monkeypatch.setenv("GRAPHFED_CACHE", str(path))
    return path


def count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record every call of the decoder (which the loader looks up at call time)."""
    calls: list[Path] = []

    def counting(tarball: Path, limit: int | None = None) -> cifar10.DecodedImages:
        calls.append(Path(tarball))
        return decode_tarball(tarball, limit)

    monkeypatch.setattr(cifar10, "decode_tarball", counting)
    return calls


def forbid_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(tarball: Path, limit: int | None = None) -> cifar10.DecodedImages:
        raise AssertionError(f"decoded {tarball} again although a current cache exists")

    monkeypatch.setattr(cifar10, "decode_tarball", refuse)


# --- CIFAR: decoding -----------------------------------------------------------------------------------------


def test_fixture_tarball_decodes_sorted_train_first_channels_first(tmp_path: Path, user_cache: Path) -> None:
    expected = write_cifar_tarball(tmp_path)
    decoded = load_cifar10_arrays(tmp_path)
    assert decoded.class_names == ("airplane", "cat", "ship")  # sorted folders, whatever the packing order
    assert decoded.num_train == 9 and decoded.images.shape == (15, 32, 32, 3) and decoded.images.dtype == np.uint8
    order = sorted(expected)  # (part, class, member): train first, then by class and file name
    np.testing.assert_array_equal(decoded.images, np.stack([expected[key] for key in order]))
    np.testing.assert_array_equal(decoded.labels, [decoded.class_names.index(cls) for _, cls, _ in order])

    images = load_cifar10(tmp_path)
    assert images.x.dtype == np.float32 and images.x.shape == (15, 3, 32, 32) and images.x.flags.c_contiguous
    assert images.num_classes == 3 and images.y.dtype == np.int64
    np.testing.assert_array_equal(images.x, decoded.images.transpose(0, 3, 1, 2) / np.float32(255.0))
    assert images.x.min() >= 0.0 and images.x.max() <= 1.0
    for row in range(15):  # channel 0 is red etc.: the mean colour of each image is its class colour
        colour = PALETTE[CIFAR10_CLASSES.index(decoded.class_names[images.y[row]])] / 255.0
        np.testing.assert_allclose(images.x[row].mean(axis=(1, 2)), colour, atol=0.04)
    assert images.x[:9].std(axis=(2, 3)).min() > 0.03 > images.x[9:].std(axis=(2, 3)).max()  # train rows noisy


def test_limit_decodes_a_prefix_and_never_touches_the_cache(tmp_path: Path, user_cache: Path) -> None:
    write_cifar_tarball(tmp_path)
    decoded = load_cifar10_arrays(tmp_path, limit=4)
    assert len(decoded.images) == 4
    assert not (tmp_path / CACHE_NAME).exists() and not user_cache.exists()
    with pytest.raises(ValueError, match="limit"):
        decode_tarball(tmp_path / TARBALL, limit=0)


# --- CIFAR: the cache ----------------------------------------------------------------------------------------


def test_cache_is_written_beside_the_tarball_once_and_reused(tmp_path: Path, user_cache: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    write_cifar_tarball(tmp_path)
    calls = count_decodes(monkeypatch)
    first = load_cifar10_arrays(tmp_path)
    assert len(calls) == 1 and (tmp_path / CACHE_NAME).is_file() and not user_cache.exists()
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write left no temporary file
    forbid_decoding(monkeypatch)
    second = load_cifar10_arrays(tmp_path)
    np.testing.assert_array_equal(second.images, first.images)
    np.testing.assert_array_equal(second.labels, first.labels)
    assert (second.class_names, second.num_train) == (first.class_names, first.num_train)


def test_stale_and_corrupt_caches_are_rebuilt_with_a_log_message(tmp_path: Path, user_cache: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    write_cifar_tarball(tmp_path, seed=0)
    load_cifar10_arrays(tmp_path)
    expected = write_cifar_tarball(tmp_path, classes=("dog", "frog"), seed=1)  # same path, new content
    calls = count_decodes(monkeypatch)
    with caplog.at_level(logging.INFO, logger=cifar10.__name__):
        rebuilt = load_cifar10_arrays(tmp_path)
    assert len(calls) == 1 and "stale" in caplog.text
    assert rebuilt.class_names == ("dog", "frog")
    np.testing.assert_array_equal(rebuilt.images, np.stack([expected[key] for key in sorted(expected)]))

    cache = tmp_path / CACHE_NAME
    for damage in (b"not a zip archive", cache.read_bytes()[: cache.stat().st_size // 2]):
        cache.write_bytes(damage)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=cifar10.__name__):
            again = load_cifar10_arrays(tmp_path)
        assert "unreadable" in caplog.text and str(cache) in caplog.text
        np.testing.assert_array_equal(again.images, rebuilt.images)
    assert len(calls) == 3
    forbid_decoding(monkeypatch)  # the rebuilt cache is whole again
    load_cifar10_arrays(tmp_path)


def test_cache_falls_back_to_graphfed_cache_when_the_data_folder_is_read_only(
        tmp_path: Path, user_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "cifar10-jpeg"
    write_cifar_tarball(folder)
    folder.chmod(0o555)  # read-only by its mode; honoured even when the tests run as root
    try:
        first = load_cifar10_arrays(folder)
        assert not (folder / CACHE_NAME).exists()
        beside, in_user_cache = cache_paths(folder / TARBALL)
        assert beside == folder / CACHE_NAME and in_user_cache.parent == user_cache and in_user_cache.is_file()
        forbid_decoding(monkeypatch)
        np.testing.assert_array_equal(load_cifar10_arrays(folder).images, first.images)
    finally:
        folder.chmod(0o755)


def test_unwritable_caches_still_return_the_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "data"
    write_cifar_tarball(folder)
    blocker = tmp_path / "a-file"
    blocker.write_text("GRAPHFED_CACHE points below a file, so the cache folder cannot be created")
    monkeypatch.setenv("GRAPHFED_CACHE", str(blocker / "cache"))
    folder.chmod(0o555)
    try:
        with caplog.at_level(logging.WARNING, logger=cifar10.__name__):
            decoded = load_cifar10_arrays(folder)
    finally:
        folder.chmod(0o755)
    assert len(decoded.images) == 15 and "GRAPHFED_CACHE" in caplog.text


# --- CIFAR: errors -------------------------------------------------------------------------------------------


def test_missing_tarball_names_the_path_and_the_settings(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        load_cifar10(tmp_path / "cifar10-jpeg")
    message = str(err.value)
    assert str(tmp_path / "cifar10-jpeg" / TARBALL) in message
    assert "dataset.data_dir" in message and "GRAPHFED_DATA" in message
    with pytest.raises(FileNotFoundError, match=r"dataset\.data_dir"):
        build_federation(DatasetConfig(name="cifar10", data_dir=str(tmp_path)), seed=0)


def _valid_jpeg() -> bytes:
    return jpeg_bytes(np.full((32, 32, 3), 128, dtype=np.uint8))


@pytest.mark.parametrize(("member", "data", "problem"), [
    ("train/cat/9999.jpg", b"this is not a JPEG", "not a readable image"),
    ("test/cat/9999.jpg", _valid_jpeg()[:300], "not a readable image"),  # truncated JPEG
    ("train/9999.jpg", _valid_jpeg(), "not under train/<class>/"),
    ("train/cat/9999.jpg", jpeg_bytes(np.zeros((16, 32, 3), dtype=np.uint8)), "32x16 but earlier images are 32x32"),
])
def test_bad_members_raise_value_error_naming_the_member(tmp_path: Path, user_cache: Path, member: str,
                                                         data: bytes, problem: str) -> None:
    write_cifar_tarball(tmp_path, extra={member: data})
    with pytest.raises(ValueError, match=problem) as err:
        load_cifar10_arrays(tmp_path)
    assert member in str(err.value) and str(tmp_path / TARBALL) in str(err.value)
    assert not (tmp_path / CACHE_NAME).exists()


def test_broken_archives_raise_value_error_naming_the_tarball(tmp_path: Path, user_cache: Path) -> None:
    write_cifar_tarball(tmp_path)
    tarball = tmp_path / TARBALL
    whole = tarball.read_bytes()
    for broken in (whole[: len(whole) // 2], b"not gzip at all"):
        tarball.write_bytes(broken)
        with pytest.raises(ValueError, match=r"not a readable \.tar\.gz archive") as err:
            load_cifar10_arrays(tmp_path)
        assert str(tarball) in str(err.value)
    write_cifar_tarball(tmp_path, per_class=(0, 0))  # only the README
    with pytest.raises(ValueError, match="no images"):
        load_cifar10_arrays(tmp_path)


# --- CIFAR: the federation -------------------------------------------------------------------------------------


def test_cifar10_fixture_builds_a_partitioned_federation(tmp_path: Path, user_cache: Path) -> None:
    write_cifar_tarball(tmp_path / "cifar10-jpeg", classes=CIFAR10_CLASSES, per_class=(2, 1))
    cfg = DatasetConfig(name="cifar10", data_dir=str(tmp_path), num_clients=3, partition="iid",
                        min_samples_per_client=1)
    fed = build_federation(cfg, seed=0)
    assert fed.num_clients == 3 and fed.input_shape == (3, 32, 32) and fed.output_dim == 10
    assert fed.client_graph is None and fed.metric == "accuracy" and fed.description.startswith("CIFAR-10 (JPEG)")
    assert int(sum(split.counts.sum() for split in (fed.train, fed.val, fed.test))) == 30
    again = build_federation(cfg, seed=0)  # from the cache now: identical tensors
    torch.testing.assert_close(again.train.x, fed.train.x, rtol=0, atol=0)
    description = DATASETS["cifar10"].description
    assert "JPEG re-encoding" in description and "official binary" in description


@needs_cifar
def test_real_tarball_prefix_decodes(user_cache: Path) -> None:
    """The first 300 members in archive order (quick): size, range and class names of the real files."""
    decoded = load_cifar10_arrays(REAL_CIFAR, limit=300)
    assert decoded.images.shape == (300, 32, 32, 3)
    assert set(decoded.class_names) <= set(CIFAR10_CLASSES)
    assert decoded.images.std() > 20  # real photographs, not blank decodes


@needs_cifar
@pytest.mark.slow
def test_real_cifar10_counts_classes_and_cache() -> None:
    """All 60k images; decodes once into the user cache (about 20-30 s), later runs load that cache."""
    started = time.perf_counter()
    decoded = load_cifar10_arrays(REAL_CIFAR)
    first_seconds = time.perf_counter() - started
    assert decoded.images.shape == (60_000, 32, 32, 3) and decoded.num_train == 50_000
    assert decoded.class_names == CIFAR10_CLASSES
    np.testing.assert_array_equal(np.bincount(decoded.labels[:50_000]), [5000] * 10)
    np.testing.assert_array_equal(np.bincount(decoded.labels[50_000:]), [1000] * 10)
    beside, in_user_cache = cache_paths(REAL_CIFAR / TARBALL)
    assert beside.is_file() or in_user_cache.is_file()
    if REAL_CIFAR.stat().st_mode & 0o222 == 0:  # the shared folder is read-only: it must stay untouched
        assert not beside.exists() and in_user_cache.is_file()
    started = time.perf_counter()
    again = load_cifar10_arrays(REAL_CIFAR)
    assert time.perf_counter() - started < max(5.0, first_seconds / 2)
    np.testing.assert_array_equal(again.labels, decoded.labels)


# --- FEMNIST fixtures -----------------------------------------------------------------------------------------


def leaf_writers(counts: dict[str, tuple[int, int]], seed: int = 0,
                 ) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per part, writer -> (x [n, 784] in k/255, y [n]). Pixel 0 holds the writer's index and pixel 1 the row's
    index (both / 255), so every row can be traced back to its writer and position."""
    rng = np.random.default_rng(seed)
    parts: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {"train": {}, "test": {}}
    for index, (writer, sizes) in enumerate(sorted(counts.items())):
        for part, n in zip(("train", "test"), sizes, strict=True):
            x = rng.integers(0, 256, size=(n, 784)) / 255.0
            x[:, 0] = index / 255.0
            x[:, 1] = np.arange(n) / 255.0
            parts[part][writer] = (x, rng.integers(0, 62, size=n))
    return parts


def write_leaf_folder(folder: Path, parts: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]],
                      num_shards: int = 2) -> None:
    """LEAF shards: writers dealt round-robin over ``num_shards`` paired train/test files."""
    for part, writers in parts.items():
        (folder / part).mkdir(parents=True, exist_ok=True)
        for shard in range(num_shards):
            names = sorted(writers)[shard::num_shards]
            payload = {"users": names, "num_samples": [len(writers[w][1]) for w in names],
                       "user_data": {w: {"x": writers[w][0].tolist(), "y": writers[w][1].tolist()} for w in names}}
            path = folder / part / f"all_data_{shard}_niid_05_keep_0_{part}_9.json.gz"
            path.write_bytes(gzip.compress(json.dumps(payload).encode()))


FIXTURE_WRITERS = {"f0003_11": (8, 2), "f0001_42": (12, 3), "f0200_07": (4, 1), "f0150_90": (9, 2), "f0042_00": (2, 1)}


LeafParts = dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]  # part -> writer -> (x, y)
LeafFolder = tuple[Path, LeafParts]


@pytest.fixture
def leaf_folder(tmp_path: Path) -> LeafFolder:
    parts = leaf_writers(FIXTURE_WRITERS)
    write_leaf_folder(tmp_path / "femnist", parts)
    return tmp_path, parts


# --- FEMNIST ----------------------------------------------------------------------------------------------------


def test_leaf_fixture_loads_exactly(leaf_folder: LeafFolder,
                                    ) -> None:
    root, parts = leaf_folder
    data = load_femnist(root / "femnist")
    assert data.writers == sorted(FIXTURE_WRITERS)
    for i, writer in enumerate(data.writers):
        for x, y, part in ((data.train_x[i], data.train_y[i], "train"), (data.test_x[i], data.test_y[i], "test")):
            raw_x, raw_y = parts[part][writer]
            assert x.dtype == np.float32 and x.shape == (len(raw_x), 1, 28, 28) and y.dtype == np.int64
            np.testing.assert_array_equal(x.reshape(len(x), 784), raw_x.astype(np.float32))  # row-major 28x28
            np.testing.assert_array_equal(y, raw_y)


def _rows(x: torch.Tensor) -> list[tuple[int, int]]:
    """(writer index, row index) of every image, decoded from the fixture's marker pixels."""
    flat = (x.reshape(len(x), -1)[:, :2] * 255).round().long()
    return [(int(a), int(b)) for a, b in flat]


@pytest.mark.parametrize("mode", ["random", "chronological"])
def test_femnist_federation_carves_validation_from_leaf_train(
        leaf_folder: LeafFolder, mode: str) -> None:
    root, parts = leaf_folder
    cfg = DatasetConfig(name="femnist", data_dir=str(root), split=(0.6, 0.2, 0.2), split_mode=mode)
    fed = build_federation(cfg, seed=0)
    writers = sorted(FIXTURE_WRITERS)
    assert fed.client_names == writers and fed.num_clients == 5 and fed.client_graph is None
    assert fed.input_shape == (1, 28, 28) and fed.output_dim == 62 and fed.metric == "accuracy"
    assert "dataset.partition is not used" in fed.description
    for c, writer in enumerate(writers):
        n_train, n_test = FIXTURE_WRITERS[writer]
        train_rows, val_rows, test_rows = (_rows(split.client(c)[0]) for split in (fed.train, fed.val, fed.test))
        # No writer is split across clients: every row of client c carries writer c's marker.
        assert {w for w, _ in train_rows + val_rows + test_rows} == {c}
        assert test_rows == [(c, i) for i in range(n_test)]  # LEAF test, untouched and in order
        torch.testing.assert_close(fed.test.client(c)[1], torch.as_tensor(parts["test"][writer][1]))
        # Train and val partition the LEAF train rows; val = round(25% of them), at least one train row stays.
        assert sorted(train_rows + val_rows) == [(c, i) for i in range(n_train)]
        assert len(val_rows) == min(int(np.floor(0.25 * n_train + 0.5)), n_train - 1)
        if mode == "chronological":
            assert val_rows == [(c, i) for i in range(n_train - len(val_rows), n_train)]
        for split in (fed.train, fed.val):
            x, y = split.client(c)
            torch.testing.assert_close(y, torch.as_tensor(parts["train"][writer][1][[i for _, i in _rows(x)]]))


def test_femnist_client_count_is_fixed_by_the_data(
        leaf_folder: LeafFolder) -> None:
    root, _ = leaf_folder
    assert build_federation(DatasetConfig(name="femnist", data_dir=str(root), num_clients=5), seed=0).num_clients == 5
    with pytest.raises(ConfigError, match="exactly 5 clients"):
        build_federation(DatasetConfig(name="femnist", data_dir=str(root), num_clients=6), seed=0)


def test_carve_validation_sizes() -> None:
    rng = np.random.default_rng(0)
    for n, fraction, n_val in ((8, 0.125, 1), (4, 0.125, 1), (3, 0.125, 0), (1, 0.5, 0), (10, 0.99, 9), (0, 0.2, 0)):
        train, val = carve_validation(n, fraction, rng)
        assert len(val) == n_val and sorted([*train, *val]) == list(range(n))
    with pytest.raises(ValueError, match="validation fraction"):
        carve_validation(5, 1.0, rng)


def test_missing_femnist_folders_raise_file_not_found_with_hint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        build_federation(DatasetConfig(name="femnist", data_dir=str(tmp_path)), seed=0)
    assert str(tmp_path / "femnist") in str(err.value)
    assert "dataset.data_dir" in str(err.value) and "GRAPHFED_DATA" in str(err.value)
    write_leaf_folder(tmp_path / "femnist", {"train": leaf_writers({"w": (3, 1)})["train"]})  # no test/ folder
    with pytest.raises(FileNotFoundError, match=r"femnist/test.*dataset\.data_dir"):
        load_femnist(tmp_path / "femnist")
    (tmp_path / "femnist" / "test").mkdir()
    with pytest.raises(FileNotFoundError, match=r"test/\*\.json\.gz"):
        load_femnist(tmp_path / "femnist")


def _shard(folder: Path, part: str = "train", shard: int = 0) -> Path:
    return folder / "femnist" / part / f"all_data_{shard}_niid_05_keep_0_{part}_9.json.gz"


LeafEdit = Callable[[dict[str, Any]], object]


def _rewrite(path: Path, edit: LeafEdit) -> None:
    payload = json.loads(gzip.decompress(path.read_bytes()))
    edit(payload)
    path.write_bytes(gzip.compress(json.dumps(payload).encode()))


def _first(payload: dict[str, Any]) -> dict[str, Any]:
    return payload["user_data"][payload["users"][0]]


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda p: p.pop("user_data"), "missing LEAF key 'user_data'"),
    (lambda p: p.update(users="f0001_42"), "'users' must be a list"),
    (lambda p: _first(p).update(x=[row[:700] for row in _first(p)["x"]]), "rows of 784 pixels"),
    (lambda p: _first(p)["x"][0].pop(), "not numeric arrays"),  # one ragged row
    (lambda p: _first(p)["y"].__setitem__(0, 62), r"label outside 0\.\.61"),
    (lambda p: _first(p)["y"].__setitem__(0, 1.5), "labels must be integers"),
    (lambda p: _first(p)["x"][0].__setitem__(5, 255.0), r"outside \[0, 1\]"),
    (lambda p: p["num_samples"].__setitem__(0, 99), "num_samples says 99"),
    (lambda p: (p["users"].append("f9999_99"), p["num_samples"].append(1)), "not in 'user_data'"),
])
def test_malformed_shards_raise_value_error_naming_the_file(
        leaf_folder: LeafFolder, edit: LeafEdit, problem: str) -> None:
    root, _ = leaf_folder
    path = _shard(root)
    _rewrite(path, edit)
    with pytest.raises(ValueError, match=problem) as err:
        load_femnist(root / "femnist")
    assert str(path) in str(err.value)


def test_unreadable_or_inconsistent_shards_raise_value_error_naming_the_file(
        leaf_folder: LeafFolder) -> None:
    root, _ = leaf_folder
    path = _shard(root, "test", 1)
    original = path.read_bytes()
    for broken in (original[:-20], gzip.compress(b"{not json"), gzip.compress(b"[1, 2]")):
        path.write_bytes(broken)
        with pytest.raises(ValueError) as err:
            load_femnist(root / "femnist")
        assert str(path) in str(err.value)
    path.write_bytes(original)
    # A writer in two shards of one part (a shard copied twice) is refused, not merged.
    twin = _shard(root, "test", 7)
    twin.write_bytes(original)
    with pytest.raises(ValueError, match="also appears in") as err:
        load_femnist(root / "femnist")
    assert str(twin) in str(err.value) or str(path) in str(err.value)
    twin.unlink()
    # A writer with train samples but no test samples: drop the last writer of a test shard.
    def drop_last_writer(payload: dict[str, Any]) -> None:
        payload["user_data"].pop(payload["users"].pop())
        payload["num_samples"].pop()

    _rewrite(path, drop_last_writer)
    with pytest.raises(ValueError, match="has no test samples"):
        load_femnist(root / "femnist")


@needs_femnist
def test_real_femnist_writers_classes_and_counts() -> None:
    """One load of the real shards (about 7 s: LEAF stores pixels as JSON numbers)."""
    fed = build_federation(DatasetConfig(name="femnist", data_dir=str(SHARED_DATA)), seed=0)
    assert fed.num_clients == 105 and len(set(fed.client_names)) == 105 and fed.client_graph is None
    assert int(fed.train.counts.sum() + fed.val.counts.sum()) == 14_708 and int(fed.test.counts.sum()) == 1_685
    labels = torch.cat([split.client(c)[1] for split in (fed.train, fed.val, fed.test)
                        for c in range(fed.num_clients)])
    assert sorted(labels.unique().tolist()) == list(range(62))
    assert float(fed.train.x.min()) == 0.0 and float(fed.train.x.max()) == 1.0
    # val = 12.5% of each writer's LEAF train part (split 0.7/0.1/0.2), so about 1/8 of the 14,708 rows.
    assert abs(int(fed.val.counts.sum()) - 14_708 / 8) < 105
    with pytest.raises(ConfigError, match="exactly 105 clients"):
        build_federation(DatasetConfig(name="femnist", data_dir=str(SHARED_DATA), num_clients=20), seed=0)


# --- LeNet ------------------------------------------------------------------------------------------------------


def _per_client_params(model: TargetModel, num_clients: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {name: p.detach() + 0.05 * torch.randn(num_clients, *p.shape, generator=g)
            for name, p in model.named_parameters()}


def test_lenet_shapes_and_parameter_count() -> None:
    torch.manual_seed(0)
    cifar = LeNet((3, 32, 32), 10)
    assert cifar.fc1.in_features == 32 * 5 * 5
    assert sum(p.numel() for p in cifar.parameters()) == 121_182  # pFedHN's CIFAR-10 target network
    assert cifar(torch.rand(7, 3, 32, 32)).shape == (7, 10)
    emnist = LeNet((1, 28, 28), 62, channels=8, hidden=64, hidden2=32)
    assert emnist.conv2.out_channels == 16 and emnist.fc1.in_features == 16 * 4 * 4
    assert emnist(torch.rand(2, 1, 28, 28)).shape == (2, 62)
    assert LeNet((3, 32, 32), 10, channels2=24).fc1.in_features == 24 * 5 * 5
    with pytest.raises(ValueError, match="too small"):
        LeNet((1, 15, 28), 10)
    with pytest.raises(ValueError, match="hidden2"):
        LeNet((3, 32, 32), 10, hidden2=0)


@pytest.mark.parametrize("name", ["lenet", "cnn", "pfl-cnn"])
def test_batched_cnn_forward_and_gradients_match_per_client_modules(name: str) -> None:
    """The CNN kernels (one grouped convolution over clients; pfl-cnn: per-client convolutions, batched linear
    layers) give every client its own module's outputs and its own gradients."""
    torch.manual_seed(0)
    models = {"lenet": lambda: LeNet((3, 32, 32), 10), "pfl-cnn": lambda: PflCNN((3, 32, 32), 10),
              "cnn": lambda: SmallCNN((3, 32, 32), 10, channels=6, hidden=12)}
    model = models[name]()
    params = {n: v.requires_grad_(True) for n, v in _per_client_params(model, 3).items()}
    x = torch.rand(3, 5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    batched = model.batched_forward(params, x)
    assert batched.shape == (3, 5, 10)
    grads = torch.autograd.grad(batched.pow(2).sum(), list(params.values()))
    for s in range(3):
        module = copy.deepcopy(model)
        with torch.no_grad():
            for n, value in params.items():
                module.get_parameter(n).copy_(value[s])
        out = module(x[s])
        torch.testing.assert_close(batched[s], out.detach(), atol=1e-5, rtol=1e-5)
        out.pow(2).sum().backward()
        for (n, _), grad in zip(params.items(), grads, strict=True):
            reference = module.get_parameter(n).grad
            # float32 sums in another order: tolerance relative to the gradient's own scale
            torch.testing.assert_close(grad[s], reference, atol=1e-4 * float(reference.abs().max()), rtol=1e-4)
        torch.testing.assert_close(batched[s], functional_call(model, {n: v[s] for n, v in params.items()}, (x[s],)))
    torch.testing.assert_close(batched, TargetModel.batched_forward(model, params, x), atol=1e-5, rtol=1e-5)  # vmap


def test_pfl_cnn_grouped_convolutions_match_its_per_client_loop() -> None:
    """pfl-cnn's two convolution paths (per client on a CPU, grouped on a GPU) give the same features and the same
    gradients to float32 rounding."""
    torch.manual_seed(0)
    model = PflCNN((3, 32, 32), 10)
    params = {n: v.requires_grad_(True) for n, v in _per_client_params(model, 3).items()}
    x = torch.rand(3, 5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    looped, grouped = PflCNN.client_loop_convolutions(params, x), PflCNN.grouped_convolutions(params, x)
    torch.testing.assert_close(grouped, looped, atol=1e-5, rtol=1e-5)
    conv_params = [value for n, value in params.items() if n.startswith("conv")]
    for by_loop, by_groups in zip(torch.autograd.grad(looped.pow(2).sum(), conv_params),
                                  torch.autograd.grad(grouped.pow(2).sum(), conv_params), strict=True):
        torch.testing.assert_close(by_groups, by_loop, atol=1e-5 * float(by_loop.abs().max()), rtol=1e-4)


def test_lenet_registry_and_options(tmp_path: Path, user_cache: Path) -> None:
    assert "lenet" in MODELS
    write_cifar_tarball(tmp_path / "cifar10-jpeg", per_class=(4, 2))
    fed = build_federation(DatasetConfig(name="cifar10", data_dir=str(tmp_path), num_clients=2, partition="iid",
                                         min_samples_per_client=1), seed=0)
    model = build_model("lenet", fed, {"channels": 6, "hidden": 32})
    assert isinstance(model, LeNet) and model.conv1.in_channels == 3 and model.fc3.out_features == 3
    with pytest.raises(ConfigError, match=r"model\.options"):
        build_model("lenet", fed, {"width": 3})


def test_lenet_learns_the_fixture_federation_well_above_chance(tmp_path: Path, user_cache: Path) -> None:
    """A seeded FedAvg run through the simulator: 2 clients x 10 rounds x 10 local SGD steps of LeNet on four
    colour-coded classes (dark grey, red, green, blue). Chance is 25%; the run must reach 80% test accuracy."""
    write_cifar_tarball(tmp_path / "cifar10-jpeg", classes=CIFAR10_CLASSES[:4], per_class=(30, 8))
    cfg = load_config(None, [
        "dataset.name=cifar10", f"dataset.data_dir={tmp_path}", "dataset.num_clients=2", "dataset.partition=iid",
        "model.name=lenet", "method.name=fedavg", "train.rounds=10", "train.local_steps=10",
        "train.batch_size=16", "train.clients_per_round=2", "train.lr=0.05", "train.eval_every=10",
        "train.checkpoint_every=10", "train.novel_adapt_rounds=0", "seed=0",
    ])
    summary = run_config(cfg, progress=False)
    assert summary.status == "completed"
    assert summary.test_mean >= 0.8
