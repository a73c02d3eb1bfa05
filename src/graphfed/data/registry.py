"""The dataset registry: a dataset is a name, a task, a description and a builder.

A builder turns ``(dataset config, random streams)`` into a :class:`Federation`. Built-in datasets are one module
each under ``graphfed.data.datasets`` (listed once in ``graphfed.data``); users add their own from Python with
:func:`register_dataset`, and ``dataset.name`` then accepts the new name everywhere (config validation, ``graphfed
run``, benchmark suites run in-process). What every dataset shares (novel clients, ``dataset.graph``) is applied by
``graphfed.data.build_federation`` after the builder, so a builder only says who holds which rows.

The helpers below are what most builders need: per-client train/val/test splits by ``dataset.split``, a fixed
client count, and :func:`federation_from_clients`, the whole path from per-client arrays to a federation.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch

from graphfed.config import ConfigError, DatasetConfig
from graphfed.data.federation import ClientSplit, Federation, Task
from graphfed.data.partition import split_client_indices


class Streams(NamedTuple):
    """Independent random streams of one build, all from the run seed: each stage owns its stream, so e.g.
    changing the split fractions does not change which clients are novel."""

    generate: np.random.Generator  # synthetic data
    partition: np.random.Generator  # who holds which rows
    split: np.random.Generator  # each client's train/val/test rows
    novel: np.random.Generator  # which clients are held out (used by build_federation)

    @staticmethod
    def from_seed(seed: int) -> Streams:
        return Streams(*np.random.default_rng(seed).spawn(4))


Builder = Callable[[DatasetConfig, Streams], Federation]


#: a dataset's input shape and output size as its config decides them, known before its files are read
Shape = Callable[[DatasetConfig], tuple[tuple[int, ...], int]]


@dataclass(frozen=True)
class DatasetInfo:
    """Registry entry: what a dataset name means and how to build it. ``shape`` (when the config alone decides it)
    lets a run check its model and method against the data before reading slow files."""

    name: str
    description: str
    task: Task
    build: Builder
    shape: Shape | None = None


DATASETS: dict[str, DatasetInfo] = {}


def register_dataset(name: str, build: Builder, task: Task, description: str = "", *,
                     replace: bool = False, shape: Shape | None = None) -> DatasetInfo:
    """Make ``dataset.name: <name>`` build a federation with ``build(cfg, streams)``.

    ``task`` is "classification" or "regression". A name already registered is refused unless ``replace=True``
    (so a plugin cannot silently shadow a built-in dataset)."""
    if not name or not isinstance(name, str):
        raise ValueError("a dataset needs a non-empty name")
    if task not in ("classification", "regression"):
        raise ValueError(f"dataset {name!r}: task must be 'classification' or 'regression', got {task!r}")
    if name in DATASETS and not replace:
        raise ValueError(f"dataset {name!r} is already registered; pass replace=True to replace it")
    info = DatasetInfo(name, description or name, task, build, shape)
    DATASETS[name] = info
    return info


# ---- what builders share ---------------------------------------------------------------------------------------

def split_pool(pool_x: np.ndarray, pool_y: np.ndarray, parts: Sequence[np.ndarray], cfg: DatasetConfig,
               task: Task, rng: np.random.Generator) -> tuple[ClientSplit, ClientSplit, ClientSplit]:
    """Split every client's rows of the pool (``parts[i]``: client i's row indices) by ``cfg.split`` /
    ``cfg.split_mode``; the splits are cut from the pool in place (``ClientSplit.splits_from_pool``)."""
    # per_split[k] collects every client's pool rows for split k (train, val, test).
    per_split: list[list[np.ndarray]] = [[], [], []]
    for part in parts:
        for split_rows, index in zip(per_split, split_client_indices(len(part), cfg.split, rng, cfg.split_mode),
                                     strict=True):
            split_rows.append(part[index])
    train, val, test = ClientSplit.splits_from_pool(pool_x, pool_y, per_split, task)
    return train, val, test


def split_clients(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], cfg: DatasetConfig, task: Task,
                  rng: np.random.Generator) -> tuple[ClientSplit, ClientSplit, ClientSplit]:
    """Split every client's rows (``xs[i]``, ``ys[i]``) by ``cfg.split`` / ``cfg.split_mode``."""
    offsets = np.cumsum([0, *(len(x) for x in xs)])
    parts = [np.arange(lo, hi) for lo, hi in itertools.pairwise(offsets)]
    return split_pool(np.concatenate(xs), np.concatenate(ys), parts, cfg, task, rng)


def fixed_client_count(cfg: DatasetConfig, count: int) -> None:
    """Refuse ``dataset.num_clients`` other than ``count`` (a fixed-size dataset silently ignoring it would make a
    sweep over it meaningless)."""
    if cfg.num_clients is not None and cfg.num_clients != count:
        hint = "; use dataset.name=fln to choose the client count" if cfg.name == "fl60" else ""
        raise ConfigError(f"dataset.num_clients: {cfg.name} has exactly {count} clients, "
                          f"got {cfg.num_clients}{hint}")


def partition_description(cfg: DatasetConfig) -> str:
    """E.g. ``dirichlet partition (beta=0.5)``."""
    return f"{cfg.partition} partition" + (
        f" (beta={cfg.dirichlet_beta})" if cfg.partition == "dirichlet" else
        f" ({cfg.classes_per_client} classes/client)" if cfg.partition == "pathological" else "")


def federation_from_clients(name: str, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], cfg: DatasetConfig,
                            streams: Streams, task: Task, output_dim: int, *,
                            client_graph: torch.Tensor | None = None, client_names: Sequence[str] = (),
                            metric: Literal["accuracy", "mse"] | None = None, description: str = "",
                            input_shape: tuple[int, ...] | None = None, **extra: object) -> Federation:
    """A federation from each client's rows (``xs[i]`` features, ``ys[i]`` labels or targets), split into
    train/val/test by ``dataset.split`` with the build's split stream. ``extra``: further :class:`Federation`
    fields (e.g. ``client_groups``, ``target_scale``)."""
    train, val, test = split_clients(xs, ys, cfg, task, streams.split)
    shape = input_shape if input_shape is not None else tuple(np.asarray(xs[0]).shape[1:])
    return Federation(name=name, task=task, train=train, val=val, test=test, input_shape=shape,
                      output_dim=output_dim, client_graph=client_graph, client_names=list(client_names),
                      metric=metric or ("accuracy" if task == "classification" else "mse"), description=description,
                      **extra)  # type: ignore[arg-type]
