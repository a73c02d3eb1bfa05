"""Bring your own federation: a directory of per-client splits, an optional client graph and meta.yaml.

The format (docs/how-to/own-federation.md)::

    my_federation/
      meta.yaml                  optional: task, metric, name, description, features, target
      graph.csv                  optional: header src,dst[,weight]; client ids as in clients/
      clients/<client_id>/train.npz, val.npz, test.npz      arrays x (features) and y (targets)
                 or        train.csv, val.csv, test.csv      a header naming feature and target columns

``read_federation_folder`` validates the whole directory before anything is built and raises
``FederationFormatError`` naming the file (and the line or row) of the first problem it finds, so a bad folder
never gets half-way into a run. ``load_federation`` then stores the validated arrays in a ``Federation``.
``write_federation`` writes the format and ``write_example_federation`` a small ready-made federation to try.
"""

from __future__ import annotations

import csv
import math
import os
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from numpy.typing import ArrayLike

from graphfed.config import ConfigError, DatasetConfig, printable, read_yaml
from graphfed.data.federation import ClientSplit, Federation, Task
from graphfed.data.graphs import choose_novel_clients, edges_to_adjacency
from graphfed.data.registry import DatasetInfo, Streams
from graphfed.errors import DataError

Metric = Literal["accuracy", "mse"]

SPLITS: tuple[str, str, str] = ("train", "val", "test")
META_FILE = "meta.yaml"
GRAPH_FILE = "graph.csv"
CLIENTS_DIR = "clients"
META_KEYS: tuple[str, ...] = ("task", "metric", "name", "description", "features", "target", "target_scale",
                               "target_units", "classes", "metrics", "select_by")
TASK_METRIC: dict[str, Metric] = {"classification": "accuracy", "regression": "mse"}
METRIC_TASK: dict[str, Task] = {"accuracy": "classification", "mse": "regression"}
DEFAULT_TARGET = "y"  # the CSV target column when meta.yaml names none
AMBIGUOUS_TASK = "warning: "  # how a task reason starts where the data could be read as either task
GRAPH_HEADERS = (["src", "dst"], ["src", "dst", "weight"])
_LISTED = 8  # names an error message lists before "..."; a 3,000-client federation must still give one line


class FederationFormatError(DataError):
    """A federation folder that cannot be loaded. The one-line message names the file (and line or row)."""


@dataclass(frozen=True)
class FolderMeta:
    """The contents of meta.yaml; every field optional."""

    task: Task | None = None
    metric: Metric | None = None
    name: str | None = None
    description: str | None = None
    features: tuple[str, ...] | None = None  # CSV feature columns, in this order; None = all but the target
    target: str = DEFAULT_TARGET  # CSV target column
    #: regression: one unit of the stored target in the data's own units (MAE is reported in them too)
    target_scale: float | None = None
    target_units: str | None = None  # the name of those units (e.g. "µg/m³"), for the description
    #: the metrics this federation is judged by besides accuracy / MSE (``train.metrics`` when the config names
    #: none), and the one that picks the reported round (``train.select_by``); checked against the task by the engine
    metrics: tuple[str, ...] = ()
    select_by: str | None = None
    #: classification: the name of each label, label k's at index k (what predictions and exports answer with)
    classes: tuple[str, ...] | None = None


@dataclass
class SplitArrays:
    """One client's split as read from disk (float32 features, raw targets), before cross-client checks."""

    path: Path
    x: np.ndarray  # [rows, *feature_shape] float32
    y: np.ndarray  # [rows, *target_shape] as stored
    y_integer: bool  # labels stored as integers (npz: integer dtype; CSV: every value an integer literal)
    lines: np.ndarray | None = None  # CSV: 1-based file line of each row; None for npz (rows are array indices)
    columns: tuple[str, ...] | None = None  # CSV feature column names

    def at(self, row: int, array: str) -> str:
        """Where a row lives, in the user's terms: ``line 7`` of a CSV, ``x[5]`` of an npz."""
        return f"{array}[{row}]" if self.lines is None else f"line {int(self.lines[row])}"


@dataclass
class FolderFederation:
    """A validated federation folder: per-split arrays in client order, not stored in a federation yet."""

    root: Path
    meta: FolderMeta
    client_ids: list[str]
    splits: dict[str, list[SplitArrays]]  # split name -> one entry per client, in client_ids order
    task: Task
    metric: Metric
    input_shape: tuple[int, ...]
    output_dim: int  # classes, or flattened target size
    edges: np.ndarray | None  # [E, 2] int64 client indices; None = no graph.csv
    weights: np.ndarray | None  # [E] float32
    #: why the folder is read as its task, in words (meta.yaml, integer labels, or float targets), with how to
    #: declare the other; it starts with "warning:" where the data could be read either way
    task_reason: str = ""
    #: the feature columns' names (meta.yaml ``features``, else the CSV header), None for npz without meta.yaml
    feature_names: tuple[str, ...] | None = None


def _error(where: Path | str, message: str) -> FederationFormatError:
    # Names come from the user's files: escape control characters so the message stays one printable line.
    return FederationFormatError(printable(f"{where}: {message}"))


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _LISTED else "")


def natural_key(name: str) -> tuple[tuple[int | str, ...], str]:
    """Sort key putting ``client2`` before ``client10`` and ``9`` before ``10``; ties fall back to the text.

    ``re.split`` with a capturing group alternates text and digit runs, so parts compare str-to-str and
    int-to-int at every position.
    """
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


# ---- meta.yaml --------------------------------------------------------------------------------------------


def read_meta(root: Path) -> FolderMeta:
    path = root / META_FILE
    if not path.exists():
        return FolderMeta()
    try:
        data = read_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise _error(path, f"not valid YAML ({_first_line(err)})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise _error(path, f"cannot be read ({_first_line(err)})") from None
    if data is None:
        return FolderMeta()
    if not isinstance(data, dict):
        raise _error(path, f"the top level must be a mapping of keys; allowed: {', '.join(META_KEYS)}")
    for key in data:
        if key not in META_KEYS:
            raise _error(path, f"unknown key {key!r}; allowed: {', '.join(META_KEYS)}")
    task, metric = data.get("task"), data.get("metric")
    if task is not None and task not in TASK_METRIC:
        raise _error(path, f"task must be classification or regression, got {task!r}")
    if metric is not None and metric not in METRIC_TASK:
        raise _error(path, f"metric must be accuracy or mse, got {metric!r}")
    if task is not None and metric is not None and TASK_METRIC[task] != metric:
        # The engine scores classification by accuracy and regression by MSE; any other pairing would mislabel.
        raise _error(path, f"metric {metric!r} does not fit task {task!r} (use {TASK_METRIC[task]!r})")
    for key in ("name", "description", "target"):
        if data.get(key) is not None and (not isinstance(data[key], str) or not data[key].strip()):
            raise _error(path, f"{key} must be a non-empty string, got {data[key]!r}")
    features = data.get("features")
    if features is not None:
        if (not isinstance(features, list) or not features
                or not all(isinstance(f, str) and f.strip() for f in features)):
            raise _error(path, f"features must be a non-empty list of column names, got {features!r}")
        if len(set(features)) != len(features):
            raise _error(path, "features lists a column twice")
    target = data.get("target") or DEFAULT_TARGET
    if features is not None and target in features:
        raise _error(path, f"the target column {target!r} is also listed in features")
    scale = data.get("target_scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0
                              or scale == float("inf")):
        raise _error(path, f"target_scale must be a positive number (data units per stored unit), got {scale!r}")
    units = data.get("target_units")
    if units is not None and not (isinstance(units, str) and units.strip()):
        raise _error(path, f"target_units must be text, e.g. mph, got {units!r}")
    if (scale is not None or units is not None) and (task == "classification" or metric == "accuracy"):
        raise _error(path, "target_scale / target_units apply to regression targets only")
    metrics = data.get("metrics") or []
    if not (isinstance(metrics, list) and all(isinstance(m, str) and m.strip() for m in metrics)):
        raise _error(path, f"metrics must be a list of metric names (e.g. [auroc, macro_f1]), got {metrics!r}")
    select_by = data.get("select_by")
    if select_by is not None and not (isinstance(select_by, str) and select_by.strip()):
        raise _error(path, f"select_by must be a metric name, got {select_by!r}")
    classes = data.get("classes")
    if classes is not None:
        if (not isinstance(classes, list) or len(classes) < 2
                or not all(isinstance(c, str | int) and str(c).strip() for c in classes)):
            raise _error(path, f"classes must be a list of at least two class names (label k's at position k), got "
                               f"{classes!r}")
        if len({str(c) for c in classes}) != len(classes):
            raise _error(path, "classes names a class twice")
        if task == "regression" or metric == "mse":
            raise _error(path, "classes apply to classification labels only")
    # A metric alone settles the task: metric mse means the targets are regression targets.
    resolved_task: Task | None = task if task is not None else (METRIC_TASK[metric] if metric is not None else None)
    return FolderMeta(task=resolved_task, metric=metric, name=data.get("name"), description=data.get("description"),
                      features=tuple(features) if features is not None else None, target=target,
                      target_scale=None if scale is None else float(scale), target_units=units,
                      metrics=tuple(metrics), select_by=select_by,
                      classes=tuple(str(c) for c in classes) if classes is not None else None)


# ---- clients/ and the split files ---------------------------------------------------------------------------


def _client_ids(root: Path) -> list[str]:
    if not root.is_dir():
        raise _error(root, "federation folder not found (or not a directory)")
    clients = root / CLIENTS_DIR
    if not clients.is_dir():
        raise _error(clients, "missing; expected one folder per client: clients/<client_id>/train.npz, val.npz, "
                              "test.npz (or .csv)")
    # Hidden entries (.DS_Store, .ipynb_checkpoints) are tool litter, not clients.
    entries = sorted((p for p in clients.iterdir() if not p.name.startswith(".")), key=lambda p: p.name)
    for entry in entries:
        if printable(entry.name) != entry.name:
            raise _error(entry, "client folder names must not hold control characters")
    for entry in entries:
        if not entry.is_dir():
            raise _error(entry, "not a folder; clients/ holds one folder per client")
    if not entries:
        raise _error(clients, "no client folders; expected clients/<client_id>/train.npz, val.npz, test.npz "
                              "(or .csv)")
    return sorted((p.name for p in entries), key=natural_key)


def _split_file(client_dir: Path, split: str) -> Path:
    npz, table = client_dir / f"{split}.npz", client_dir / f"{split}.csv"
    if npz.is_file() and table.is_file():
        raise _error(client_dir, f"both {split}.npz and {split}.csv; keep one")
    if npz.is_file():
        return npz
    if table.is_file():
        return table
    raise _error(npz, f"missing {split} split (no {split}.npz or {split}.csv); every client needs "
                      f"train, val and test")


def _check_npz_member(path: Path, archive: np.lib.npyio.NpzFile, name: str) -> None:
    """Read only the .npy header of ``name`` and refuse a shape its stored bytes cannot hold (a header claiming
    10^12 rows would otherwise allocate terabytes before anything fails)."""
    member = f"{name}.npy"
    try:
        with archive.zip.open(member) as handle:
            version = np.lib.format.read_magic(handle)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(handle)
        stored = archive.zip.getinfo(member).file_size
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise _error(path, f"cannot read the header of array {name} ({_first_line(err)})") from None
    needed = math.prod(shape) * dtype.itemsize
    if needed > stored:
        raise _error(path, f"array {name} claims shape {tuple(shape)} ({needed:,} bytes) but the archive stores "
                           f"{stored:,} bytes for it")


def _read_npz(path: Path) -> SplitArrays:
    try:
        archive = np.load(path, allow_pickle=False)  # never unpickle: the folder may come from anyone
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise _error(path, f"not a readable .npz archive ({_first_line(err)})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise _error(path, "holds a single array, not an .npz archive with arrays x and y (write it with np.savez)")
    with archive:
        if "x" not in archive.files or "y" not in archive.files:
            raise _error(path, f"needs arrays 'x' and 'y', found {', '.join(archive.files) or 'none'}")
        for name in ("x", "y"):
            _check_npz_member(path, archive, name)
        try:
            x, y = archive["x"], archive["y"]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise _error(path, f"cannot read its arrays ({_first_line(err)})") from None
    for name, array in (("x", x), ("y", y)):
        if array.dtype.kind not in "biuf":
            raise _error(path, f"{name} has dtype {array.dtype}; it must be numeric")
        if array.ndim == 0:
            raise _error(path, f"{name} is a scalar; it needs one row per sample")
    if len(x) != len(y):
        raise _error(path, f"x has {len(x)} rows but y has {len(y)}")
    # One feature per sample may be saved as a vector; give it its feature axis.
    x = x.reshape(len(x), 1) if x.ndim == 1 else x
    return SplitArrays(path, x.astype(np.float32), y, y_integer=y.dtype.kind in "biu")


def _read_csv(path: Path, meta: FolderMeta) -> SplitArrays:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = [h.strip() for h in next(reader, [])]
            if not header:
                raise _error(path, "empty; expected a header row naming the feature and target columns")
            duplicated = sorted({h for h in header if header.count(h) > 1})
            if duplicated:
                raise _error(path, f"line 1: column(s) {', '.join(duplicated)} appear twice")
            if meta.target not in header:
                raise _error(path, f"line 1: no target column {meta.target!r} (columns: {', '.join(header)}); "
                                   f"name it in meta.yaml 'target'")
            features = list(meta.features) if meta.features is not None else [h for h in header if h != meta.target]
            missing = [f for f in features if f not in header]
            if missing:
                raise _error(path, f"line 1: no column(s) {', '.join(missing)} (listed in meta.yaml features)")
            if not features:
                raise _error(path, "line 1: no feature columns besides the target")
            cols, target_col = [header.index(f) for f in features], header.index(meta.target)
            rows: list[list[float]] = []
            targets: list[int | float] = []
            lines: list[int] = []
            y_integer = True
            for record in reader:
                if not any(cell.strip() for cell in record):
                    continue  # blank lines (e.g. a trailing one) carry no sample
                line = reader.line_num
                if len(record) != len(header):
                    raise _error(path, f"line {line}: {len(record)} fields, the header has {len(header)}")
                values: list[float] = []
                for name, col in zip(features, cols, strict=True):
                    try:
                        values.append(float(record[col]))
                    except ValueError:
                        raise _error(path, f"line {line}: column {name!r} is not a number: {record[col]!r}") from None
                raw = record[target_col].strip()
                target: int | float
                try:
                    target = int(raw)
                except ValueError:
                    try:
                        target = float(raw)
                    except ValueError:
                        raise _error(path, f"line {line}: target {meta.target!r} is not a number: {raw!r}"
                                           ) from None
                    y_integer = False
                rows.append(values)
                targets.append(target)
                lines.append(line)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise _error(path, f"cannot be read as CSV ({_first_line(err)})") from None
    x = np.asarray(rows, dtype=np.float32).reshape(len(rows), len(features))
    y = np.asarray(targets, dtype=np.int64 if y_integer else np.float64)
    return SplitArrays(path, x, y, y_integer=y_integer, lines=np.asarray(lines, dtype=np.int64),
                       columns=tuple(features))


def _check_rows(arrays: SplitArrays) -> None:
    """Checks that need only this file: some rows, some features, finite features (in float32, as trained),
    finite targets (float32 too)."""
    if len(arrays.x) == 0:
        raise _error(arrays.path, "no rows; every split of every client needs at least one")
    if arrays.x[0].size == 0:
        raise _error(arrays.path, f"x rows have shape {tuple(arrays.x.shape[1:])}: no features")
    if arrays.y.ndim > 1 and arrays.y[0].size == 0:
        raise _error(arrays.path, f"y rows have shape {tuple(arrays.y.shape[1:])}: no targets")
    finite = np.isfinite(arrays.x.reshape(len(arrays.x), -1))
    bad_rows = np.flatnonzero(~finite.all(axis=1))
    if len(bad_rows):
        row = int(bad_rows[0])
        column = (f" (column {arrays.columns[int(np.argmin(finite[row]))]!r})"
                  if arrays.columns is not None else "")
        raise _error(arrays.path, f"{arrays.at(row, 'x')}: features hold NaN or Inf{column}")
    if arrays.y.dtype.kind == "f":
        with np.errstate(over="ignore"):
            as_trained = arrays.y.astype(np.float32)
        bad_targets = np.flatnonzero(~np.isfinite(as_trained.reshape(len(arrays.y), -1)).all(axis=1))
        if len(bad_targets):
            raise _error(arrays.path, f"{arrays.at(int(bad_targets[0]), 'y')}: target is NaN or Inf, or beyond "
                                      f"float32's range (about 3.4e38)")


def _check_labels(arrays: SplitArrays) -> np.ndarray:
    """Classification labels as int64, or an error naming the first bad row."""
    y = arrays.y
    if y.ndim != 1:
        raise _error(arrays.path, f"y has shape {tuple(y.shape)}; classification needs one integer label per "
                                  f"row (shape [rows]), or set task: regression in meta.yaml")
    if not arrays.y_integer:
        fractional = np.flatnonzero(y != np.round(y))
        if len(fractional):
            row = int(fractional[0])
            raise _error(arrays.path, f"{arrays.at(row, 'y')}: label {y[row]!r} is not an integer; classification "
                                      f"needs labels 0..C-1 (or set task: regression in meta.yaml)")
    labels = y.astype(np.int64)
    negative = np.flatnonzero(labels < 0)
    if len(negative):
        row = int(negative[0])
        raise _error(arrays.path, f"{arrays.at(row, 'y')}: label {int(labels[row])} is negative; classification "
                                  f"needs labels 0..C-1")
    return labels


# ---- graph.csv ----------------------------------------------------------------------------------------------


def _read_graph(root: Path, client_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(edges [E, 2] client indices, weights [E]) from graph.csv, or None when there is no graph.csv."""
    path = root / GRAPH_FILE
    if not path.exists():
        return None
    index = {cid: i for i, cid in enumerate(client_ids)}
    edges: dict[tuple[int, int], tuple[float, int]] = {}  # undirected edge -> (weight, line that gave it)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = [h.strip().lower() for h in next(reader, [])]
            if header not in GRAPH_HEADERS:
                raise _error(path, f"line 1: header must be 'src,dst' or 'src,dst,weight', got {','.join(header)!r}")
            for record in reader:
                if not any(cell.strip() for cell in record):
                    continue
                line = reader.line_num
                if len(record) != len(header):
                    raise _error(path, f"line {line}: {len(record)} fields, the header has {len(header)}")
                ends = [record[0].strip(), record[1].strip()]
                for cid in ends:
                    if cid not in index:
                        raise _error(path, f"line {line}: unknown client {cid!r}; clients are "
                                           f"{_listing(list(client_ids))}")
                weight = 1.0
                if len(header) == 3:
                    try:
                        weight = float(record[2])
                    except ValueError:
                        raise _error(path, f"line {line}: weight is not a number: {record[2]!r}") from None
                    if not math.isfinite(weight) or abs(weight) > float(np.finfo(np.float32).max) or weight <= 0:
                        raise _error(path, f"line {line}: weight must be finite and > 0, got {record[2].strip()}")
                i, j = index[ends[0]], index[ends[1]]
                if i == j:
                    continue  # the client graph has a zero diagonal: a self-loop carries nothing
                key = (min(i, j), max(i, j))
                if key in edges and edges[key][0] != weight:
                    # The graph is symmetrised, so a-b and b-a are one edge; two weights for it is a contradiction.
                    raise _error(path, f"line {line}: edge {ends[0]}-{ends[1]} has weight {weight:g}, but line "
                                       f"{edges[key][1]} gave it {edges[key][0]:g}")
                edges.setdefault(key, (weight, line))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise _error(path, f"cannot be read as CSV ({_first_line(err)})") from None
    pairs = np.asarray(sorted(edges), dtype=np.int64).reshape(-1, 2)
    weights = np.asarray([edges[key][0] for key in sorted(edges)], dtype=np.float32)
    return pairs, weights


# ---- the whole folder ---------------------------------------------------------------------------------------


def read_federation_folder(root: str | Path) -> FolderFederation:
    """Read and validate a federation folder; raise ``FederationFormatError`` on the first problem.

    Order: meta.yaml, clients/ and every split file's presence, graph.csv (cheap checks first, so a typo
    fails before gigabytes are read), then every split file, then the checks across clients.
    """
    root = Path(root).expanduser()
    client_ids = _client_ids(root)
    meta = read_meta(root)
    files = {split: [_split_file(root / CLIENTS_DIR / cid, split) for cid in client_ids] for split in SPLITS}
    graph = _read_graph(root, client_ids)

    splits: dict[str, list[SplitArrays]] = {}
    for split in SPLITS:
        splits[split] = [_read_npz(path) if path.suffix == ".npz" else _read_csv(path, meta) for path in files[split]]
        for arrays in splits[split]:
            _check_rows(arrays)
    everything = [arrays for split in SPLITS for arrays in splits[split]]

    reference = everything[0]
    for arrays in everything[1:]:
        if arrays.columns is not None and reference.columns is not None and arrays.columns != reference.columns:
            raise _error(arrays.path, f"feature columns {', '.join(arrays.columns)} differ from {reference.path}'s "
                                      f"{', '.join(reference.columns)}; list the columns in meta.yaml features")
        if arrays.x.shape[1:] != reference.x.shape[1:]:
            raise _error(arrays.path, f"x rows have shape {tuple(arrays.x.shape[1:])}, but {reference.path} has "
                                      f"{tuple(reference.x.shape[1:])}; every client needs the same features")

    # Integer targets mean labels unless meta.yaml says otherwise: the common case needs no meta.yaml.
    task: Task = meta.task or ("classification" if all(a.y_integer for a in everything) else "regression")
    task_reason = _task_reason(meta, everything, task)
    if meta.classes is not None and task == "regression":
        raise _error(root / META_FILE, f"classes name class labels, but the targets read as regression targets "
                                       f"({task_reason.removeprefix(AMBIGUOUS_TASK).split(';')[0]}); set task: "
                                       f"classification")
    if task == "classification":
        for arrays in everything:
            arrays.y = _check_labels(arrays)
        output_dim = max(int(arrays.y.max()) for arrays in everything) + 1
        labelled = sum(len(arrays.y) for arrays in everything)
        if output_dim > labelled:
            # Classes are 0..C-1 with C = largest label + 1; one stray huge label would allocate C-wide outputs.
            worst = max(everything, key=lambda arrays: int(arrays.y.max()))
            raise _error(worst.path, f"label {output_dim - 1} means {output_dim:,} classes for {labelled:,} labelled "
                                     f"rows; labels must be 0..C-1")
        if meta.classes is not None:
            if output_dim > len(meta.classes):
                worst = max(everything, key=lambda arrays: int(arrays.y.max()))
                raise _error(worst.path, f"label {output_dim - 1}, but meta.yaml names {len(meta.classes)} classes "
                                         f"(labels 0..{len(meta.classes) - 1})")
            output_dim = len(meta.classes)  # a class no client holds yet is still a class the model answers
        if output_dim < 2:
            raise _error(root / CLIENTS_DIR, "every label is 0; classification needs at least two classes")
    else:
        for arrays in everything:
            if arrays.y.shape[1:] != reference.y.shape[1:]:
                raise _error(arrays.path, f"y rows have shape {tuple(arrays.y.shape[1:])}, but {reference.path} "
                                          f"has {tuple(reference.y.shape[1:])}; every client needs the same targets")
            arrays.y = arrays.y.astype(np.float32)
        output_dim = math.prod(reference.y.shape[1:])

    return FolderFederation(
        root=root, meta=meta, client_ids=client_ids, splits=splits, task=task, metric=TASK_METRIC[task],
        input_shape=tuple(int(d) for d in reference.x.shape[1:]), output_dim=output_dim,
        edges=graph[0] if graph is not None else None, weights=graph[1] if graph is not None else None,
        task_reason=task_reason, feature_names=meta.features if meta.features is not None else reference.columns)


def _task_reason(meta: FolderMeta, everything: list[SplitArrays], task: Task) -> str:
    """Why the folder is read as ``task``: what a user needs to see when the data could be read either way
    (labels 0.0 / 1.0 stored as floats read as regression targets)."""
    if meta.task is not None:
        return f"{task}: meta.yaml says so"
    if task == "classification":
        return ("classification: every target is an integer (labels 0..C-1); set task: regression in meta.yaml to "
                "read them as numbers")
    floats = next(arrays for arrays in everything if not arrays.y_integer)
    kind = f"dtype {floats.y.dtype}" if floats.lines is None else "a decimal point or exponent"
    whole = all(np.array_equal(arrays.y, np.round(arrays.y)) for arrays in everything)
    values = np.unique(np.concatenate([np.ravel(arrays.y) for arrays in everything])) if whole else None
    if whole and values is not None and len(values) <= 20:
        shown = ", ".join(f"{v:g}" for v in values[:8]) + (", ..." if len(values) > 8 else "")
        return (f"{AMBIGUOUS_TASK}regression: the targets are stored as floats ({floats.path.name}: {kind}), though "
                f"they take only the whole values {shown}; if they are class labels, set task: classification in "
                f"meta.yaml")
    return (f"regression: the targets are stored as floats ({floats.path.name}: {kind}); set task: classification "
            f"in meta.yaml if they are class labels")


def folder_to_federation(folder: FolderFederation, novel_fraction: float = 0.0,
                         rng: np.random.Generator | None = None) -> Federation:
    """Store a validated folder in a ``Federation``; ``rng`` picks the novel clients."""
    n = len(folder.client_ids)
    train, val, test = (ClientSplit.from_lists([a.x for a in folder.splits[s]], [a.y for a in folder.splits[s]],
                                               folder.task) for s in SPLITS)
    graph = None
    if folder.edges is not None:
        graph = edges_to_adjacency(folder.edges, n, folder.weights)
    novel = choose_novel_clients(n, novel_fraction, rng if rng is not None else np.random.default_rng(0))
    edges_text = f"{len(folder.edges)} graph edges" if folder.edges is not None else "no graph"
    description = folder.meta.description or (f"federation folder {folder.root}: {n} clients, {folder.task}, "
                                              f"{edges_text}")
    return Federation(name=folder.meta.name or folder.root.resolve().name, task=folder.task, train=train, val=val,
                      test=test, input_shape=folder.input_shape, output_dim=folder.output_dim, client_graph=graph,
                      novel_mask=novel, client_names=list(folder.client_ids), metric=folder.metric,
                      description=description + (f"; targets in {folder.meta.target_units}"
                                                 if folder.meta.target_units else ""),
                      target_scale=folder.meta.target_scale if folder.task == "regression" else None,
                      target_units=folder.meta.target_units if folder.task == "regression" else None,
                      feature_names=list(folder.feature_names) if folder.feature_names else None,
                      class_names=list(folder.meta.classes) if folder.meta.classes and folder.task == "classification"
                      else None, task_reason=folder.task_reason,
                      default_metrics=folder.meta.metrics, default_select_by=folder.meta.select_by)


def load_federation(root: str | Path, novel_fraction: float = 0.0,
                    rng: np.random.Generator | None = None) -> Federation:
    """Validate the folder at ``root`` and build its ``Federation`` (raises ``FederationFormatError``)."""
    return folder_to_federation(read_federation_folder(root), novel_fraction, rng)


def build(cfg: DatasetConfig, streams: Streams) -> Federation:
    """``dataset.name: folder``: ``dataset.data_dir`` is the federation folder itself.

    The folder fixes the clients and their splits, so ``partition``/``split``/``split_mode`` do not apply;
    ``num_clients``, when set, must match the folder (a silent mismatch would mislabel a sweep). A bad folder is
    bad input like a bad config: one line naming the file.
    """
    try:
        return folder_federation(cfg)
    except FederationFormatError as err:
        raise ConfigError(f"dataset.data_dir: {err}") from None


def folder_federation(cfg: DatasetConfig) -> Federation:
    """The federation folder ``dataset.data_dir`` (raises ``FederationFormatError``)."""
    if not cfg.data_dir:
        raise ConfigError("dataset.data_dir: dataset 'folder' needs dataset.data_dir set to the federation folder "
                          "(e.g. dataset.data_dir=path/to/my_federation)")
    folder = read_federation_folder(cfg.data_dir)
    if cfg.num_clients is not None and cfg.num_clients != len(folder.client_ids):
        raise ConfigError(f"dataset.num_clients: the folder {folder.root} has {len(folder.client_ids)} clients, "
                          f"got {cfg.num_clients} (leave num_clients unset for a folder)")
    return folder_to_federation(folder)  # build_federation chooses the novel clients, as for every dataset


# The task listed is only the default: a folder's meta.yaml (or float targets) makes it regression.
REGISTRY = (DatasetInfo("folder", "your own federation folder (dataset.data_dir = the folder): per-client "
                        "train/val/test npz or CSV, optional graph.csv and meta.yaml; classification or regression "
                        "as the folder says (docs: how-to/own-federation.md)", "classification", build),)


# ---- writing the format -------------------------------------------------------------------------------------


def _write_csv(path: Path, x: np.ndarray, y: np.ndarray, features: Sequence[str] | None, target: str) -> None:
    x = x.reshape(len(x), -1)
    names = list(features) if features is not None else [f"x{j}" for j in range(x.shape[1])]
    if len(names) != x.shape[1]:
        raise ValueError(f"{path}: {x.shape[1]} feature columns but {len(names)} feature names")
    if y.ndim != 1:
        raise ValueError(f"{path}: the CSV form holds one target column; y has shape {tuple(y.shape)} (use npz)")
    integer = y.dtype.kind in "biu"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator=os.linesep)  # the platform's line ends, not csv's \r\n
        writer.writerow([*names, target])
        for row, label in zip(x, y, strict=True):
            # repr() of a Python float round-trips exactly, so CSV and npz forms load to identical tensors.
            writer.writerow([*(repr(float(v)) for v in row), str(int(label)) if integer else repr(float(label))])


def write_federation(root: str | Path, clients: Mapping[str, Mapping[str, tuple[ArrayLike, ArrayLike]]],
                     graph: Iterable[tuple[str, str] | tuple[str, str, float]] | None = None,
                     meta: Mapping[str, Any] | None = None, fmt: Literal["npz", "csv"] = "npz") -> Path:
    """Write ``clients`` (id -> split -> (x, y)) in the folder format; returns the folder.

    ``graph`` edges become graph.csv (a weight column when any edge has a third item), ``meta`` meta.yaml. It
    writes what it is given without validating, so it can also produce broken folders for tests; use
    ``read_federation_folder`` to check the result.
    """
    root = Path(root).expanduser()
    (root / CLIENTS_DIR).mkdir(parents=True, exist_ok=True)
    if meta is not None:
        (root / META_FILE).write_text(yaml.safe_dump(dict(meta), sort_keys=False, allow_unicode=True),
                                      encoding="utf-8")
    features = meta.get("features") if meta is not None else None
    target = str(meta.get("target", DEFAULT_TARGET)) if meta is not None else DEFAULT_TARGET
    for cid, splits in clients.items():
        client_dir = root / CLIENTS_DIR / cid
        client_dir.mkdir(parents=True, exist_ok=True)
        for split, (x, y) in splits.items():
            if fmt == "npz":
                np.savez(client_dir / f"{split}.npz", x=np.asarray(x), y=np.asarray(y))
            else:
                _write_csv(client_dir / f"{split}.csv", np.asarray(x), np.asarray(y), features, target)
    if graph is not None:
        edges = [tuple(edge) for edge in graph]
        weighted = any(len(edge) == 3 for edge in edges)
        with (root / GRAPH_FILE).open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, lineterminator=os.linesep)
            writer.writerow(GRAPH_HEADERS[1] if weighted else GRAPH_HEADERS[0])
            for edge in edges:
                writer.writerow([edge[0], edge[1], *([edge[2] if len(edge) == 3 else 1.0] if weighted else [])])
    return root


def write_example_federation(root: str | Path, num_clients: int = 8, seed: int = 0,
                             fmt: Literal["npz", "csv"] = "npz") -> Path:
    """A small federation to try the format on: 3-class Gaussian blobs in 4-D, two groups of clients.

    The groups differ in which classes they mostly hold (label skew) and each client's features carry a
    small client-specific shift, so clients are related but not identical; graph.csv chains the clients of
    each group and bridges the two groups once. Client sizes vary (40-80 rows), split 60/20/20.
    """
    if num_clients < 2:
        raise ValueError(f"num_clients must be >= 2, got {num_clients}")
    rng = np.random.default_rng(seed)
    angles = 2 * np.pi * np.arange(3) / 3
    centres = np.zeros((3, 4))
    centres[:, :2] = 3.0 * np.stack([np.cos(angles), np.sin(angles)], axis=1)  # 2 informative, 2 noise dims
    priors = (np.array([0.45, 0.45, 0.10]), np.array([0.10, 0.45, 0.45]))
    ids = [f"client{i}" for i in range(num_clients)]
    groups = [i % 2 for i in range(num_clients)]
    clients: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for cid, group in zip(ids, groups, strict=True):
        rows = int(rng.integers(40, 81))
        y = rng.choice(3, size=rows, p=priors[group])
        x = centres[y] + rng.normal(size=(rows, 4)) + rng.normal(scale=0.3, size=4)
        cut1, cut2 = int(0.6 * rows), int(0.8 * rows)
        clients[cid] = {"train": (x[:cut1], y[:cut1]), "val": (x[cut1:cut2], y[cut1:cut2]),
                        "test": (x[cut2:], y[cut2:])}
    members = [[cid for cid, g in zip(ids, groups, strict=True) if g == group] for group in (0, 1)]
    edges: list[tuple[str, str]] = [(a, b) for group in members for a, b in pairwise(group)]
    edges.append((members[0][0], members[1][0]))
    meta: dict[str, Any] = {"name": "example", "task": "classification",
            "description": f"example federation: {num_clients} clients, 3-class blobs, two label-skewed groups"}
    if fmt == "csv":
        meta["features"] = ["f0", "f1", "f2", "f3"]
        meta["target"] = "label"
    return write_federation(root, clients, graph=edges, meta=meta, fmt=fmt)
