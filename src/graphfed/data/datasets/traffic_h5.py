"""METR-LA and PEMS-BAY as DCRNN publishes them: ``metr-la.h5`` / ``pems-bay.h5`` speeds and the road-distance CSVs.

The ``.h5`` files are pandas DataFrames in HDF5's "fixed" layout: one top-level group (``df`` for METR-LA,
``speed`` for PEMS-BAY) holding ``axis0`` (the sensor ids), ``axis1`` (5-minute timestamps, int64 nanoseconds),
``block0_items`` and ``block0_values`` (float speeds in mph, ``[steps, sensors]``). They are read with h5py, never
unpickled, and every shape and dtype is checked before the values are read. ``dataset.window``
(``FIRST..END``, END excluded) keeps a range of days; the default is the whole recording (METR-LA: 1 March -
30 June 2012; PEMS-BAY: 1 January - 31 May 2017).

The sensor graph is built from the published distance CSV (``from,to,cost`` in metres) the way DCRNN's
``gen_adj_mx.py`` does: ``W_ij = exp(-(d_ij / sigma)^2)`` with sigma the std of the finite distances, entries below
``dataset.graph_threshold`` (DCRNN's ``normalized_k``, 0.1) dropped; then symmetrised with a zero diagonal like the
week's CSV graph. Windows, chronological split and scaling are those of ``metr-la-week``
(:func:`~graphfed.data.datasets.metr_la.window_speeds`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphfed.config import DatasetConfig
from graphfed.data.datasets import missing_data, require_file
from graphfed.data.datasets.metr_la import threshold_graph, traffic_federation, window_speeds
from graphfed.data.federation import Federation
from graphfed.data.registry import DatasetInfo, Streams, fixed_client_count
from graphfed.errors import DataError

NANOSECONDS_PER_DAY = 86_400 * 10**9


@dataclass(frozen=True)
class Recording:
    """One published traffic recording."""

    name: str
    title: str
    folder: str
    speeds: str
    distances: str
    sensors: int
    sensor_ids: str | None = None  #: a file listing the sensors in the graph's order (checked against the .h5)


METR_LA = Recording("metr-la", "METR-LA", "metr-la", "metr-la.h5", "distances_la_2012.csv", 207,
                    "graph_sensor_ids.txt")
PEMS_BAY = Recording("pems-bay", "PEMS-BAY", "pems-bay", "pems-bay.h5", "distances_bay_2017.csv", 325)


def read_speed_h5(path: Path, sensors: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(sensor ids, timestamps int64 ns [T], speeds float64 [sensors, T])`` of a pandas "fixed" HDF5 frame."""
    import h5py

    require_file(path, "traffic speed file", path.parent.name)
    try:
        with h5py.File(path, "r") as h5:
            groups = [key for key in h5 if isinstance(h5[key], h5py.Group)]
            if len(groups) != 1:
                raise DataError(f"{path}: expected one pandas frame (a top-level group), found {len(groups)}")
            frame = h5[groups[0]]
            missing = [key for key in ("axis0", "axis1", "block0_values") if key not in frame]
            if missing:
                raise DataError(f"{path}: group {groups[0]!r} lacks {', '.join(missing)} (not a pandas fixed frame)")
            columns, index, values = frame["axis0"], frame["axis1"], frame["block0_values"]
            if values.ndim != 2 or values.dtype.kind != "f":
                raise DataError(f"{path}: block0_values must be a 2-D float table, got {values.ndim}-D "
                                f"{values.dtype}")
            if values.shape != (index.shape[0], columns.shape[0]):
                raise DataError(f"{path}: block0_values is {values.shape}, but the frame has {index.shape[0]} "
                                f"timestamps and {columns.shape[0]} sensors")
            if columns.shape[0] != sensors:
                raise DataError(f"{path}: {columns.shape[0]} sensors, the published recording has {sensors}")
            if index.dtype.kind not in "iu":
                raise DataError(f"{path}: axis1 must hold int64 timestamps, got {index.dtype}")
            ids = [value.decode() if isinstance(value, bytes) else str(value) for value in columns[()]]
            timestamps = np.asarray(index[()], dtype=np.int64)
            speeds = np.asarray(values[()], dtype=np.float64).T
    except OSError as error:
        raise DataError(f"{path}: not a readable HDF5 file ({error})") from None
    if len(timestamps) > 1 and not (np.diff(timestamps) > 0).all():
        raise DataError(f"{path}: timestamps are not strictly increasing")
    if not np.isfinite(speeds).all():
        raise DataError(f"{path}: non-finite speeds")
    return ids, timestamps, speeds


def select_window(timestamps: np.ndarray, speeds: np.ndarray, window: str | None, path: Path) -> np.ndarray:
    """The columns of ``speeds`` inside ``FIRST..END`` (days, END excluded); all of them without a window."""
    if window is None:
        return speeds
    first, end = (np.datetime64(day, "ns").astype(np.int64) for day in window.split(".."))
    keep = (timestamps >= first) & (timestamps < end)
    if not keep.any():
        recorded = np.array([timestamps[0], timestamps[-1]]).astype("datetime64[ns]").astype("datetime64[D]")
        raise DataError(f"dataset.window {window}: no reading of {path} falls inside it (recorded "
                        f"{recorded[0]}..{recorded[1]})")
    return speeds[:, keep]


def gaussian_kernel_adjacency(path: Path, sensor_ids: list[str]) -> np.ndarray:
    """DCRNN's road graph: ``exp(-(d / std(d))^2)`` over the published ``from,to,cost`` distances (unlisted pairs:
    0), directed as published."""
    require_file(path, "sensor distance file", path.parent.name)
    position = {sensor: i for i, sensor in enumerate(sensor_ids)}
    distance = np.full((len(sensor_ids), len(sensor_ids)), np.inf)
    with path.open(newline="", encoding="utf-8-sig") as handle:
        rows = csv.reader(handle)
        header = next(rows, None)
        if header is None or [column.strip() for column in header[:3]] != ["from", "to", "cost"]:
            raise DataError(f"{path}: line 1 must be the header from,to,cost")
        for line, row in enumerate(rows, start=2):
            if len(row) < 3:
                raise DataError(f"{path}: line {line}: expected from,to,cost")
            try:
                cost = float(row[2])
            except ValueError:
                raise DataError(f"{path}: line {line}: cost {row[2]!r} is not a number") from None
            if not np.isfinite(cost) or cost < 0:
                raise DataError(f"{path}: line {line}: cost {cost} must be finite and >= 0")
            source, target = row[0].strip(), row[1].strip()
            if source in position and target in position:  # DCRNN skips pairs outside the sensor list too
                distance[position[source], position[target]] = cost
    finite = distance[np.isfinite(distance)]
    if finite.size < 2 or finite.std() == 0:
        raise DataError(f"{path}: fewer than two distinct distances between the recording's sensors")
    return np.exp(-np.square(distance / finite.std()))


def load_recording(recording: Recording, cfg: DatasetConfig) -> Federation:
    folder = cfg.resolved_data_dir() / recording.folder
    if not folder.is_dir():
        raise missing_data(f"{recording.title} data folder", folder, recording.folder,
                           f" (graphfed data fetch {recording.name})")
    speed_path = folder / recording.speeds
    ids, timestamps, speeds = read_speed_h5(speed_path, recording.sensors)
    if recording.sensor_ids is not None and (folder / recording.sensor_ids).is_file():
        listed = [s.strip() for s in (folder / recording.sensor_ids).read_text(encoding="utf-8-sig")
                  .replace("\n", ",").split(",") if s.strip()]
        if listed != ids:  # the graph's order: a reordered frame would silently mis-wire the graph
            raise DataError(f"{speed_path}: sensor ids differ from {folder / recording.sensor_ids}")
    adjacency = threshold_graph(gaussian_kernel_adjacency(folder / recording.distances, ids), cfg.graph_threshold)
    metr = window_speeds(ids, select_window(timestamps, speeds, cfg.window, speed_path), adjacency, cfg.split,
                         cfg.graph_threshold, speed_path)
    title = f"{recording.title}{f' {cfg.window}' if cfg.window else ''}"
    return traffic_federation(recording.name, title, metr, cfg)


def _builder(recording: Recording):
    def build(cfg: DatasetConfig, streams: Streams) -> Federation:
        fixed_client_count(cfg, recording.sensors)
        return load_recording(recording, cfg)

    return build


REGISTRY = (
    DatasetInfo("metr-la", "METR-LA traffic speed as DCRNN publishes it (metr-la.h5, 1 March - 30 June 2012, or "
                "dataset.window), 207 sensor clients, 12 steps in -> 12 out; chronological split, min-max scaled "
                "on the training segment; road graph from the distance CSV (Gaussian kernel)", "regression",
                _builder(METR_LA)),
    DatasetInfo("pems-bay", "PEMS-BAY traffic speed as DCRNN publishes it (pems-bay.h5, 1 January - 31 May 2017, "
                "or dataset.window), 325 sensor clients, 12 steps in -> 12 out; as metr-la", "regression",
                _builder(PEMS_BAY)),
)
