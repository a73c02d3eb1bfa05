"""The published formats: CIFAR-10/-100 binary records and DCRNN's METR-LA / PEMS-BAY ``.h5``. Fixtures are written
by the tests in each format (CIFAR-10 records made from the JPEG set, an ``.h5`` with METR-LA's layout made from the
week's CSV) and must load to the same arrays as the existing loaders give for the same rows; a CIFAR-100 and a
PEMS-BAY-layout federation run end to end with FedAvg and Panacea."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from graphfed.config import DatasetConfig, load_config
from graphfed.data import build_federation
from graphfed.data.datasets.cifar_binary import CIFAR10, CIFAR100, load_cifar_binary
from graphfed.data.datasets.metr_la import read_speeds
from graphfed.data.datasets.traffic_h5 import gaussian_kernel_adjacency
from graphfed.errors import DataError
from graphfed.sim.engine import Simulator

SHARED = Path(os.environ.get("GRAPHFED_DATA", "../shared/data"))
needs_shared = pytest.mark.skipif(not (SHARED / "cifar10-jpeg").is_dir(), reason="the shared data folder is absent")


def _records(images: np.ndarray, *labels: np.ndarray) -> bytes:
    """CIFAR binary records: the label byte(s), then the R, G and B planes of each uint8 [n, 3, 32, 32] image."""
    head = np.stack(labels, axis=1).astype(np.uint8)
    return np.concatenate([head, images.reshape(len(images), -1)], axis=1).tobytes()


@needs_shared
def test_cifar10_binary_records_load_to_the_jpeg_loaders_arrays(tmp_path: Path) -> None:
    from graphfed.data.datasets.cifar10 import load_cifar10_arrays

    decoded = load_cifar10_arrays(SHARED / "cifar10-jpeg", limit=36)
    chw = decoded.images.transpose(0, 3, 1, 2)  # [n, 3, 32, 32] uint8, as the binary version stores them
    extracted = tmp_path / "cifar10" / "cifar-10-batches-bin"
    extracted.mkdir(parents=True)
    for i, name in enumerate((*CIFAR10.train, *CIFAR10.test)):
        rows = slice(6 * i, 6 * i + 6)
        (extracted / name).write_bytes(_records(chw[rows], decoded.labels[rows]))
    from_folder = load_cifar_binary(tmp_path, CIFAR10)
    np.testing.assert_array_equal(from_folder.x, chw.astype(np.float32) / np.float32(255.0))
    np.testing.assert_array_equal(from_folder.y, decoded.labels)
    # the same records inside the official archive (nothing extracted) load identically
    archived = tmp_path / "archived"
    (archived / "cifar10").mkdir(parents=True)
    with tarfile.open(archived / "cifar10" / CIFAR10.archive, "w:gz") as tar:
        tar.add(extracted, arcname=CIFAR10.members)
    from_archive = load_cifar_binary(archived, CIFAR10)
    np.testing.assert_array_equal(from_archive.x, from_folder.x)
    # a truncated record is one line naming the file
    (extracted / "test_batch.bin").write_bytes(_records(chw[:2], decoded.labels[:2])[:-5])
    with pytest.raises(DataError, match=r"test_batch.bin: .* not a whole number of 3073-byte CIFAR records"):
        load_cifar_binary(tmp_path, CIFAR10)


def _cifar100(root: Path, count: int = 240) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8)
    fine = rng.integers(0, 100, count)
    coarse = fine // 5
    folder = root / "cifar100" / "cifar-100-binary"
    folder.mkdir(parents=True)
    (folder / "train.bin").write_bytes(_records(images[:200], coarse[:200], fine[:200]))
    (folder / "test.bin").write_bytes(_records(images[200:], coarse[200:], fine[200:]))
    return fine, coarse


def test_cifar100_reads_fine_or_coarse_labels_and_trains_with_fedavg_and_panacea(tmp_path: Path) -> None:
    fine, coarse = _cifar100(tmp_path)
    np.testing.assert_array_equal(load_cifar_binary(tmp_path, CIFAR100).y, fine)
    coarse_set = load_cifar_binary(tmp_path, CIFAR100, coarse=True)
    np.testing.assert_array_equal(coarse_set.y, coarse)
    assert coarse_set.num_classes == 20
    fed = build_federation(DatasetConfig(name="cifar100", data_dir=str(tmp_path), num_clients=4, partition="iid",
                                         labels="coarse"), seed=0)
    assert fed.output_dim == 20 and fed.input_shape == (3, 32, 32)
    base = [f"dataset.data_dir={tmp_path}", "dataset.name=cifar100", "dataset.num_clients=4", "dataset.partition=iid",
            "model.name=lenet", "train.rounds=2", "train.local_steps=2", "train.batch_size=8", "train.eval_every=2",
            "train.clients_per_round=4", "train.novel_adapt_rounds=0", "train.autotune=false"]
    for method in ("fedavg", "panacea"):
        extra = ["dataset.graph=knn", "dataset.graph_k=2", "method.options={server_steps: 1}"] \
            if method == "panacea" else []
        result = Simulator(load_config(None, [*base, f"method.name={method}", *extra]), progress=False).run()
        assert result.status == "completed" and result.dataset == "cifar100" and 0.0 <= result.test_mean <= 1.0


def _write_frame(path: Path, key: str, ids: list, start: str, speeds: np.ndarray) -> None:
    """A pandas "fixed" frame as DCRNN's files hold it: speeds ``[steps, sensors]``."""
    stamps = np.datetime64(start, "ns").astype(np.int64) + np.arange(speeds.shape[0]) * 300 * 10**9
    with h5py.File(path, "w") as h5:
        group = h5.create_group(key)
        columns = np.array([str(s).encode() for s in ids]) if isinstance(ids[0], str) else np.asarray(ids)
        group["axis0"] = columns
        group["block0_items"] = columns
        group["axis1"] = stamps
        group["block0_values"] = speeds.astype(np.float64)


@needs_shared
def test_metr_la_h5_loads_to_the_week_loaders_windows(tmp_path: Path) -> None:
    ids, speeds = read_speeds(SHARED / "metr-la-week" / "los_speed.csv.gz")
    folder = tmp_path / "metr-la"
    folder.mkdir()
    _write_frame(folder / "metr-la.h5", "df", ids, "2012-03-01", speeds.T)
    (folder / "distances_la_2012.csv").write_text("from,to,cost\n" + "".join(
        f"{ids[i]},{ids[i + 1]},{100.0 * (1 + i % 7)}\n" for i in range(len(ids) - 1)))
    week = build_federation(DatasetConfig(name="metr-la-week", data_dir=str(SHARED)), seed=0)
    h5 = build_federation(DatasetConfig(name="metr-la", data_dir=str(tmp_path)), seed=0)
    for split in ("train", "val", "test"):
        assert np.array_equal(getattr(h5, split).x.numpy(), getattr(week, split).x.numpy())
        assert np.array_equal(getattr(h5, split).y.numpy(), getattr(week, split).y.numpy())
    assert h5.client_names == week.client_names and h5.target_scale == week.target_scale
    # a window of two days keeps 2 x 288 five-minute steps
    two_days = build_federation(DatasetConfig(name="metr-la", data_dir=str(tmp_path),
                                              window="2012-03-02..2012-03-04"), seed=0)
    assert "576 5-minute steps" in two_days.description
    with pytest.raises(DataError, match=r"dataset.window 2013-01-01..2013-01-02: no reading .* \(recorded "
                                        r"2012-03-01..2012-03-07"):
        build_federation(DatasetConfig(name="metr-la", data_dir=str(tmp_path), window="2013-01-01..2013-01-02"), 0)


def test_the_road_graph_is_dcrnns_gaussian_kernel(tmp_path: Path) -> None:
    path = tmp_path / "distances.csv"
    path.write_text("from,to,cost\na,b,100\nb,c,300\na,c,50\nx,a,10\n")  # x is not a sensor: skipped
    kernel = gaussian_kernel_adjacency(path, ["a", "b", "c"])
    sigma = np.std([100.0, 300.0, 50.0])
    assert kernel[0, 1] == pytest.approx(np.exp(-(100 / sigma) ** 2))
    assert kernel[1, 2] == pytest.approx(np.exp(-(300 / sigma) ** 2)) and kernel[2, 1] == 0  # directed
    assert kernel[1, 0] == 0


def _pems_bay(root: Path, steps: int = 400) -> None:
    rng = np.random.default_rng(1)
    ids = list(range(400001, 400001 + 325))
    folder = root / "pems-bay"
    folder.mkdir()
    _write_frame(folder / "pems-bay.h5", "speed", ids, "2017-01-01",
                 60 + 5 * np.sin(np.arange(steps)[:, None] / 20 + rng.uniform(0, 6, 325)))
    pairs = rng.integers(0, 325, (900, 2))
    (folder / "distances_bay_2017.csv").write_text("from,to,cost\n" + "".join(
        f"{ids[a]},{ids[b]},{rng.uniform(100, 3000):.1f}\n" for a, b in pairs))


def test_a_pems_bay_layout_trains_end_to_end_with_fedavg_and_panacea(tmp_path: Path) -> None:
    _pems_bay(tmp_path)
    fed = build_federation(DatasetConfig(name="pems-bay", data_dir=str(tmp_path)), seed=0)
    assert fed.num_clients == 325 and fed.client_names[0] == "400001" and fed.client_graph is not None
    base = [f"dataset.data_dir={tmp_path}", "dataset.name=pems-bay", "model.name=gru", "model.options={hidden: 8}",
            "train.rounds=2", "train.local_steps=2", "train.batch_size=8", "train.eval_every=2",
            "train.clients_per_round=5", "train.novel_adapt_rounds=0"]
    for method in ("fedavg", "panacea"):
        extra = ["method.options={server_steps: 1, embedding_dim: 4, gnn_hidden: 8, hypernet_hidden: 8}"] \
            if method == "panacea" else []
        result = Simulator(load_config(None, [*base, f"method.name={method}", *extra]), progress=False).run()
        assert result.status == "completed" and result.metric == "mse" and result.test_mean < 1.0


def test_a_malformed_h5_is_one_line_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "pems-bay"
    folder.mkdir()
    _write_frame(folder / "pems-bay.h5", "speed", list(range(10)), "2017-01-01", np.ones((30, 10)))
    with pytest.raises(DataError, match=r"pems-bay.h5: 10 sensors, the published recording has 325"):
        build_federation(DatasetConfig(name="pems-bay", data_dir=str(tmp_path)), seed=0)
    (folder / "pems-bay.h5").write_bytes(io.BytesIO(b"not hdf5 at all").getvalue())
    with pytest.raises(DataError, match=r"pems-bay.h5: not a readable HDF5 file"):
        build_federation(DatasetConfig(name="pems-bay", data_dir=str(tmp_path)), seed=0)
