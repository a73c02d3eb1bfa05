"""Behavioural tests of the dataset builders and ``build_federation``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from graphfed.config import ConfigError, DatasetConfig
from graphfed.data import DATASETS, Federation, build_federation
from graphfed.data.datasets.fl_n import make_fl_n
from graphfed.data.datasets.tpt48 import (
    EDGES_FILE,
    NOAA_STATES,
    TEMPERATURE_FILE,
    border_edges,
    load_tpt48,
    read_edges,
    read_nclimdiv,
    read_temperatures,
)

SHARED_DATA = (Path(__file__).parents[1] / "../shared/data").resolve()
needs_tpt48 = pytest.mark.skipif(
    not (SHARED_DATA / "tpt48" / TEMPERATURE_FILE).is_file(),
    reason=f"real TPT-48 files not found under {SHARED_DATA / 'tpt48'} (the shared data folder is absent)",
)


def _all_tensors(fed: Federation) -> dict[str, torch.Tensor]:
    out = {f"{s}.{a}": getattr(getattr(fed, s), a)
           for s in ("train", "val", "test") for a in ("x", "y", "counts")}
    out["novel_mask"] = fed.novel_mask
    if fed.client_graph is not None:
        out["graph"] = fed.client_graph
    return out


def _assert_graph_ok(adj: torch.Tensor) -> None:
    assert torch.equal(adj, adj.T)
    assert torch.all(adj.diagonal() == 0)
    assert set(adj.unique().tolist()) <= {0.0, 1.0}


# --- registry ----------------------------------------------------------------------------------------


def test_registry_names_and_unknown_dataset_error() -> None:
    # A subset check: several loaders are added to the registry independently, each with its own tests.
    assert {"digits", "fashion-mnist", "fashion-mnist-casestudy", "fl60", "fln", "folder", "mnist",
            "tpt48"} <= set(DATASETS)
    assert DATASETS["tpt48"].task == "regression" and DATASETS["fl60"].task == "classification"
    with pytest.raises(ConfigError) as err:
        build_federation(DatasetConfig(name="mnistt"), seed=0)
    msg = str(err.value)
    assert msg == f"dataset.name: unknown dataset 'mnistt'; allowed: {', '.join(sorted(DATASETS))}"
    assert "\n" not in msg


# --- FL-N --------------------------------------------------------------------------------------------


def test_fl_n_points_lie_within_unit_distance_of_their_class_mean() -> None:
    xs, ys, _, angles = make_fl_n(60, np.random.default_rng(0))
    assert xs.shape == (60, 100, 2) and ys.shape == (60, 100)
    assert np.all(np.bincount(ys.ravel()) == 60 * 50)
    radius = 1.0 + 6.0 * angles / (2 * np.pi)
    direction = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    sign = np.where(ys == 1, 1.0, -1.0)  # label 1 -> +mean, label 0 -> -mean
    means = sign[:, :, None] * (radius[:, None] * direction)[:, None, :]
    assert np.all(np.linalg.norm(xs - means, axis=2) <= 1.0 + 1e-6)
    # The points are not all collapsed on the mean: N(0, I) restricted to the unit disc has a spread.
    assert 0.4 < float(np.linalg.norm(xs - means, axis=2).mean()) < 0.8


def test_fl_n_classes_are_linearly_separable_per_client() -> None:
    xs, ys, _, angles = make_fl_n(60, np.random.default_rng(1))
    direction = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    # The hyperplane through the origin orthogonal to the client's axis classifies every point.
    predicted = (np.einsum("tnd,td->tn", xs, direction) > 0).astype(np.int64)
    assert np.array_equal(predicted, ys)
    # And the estimated class-mean direction (what a learner could find) does too.
    est = np.stack([xs[t][ys[t] == 1].mean(0) - xs[t][ys[t] == 0].mean(0) for t in range(60)])
    mid = np.stack([xs[t].mean(0) for t in range(60)])
    predicted = (np.einsum("tnd,td->tn", xs - mid[:, None], est) > 0).astype(np.int64)
    assert np.array_equal(predicted, ys)


def test_fl_n_graph_links_clients_with_close_angles() -> None:
    _, _, adj, angles = make_fl_n(200, np.random.default_rng(2))
    _assert_graph_ok(torch.as_tensor(adj))
    gap = np.abs(angles[:, None] - angles[None, :])
    gap = np.minimum(gap, 2 * np.pi - gap)
    off_diag = ~np.eye(200, dtype=bool)
    linked, unlinked = gap[(adj == 1) & off_diag], gap[(adj == 0) & off_diag]
    assert linked.mean() < unlinked.mean() - 0.5  # expected gaps ~1.0 vs ~2.1 rad
    # Edge density follows E[0.5 cos(gap) + 0.5] = 0.5 for uniform angles.
    assert 0.45 < adj[off_diag].mean() < 0.55


def test_fl60_federation_shapes_and_novel_clients() -> None:
    fed = build_federation(DatasetConfig(name="fl60", novel_fraction=0.2), seed=0)
    assert fed.num_clients == 60 and fed.task == "classification" and fed.metric == "accuracy"
    assert fed.input_shape == (2,) and fed.output_dim == 2
    assert fed.train.counts.tolist() == [70] * 60
    assert fed.val.counts.tolist() == [10] * 60
    assert fed.test.counts.tolist() == [20] * 60
    assert fed.train.x.dtype == torch.float32 and fed.train.y.dtype == torch.int64
    assert int(fed.novel_mask.sum()) == 12 and len(fed.train_client_ids) == 48
    assert fed.client_graph is not None
    _assert_graph_ok(fed.client_graph)
    assert fed.description


def test_fln_uses_num_clients_and_fl60_rejects_another_count() -> None:
    fed = build_federation(DatasetConfig(name="fln", num_clients=25), seed=0)
    assert fed.num_clients == 25 and fed.client_graph is not None and fed.client_graph.shape == (25, 25)
    assert build_federation(DatasetConfig(name="fln"), seed=0).num_clients == 60
    with pytest.raises(ConfigError, match=r"^dataset\.num_clients: fl60 has exactly 60 clients"):
        build_federation(DatasetConfig(name="fl60", num_clients=25), seed=0)


@pytest.mark.parametrize("name", ["fl60", "digits"])
def test_same_seed_gives_identical_tensors_and_other_seed_differs(name: str) -> None:
    cfg = DatasetConfig(name=name, novel_fraction=0.3)
    a, b, c = (build_federation(cfg, seed=s) for s in (5, 5, 6))
    ta, tb, tc = _all_tensors(a), _all_tensors(b), _all_tensors(c)
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert not torch.equal(ta["train.x"], tc["train.x"])
    assert not torch.equal(ta["novel_mask"], tc["novel_mask"])


# --- digits ------------------------------------------------------------------------------------------


def _client_labels(fed: Federation, i: int) -> torch.Tensor:
    return torch.cat([split.client(i)[1] for split in (fed.train, fed.val, fed.test)])


@pytest.mark.parametrize("partition", ["iid", "pathological", "dirichlet"])
def test_digits_partitions_use_every_sample(partition: str) -> None:
    cfg = DatasetConfig(name="digits", partition=partition, classes_per_client=3, dirichlet_beta=0.1,
                        min_samples_per_client=20)
    fed = build_federation(cfg, seed=0)
    assert fed.num_clients == 10 and fed.client_graph is None
    assert fed.input_shape == (64,) and fed.output_dim == 10
    total = sum(int(s.counts.sum()) for s in (fed.train, fed.val, fed.test))
    assert total == 1797
    assert float(fed.train.x.min()) >= 0.0 and float(fed.train.x.max()) <= 1.0
    for i in range(10):
        labels = _client_labels(fed, i)
        assert len(labels) >= 20
        if partition == "pathological":
            assert len(labels.unique()) == 3


# --- TPT-48 (real files) -----------------------------------------------------------------------------


@needs_tpt48
def test_tpt48_real_files_random_split() -> None:
    fed = build_federation(DatasetConfig(name="tpt48", data_dir=str(SHARED_DATA)), seed=0)
    assert fed.num_clients == 48 and fed.task == "regression" and fed.metric == "mse"
    assert fed.input_shape == (6,) and fed.output_dim == 6
    assert fed.client_names[:3] == ["AL", "AZ", "AR"]  # CSV row order (NOAA), not alphabetical by code
    assert fed.train.counts.tolist() == [93] * 48
    assert fed.val.counts.tolist() == [13] * 48
    assert fed.test.counts.tolist() == [27] * 48
    assert fed.train.padded().x.shape == (48, 93, 6) and fed.train.padded().y.shape == (48, 93, 6)
    values = torch.cat([torch.cat([s.x.flatten(), s.y.flatten()]) for s in (fed.train, fed.val, fed.test)])
    assert float(values.min()) == 0.0 and float(values.max()) == pytest.approx(1.0)
    adj = fed.client_graph
    assert adj is not None
    _assert_graph_ok(adj)
    assert int(adj.sum()) == 2 * 105
    idx = {name: i for i, name in enumerate(fed.client_names)}
    assert adj[idx["AL"], idx["FL"]] == 1 and adj[idx["WA"], idx["FL"]] == 0


@needs_tpt48
def test_tpt48_windows_and_chronological_split() -> None:
    data = load_tpt48(SHARED_DATA)
    assert data.x.shape == (48, 133, 6) and data.y.shape == (48, 133, 6)
    # Window t's target months are window t+6's input months.
    assert np.array_equal(data.y[:, :-6], data.x[:, 6:])
    fed = build_federation(DatasetConfig(name="tpt48", data_dir=str(SHARED_DATA), split_mode="chronological"),
                           seed=0)
    assert torch.equal(fed.train.padded().x, torch.as_tensor(data.x[:, :93]))
    assert torch.equal(fed.test.padded().y, torch.as_tensor(data.y[:, 106:]))


def test_tpt48_missing_data_dir_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as err:
        build_federation(DatasetConfig(name="tpt48", data_dir=str(missing)), seed=0)
    assert str(missing / "tpt48") in str(err.value)
    assert "data_dir" in str(err.value) and "GRAPHFED_DATA" in str(err.value)


def _write_small_tpt48(root: Path, bad_cell: str | None = None, truncate: bool = False,
                       edges: str = "state_a,state_b\nAA,BB\nBB,CC\n") -> Path:
    """A 3-state table in the real file's layout (2007-01..2019-12), optionally corrupted."""
    folder = root / "tpt48"
    folder.mkdir(parents=True)
    months = [f"{y}-{m:02d}" for y in range(2007, 2020) for m in range(1, 13)]
    rng = np.random.default_rng(0)
    lines = ["state," + ",".join(months)]
    for code in ("AA", "BB", "CC"):
        cells = [f"{v:.2f}" for v in rng.uniform(10, 90, len(months))]
        lines.append(",".join([code, *cells]))
    if bad_cell is not None:
        parts = lines[2].split(",")
        parts[50] = bad_cell
        lines[2] = ",".join(parts)
    if truncate:
        lines[3] = ",".join(lines[3].split(",")[:100])
    (folder / TEMPERATURE_FILE).write_text("\n".join(lines) + "\n")
    (folder / EDGES_FILE).write_text(edges)
    return folder


def test_tpt48_loader_accepts_a_well_formed_small_table(tmp_path: Path) -> None:
    _write_small_tpt48(tmp_path)
    data = load_tpt48(tmp_path)
    assert data.codes == ["AA", "BB", "CC"] and data.x.shape == (3, 133, 6)
    assert data.edges.tolist() == [[0, 1], [1, 2]]


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"bad_cell": "n/a"}, "not a number: 'n/a'"),
    ({"truncate": True}, "line 4 has 100 fields"),
])
def test_tpt48_corrupt_temperature_file_raises_value_error_naming_it(tmp_path: Path, kwargs: dict,
                                                                     problem: str) -> None:
    folder = _write_small_tpt48(tmp_path, **kwargs)
    with pytest.raises(ValueError) as err:
        build_federation(DatasetConfig(name="tpt48", data_dir=str(tmp_path)), seed=0)
    assert str(folder / TEMPERATURE_FILE) in str(err.value)
    assert problem in str(err.value)


def test_tpt48_corrupt_edges_file_raises_value_error_naming_it(tmp_path: Path) -> None:
    folder = _write_small_tpt48(tmp_path, edges="state_a,state_b\nAA,ZZ\n")
    with pytest.raises(ValueError) as err:
        load_tpt48(tmp_path)
    assert str(folder / EDGES_FILE) in str(err.value) and "unknown state code" in str(err.value)


NOAA_FILE = "climdiv-tmpcst-v1.0.0-20200106"


@pytest.mark.skipif(not (SHARED_DATA / "tpt48" / NOAA_FILE).is_file(), reason="NOAA's nClimDiv file is absent")
def test_noaas_published_file_gives_the_same_tpt48_as_this_projects_csv(tmp_path: Path) -> None:
    """NOAA's fixed-width nClimDiv file (what ``data fetch tpt48`` downloads) and the built-in borders load to the
    very arrays the CSV table and edge list give, over all 1,500 months and for the federation."""
    shared = SHARED_DATA / "tpt48"
    csv_codes, csv_table = read_temperatures(shared / TEMPERATURE_FILE, "1895-01", "2019-12")
    noaa_codes, noaa_table = read_nclimdiv(shared / NOAA_FILE, "1895-01", "2019-12")
    assert noaa_codes == csv_codes and np.array_equal(noaa_table, csv_table)
    assert np.array_equal(border_edges(csv_codes), read_edges(shared / EDGES_FILE, csv_codes))
    (tmp_path / "tpt48").mkdir()
    (tmp_path / "tpt48" / NOAA_FILE).write_bytes((shared / NOAA_FILE).read_bytes())  # NOAA's file, nothing else
    from_noaa = _all_tensors(build_federation(DatasetConfig(name="tpt48", data_dir=str(tmp_path)), seed=3))
    from_csv = _all_tensors(build_federation(DatasetConfig(name="tpt48", data_dir=str(SHARED_DATA)), seed=3))
    assert from_noaa.keys() == from_csv.keys()
    assert all(torch.equal(from_noaa[key], from_csv[key]) for key in from_csv)


def _write_nclimdiv(root: Path, first_year: int = 2007, last_year: int = 2019, **replace_lines: str) -> Path:
    """An nClimDiv statewide temperature file in NOAA's fixed-width layout: the 48 states, Alaska (050) and a
    region (110), which the loader skips; ``replace_lines`` swaps whole lines by their 10-character key."""
    folder = root / "tpt48"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    lines = []
    for state in [*range(1, 49), 50, 110]:
        for year in range(first_year, last_year + 1):
            key = f"{state:03d}002{year}"
            values = "".join(f"{value:7.2f}" for value in rng.uniform(5, 90, 12))
            lines.append(replace_lines.get(f"k{key}", key + values + "   "))
    path = folder / "climdiv-tmpcst-v1.0.0-20240105"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_nclimdiv_file_alone_is_a_tpt48_folder(tmp_path: Path) -> None:
    _write_nclimdiv(tmp_path)
    data = load_tpt48(tmp_path)
    assert data.codes == NOAA_STATES and data.x.shape == (48, 133, 6) and len(data.edges) == 105


@pytest.mark.parametrize(("key", "line", "problem"), [
    ("0010022007", "0010022007  43.10  37.40", "line 1 is not an nClimDiv record"),
    ("0010022007", "0010012007" + "  43.10" * 12, "element 01, not 02"),
    ("0020022010", "0020022010" + "  43.10" * 11 + " -99.90", r"state 002 \(AZ\) is missing 2010-12"),
])
def test_a_malformed_nclimdiv_file_names_its_line_or_gap(tmp_path: Path, key: str, line: str, problem: str) -> None:
    path = _write_nclimdiv(tmp_path, **{f"k{key}": line})
    with pytest.raises(ValueError, match=problem) as err:
        load_tpt48(tmp_path)
    assert str(path) in str(err.value)


def test_an_nclimdiv_file_short_of_the_papers_months_names_them(tmp_path: Path) -> None:
    _write_nclimdiv(tmp_path, last_year=2015)
    with pytest.raises(ValueError, match=r"state 001 \(AL\) has no record for 2016..2019"):
        load_tpt48(tmp_path)


def test_an_empty_tpt48_folder_names_both_layouts(tmp_path: Path) -> None:
    (tmp_path / "tpt48").mkdir()
    with pytest.raises(FileNotFoundError, match=rf"{TEMPERATURE_FILE} or NOAA's climdiv-tmpcst-v\* file "
                                                r"\(graphfed data fetch tpt48\)"):
        load_tpt48(tmp_path)


def test_tpt48_missing_month_columns_raise(tmp_path: Path) -> None:
    folder = tmp_path / "tpt48"
    folder.mkdir()
    (folder / TEMPERATURE_FILE).write_text("state,2019-01,2019-02\nAA,1,2\n")
    with pytest.raises(ValueError, match="no month column '2008-01'"):
        load_tpt48(tmp_path)
