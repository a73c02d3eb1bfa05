"""METR-LA, one week: traffic speed of 207 Los Angeles loop detectors, one client per sensor.

Files (under ``<data_dir>/metr-la-week``): ``los_speed.csv.gz`` holds 5-minute average speeds in mph, one row
per time step (2016 rows = 1-7 March 2012) and one column per sensor, with a header of sensor ids;
``los_adj.csv`` is DCRNN's 207 x 207 Gaussian-kernel road-distance adjacency without a header, rows and
columns in the speed file's column order (checked against ``graph_sensor_ids.txt`` where that file exists).

Task (the Panacea / CNFGNN protocol): 12 steps (1 hour) in -> the next 12 steps out, sliding windows of 24
steps with stride 1. The time axis is cut **chronologically** into train / val / test segments by
``dataset.split`` *before* windowing, and windows are built inside each segment, so no window straddles a
split and no target value of a training window is an input of a validation window. (``dataset.split_mode``
is therefore not used: a random split of overlapping windows would leak test targets into training.)

Scaling: global min-max over the *training segment* of all sensors, ``s = (v - lo) / (hi - lo)``; the papers
report MSE on scaled values, and fitting on the training segment alone keeps the test period unseen.
Validation and test values may fall slightly outside [0, 1]. ``hi - lo`` (mph per scaled unit) is kept so
that errors can be reported in mph (MAE_mph = MAE_scaled * (hi - lo)).

Missing readings: METR-LA marks a missing reading with speed 0. This loader keeps zeros as ordinary values
(as DCRNN's data preparation does; DCRNN masks them only inside its loss, and graphfed's MSE does not). The
shipped week (T-GCN's ``los_speed``) has no zeros at all: its gaps are already filled (minimum 1 mph), so the
choice only matters for other files; the number of zero readings is reported in the dataset description.

Client graph: the adjacency is symmetrised (``max(A, A^T)``), entries below ``dataset.graph_threshold`` are
dropped (DCRNN's ``normalized_k``, default 0.1: the shipped file is already cut there and has 1313 undirected
edges), the diagonal is zeroed and the kernel weights in (0, 1] are kept.
"""

from __future__ import annotations

import csv
import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from graphfed.config import DatasetConfig
from graphfed.data.datasets import missing_data, require_file
from graphfed.data.federation import ClientSplit, Federation
from graphfed.data.partition import split_client_indices
from graphfed.data.registry import DatasetInfo, Streams, fixed_client_count

FOLDER = "metr-la-week"
SPEED_FILE = "los_speed.csv.gz"
ADJACENCY_FILE = "los_adj.csv"
SENSOR_IDS_FILE = "graph_sensor_ids.txt"
NUM_SENSORS = 207
INPUT_STEPS = 12  # one hour of 5-minute steps in
HORIZON = 12  # one hour out
DEFAULT_THRESHOLD = 0.1  # DCRNN's normalized_k


@dataclass
class MetrLAData:
    """Scaled, windowed METR-LA: one entry per sensor, in the speed file's column order."""

    sensor_ids: list[str]
    # (x, y) of the train, val and test segments: x [207, W_k, 12], y [207, W_k, 12] float32 scaled speeds.
    splits: tuple[tuple[np.ndarray, np.ndarray], ...]
    segment_steps: tuple[int, int, int]  # time steps in each segment before windowing
    adjacency: np.ndarray  # [207, 207] float32, thresholded, symmetric, zero diagonal, kernel weights kept
    speed_min: float  # mph mapped to 0 (training-segment minimum)
    speed_max: float  # mph mapped to 1 (training-segment maximum)
    zero_readings: int  # speeds equal to 0 (METR-LA's missing-reading marker), kept as values

    @property
    def mph_per_unit(self) -> float:
        """Multiply a scaled error (MAE, RMSE) by this to get mph."""
        return self.speed_max - self.speed_min


def _parse_row(path: Path, line: int, row: list[str], width: int) -> np.ndarray:
    """One CSV row as float64, with an error naming the file, the line and the offending cell."""
    if len(row) != width:
        raise ValueError(f"{path}: line {line} has {len(row)} fields, expected {width}")
    try:
        values = np.asarray(row, dtype=np.float64)
    except ValueError:
        # Re-parse cell by cell only on failure, to name the column (the fast path converts the whole row).
        for column, cell in enumerate(row, start=1):
            try:
                float(cell)
            except ValueError:
                raise ValueError(f"{path}: line {line}, column {column}: not a number: {cell!r}") from None
        raise
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(f"{path}: line {line}, column {bad[0] + 1}: non-finite value {row[bad[0]]!r} (NaN/inf)")
    return values


def read_speeds(path: Path, num_sensors: int = NUM_SENSORS) -> tuple[list[str], np.ndarray]:
    """Read the gzipped speed table; return (sensor ids in column order, mph array [sensors, steps])."""
    require_file(path, "METR-LA data file", FOLDER)
    try:
        with gzip.open(path, "rt", newline="", encoding="utf-8-sig") as fh:
            rows = [row for row in csv.reader(fh) if row]
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:  # not gzip, truncated, corrupt, not text
        raise ValueError(f"{path}: not a readable gzip file ({err})") from None
    if len(rows) < 2:
        raise ValueError(f"{path}: expected a header of sensor ids and at least one row, got {len(rows)} rows")
    ids = [cell.strip() for cell in rows[0]]
    if len(ids) != num_sensors:
        raise ValueError(f"{path}: line 1 (header) has {len(ids)} sensor ids, expected {num_sensors}")
    if any(not sid for sid in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"{path}: line 1 (header) has empty or duplicate sensor ids")
    table = np.stack([_parse_row(path, line, row, num_sensors) for line, row in enumerate(rows[1:], start=2)])
    negative = np.argwhere(table < 0)
    if negative.size:
        step, sensor = negative[0]
        raise ValueError(f"{path}: line {step + 2}, column {sensor + 1}: negative speed {table[step, sensor]}")
    return ids, table.T


def read_adjacency(path: Path, num_sensors: int = NUM_SENSORS) -> np.ndarray:
    """Read the header-less ``num_sensors`` x ``num_sensors`` weighted adjacency; entries must be >= 0."""
    require_file(path, "METR-LA data file", FOLDER)
    with path.open(newline="", encoding="utf-8-sig") as fh:
        rows = [row for row in csv.reader(fh) if row]
    if len(rows) != num_sensors:
        raise ValueError(f"{path}: expected {num_sensors} rows (a {num_sensors}x{num_sensors} matrix without "
                         f"header), got {len(rows)}")
    adjacency = np.stack([_parse_row(path, line, row, num_sensors) for line, row in enumerate(rows, start=1)])
    negative = np.argwhere(adjacency < 0)
    if negative.size:
        r, c = negative[0]
        raise ValueError(f"{path}: line {r + 1}, column {c + 1}: negative weight {adjacency[r, c]}")
    return adjacency


def threshold_graph(adjacency: np.ndarray, threshold: float) -> np.ndarray:
    """Symmetrise (max of A and A^T), keep weights >= ``threshold`` (and > 0), zero the diagonal."""
    sym = np.maximum(adjacency, adjacency.T)
    kept = np.where((sym >= threshold) & (sym > 0), sym, 0.0)
    np.fill_diagonal(kept, 0.0)
    return kept.astype(np.float32)


def segment_bounds(num_steps: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    """Time steps of the chronological train / val / test segments (the same rounding as the other
    datasets' chronological split)."""
    train, val, test = split_client_indices(num_steps, fractions, mode="chronological")
    return len(train), len(val), len(test)


def windows(series: np.ndarray, input_steps: int = INPUT_STEPS,
            horizon: int = HORIZON) -> tuple[np.ndarray, np.ndarray]:
    """All stride-1 windows of ``[N, T]``: x = ``input_steps`` steps, y = the next ``horizon``; none if T is short."""
    size = input_steps + horizon
    count = max(series.shape[1] - size + 1, 0)
    win = series[:, np.arange(count)[:, None] + np.arange(size)[None, :]]  # [N, count, size]
    return win[:, :, :input_steps], win[:, :, input_steps:]


def load_metr_la(data_dir: Path | str, split: tuple[float, float, float] = (0.7, 0.1, 0.2),
                 graph_threshold: float = DEFAULT_THRESHOLD, num_sensors: int = NUM_SENSORS) -> MetrLAData:
    """Load ``<data_dir>/metr-la-week``: chronological segments, train-fitted min-max scaling, windows and the
    thresholded sensor graph (see the module docstring)."""
    folder = Path(data_dir) / FOLDER
    if not folder.is_dir():
        raise missing_data("METR-LA data folder", folder, FOLDER)
    speed_path = folder / SPEED_FILE
    ids, speeds = read_speeds(speed_path, num_sensors)
    ids_path = folder / SENSOR_IDS_FILE
    if ids_path.is_file():  # the adjacency's row order; a reordered speed header would silently mis-wire the graph
        listed = [s.strip() for s in ids_path.read_text(encoding="utf-8-sig").replace("\n", ",").split(",")
                  if s.strip()]
        if listed != ids:
            raise ValueError(f"{speed_path}: header sensor ids differ from {ids_path} (the adjacency's order)")
    adjacency = read_adjacency(folder / ADJACENCY_FILE, num_sensors)
    return window_speeds(ids, speeds, adjacency, split, graph_threshold, speed_path)


def window_speeds(ids: list[str], speeds: np.ndarray, adjacency: np.ndarray, split: tuple[float, float, float],
                  graph_threshold: float, speed_path: Path | str) -> MetrLAData:
    """Speeds ``[N, T]`` (mph) -> chronological segments, train-fitted min-max scaling, windows, and the
    thresholded graph; shared by the CSV week and the DCRNN ``.h5`` recordings."""
    steps = segment_bounds(speeds.shape[1], split)
    size = INPUT_STEPS + HORIZON
    for name, length, fraction in zip(("train", "val", "test"), steps, split, strict=True):
        if fraction > 0 and length < size:
            raise ValueError(f"{speed_path}: the {name} segment has {length} time steps (dataset.split "
                             f"{name} fraction {fraction}), fewer than one {size}-step window")
    cut = np.cumsum((0, *steps))
    segments = [speeds[:, cut[k]:cut[k + 1]] for k in range(3)]
    lo, hi = float(segments[0].min()), float(segments[0].max())
    if hi <= lo:
        raise ValueError(f"{speed_path}: speeds are constant over the training segment")
    splits = tuple(tuple(part.astype(np.float32) for part in windows((seg - lo) / (hi - lo))) for seg in segments)
    return MetrLAData(ids, splits, steps, threshold_graph(adjacency, graph_threshold), lo, hi,
                      int(np.count_nonzero(speeds == 0)))


def build(cfg: DatasetConfig, streams: Streams) -> Federation:
    """The split is part of the task (the time axis is cut before windowing): no per-client split step."""
    fixed_client_count(cfg, NUM_SENSORS)
    metr = load_metr_la(cfg.resolved_data_dir(), cfg.split, cfg.graph_threshold, NUM_SENSORS)
    return traffic_federation("metr-la-week", "METR-LA week", metr, cfg)


def traffic_federation(name: str, title: str, metr: MetrLAData, cfg: DatasetConfig) -> Federation:
    """One client per sensor, its windows split chronologically; the road graph between sensors."""
    train, val, test = (ClientSplit.from_lists(list(x), list(y), "regression") for x, y in metr.splits)
    graph = torch.as_tensor(metr.adjacency)
    edges = int(torch.count_nonzero(graph)) // 2
    description = (f"{title}: {len(metr.sensor_ids)} sensors, {sum(metr.segment_steps)} 5-minute steps, "
                   f"{INPUT_STEPS} in -> {HORIZON} out; chronological segments of "
                   f"{'/'.join(map(str, metr.segment_steps))} steps -> "
                   f"{'/'.join(str(x.shape[1]) for x, _ in metr.splits)} windows per sensor "
                   f"(dataset.split_mode not used); min-max scaled on the training segment "
                   f"({metr.speed_min:.2f}..{metr.speed_max:.2f} mph, {metr.mph_per_unit:.2f} mph/unit); "
                   f"{metr.zero_readings} zero (missing) readings kept as values; graph = {edges} edges "
                   f"with weight >= {cfg.graph_threshold}")
    return Federation(name=name, task="regression", train=train, val=val, test=test,
                      input_shape=(INPUT_STEPS,), output_dim=HORIZON, client_graph=graph,
                      client_names=list(metr.sensor_ids), metric="mse", description=description,
                      target_scale=metr.mph_per_unit)


REGISTRY = (DatasetInfo("metr-la-week", "METR-LA traffic speed, 1-7 March 2012, 207 sensor clients, 12 steps (1 h) "
                        "in -> 12 out; chronological split, min-max scaled on the training segment (MSE on scaled "
                        "values); DCRNN road graph cut at dataset.graph_threshold", "regression", build),)
