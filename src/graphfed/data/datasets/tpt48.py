"""TPT-48: monthly average temperature of the 48 contiguous US states, one client per state.

Paper protocol (Panacea, after VDI): months 2008-01..2019-12 (144 months), min-max scaled to [0, 1] over
the whole 48 x 144 table, cut into sliding windows of 12 consecutive months where the first 6 months are
the input and the next 6 the target, which gives 144 - 12 + 1 = 133 windows per state. The client graph
is state adjacency (shared border), 105 undirected edges.

Two layouts are read: this project's CSV table (``tpt48_monthly_tavg_F_1895-2019.csv`` with
``tpt48_adjacency_edges.csv``), or NOAA's published nClimDiv statewide file (``climdiv-tmpcst-v1.0.0-YYYYMMDD``,
what ``graphfed data fetch tpt48`` downloads) with the built-in border list. Both give the same arrays.
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
#: NOAA's statewide monthly mean temperature file; the suffix is the date NOAA processed it (``procdate.txt``)
NCLIMDIV_PATTERN = "climdiv-tmpcst-v*"
FIRST_MONTH = "2008-01"
LAST_MONTH = "2019-12"
WINDOW = 12  # months per sample: input then target
HORIZON = 6  # months predicted

_MONTH = re.compile(r"^(\d{4})-(\d{2})$")

#: the 48 contiguous states in NOAA's state-code order (nClimDiv codes 001..048)
NOAA_STATES = ["AL", "AZ", "AR", "CA", "CO", "CT", "DE", "FL", "GA", "ID", "IL", "IN", "IA", "KS", "KY", "LA",
               "ME", "MD", "MA", "MI", "MN", "MS", "MO", "MT", "NE", "NV", "NH", "NJ", "NM", "NY", "NC", "ND",
               "OH", "OK", "OR", "PA", "RI", "SC", "SD", "TN", "TX", "UT", "VT", "VA", "WA", "WV", "WI", "WY"]
#: shared state borders (the graph VDI and Panacea use; the edge order of VDI's ``tpt48_adjacency_edges.csv``)
_BORDERS = """
AL-FL AL-GA AL-MS AL-TN AR-LA AR-MO AR-MS AR-OK AR-TN AR-TX AZ-CA AZ-NM AZ-NV AZ-UT CA-NV CA-OR CO-KS CO-NE
CO-NM CO-OK CO-UT CO-WY CT-MA CT-NY CT-RI DE-MD DE-NJ DE-PA FL-GA GA-NC GA-SC GA-TN IA-IL IA-MN IA-MO IA-NE
IA-SD IA-WI ID-MT ID-NV ID-OR ID-UT ID-WA ID-WY IL-IN IL-KY IL-MO IL-WI IN-KY IN-MI IN-OH KS-MO KS-NE KS-OK
KY-MO KY-OH KY-TN KY-VA KY-WV LA-MS LA-TX MA-NH MA-NY MA-RI MA-VT MD-PA MD-VA MD-WV ME-NH MI-OH MI-WI MN-ND
MN-SD MN-WI MO-NE MO-OK MO-TN MS-TN MT-ND MT-SD MT-WY NC-SC NC-TN NC-VA ND-SD NE-SD NE-WY NH-VT NJ-NY NJ-PA
NM-OK NM-TX NV-OR NV-UT NY-PA NY-VT OH-PA OH-WV OK-TX OR-WA PA-WV SD-WY TN-VA UT-WY VA-WV"""
STATE_BORDERS = [tuple(pair.split("-")) for pair in _BORDERS.split()]
_NCLIMDIV_LINE = re.compile(r"^(\d{3})(\d)(\d{2})(\d{4})((?:\s*-?\d+\.\d+){12})\s*$")
_MISSING = -99.9  # nClimDiv's missing value (-99.90)


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


def read_nclimdiv(path: Path, first: str = FIRST_MONTH,
                  last: str = LAST_MONTH) -> tuple[list[str], np.ndarray]:
    """NOAA's nClimDiv statewide temperature file as ``read_temperatures`` returns the CSV: (state codes in NOAA
    order, deg F [48, months]). Each line is ``SSSDEEYYYY`` (state, division 0 = statewide, element 02 = mean
    temperature, year) then 12 monthly values; other states and regions (049 and up) are skipped."""
    require_file(path, "TPT-48 nClimDiv file", FOLDER)
    months = _month_range(first, last)
    first_year, last_year = int(first[:4]), int(last[:4])
    years = range(first_year, last_year + 1)
    by_state: dict[int, dict[int, list[float]]] = {}
    with path.open(encoding="ascii", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            match = _NCLIMDIV_LINE.match(line.rstrip("\n"))
            if match is None:
                raise ValueError(f"{path}: line {number} is not an nClimDiv record (SSSDEEYYYY and 12 values): "
                                 f"{line[:40].rstrip()!r}")
            state, division, element, year = (int(match.group(k)) for k in range(1, 5))
            if element != 2:
                raise ValueError(f"{path}: line {number} holds element {element:02d}, not 02 (mean temperature); "
                                 f"this is not a climdiv-tmpcst file")
            if 1 <= state <= len(NOAA_STATES) and division == 0 and year in years:
                by_state.setdefault(state, {})[year] = [float(value) for value in match.group(5).split()]
    table = np.empty((len(NOAA_STATES), len(months)), dtype=np.float64)
    offset = _month_index(first) - first_year * 12
    for state in range(1, len(NOAA_STATES) + 1):
        code = NOAA_STATES[state - 1]
        rows = by_state.get(state, {})
        absent = [year for year in years if year not in rows]
        if absent:
            raise ValueError(f"{path}: state {state:03d} ({code}) has no record for {absent[0]}..{absent[-1]}")
        values = np.array([rows[year] for year in years]).reshape(-1)[offset:offset + len(months)]
        if np.any(values <= _MISSING):
            month = months[int(np.argmax(values <= _MISSING))]
            raise ValueError(f"{path}: state {state:03d} ({code}) is missing {month} (-99.90)")
        table[state - 1] = values
    return list(NOAA_STATES), table


def nclimdiv_file(folder: Path) -> Path | None:
    """The newest NOAA nClimDiv statewide file in ``folder`` (the names sort by NOAA's processing date)."""
    found = sorted(path for path in folder.glob(NCLIMDIV_PATTERN) if path.is_file() and path.suffix != ".part")
    return found[-1] if found else None


def border_edges(codes: Sequence[str]) -> np.ndarray:
    """:data:`STATE_BORDERS` as row indices of ``codes``; [105, 2] int64."""
    index = {code: i for i, code in enumerate(codes)}
    absent = sorted({code for pair in STATE_BORDERS for code in pair} - set(index))
    if absent:
        raise ValueError(f"the built-in state borders need every contiguous state; the table lacks {absent} "
                         f"(or give {EDGES_FILE})")
    return np.asarray([(index[a], index[b]) for a, b in STATE_BORDERS], dtype=np.int64)


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
    """Load TPT-48 from ``<data_dir>/tpt48``, scaled and windowed (see the module docstring): this project's CSV
    table when it is there, else NOAA's nClimDiv file; the CSV edge list when it is there, else the built-in
    borders."""
    folder = Path(data_dir) / FOLDER
    if not folder.is_dir():
        raise missing_data("TPT-48 data folder", folder, FOLDER)
    temp_path = folder / TEMPERATURE_FILE
    noaa_path = None if temp_path.is_file() else nclimdiv_file(folder)
    if noaa_path is not None:
        temp_path = noaa_path
        codes, temps = read_nclimdiv(noaa_path)
    elif temp_path.is_file():
        codes, temps = read_temperatures(temp_path)
    else:
        raise missing_data("TPT-48 temperatures", temp_path, FOLDER,
                           f" with {TEMPERATURE_FILE} or NOAA's {NCLIMDIV_PATTERN} file (graphfed data fetch tpt48)")
    lo, hi = float(temps.min()), float(temps.max())
    if hi <= lo:
        raise ValueError(f"{temp_path}: temperatures are constant over {FIRST_MONTH}..{LAST_MONTH}")
    scaled = (temps - lo) / (hi - lo)
    if not np.all(np.isfinite(scaled)):
        raise ValueError(f"{temp_path}: temperatures span {lo:g}..{hi:g}, too wide to scale")
    x, y = sliding_windows(scaled)
    edges_path = folder / EDGES_FILE
    edges = read_edges(edges_path, codes) if edges_path.is_file() else border_edges(codes)
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
