"""TPT-48: monthly average temperature of the 48 contiguous US states, one client per state.

Paper protocol (Panacea, after VDI): months 2008-01..2019-12 (144 months), min-max scaled to [0, 1] over
the whole 48 x 144 table, cut into sliding windows of 12 consecutive months where the first 6 months are
the input and the next 6 the target, which gives 144 - 12 + 1 = 133 windows per state. The client graph
is state adjacency (shared border), 105 undirected edges.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphfed.config import DatasetConfig
from graphfed.data.datasets import missing_data, require_file
from graphfed.data.federation import Federation
from graphfed.data.graphs import edges_to_adjacency
from graphfed.data.registry import DatasetInfo, Streams, federation_from_clients, fixed_client_count

FOLDER = "tpt48"
TEMPERATURE_FILE = "tpt48_monthly_tavg_F_1895-2019.csv"
EDGES_FILE = "tpt48_adjacency_edges.csv"
FIRST_MONTH = "2008-01"
LAST_MONTH = "2019-12"
WINDOW = 12  # months per sample: input then target
HORIZON = 6  # months predicted

_MONTH = re.compile(r"^(\d{4})-(\d{2})$")


@dataclass
class TPT48Data:
    """Windowed TPT-48 ready to split: one entry per state, in the temperature file's row order."""

    codes: list[str]  # state codes, e.g. "AL"
    x: np.ndarray  # [48, 133, 6] float32, scaled temperatures of the input months
    y: np.ndarray  # [48, 133, 6] float32, scaled temperatures of the target months
    edges: np.ndarray  # [E, 2] int64, row indices of adjacent states
    temp_min_f: float  # scaling constants, to map predictions back to deg F
    temp_max_f: float


def _month_index(label: str) -> int:
    match = _MONTH.match(label)
    if match is None:
        raise ValueError(f"month must look like YYYY-MM, got {label!r}")
    return int(match.group(1)) * 12 + int(match.group(2)) - 1


def _month_range(first: str, last: str) -> list[str]:
    """Inclusive list of 'YYYY-MM' labels from ``first`` to ``last``."""
    return [f"{k // 12:04d}-{k % 12 + 1:02d}" for k in range(_month_index(first), _month_index(last) + 1)]


def read_temperatures(path: Path, first: str = FIRST_MONTH,
                      last: str = LAST_MONTH) -> tuple[list[str], np.ndarray]:
    """Read the state x month table; return (state codes in row order, deg F array [states, months])."""
    require_file(path, "TPT-48 data file", FOLDER)
    # utf-8-sig: tolerate a byte-order mark (some of the sibling CSVs in this folder carry one).
    with path.open(newline="", encoding="utf-8-sig") as fh:
        rows = [row for row in csv.reader(fh) if row]
    if len(rows) < 2:
        raise ValueError(f"{path}: expected a header and at least one state row, got {len(rows)} rows")
    header = [h.strip() for h in rows[0]]
    wanted = _month_range(first, last)
    try:
        start = header.index(wanted[0])
    except ValueError:
        raise ValueError(f"{path}: header has no month column '{wanted[0]}'") from None
    if header[start:start + len(wanted)] != wanted:
        raise ValueError(f"{path}: header lacks the consecutive month columns {first}..{last}")

    codes: list[str] = []
    table = np.empty((len(rows) - 1, len(wanted)), dtype=np.float64)
    for r, row in enumerate(rows[1:]):
        line = r + 2  # 1-based, after the header
        if len(row) != len(header):
            raise ValueError(f"{path}: line {line} has {len(row)} fields, the header has {len(header)}")
        code = row[0].strip()
        if not code:
            raise ValueError(f"{path}: line {line} has an empty state code")
        codes.append(code)
        for c, cell in enumerate(row[start:start + len(wanted)]):
            try:
                table[r, c] = float(cell)
            except ValueError:
                raise ValueError(f"{path}: line {line} ({code}), column {wanted[c]}: "
                                 f"not a number: {cell!r}") from None
    if len(set(codes)) != len(codes):
        dupes = sorted({c for c in codes if codes.count(c) > 1})
        raise ValueError(f"{path}: duplicate state codes {dupes}")
    with np.errstate(over="ignore"):
        as_trained = table.astype(np.float32)
    if not np.all(np.isfinite(as_trained)):
        raise ValueError(f"{path}: non-finite temperatures (or beyond float32's range) in {first}..{last}")
    return codes, table


def read_edges(path: Path, codes: Sequence[str]) -> np.ndarray:
    """Read the ``state_a,state_b`` edge list and map codes to row indices of ``codes``; [E, 2] int64."""
    require_file(path, "TPT-48 data file", FOLDER)
    with path.open(newline="", encoding="utf-8-sig") as fh:
        rows = [row for row in csv.reader(fh) if row]
    if not rows or [h.strip() for h in rows[0]] != ["state_a", "state_b"]:
        raise ValueError(f"{path}: expected the header 'state_a,state_b'")
    index = {code: i for i, code in enumerate(codes)}
    edges = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != 2:
            raise ValueError(f"{path}: line {line} has {len(row)} fields, expected 2")
        a, b = row[0].strip(), row[1].strip()
        unknown = [s for s in (a, b) if s not in index]
        if unknown:
            raise ValueError(f"{path}: line {line} names unknown state code(s) {unknown}")
        if a == b:
            raise ValueError(f"{path}: line {line} is a self-loop ({a})")
        edges.append((index[a], index[b]))
    return np.asarray(edges, dtype=np.int64).reshape(-1, 2)


def sliding_windows(series: np.ndarray, window: int = WINDOW,
                    horizon: int = HORIZON) -> tuple[np.ndarray, np.ndarray]:
    """Cut [N, T] series into all length-``window`` windows: x = first window-horizon, y = last horizon."""
    t = series.shape[1]
    if not 0 < horizon < window <= t:
        raise ValueError(f"need 0 < horizon ({horizon}) < window ({window}) <= series length ({t})")
    starts = np.arange(t - window + 1)
    win = series[:, starts[:, None] + np.arange(window)[None, :]]  # [N, W, window]
    return win[:, :, : window - horizon], win[:, :, window - horizon:]


def load_tpt48(data_dir: Path | str) -> TPT48Data:
    """Load TPT-48 from ``<data_dir>/tpt48``, scaled and windowed (see the module docstring)."""
    folder = Path(data_dir) / FOLDER
    if not folder.is_dir():
        raise missing_data("TPT-48 data folder", folder, FOLDER)
    temp_path = folder / TEMPERATURE_FILE
    codes, temps = read_temperatures(temp_path)
    lo, hi = float(temps.min()), float(temps.max())
    if hi <= lo:
        raise ValueError(f"{temp_path}: temperatures are constant over {FIRST_MONTH}..{LAST_MONTH}")
    scaled = (temps - lo) / (hi - lo)
    if not np.all(np.isfinite(scaled)):
        raise ValueError(f"{temp_path}: temperatures span {lo:g}..{hi:g}, too wide to scale")
    x, y = sliding_windows(scaled)
    edges = read_edges(folder / EDGES_FILE, codes)
    return TPT48Data(codes, x.astype(np.float32), y.astype(np.float32), edges, lo, hi)


TPT48_CLIENTS = 48


def build(cfg: DatasetConfig, streams: Streams) -> Federation:
    fixed_client_count(cfg, TPT48_CLIENTS)
    data = load_tpt48(cfg.resolved_data_dir())
    return federation_from_clients(
        "tpt48", list(data.x), list(data.y), cfg, streams, "regression", HORIZON, input_shape=(WINDOW - HORIZON,),
        client_graph=edges_to_adjacency(data.edges, len(data.codes)), client_names=data.codes,
        description=f"TPT-48: {len(data.codes)} states x {data.x.shape[1]} windows, 6 months in -> 6 out "
                    f"(2008-01..2019-12, min-max scaled from {data.temp_min_f:.1f}..{data.temp_max_f:.1f} deg F); "
                    f"graph = {len(data.edges)} shared state borders; split {cfg.split_mode}")


REGISTRY = (DatasetInfo("tpt48", "TPT-48 monthly temperatures of 48 US states, 6-month-ahead regression, "
                        "state-border graph", "regression", build),)
