"""FEMNIST built the LEAF way from NIST SD19's two archives (fixtures written here in SD19's layout: 128x128 PNG
scans under ``by_class/<hex>/hsf_k/`` and ``by_write/hsf_k/<writer>/<kind>/``), read back by the FEMNIST loader."""

from __future__ import annotations

import io
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import LoopbackHandler
from graphfed.data.datasets.femnist import load_femnist
from graphfed.data.leaf_femnist import (
    LeafOptions,
    build_shards,
    image_vector,
    relabel_class,
    sample_niid,
    split_by_sample,
)
from graphfed.errors import DataError

CLASSES = ("30", "39", "41", "5a", "61", "7a")  # '0', '9', 'A', 'Z', 'a', 'z'


def _scan(seed: int) -> bytes:
    """A 128x128 grayscale scan: white page, a dark stroke whose place depends on ``seed`` (distinct bytes)."""
    page = np.full((128, 128), 255, dtype=np.uint8)
    rng = np.random.default_rng(seed)
    row, col = rng.integers(10, 100, size=2)
    page[row:row + 20, col:col + 6] = rng.integers(0, 60)
    buffer = io.BytesIO()
    Image.fromarray(page, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def _sd19(root: Path, counts: dict[str, int], unmatched: int = 0) -> tuple[Path, Path, dict[str, list[int]]]:
    """``by_class.zip`` and ``by_write.zip`` for writers holding ``counts[writer]`` images each (classes in turn);
    a ``mit`` copy of every image, which LEAF ignores, and ``unmatched`` by_write images with no by_class twin."""
    labels: dict[str, list[int]] = {}
    by_class, by_write = root / "by_class.zip", root / "by_write.zip"
    seed = 0
    with zipfile.ZipFile(by_class, "w") as classes, zipfile.ZipFile(by_write, "w") as writes:
        for writer, count in counts.items():
            for k in range(count):
                code = CLASSES[(seed + k) % len(CLASSES)]
                scan = _scan(seed)
                classes.writestr(f"by_class/{code}/hsf_0/hsf_0_{seed:05d}.png", scan)
                classes.writestr(f"by_class/{code}/train_{code}/train_{code}_{seed:05d}.png", _scan(10_000 + seed))
                writes.writestr(f"by_write/hsf_0/{writer}/c{writer[1:]}/{k:03d}.png", scan)
                labels.setdefault(writer, []).append(relabel_class(code))
                seed += 1
        for k in range(unmatched):
            writes.writestr(f"by_write/hsf_1/f9999_99/c9999_99/{k:03d}.png", _scan(50_000 + k))
    return by_class, by_write, labels


def test_leaf_relabels_hex_folders_as_digits_then_upper_then_lower_case() -> None:
    assert [relabel_class(code) for code in CLASSES] == [0, 9, 10, 35, 36, 61]
    with pytest.raises(DataError, match="not the hex code of a digit or a letter"):
        relabel_class("2a")


def test_a_whole_build_gives_every_writer_its_own_images_split_nine_to_one(tmp_path: Path) -> None:
    """--sf 1.0: every writer with 2+ matched images, labels from by_class, LEAF's split sizes, pixels as LEAF's
    thumbnail gives them; the FEMNIST loader reads the shards."""
    counts = {"f0000_14": 10, "f0001_41": 2, "f0002_33": 1, "f0003_07": 21}
    by_class, by_write, labels = _sd19(tmp_path, counts, unmatched=3)
    shards = build_shards(by_class, by_write, tmp_path / "femnist", LeafOptions(fraction=1.0), echo=lambda _: None)
    assert [path.name for path in shards] == ["all_data_0_niid_0_keep_0_train_9.json.gz",
                                             "all_data_0_niid_0_keep_0_test_9.json.gz"]
    data = load_femnist(tmp_path / "femnist")
    assert data.writers == ["f0000_14", "f0001_41", "f0003_07"]  # one image is too few to split; f9999 unmatched
    sizes = {writer: (len(train), len(test)) for writer, train, test in zip(data.writers, data.train_y, data.test_y,
                                                                          strict=True)}
    assert sizes == {"f0000_14": (9, 1), "f0001_41": (1, 1), "f0003_07": (18, 3)}
    for writer, train, test in zip(data.writers, data.train_y, data.test_y, strict=True):
        assert sorted([*train.tolist(), *test.tolist()]) == sorted(labels[writer])
    first = np.asarray(image_vector(_scan(0)), dtype=np.float32).reshape(28, 28)
    images = np.concatenate([data.train_x[0], data.test_x[0]])
    assert any(np.array_equal(image.reshape(28, 28), first) for image in images)
    assert float(images.max()) == 1.0 and float(images.min()) < 1.0  # white page, dark ink


def test_the_same_options_build_the_same_bytes_and_other_seeds_other_splits(tmp_path: Path) -> None:
    counts = {f"f{i:04d}_{i % 50:02d}": 5 + i for i in range(12)}
    by_class, by_write, _ = _sd19(tmp_path, counts)
    read = lambda folder: [path.read_bytes() for path in sorted(folder.rglob("*.json.gz"))]  # noqa: E731
    options = LeafOptions(fraction=0.5)
    build_shards(by_class, by_write, tmp_path / "a", options, echo=lambda _: None)
    build_shards(by_class, by_write, tmp_path / "b", options, echo=lambda _: None)
    assert read(tmp_path / "a") == read(tmp_path / "b")
    build_shards(by_class, by_write, tmp_path / "c", LeafOptions(fraction=0.5, split_seed=1), echo=lambda _: None)
    assert read(tmp_path / "a") != read(tmp_path / "c")


def test_niid_sampling_takes_whole_writers_then_a_shuffled_prefix_of_the_last() -> None:
    """LEAF's sample.py: per file, shuffle the writers, take them until fraction x the file's samples; the last
    writer's share is a random order of its first samples."""
    writers = [(f"w{i}", [(f"w{i}/{k}", k) for k in range(size)]) for i, size in enumerate((4, 6, 10, 5))]
    (taken,) = sample_niid([writers], 0.6, random.Random(7))  # 0.6 x 25 = 15 samples
    assert sum(len(images) for _, images in taken) == 15
    *whole, (last_writer, last) = taken
    by_name = dict(writers)
    assert all(images == by_name[writer] for writer, images in whole)
    assert sorted(last) == by_name[last_writer][:len(last)] and len({w for w, _ in taken}) == len(taken)
    reference = random.Random(7)  # the same draws as LEAF: one shuffle, then one sample for the last writer
    order = list(writers)
    reference.shuffle(order)
    assert [writer for writer, _ in taken] == [writer for writer, _ in order[:len(taken)]]


def test_split_by_sample_follows_leafs_sizes_and_keeps_train_in_order() -> None:
    writers = [("two", [("a", 0), ("b", 1)]), ("one", [("c", 2)]), ("ten", [(str(k), k) for k in range(10)])]
    train, test = split_by_sample(writers, 0.9, random.Random(3))
    assert [(writer, len(images)) for writer, images in train] == [("two", 1), ("ten", 9)]
    assert [(writer, len(images)) for writer, images in test] == [("two", 1), ("ten", 1)]
    assert [label for _, label in train[1][1]] == sorted(label for _, label in train[1][1])


def test_an_oversized_member_or_a_broken_archive_is_one_error_and_writes_nothing(tmp_path: Path) -> None:
    by_class, by_write, _ = _sd19(tmp_path, {"f0000_14": 3})
    with zipfile.ZipFile(by_class, "a") as archive:
        archive.writestr("by_class/4a/hsf_0/huge.png", b"\0" * (2 << 20))
    with pytest.raises(DataError, match=r"huge.png' holds 2,097,152 bytes, not an SD19 image"):
        build_shards(by_class, by_write, tmp_path / "out", echo=lambda _: None)
    (tmp_path / "broken.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(DataError, match="not a readable SD19 archive"):
        build_shards(tmp_path / "broken.zip", by_write, tmp_path / "out", echo=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_a_sample_too_small_to_hold_a_writer_says_so(tmp_path: Path) -> None:
    by_class, by_write, _ = _sd19(tmp_path, {"f0000_14": 6, "f0001_41": 4})  # 5 % of 10 samples: none
    with pytest.raises(DataError, match=r"no writer with 2 or more samples: raise the fraction \(0.05\)"):
        build_shards(by_class, by_write, tmp_path / "out", echo=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_data_fetch_femnist_downloads_sd19_and_builds_the_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  server: str) -> None:
    """``graphfed data fetch femnist``: both archives from the (loopback) publisher, then LEAF's build; a second
    fetch finds the shards and downloads nothing; ``data list`` shows the folder present."""
    from dataclasses import replace

    from graphfed.data import fetch

    by_class, by_write, _ = _sd19(tmp_path, {"f0000_14": 24, "f0001_41": 16})
    LoopbackHandler.files.update({"/by_class.zip": by_class.read_bytes(), "/by_write.zip": by_write.read_bytes()})
    entry = fetch.SOURCES["femnist"]
    assert [remote.url for remote in entry.files] == ["https://s3.amazonaws.com/nist-srd/SD19/by_class.zip",
                                                      "https://s3.amazonaws.com/nist-srd/SD19/by_write.zip"]
    monkeypatch.setitem(fetch.SOURCES, "femnist", replace(entry, files=tuple(
        replace(remote, url=f"{server}/{remote.name}") for remote in entry.files)))
    data_dir = tmp_path / "data"
    lines = fetch.fetch("femnist", data_dir, progress=False)
    assert lines[:2] == ["by_class.zip: downloaded (no published checksum)",
                         "by_write.zip: downloaded (no published checksum)"]
    assert "train/all_data_0_niid_05_keep_0_train_9.json.gz: built" in lines
    (writer,) = load_femnist(data_dir / "femnist").writers  # 5 % of 40 samples: 2 of the first shuffled writer
    assert writer in ("f0000_14", "f0001_41")
    assert fetch.fetch("femnist", data_dir, progress=False) == ["train/: already there (built)",
                                                                "test/: already there (built)"]
    (row,) = [row for row in fetch.list_data(data_dir) if row.folder == "femnist"]
    assert row.status == "present"
