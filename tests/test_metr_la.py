"""METR-LA (one week) loader and federation, and the ``gru`` target model."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from graphfed.config import ConfigError, DatasetConfig, load_config, validate_config
from graphfed.data import DATASETS, Federation, build_federation
from graphfed.data.datasets.metr_la import (
    ADJACENCY_FILE,
    FOLDER,
    SENSOR_IDS_FILE,
    SPEED_FILE,
    load_metr_la,
    read_adjacency,
    read_speeds,
    threshold_graph,
)
from graphfed.models import MODELS, build_model
from graphfed.models.gru import GRUForecaster
from graphfed.sim.engine import run_config

SHARED_DATA = (Path(__file__).parents[1] / "../shared/data").resolve()
needs_metr_la = pytest.mark.skipif(
    not (SHARED_DATA / FOLDER / SPEED_FILE).is_file(),
    reason=f"real METR-LA files not found under {SHARED_DATA / FOLDER} (the shared data folder is absent)",
)
SENSORS = 207


def write_metr_la(root: Path, speeds: np.ndarray, adjacency: np.ndarray | None = None) -> Path:
    """Write ``speeds [T, sensors]`` and an adjacency in the real files' layout under ``root/metr-la-week``."""
    folder = root / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    ids = [str(770000 + i) for i in range(speeds.shape[1])]
    with gzip.open(folder / SPEED_FILE, "wt") as fh:
        fh.write(",".join(ids) + "\n")
        fh.writelines(",".join(f"{v:.4f}" for v in row) + "\n" for row in speeds)
    if adjacency is None:
        adjacency = np.eye(speeds.shape[1])
    np.savetxt(folder / ADJACENCY_FILE, adjacency, delimiter=",", fmt="%.6f")
    return folder


def ramp(steps: int = 300) -> np.ndarray:
    """Speed = 10 + time index at every sensor, so a scaled value tells which time step it came from."""
    return np.repeat(10.0 + np.arange(steps, dtype=np.float64)[:, None], SENSORS, axis=1)


def random_adjacency(seed: int = 0) -> np.ndarray:
    """Asymmetric weights in [0, 1) on about 10% of the pairs, unit diagonal (like DCRNN's file)."""
    rng = np.random.default_rng(seed)
    adj = np.where(rng.random((SENSORS, SENSORS)) < 0.1, rng.random((SENSORS, SENSORS)), 0.0)
    np.fill_diagonal(adj, 1.0)
    return np.round(adj, 6)  # what the file holds (written with 6 decimals)


def fed_from(root: Path, **overrides: object) -> Federation:
    return build_federation(DatasetConfig(name="metr-la-week", data_dir=str(root), **overrides), seed=0)


# --- real files --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_fed() -> Federation:
    return build_federation(DatasetConfig(name="metr-la-week", data_dir=str(SHARED_DATA), novel_fraction=0.2),
                            seed=0)


@needs_metr_la
def test_real_week_federation_shapes_graph_and_scale(real_fed: Federation) -> None:
    fed = real_fed
    assert DATASETS["metr-la-week"].task == "regression"
    assert fed.num_clients == SENSORS and fed.task == "regression" and fed.metric == "mse"
    assert fed.input_shape == (12,) and fed.output_dim == 12
    ids = (SHARED_DATA / FOLDER / SENSOR_IDS_FILE).read_text().strip().split(",")
    assert fed.client_names == ids
    # 2016 steps cut 1411 / 202 / 403 (0.7 / 0.1 / 0.2); each segment gives length - 24 + 1 windows.
    assert fed.train.counts.tolist() == [1388] * SENSORS
    assert fed.val.counts.tolist() == [179] * SENSORS
    assert fed.test.counts.tolist() == [380] * SENSORS
    train = fed.train.padded()
    assert train.x.shape == (SENSORS, 1388, 12) and fed.test.padded().y.shape == (SENSORS, 380, 12)
    assert int(fed.novel_mask.sum()) == 41
    # Stride 1: window t's targets are window t+12's inputs.
    assert torch.equal(train.y[:, :-12], train.x[:, 12:])
    # Min-max over the training segment: it spans exactly [0, 1]; speeds 1.125..70 mph in this week.
    train_values = torch.cat([fed.train.x.flatten(), fed.train.y.flatten()])
    assert float(train_values.min()) == 0.0 and float(train_values.max()) == pytest.approx(1.0)
    assert fed.target_scale == pytest.approx(70.0 - 1.125)
    # Orientation: sensor c's first window is that sensor's column of the speed file, time along the window.
    _, raw = read_speeds(SHARED_DATA / FOLDER / SPEED_FILE)
    np.testing.assert_allclose(train.x[:, 0].numpy() * fed.target_scale + 1.125, raw[:, :12], atol=1e-4)
    adj = fed.client_graph
    assert adj is not None
    assert torch.equal(adj, adj.T) and torch.all(adj.diagonal() == 0)
    assert float(adj.max()) <= 1.0 and float(adj[adj > 0].min()) >= 0.1
    assert int(torch.count_nonzero(adj)) == 2 * 1313  # DCRNN's file is already cut at 0.1
    assert "0 zero (missing) readings" in fed.description


@needs_metr_la
def test_real_week_threshold_thins_the_graph(real_fed: Federation) -> None:
    strict = build_federation(DatasetConfig(name="metr-la-week", data_dir=str(SHARED_DATA), graph_threshold=0.5),
                              seed=0)
    assert strict.client_graph is not None and real_fed.client_graph is not None
    assert int(torch.count_nonzero(strict.client_graph)) == 2 * 444
    kept = strict.client_graph > 0
    assert torch.equal(strict.client_graph[kept], real_fed.client_graph[kept])  # weights kept, not binarised


# --- generated files ---------------------------------------------------------------------------------


def test_windows_never_straddle_the_chronological_split(tmp_path: Path) -> None:
    write_metr_la(tmp_path, ramp(150))
    fed = fed_from(tmp_path, split=(0.6, 0.2, 0.2), novel_fraction=0.2)
    assert fed.num_clients == SENSORS and int(fed.novel_mask.sum()) == 41
    # Segments of 90 / 30 / 30 steps -> 67 / 7 / 7 windows per sensor.
    assert [s.counts.tolist() for s in (fed.train, fed.val, fed.test)] == [[67] * SENSORS, [7] * SENSORS,
                                                                           [7] * SENSORS]
    assert fed.target_scale is not None
    lo = 10.0  # the training minimum (time 0)

    def times(split_values: torch.Tensor) -> torch.Tensor:
        return torch.round(split_values * fed.target_scale + lo - 10.0).long()

    for name, split, first, last in (("train", fed.train, 0, 89), ("val", fed.val, 90, 119),
                                     ("test", fed.test, 120, 149)):
        x_t, y_t = times(split.padded().x), times(split.padded().y)
        # Every window is 24 consecutive steps: inputs then targets.
        assert torch.equal(torch.cat([x_t, y_t], dim=-1)[0], x_t[0, :, :1] + torch.arange(24)), name
        # ...and lies wholly inside its segment, covering it from the first to the last step.
        assert int(x_t.min()) == first and int(y_t.max()) == last, name
    # The split point: the last training target comes before the first validation input, and so on.
    assert int(times(fed.train.y).max()) < int(times(fed.val.x).min())
    assert int(times(fed.val.y).max()) < int(times(fed.test.x).min())
    assert fed.description.startswith("METR-LA week: 207 sensors, 150 5-minute steps")


def test_scaling_is_fitted_on_the_training_segment_only(tmp_path: Path) -> None:
    speeds = ramp(150)
    write_metr_la(tmp_path / "a", speeds)
    spiky = speeds.copy()
    spiky[100:] += 500.0  # val and test only
    spiky[130, 7] = 0.0
    write_metr_la(tmp_path / "b", spiky)
    a, b = fed_from(tmp_path / "a", split=(0.6, 0.2, 0.2)), fed_from(tmp_path / "b", split=(0.6, 0.2, 0.2))
    assert a.target_scale == b.target_scale == pytest.approx(89.0)  # train covers speeds 10..99
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert float(a.train.x.min()) == 0.0 and float(a.train.y.max()) == pytest.approx(1.0)
    assert float(b.test.y.max()) > 5.0  # later values are not clipped into [0, 1]
    assert "1 zero (missing) readings kept" in b.description  # zeros stay in the data, counted


def test_threshold_changes_the_edge_count_monotonically(tmp_path: Path) -> None:
    adjacency = random_adjacency()
    folder = write_metr_la(tmp_path, ramp(), adjacency)
    sym = np.maximum(adjacency, adjacency.T)
    counts = []
    for threshold in (0.0, 0.1, 0.3, 0.6, 0.9, 1.0):
        graph = threshold_graph(read_adjacency(folder / ADJACENCY_FILE), threshold)
        assert np.array_equal(graph, graph.T) and np.all(np.diag(graph) == 0)
        kept = graph > 0
        assert np.array_equal(graph[kept], sym[kept].astype(np.float32)) and np.all(graph[kept] >= threshold)
        counts.append(int(kept.sum()) // 2)
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[2] > counts[4] > 0 == counts[-1]
    # Symmetrised: a one-directional weight becomes an undirected edge.
    assert counts[0] == int(np.count_nonzero(np.triu(sym, k=1)))
    # dataset.graph_threshold reaches the federation's graph.
    fed_graph = fed_from(tmp_path, graph_threshold=0.3).client_graph
    assert fed_graph is not None and int(torch.count_nonzero(fed_graph)) == 2 * counts[2]


def test_graph_threshold_is_validated_with_the_field_name() -> None:
    assert DatasetConfig().graph_threshold == 0.1
    with pytest.raises(ConfigError, match=r"^dataset\.graph_threshold: "):
        validate_config({"dataset": {"name": "metr-la-week", "graph_threshold": 1.5}})


def test_fixed_client_count_and_short_segments_are_rejected(tmp_path: Path) -> None:
    write_metr_la(tmp_path, ramp(150))
    with pytest.raises(ConfigError, match=r"^dataset\.num_clients: metr-la-week has exactly 207 clients"):
        fed_from(tmp_path, num_clients=20)
    with pytest.raises(ValueError, match=r"val segment has 15 time steps \(dataset\.split"):
        fed_from(tmp_path, split=(0.7, 0.1, 0.2))
    no_val = fed_from(tmp_path, split=(0.8, 0.0, 0.2))  # a zero fraction is allowed: an empty split
    assert no_val.val.counts.tolist() == [0] * SENSORS and no_val.train.counts.tolist() == [97] * SENSORS


def test_missing_files_name_the_path_and_the_setting(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        fed_from(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere" / FOLDER) in str(err.value)
    folder = write_metr_la(tmp_path, ramp())
    (folder / ADJACENCY_FILE).unlink()
    with pytest.raises(FileNotFoundError) as err:
        fed_from(tmp_path)
    message = str(err.value)
    assert str(folder / ADJACENCY_FILE) in message and "dataset.data_dir" in message and "GRAPHFED_DATA" in message


def _edit_speed_line(line: int, edit: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    """A corrupter that rewrites the cells of 1-based ``line`` of the gzipped speed file."""

    def corrupt(folder: Path) -> None:
        with gzip.open(folder / SPEED_FILE, "rt") as fh:
            lines = fh.read().splitlines()
        lines[line - 1] = ",".join(edit(lines[line - 1].split(",")))
        with gzip.open(folder / SPEED_FILE, "wt") as fh:
            fh.write("\n".join(lines) + "\n")

    return corrupt


def _set_cell(text: str) -> Callable[[Path], None]:
    return _edit_speed_line(10, lambda cells: [*cells[:3], text, *cells[4:]])


def _adjacency_rows(folder: Path) -> None:
    np.savetxt(folder / ADJACENCY_FILE, np.eye(SENSORS)[:-1], delimiter=",")


def _adjacency_header(folder: Path) -> None:
    rows = (folder / ADJACENCY_FILE).read_text().splitlines()
    (folder / ADJACENCY_FILE).write_text("\n".join([",".join(f"s{i}" for i in range(SENSORS)), *rows[1:]]) + "\n")


@pytest.mark.parametrize(("corrupt", "file", "problem"), [
    (_edit_speed_line(6, lambda cells: cells[:-1]), SPEED_FILE, "line 6 has 206 fields, expected 207"),
    (_set_cell("n/a"), SPEED_FILE, "line 10, column 4: not a number: 'n/a'"),
    (_set_cell("nan"), SPEED_FILE, "line 10, column 4: non-finite value 'nan'"),
    (_set_cell("-3"), SPEED_FILE, "line 10, column 4: negative speed"),
    (_adjacency_rows, ADJACENCY_FILE, "expected 207 rows"),
    (_adjacency_header, ADJACENCY_FILE, "line 1, column 1: not a number: 's0'"),
], ids=["short-row", "text", "nan", "negative", "adjacency-shape", "adjacency-header"])
def test_corrupt_files_raise_value_errors_naming_file_and_row(
        tmp_path: Path, corrupt: Callable[[Path], None], file: str, problem: str) -> None:
    folder = write_metr_la(tmp_path, ramp())
    corrupt(folder)
    with pytest.raises(ValueError) as err:
        fed_from(tmp_path)
    assert str(folder / file) in str(err.value)
    assert problem in str(err.value)


def test_header_must_match_the_sensor_id_list_and_count(tmp_path: Path) -> None:
    folder = write_metr_la(tmp_path, ramp())
    ids = [str(770000 + i) for i in range(SENSORS)]
    (folder / SENSOR_IDS_FILE).write_text(",".join([ids[1], ids[0], *ids[2:]]))
    with pytest.raises(ValueError, match="header sensor ids differ"):
        load_metr_la(tmp_path)
    write_metr_la(tmp_path / "narrow", ramp()[:, :20])
    with pytest.raises(ValueError, match=r"line 1 \(header\) has 20 sensor ids, expected 207"):
        load_metr_la(tmp_path / "narrow")


# --- GRU -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("features", [1, 2])
def test_gru_batched_forward_equals_per_client_forward_and_torch_gru(features: int) -> None:
    torch.manual_seed(0)
    model = GRUForecaster(input_steps=12, horizon=12, hidden=10, input_features=features)
    clients = 4
    params = {name: value.detach() + 0.3 * torch.randn(clients, *value.shape) for name, value in
              model.named_parameters()}
    x = torch.randn(clients, 5, 12, features)
    if features == 1:
        x = x.squeeze(-1)  # the metr-la-week layout: [S, B, steps]
    batched = model.batched_forward(params, x)
    assert batched.shape == (clients, 5, 12)
    for s in range(clients):
        client = {name: value[s] for name, value in params.items()}
        single = functional_call(model, client, (x[s],))
        torch.testing.assert_close(batched[s], single, atol=1e-5, rtol=0)
        # The hand-written recurrence is PyTorch's GRU.
        cell = nn.GRUCell(features, 10)
        head = nn.Linear(10, 12)
        cell.load_state_dict({k.removeprefix("gru."): v for k, v in client.items() if k.startswith("gru.")})
        head.load_state_dict({k.removeprefix("head."): v for k, v in client.items() if k.startswith("head.")})
        h = torch.zeros(5, 10)
        for t in range(12):
            h = cell(x[s, :, t].reshape(5, features), h)
        torch.testing.assert_close(batched[s], head(h), atol=1e-5, rtol=0)


def test_gru_registry_parameter_count_and_task_check(tmp_path: Path) -> None:
    assert "gru" in MODELS
    write_metr_la(tmp_path, ramp())
    fed = fed_from(tmp_path)
    model = build_model("gru", fed)
    assert sum(p.numel() for p in model.parameters()) == 32_112  # as the module docstring says, hidden=100
    assert model(fed.train.client(0)[0][:3]).shape == (3, 12)
    with pytest.raises(ConfigError, match="gru forecasts a series"):
        build_model("gru", build_federation(DatasetConfig(name="fl60"), seed=0))


def test_gru_federated_run_beats_the_mean_and_last_value_baselines(tmp_path: Path) -> None:
    """Sinusoidal speeds with a 4-hour period and a random phase per sensor: one hour ahead is a quarter period,
    so repeating the last value is poor, and so is the training mean; a GRU that learned the dynamics beats both."""
    rng = np.random.default_rng(0)
    steps = np.arange(300)[:, None]
    speeds = 50 + 15 * np.sin(2 * np.pi * steps / 48 + rng.uniform(0, 2 * np.pi, SENSORS)) \
        + rng.normal(0, 0.5, (300, SENSORS))
    write_metr_la(tmp_path, speeds)
    cfg = load_config(None, [
        "dataset.name=metr-la-week", f"dataset.data_dir={tmp_path}", "model.name=gru", "model.options={hidden: 8}",
        "method.name=fedavg", "train.rounds=20", "train.local_steps=10", "train.batch_size=32", "train.lr=0.8",
        "train.clients_per_round=5", "train.eval_every=5", "train.checkpoint_every=50", "train.novel_adapt_rounds=0",
    ])
    fed = build_federation(cfg.dataset, cfg.seed)
    test_x, test_y = fed.test.padded().x, fed.test.padded().y
    mean_mse = float((test_y - fed.train.y.mean()).pow(2).mean())
    last_value_mse = float((test_y - test_x[:, :, -1:]).pow(2).mean())
    summary = run_config(cfg, federation=fed, progress=False)
    assert summary.status == "completed" and summary.metric == "mse"
    assert summary.test_mean < 0.75 * min(mean_mse, last_value_mse)
