"""Bring-your-own federation folders: round trips, one clear error per problem, ``graphfed inspect``, learning."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner, Result

from conftest import tiny_overrides
from graphfed import cli
from graphfed.config import ConfigError, DatasetConfig, load_config
from graphfed.data import build_federation
from graphfed.data.datasets.folder import (
    FederationFormatError,
    load_federation,
    natural_key,
    read_federation_folder,
    write_example_federation,
    write_federation,
)
from graphfed.data.federation import ClientSplit, Federation
from graphfed.report.federation import graph_stats, label_histogram
from graphfed.sim.engine import run_config

runner = CliRunner()
Clients = dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]

# Deliberately out of natural order on disk, so the test sees the loader sort them (c2 before c10).
IDS = ["c10", "c2", "c1"]
ORDER = ["c1", "c2", "c10"]
SIZES = {"c1": (7, 3, 4), "c2": (5, 2, 2), "c10": (9, 1, 3)}


def make_clients(task: str = "classification", seed: int = 0, features: int = 3) -> Clients:
    rng = np.random.default_rng(seed)
    clients: Clients = {}
    for cid in IDS:
        clients[cid] = {}
        for split, rows in zip(("train", "val", "test"), SIZES[cid], strict=True):
            x = rng.normal(size=(rows, features))
            y = rng.integers(0, 4, size=rows) if task == "classification" else rng.normal(size=rows)
            clients[cid][split] = (x, y)
    clients["c1"]["train"][1][0] = 3  # make sure the largest label is present: 4 classes
    return clients


GRAPH = [("c1", "c2", 0.5), ("c2", "c10", 2.0), ("c10", "c10", 1.0)]  # the self-loop is dropped


@pytest.fixture
def no_build(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Records every ``ClientSplit.from_lists`` call, so a test can assert a bad folder built nothing."""
    calls: list[int] = []
    original = ClientSplit.from_lists

    def spy(*args: Any, **kwargs: Any) -> ClientSplit:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(ClientSplit, "from_lists", staticmethod(spy))
    yield calls


def invoke(*args: str | Path) -> Result:
    return runner.invoke(cli.app, [str(a) for a in args])


def error_lines(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


# ---- round trips ---------------------------------------------------------------------------------------------


def _assert_matches(fed: Federation, clients: Clients, y_dtype: torch.dtype) -> None:
    assert fed.client_names == ORDER
    for i, cid in enumerate(ORDER):
        for split in ("train", "val", "test"):
            x, y = getattr(fed, split).client(i)
            want_x, want_y = clients[cid][split]
            assert torch.equal(x, torch.as_tensor(want_x, dtype=torch.float32))
            assert torch.equal(y, torch.as_tensor(want_y, dtype=y_dtype))


def test_npz_round_trip_classification_with_weighted_graph(tmp_path: Path) -> None:
    clients = make_clients()
    write_federation(tmp_path / "fed", clients, graph=GRAPH)
    fed = load_federation(tmp_path / "fed")
    _assert_matches(fed, clients, torch.int64)
    assert (fed.task, fed.metric, fed.output_dim, fed.input_shape) == ("classification", "accuracy", 4, (3,))
    assert fed.name == "fed" and fed.train.counts.tolist() == [7, 5, 9]
    assert fed.client_graph is not None
    expected = torch.tensor([[0.0, 0.5, 0.0], [0.5, 0.0, 2.0], [0.0, 2.0, 0.0]])  # symmetric, zero diagonal
    assert torch.equal(fed.client_graph, expected)
    assert not fed.novel_mask.any()


def test_csv_form_loads_the_same_tensors_as_npz(tmp_path: Path) -> None:
    clients = make_clients()
    write_federation(tmp_path / "npz", clients, graph=GRAPH)
    write_federation(tmp_path / "csv", clients, graph=GRAPH, fmt="csv")
    a, b = load_federation(tmp_path / "npz"), load_federation(tmp_path / "csv")
    for split in ("train", "val", "test"):
        for name in ("x", "y", "counts"):
            assert torch.equal(getattr(getattr(a, split), name), getattr(getattr(b, split), name)), (split, name)
    assert a.client_graph is not None and b.client_graph is not None and torch.equal(a.client_graph, b.client_graph)
    assert (b.task, b.output_dim, b.client_names) == ("classification", 4, ORDER)


def test_csv_named_columns_and_float_targets_give_regression(tmp_path: Path) -> None:
    """meta.yaml names the CSV columns (in any header order is fine: the loader picks by name); float targets
    without a task in meta.yaml mean regression, scored by MSE; no graph.csv means no graph."""
    clients = make_clients("regression")
    meta = {"features": ["temp", "wind", "rain"], "target": "load", "name": "grid"}
    write_federation(tmp_path / "fed", clients, meta=meta, fmt="csv")
    fed = load_federation(tmp_path / "fed")
    _assert_matches(fed, clients, torch.float32)
    assert (fed.task, fed.metric, fed.output_dim, fed.name) == ("regression", "mse", 1, "grid")
    assert fed.client_graph is None


def test_npz_regression_with_vector_targets_and_meta_task(tmp_path: Path) -> None:
    """Integer-valued targets are labels by default; task: regression in meta.yaml overrides that, and the target
    size is the flattened target shape. Images-like features keep their shape."""
    rng = np.random.default_rng(1)
    clients: Clients = {cid: {s: (rng.normal(size=(4, 2, 3)), rng.integers(0, 9, size=(4, 5)))
                              for s in ("train", "val", "test")} for cid in ("a", "b")}
    write_federation(tmp_path / "fed", clients, meta={"task": "regression"})
    fed = load_federation(tmp_path / "fed")
    assert (fed.task, fed.output_dim, fed.input_shape) == ("regression", 5, (2, 3))
    assert fed.train.y.dtype == torch.float32 and fed.train.padded().y.shape == (2, 4, 5)


def test_float_labels_are_accepted_for_classification_when_integral(tmp_path: Path) -> None:
    clients = make_clients()
    as_float = {cid: {s: (x, y.astype(np.float64)) for s, (x, y) in splits.items()} for cid, splits in clients.items()}
    write_federation(tmp_path / "fed", as_float, meta={"task": "classification"})
    fed = load_federation(tmp_path / "fed")
    _assert_matches(fed, clients, torch.int64)


def test_natural_sort_of_client_ids() -> None:
    assert sorted(["client10", "client2", "client1", "b", "a"], key=natural_key) == [
        "a", "b", "client1", "client2", "client10"]
    assert sorted(["10", "9", "100"], key=natural_key) == ["9", "10", "100"]


# ---- one clear error per problem -------------------------------------------------------------------------------

Mutation = Callable[[Path], object]


def _save(path: Path, **arrays: np.ndarray) -> None:
    np.savez(path, **arrays)


def _csv_folder(root: Path) -> None:
    """Turn the npz folder into the CSV form (used by the CSV-specific cases)."""
    for path in sorted((root / "clients").rglob("*.npz")):
        path.unlink()
    write_federation(root, make_clients(), graph=GRAPH, fmt="csv")


def _edit_line(path: Path, line: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


def _nan_in_csv(root: Path) -> None:
    _csv_folder(root)
    path = root / "clients/c2/val.csv"
    _edit_line(path, 3, "0.5,nan,0.1,1")


def _bad_cell_in_csv(root: Path) -> None:
    _csv_folder(root)
    _edit_line(root / "clients/c10/test.csv", 4, "0.5,abc,0.1,1")


def _csv_without_target(root: Path) -> None:
    _csv_folder(root)
    (root / "meta.yaml").write_text("target: label\n")


def _nan_in_npz(root: Path) -> None:
    x = np.ones((4, 3))
    x[2, 1] = np.inf
    _save(root / "clients/c1/test.npz", x=x, y=np.zeros(4, dtype=np.int64))


def _fractional_label(root: Path) -> None:
    (root / "meta.yaml").write_text("task: classification\n")
    _save(root / "clients/c2/train.npz", x=np.ones((5, 3)), y=np.array([0.0, 1.0, 2.0, 1.5, 0.0]))


BAD_FOLDERS: dict[str, tuple[Mutation, list[str]]] = {
    "missing split": (lambda r: (r / "clients/c2/val.npz").unlink(),
                      ["clients/c2/val.npz", "missing val split"]),
    "both npz and csv": (lambda r: (r / "clients/c2/val.csv").write_text("x0,y\n1,0\n"),
                         ["clients/c2", "both val.npz and val.csv"]),
    "feature shape differs between clients": (
        lambda r: _save(r / "clients/c10/train.npz", x=np.ones((9, 4)), y=np.zeros(9, dtype=np.int64)),
        ["clients/c10/train.npz", "(4,)", "(3,)", "clients/c1/train.npz"]),
    "x and y rows differ": (
        lambda r: _save(r / "clients/c2/test.npz", x=np.ones((2, 3)), y=np.zeros(3, dtype=np.int64)),
        ["clients/c2/test.npz", "x has 2 rows but y has 3"]),
    "npz lacks y": (lambda r: _save(r / "clients/c1/val.npz", x=np.ones((3, 3)), labels=np.zeros(3)),
                    ["clients/c1/val.npz", "needs arrays 'x' and 'y'", "labels"]),
    "not an npz": (lambda r: (r / "clients/c1/val.npz").write_text("hello"),
                   ["clients/c1/val.npz", "not a readable .npz"]),
    "empty split": (lambda r: _save(r / "clients/c1/val.npz", x=np.ones((0, 3)), y=np.zeros(0, dtype=np.int64)),
                    ["clients/c1/val.npz", "no rows"]),
    "graph names an unknown client": (
        lambda r: (r / "graph.csv").write_text("src,dst\nc1,c2\nc2,zed\n"),
        ["graph.csv: line 3", "unknown client 'zed'", "c1, c2, c10"]),
    "graph header": (lambda r: (r / "graph.csv").write_text("from,to\nc1,c2\n"),
                     ["graph.csv", "line 1", "src,dst"]),
    "graph conflicting weights": (
        lambda r: (r / "graph.csv").write_text("src,dst,weight\nc1,c2,1\nc2,c10,1\nc2,c1,3\n"),
        ["graph.csv: line 4", "line 2", "weight 3"]),
    "graph negative weight": (lambda r: (r / "graph.csv").write_text("src,dst,weight\nc1,c2,-1\n"),
                              ["graph.csv: line 2", "weight must be finite and > 0"]),
    "NaN features in npz": (_nan_in_npz, ["clients/c1/test.npz", "x[2]", "NaN or Inf"]),
    "NaN features in csv": (_nan_in_csv, ["clients/c2/val.csv: line 3", "NaN or Inf", "'x1'"]),
    "non-number in csv": (_bad_cell_in_csv, ["clients/c10/test.csv: line 4", "'x1'", "'abc'"]),
    "csv without target column": (_csv_without_target,
        ["clients/c1/train.csv", "no target column 'label'"]),
    "meta unknown key": (lambda r: (r / "meta.yaml").write_text("taks: regression\n"),
                         ["meta.yaml", "unknown key 'taks'", "task, metric"]),
    "meta bad task": (lambda r: (r / "meta.yaml").write_text("task: ranking\n"),
                      ["meta.yaml", "task must be classification or regression", "'ranking'"]),
    "meta metric does not fit task": (lambda r: (r / "meta.yaml").write_text("task: regression\nmetric: accuracy\n"),
                                      ["meta.yaml", "does not fit task 'regression'"]),
    "meta not YAML": (lambda r: (r / "meta.yaml").write_text("task: [classification\n"),
                      ["meta.yaml", "not valid YAML"]),
    "meta not a mapping": (lambda r: (r / "meta.yaml").write_text("- classification\n"),
                           ["meta.yaml", "mapping"]),
    "non-integer label": (_fractional_label, ["clients/c2/train.npz", "y[3]", "1.5", "not an integer"]),
    "negative label": (
        lambda r: _save(r / "clients/c10/val.npz", x=np.ones((2, 3)), y=np.array([0, -2])),
        ["clients/c10/val.npz", "y[1]", "negative"]),
    "file among client folders": (lambda r: (r / "clients/notes.txt").write_text("hi"),
                                  ["clients/notes.txt", "not a folder"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_each_problem_raises_one_line_naming_the_file(case: str, tmp_path: Path, no_build: list[int]) -> None:
    """Every malformed folder fails validation with one line naming the file (and the line or row where
    there is one), and no client tensor is built."""
    root = write_federation(tmp_path / "fed", make_clients(), graph=GRAPH)
    mutate, expected = BAD_FOLDERS[case]
    mutate(root)
    with pytest.raises(FederationFormatError) as err:
        load_federation(root)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(str(root)), message
    for text in expected:
        assert text in message, (text, message)
    assert no_build == []


def test_empty_or_missing_clients_folder(tmp_path: Path, no_build: list[int]) -> None:
    (tmp_path / "fed" / "clients").mkdir(parents=True)
    with pytest.raises(FederationFormatError, match="clients: no client folders"):
        read_federation_folder(tmp_path / "fed")
    (tmp_path / "fed" / "clients").rmdir()
    with pytest.raises(FederationFormatError, match="clients: missing"):
        read_federation_folder(tmp_path / "fed")
    with pytest.raises(FederationFormatError, match="federation folder not found"):
        read_federation_folder(tmp_path / "nowhere")
    assert no_build == []


def test_csv_feature_columns_must_agree_without_meta_features(tmp_path: Path) -> None:
    root = write_federation(tmp_path / "fed", make_clients(), fmt="csv")
    _edit_line(root / "clients/c2/train.csv", 1, "a,x1,x2,y")
    with pytest.raises(FederationFormatError, match=r"clients/c2/train\.csv: feature columns a, x1, x2 differ"):
        load_federation(root)


# ---- the config path: dataset.name=folder ---------------------------------------------------------------------


def test_build_federation_reads_the_folder_named_by_data_dir(tmp_path: Path) -> None:
    root = write_federation(tmp_path / "fed", make_clients(), graph=GRAPH)
    fed = build_federation(DatasetConfig(name="folder", data_dir=str(root), novel_fraction=0.34), seed=3)
    _assert_matches(fed, make_clients(), torch.int64)
    assert int(fed.novel_mask.sum()) == 1
    again = build_federation(DatasetConfig(name="folder", data_dir=str(root), novel_fraction=0.34), seed=3)
    assert torch.equal(fed.novel_mask, again.novel_mask)


def test_build_federation_turns_format_errors_into_config_errors(tmp_path: Path) -> None:
    root = write_federation(tmp_path / "fed", make_clients())
    (root / "clients/c1/test.npz").unlink()
    with pytest.raises(ConfigError, match=r"^dataset\.data_dir: .*clients/c1/test\.npz: missing test split"):
        build_federation(DatasetConfig(name="folder", data_dir=str(root)), seed=0)
    with pytest.raises(ConfigError, match=r"^dataset\.data_dir: dataset 'folder' needs dataset\.data_dir"):
        build_federation(DatasetConfig(name="folder"), seed=0)


def test_num_clients_must_match_the_folder(tmp_path: Path) -> None:
    root = write_federation(tmp_path / "fed", make_clients())
    assert build_federation(DatasetConfig(name="folder", data_dir=str(root), num_clients=3), seed=0).num_clients == 3
    with pytest.raises(ConfigError, match=r"^dataset\.num_clients: the folder .* has 3 clients, got 5"):
        build_federation(DatasetConfig(name="folder", data_dir=str(root), num_clients=5), seed=0)


# ---- graphfed inspect -------------------------------------------------------------------------------------------


def test_graph_stats_and_label_histogram() -> None:
    adj = torch.zeros(5, 5)
    for i, j in ((0, 1), (1, 2)):
        adj[i, j] = adj[j, i] = 1.0
    stats = graph_stats(adj, ["a", "b", "c", "d", "e"])
    assert (stats.nodes, stats.edges, stats.components, stats.largest_component) == (5, 2, 3, 3)
    assert stats.isolated == ["d", "e"] and stats.density == pytest.approx(0.2)
    assert (stats.degree_min, stats.degree_mean, stats.degree_max) == (0, pytest.approx(0.8), 2)
    assert label_histogram(np.array([0, 1, 1, 2]), 3) == "0:1 1:2 2:1"
    many = np.repeat(np.arange(7), [1, 9, 2, 8, 3, 7, 4])
    assert label_histogram(many, 10) == "1:9 3:8 5:7 6:4 +3 more"


def test_inspect_prints_clients_sizes_labels_and_graph(tmp_path: Path) -> None:
    root = write_example_federation(tmp_path / "example", num_clients=6)
    result = runner.invoke(cli.app, ["inspect", str(root)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    fed = load_federation(root)
    for i, cid in enumerate(fed.client_names):
        sizes = [str(int(getattr(fed, s).counts[i])) for s in ("train", "val", "test")]
        row = next(line for line in out.splitlines() if f" {cid} " in line)
        assert [cell.strip() for cell in row.strip("│ ").split("│")][1:4] == sizes, row
    assert "classification / accuracy" in out and "(4,)" in out
    assert "labels (all splits)" in out and "0:" in out
    # 6 clients, two chains of 3 (2 edges each) and a bridge between the chain heads: 5 edges, connected,
    # degrees 1 (the chain tails) to 2.
    assert "6 / 5" in out and "1 (largest 6 clients)" in out and "1 / 1.67 / 2" in out
    assert "0.333" in out  # density 5 / 15


def test_inspect_a_regression_folder_shows_target_mean_and_no_graph(tmp_path: Path) -> None:
    root = write_federation(tmp_path / "fed", make_clients("regression"))
    result = runner.invoke(cli.app, ["inspect", str(root)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "regression / mse" in result.stdout and "target mean ± std" in result.stdout
    assert "client graph: none given" in result.stdout


def test_inspect_a_config_dataset(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("dataset: {name: fln, num_clients: 5}\n")
    result = runner.invoke(cli.app, ["inspect", "--config", str(config)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "nodes / edges" in result.stdout and "0:50 1:50" in result.stdout
    assert all(f" {i} " in result.stdout for i in range(5))


@pytest.mark.parametrize("args", [["inspect", "{bad}"], ["inspect", "{missing}"], ["inspect"],
                                  ["inspect", "{bad}", "--config", "{bad}/c.yaml"]])
def test_inspect_exits_2_with_one_line_on_bad_input(args: list[str], tmp_path: Path) -> None:
    bad = write_federation(tmp_path / "bad", make_clients(), graph=[("c1", "ghost")])
    result = invoke(*[a.format(bad=bad, missing=tmp_path / "missing") for a in args])
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and "Traceback" not in result.output, lines
    if args == ["inspect", "{bad}"]:
        assert f"{bad / 'graph.csv'}: line 2: unknown client 'ghost'" in lines[0]


def test_run_with_a_bad_folder_exits_2_and_runs_nothing(tmp_path: Path) -> None:
    bad = write_federation(tmp_path / "bad", make_clients())
    (bad / "clients/c2/train.npz").unlink()
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{name: folder, data_dir: {bad}}}\nmethod: {{name: fedavg}}\n")
    out = tmp_path / "out"
    result = invoke("run", config, "--out", out, "--no-progress")
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and "clients/c2/train.npz" in lines[0] and "missing train split" in lines[0]
    assert not out.exists()


# ---- it learns --------------------------------------------------------------------------------------------------


def test_a_short_run_on_the_example_folder_learns(tmp_path: Path) -> None:
    """FedAvg for 10 tiny rounds on the generated example (well-separated 3-class blobs) beats chance (1/3)
    by far (lr 0.2: at the tiny default 0.05 ten rounds are too few for some seeds), and the CSV form of the same
    federation gives the same run (same tensors, same seed)."""
    summaries = []
    for fmt in ("npz", "csv"):
        root = write_example_federation(tmp_path / fmt, num_clients=8, fmt=fmt)
        config = load_config(None, tiny_overrides("fedavg", "dataset.name=folder", f"dataset.data_dir={root}",
                                                  "dataset.num_clients=null", "train.lr=0.2"))
        summaries.append(run_config(config, None, progress=False))
    npz, from_csv = summaries
    assert npz.status == "completed" and npz.dataset == "example"
    assert npz.test_mean > 0.85, npz.test_mean
    assert from_csv.test_mean == npz.test_mean and from_csv.val_mean == npz.val_mean
