"""Datasets as federations: a registry of named datasets and ``build_federation(cfg, seed)``.

All randomness of a build comes from ``np.random.default_rng(seed)``, split into independent child streams
(data generation, partition, per-client split, novel-client choice). Each stage owns its stream, so e.g.
changing the split fractions does not change which clients are novel, and one seed gives identical tensors.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from graphfed.config import ConfigError, DatasetConfig, printable
from graphfed.core.memory import check_fits
from graphfed.data.federation import ClientSplit, Federation, Task
from graphfed.data.graphs import choose_novel_clients, edges_to_adjacency, knn_graph
from graphfed.data.partition import split_client_indices

if TYPE_CHECKING:
    from pathlib import Path

    from graphfed.data.datasets.idx import ImageSet

__all__ = ["DATASETS", "ClientSplit", "DatasetInfo", "Federation", "build_federation"]


@dataclass(frozen=True)
class DatasetInfo:
    """Registry entry: what a dataset name means."""

    name: str
    description: str
    task: Task


DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo("digits", "scikit-learn 8x8 digits, 10 classes, partitioned over clients (no graph)",
                    "classification"),
        DatasetInfo("fl60", "FL-N synthetic rotating two-class toy with 60 clients and a cosine-angle graph",
                    "classification"),
        DatasetInfo("fln", "FL-N synthetic toy with dataset.num_clients clients (default 60)",
                    "classification"),
        DatasetInfo("tpt48", "TPT-48 monthly temperatures of 48 US states, 6-month-ahead regression, "
                    "state-border graph", "regression"),
        DatasetInfo("mnist", "MNIST 28x28 digits, train+test pooled (70k), partitioned over dataset.num_clients "
                    "clients (default 20, no graph)", "classification"),
        DatasetInfo("fashion-mnist", "Fashion-MNIST 28x28, train+test pooled (70k), partitioned over "
                    "dataset.num_clients clients (default 20, no graph)", "classification"),
        DatasetInfo("fashion-mnist-casestudy", "Fashion-MNIST in FedAGHN's case-study split: 20 clients in 5 groups "
                    "of 4; 80% of the data by group classes, 20% IID; client groups recorded", "classification"),
        DatasetInfo("cifar10", "CIFAR-10 (JPEG) 32x32 RGB, 10 classes, train+test pooled (60k), partitioned over "
                    "dataset.num_clients clients (default 20, no graph); decoded once into a cached .npz",
                    "classification"),
        DatasetInfo("femnist", "FEMNIST (LEAF) 28x28 digits and letters, 62 classes, natural split: one client per "
                    "writer (105); LEAF train/test per writer, val carved from the writer's train part by "
                    "dataset.split (dataset.partition is not used, no graph)", "classification"),
        # The task listed is only the default: a folder's meta.yaml (or float targets) makes it regression.
        DatasetInfo("folder", "your own federation folder (dataset.data_dir = the folder): per-client "
                    "train/val/test npz or CSV, optional graph.csv and meta.yaml; classification or regression "
                    "as the folder says (README, 'Bring your own federation')", "classification"),
        DatasetInfo("metr-la-week", "METR-LA traffic speed, 1-7 March 2012, 207 sensor clients, 12 steps (1 h) in "
                    "-> 12 out; chronological split, min-max scaled on the training segment (MSE on scaled "
                    "values); DCRNN road graph cut at dataset.graph_threshold", "regression"),
    )
}

FL60_CLIENTS = 60
TPT48_CLIENTS = 48
METR_LA_CLIENTS = 207


def _load_idx(folder: Path) -> ImageSet:
    from graphfed.data.datasets.idx import NUM_CLASSES, load_image_set

    return load_image_set(folder, NUM_CLASSES)


def _load_cifar10(folder: Path) -> ImageSet:
    from graphfed.data.datasets.cifar10 import load_cifar10

    return load_cifar10(folder)


@dataclass(frozen=True)
class ImageSource:
    """An image data set that is pooled and partitioned over clients like MNIST."""

    title: str  # how descriptions name it
    folder: str  # under the data directory
    load: Callable[[Path], ImageSet]  # the folder -> train and test pooled, float32 [N, C, H, W] in [0, 1]


IMAGE_SOURCES = {
    "mnist": ImageSource("MNIST", "mnist", _load_idx),
    "fashion-mnist": ImageSource("Fashion-MNIST", "fashion-mnist", _load_idx),
    "fashion-mnist-casestudy": ImageSource("Fashion-MNIST", "fashion-mnist", _load_idx),
    "cifar10": ImageSource("CIFAR-10 (JPEG)", "cifar10-jpeg", _load_cifar10),
}
# dataset name -> folder under the data directory holding its image files
IMAGE_FOLDERS = {name: source.folder for name, source in IMAGE_SOURCES.items()}


def _split_pool(pool_x: np.ndarray, pool_y: np.ndarray, parts: Sequence[np.ndarray], cfg: DatasetConfig,
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


def _split_clients(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], cfg: DatasetConfig, task: Task,
                   rng: np.random.Generator) -> tuple[ClientSplit, ClientSplit, ClientSplit]:
    """Split every client's rows (``xs[i]``, ``ys[i]``) by ``cfg.split`` / ``cfg.split_mode``."""
    offsets = np.cumsum([0, *(len(x) for x in xs)])
    parts = [np.arange(lo, hi) for lo, hi in itertools.pairwise(offsets)]
    return _split_pool(np.concatenate(xs), np.concatenate(ys), parts, cfg, task, rng)


def _fixed_client_count(cfg: DatasetConfig, count: int) -> None:
    # A fixed-size dataset silently ignoring num_clients would make a sweep over it meaningless.
    if cfg.num_clients is not None and cfg.num_clients != count:
        hint = "; use dataset.name=fln to choose the client count" if cfg.name == "fl60" else ""
        raise ConfigError(f"dataset.num_clients: {cfg.name} has exactly {count} clients, "
                          f"got {cfg.num_clients}{hint}")


def _partition_description(cfg: DatasetConfig) -> str:
    """E.g. ``dirichlet partition (beta=0.5)``."""
    return f"{cfg.partition} partition" + (
        f" (beta={cfg.dirichlet_beta})" if cfg.partition == "dirichlet" else
        f" ({cfg.classes_per_client} classes/client)" if cfg.partition == "pathological" else "")


def _image_clients(cfg: DatasetConfig, rng: np.random.Generator,
                   ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], torch.Tensor | None, str, int]:
    """The pooled images and labels of ``IMAGE_SOURCES[cfg.name]``, each client's row indices into them, client
    groups (case study only), a description and the number of classes."""
    from graphfed.data.datasets.digits import partition_indices
    from graphfed.data.datasets.idx import (
        CASESTUDY_GROUP_FRACTION,
        CASESTUDY_GROUPS,
        DEFAULT_NUM_CLIENTS,
        group_class_partition,
    )

    num_clients = cfg.num_clients or DEFAULT_NUM_CLIENTS
    casestudy = cfg.name == "fashion-mnist-casestudy"
    if casestudy and num_clients < CASESTUDY_GROUPS:  # checked before the (seconds-long) load
        raise ConfigError(f"dataset.num_clients: {cfg.name} needs at least {CASESTUDY_GROUPS} clients "
                          f"(one per group), got {num_clients}")
    source = IMAGE_SOURCES[cfg.name]
    images = source.load(cfg.resolved_data_dir() / source.folder)
    groups: torch.Tensor | None = None
    if casestudy:
        split = group_class_partition(images.y, num_clients, CASESTUDY_GROUPS, CASESTUDY_GROUP_FRACTION, rng)
        parts = split.clients
        groups = torch.as_tensor(split.client_groups, dtype=torch.int64)
        owned = "; ".join(f"group {g}: classes {', '.join(str(int(c)) for c in cls)}"
                          for g, cls in enumerate(split.group_classes))
        description = (f"Fashion-MNIST case study: {num_clients} clients in {CASESTUDY_GROUPS} groups; "
                       f"{CASESTUDY_GROUP_FRACTION:.0%} of 70k images dealt by group classes ({owned}), "
                       f"the rest IID over all clients (dataset.partition is not used)")
    else:
        parts = partition_indices(images.y, cfg, num_clients, rng)
        description = (f"{source.title}: {len(images.y)} images (train+test) over {num_clients} clients, "
                       f"{_partition_description(cfg)}")
    return images.x, images.y, parts, groups, description, images.num_classes


def _held_out_and_graph(fed: Federation, cfg: DatasetConfig) -> Federation:
    """The choices every dataset shares: novel clients named in ``dataset.novel_clients``, and the client graph
    ``dataset.graph`` asks for."""
    changes: dict[str, object] = {}
    if cfg.novel_clients is not None:
        index = {name: i for i, name in enumerate(fed.client_names)}
        unknown = [name for name in cfg.novel_clients if name not in index]
        if unknown:
            shown = ", ".join(fed.client_names[:8]) + (", ..." if fed.num_clients > 8 else "")
            raise ConfigError(f"dataset.novel_clients: {printable(str(unknown[:5]))} are not clients of {fed.name} "
                              f"(clients: {printable(shown)})")
        if len(cfg.novel_clients) >= fed.num_clients:
            raise ConfigError(f"dataset.novel_clients: all {fed.num_clients} clients are novel, none would train")
        mask = torch.zeros(fed.num_clients, dtype=torch.bool)
        mask[[index[name] for name in cfg.novel_clients]] = True
        changes["novel_mask"] = mask
    if cfg.graph == "none":
        changes["client_graph"] = None
    elif cfg.graph == "knn":
        changes["client_graph"] = knn_graph(client_profiles(fed), cfg.graph_k)
    return replace(fed, **changes) if changes else fed


def client_profiles(fed: Federation) -> torch.Tensor:
    """``[N, F]`` what a client's training data look like: its mean input and its label shares (classification)
    or mean target (regression), each column standardised over clients (what ``dataset.graph: knn`` compares)."""
    owner, rows = fed.train.row_owners()
    counts = fed.train.counts.clamp_min(1).to(torch.float32).unsqueeze(1)
    inputs = torch.zeros(fed.num_clients, int(np.prod(fed.input_shape))).index_add_(
        0, owner, fed.train.x[rows].flatten(1).to(torch.float32)) / counts
    if fed.task == "classification":
        targets = torch.zeros(fed.num_clients, fed.output_dim).index_add_(
            0, owner, torch.nn.functional.one_hot(fed.train.y[rows], fed.output_dim).to(torch.float32)) / counts
    else:
        targets = torch.zeros(fed.num_clients, fed.output_dim).index_add_(
            0, owner, fed.train.y[rows].flatten(1).to(torch.float32)) / counts
    profile = torch.cat([inputs, targets], dim=1)
    return (profile - profile.mean(0)) / profile.std(0).clamp_min(1e-8)


def build_federation(cfg: DatasetConfig, seed: int) -> Federation:
    """Build the federation named by ``cfg.name``; the same (cfg, seed) gives identical tensors.

    Data files are input like a config: a file that is corrupt or out of range raises ``ConfigError`` with the
    loader's one-line message (which names the file); a missing one raises ``FileNotFoundError``."""
    try:
        return _held_out_and_graph(_build_federation(cfg, seed), cfg)
    except (ConfigError, FileNotFoundError):
        raise
    except (ValueError, OSError, EOFError, zlib.error) as err:
        text = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"dataset {cfg.name}: {printable(text)}") from None


def _build_federation(cfg: DatasetConfig, seed: int) -> Federation:
    if cfg.name not in DATASETS:
        allowed = ", ".join(sorted(DATASETS))
        raise ConfigError(f"dataset.name: unknown dataset {cfg.name!r}; allowed: {allowed}")
    info = DATASETS[cfg.name]
    if cfg.graph_knn and cfg.name not in ("fl60", "fln"):
        raise ConfigError(f"dataset.graph_knn: only fl60 and fln generate their client graph; {cfg.name} "
                          f"brings its own (or none). Remove dataset.graph_knn")
    partitioned = ("digits", "mnist", "fashion-mnist", "cifar10")
    if cfg.client_fraction is not None and cfg.name not in partitioned:
        raise ConfigError(f"dataset.client_fraction: only datasets partitioned over clients ({', '.join(partitioned)})"
                          f" take it; {cfg.name} has its own clients")
    gen_rng, part_rng, split_rng, novel_rng = np.random.default_rng(seed).spawn(4)
    if cfg.name == "folder":
        # The folder brings its own splits (no partition/split step); only the novel-client choice is ours.
        from graphfed.data.datasets.folder import FederationFormatError, folder_federation

        try:
            return folder_federation(cfg, novel_rng)
        except FederationFormatError as err:
            # A bad folder is bad input like a bad config: the CLI answers one line and exit code 2.
            raise ConfigError(f"dataset.data_dir: {err}") from None

    graph: torch.Tensor | None = None
    groups: torch.Tensor | None = None
    names: list[str] = []
    input_shape: tuple[int, ...]
    output_dim: int
    metric: Literal["accuracy", "mse"]
    xs: Sequence[np.ndarray]
    ys: Sequence[np.ndarray]
    # Datasets whose split is part of the task (metr-la-week cuts its time axis before windowing) set this.
    presplit: tuple[ClientSplit, ClientSplit, ClientSplit] | None = None
    target_scale: float | None = None
    if cfg.name in ("fl60", "fln"):
        from graphfed.data.datasets.fl_n import make_fl_n

        if cfg.name == "fl60":
            _fixed_client_count(cfg, FL60_CLIENTS)
        num_clients = cfg.num_clients or FL60_CLIENTS
        # the paper's graph draws a float64 uniform per pair; either graph is held as a dense float32 matrix
        check_fits(num_clients**2 * (4 if cfg.graph_knn else 14),
                   f"the FL-N client graph of {num_clients:,} clients ({'dense' if not cfg.graph_knn else 'kNN'})",
                   "use dataset.graph_knn (a sparse kNN graph) or fewer clients (dataset.num_clients)")
        xs, ys, adjacency, _ = make_fl_n(num_clients, gen_rng, knn=cfg.graph_knn)
        graph = torch.as_tensor(adjacency, dtype=torch.float32)
        input_shape, output_dim, metric = (2,), 2, "accuracy"
        graph_text = (f"each client linked to its {cfg.graph_knn} nearest by angle" if cfg.graph_knn
                      else "graph edges ~ Bernoulli(0.5 cos(angle gap) + 0.5)")
        description = (f"FL-N synthetic: {num_clients} clients x 100 points in 2-D, 2 classes on a rotating "
                       f"axis; {graph_text}")
    elif cfg.name == "tpt48":
        from graphfed.data.datasets.tpt48 import HORIZON, WINDOW, load_tpt48

        _fixed_client_count(cfg, TPT48_CLIENTS)
        data = load_tpt48(cfg.resolved_data_dir())
        xs, ys = list(data.x), list(data.y)
        names = data.codes
        graph = edges_to_adjacency(data.edges, len(names))
        input_shape, output_dim, metric = (WINDOW - HORIZON,), HORIZON, "mse"
        description = (f"TPT-48: {len(names)} states x {data.x.shape[1]} windows, 6 months in -> 6 out "
                       f"(2008-01..2019-12, min-max scaled from {data.temp_min_f:.1f}..{data.temp_max_f:.1f} "
                       f"deg F); graph = {len(data.edges)} shared state borders; split {cfg.split_mode}")
    elif cfg.name == "metr-la-week":
        from graphfed.data.datasets.metr_la import HORIZON as METR_HORIZON
        from graphfed.data.datasets.metr_la import INPUT_STEPS, load_metr_la

        _fixed_client_count(cfg, METR_LA_CLIENTS)
        metr = load_metr_la(cfg.resolved_data_dir(), cfg.split, cfg.graph_threshold, METR_LA_CLIENTS)
        train_s, val_s, test_s = (ClientSplit.from_lists(list(x), list(y), info.task) for x, y in metr.splits)
        presplit = (train_s, val_s, test_s)
        xs, ys = [], []
        names, target_scale = metr.sensor_ids, metr.mph_per_unit
        graph = torch.as_tensor(metr.adjacency)
        input_shape, output_dim, metric = (INPUT_STEPS,), METR_HORIZON, "mse"
        edges = int(torch.count_nonzero(graph)) // 2
        description = (f"METR-LA week: {METR_LA_CLIENTS} sensors, {sum(metr.segment_steps)} 5-minute steps, "
                       f"{INPUT_STEPS} in -> {METR_HORIZON} out; chronological segments of "
                       f"{'/'.join(map(str, metr.segment_steps))} steps -> "
                       f"{'/'.join(str(x.shape[1]) for x, _ in metr.splits)} windows per sensor "
                       f"(dataset.split_mode not used); min-max scaled on the training segment "
                       f"({metr.speed_min:.2f}..{metr.speed_max:.2f} mph, {metr.mph_per_unit:.2f} mph/unit); "
                       f"{metr.zero_readings} zero (missing) readings kept as values; graph = {edges} edges "
                       f"with weight >= {cfg.graph_threshold}")
    elif cfg.name in IMAGE_FOLDERS:
        pool_x, pool_y, parts, groups, description, output_dim = _image_clients(cfg, part_rng)
        input_shape, metric = tuple(pool_x.shape[1:]), "accuracy"
        # the splits are cut from the pool of images in place: no copy per client, none per split
        presplit = _split_pool(pool_x, pool_y, parts, cfg, info.task, split_rng)
        del pool_x, pool_y
        xs, ys = [], []
    elif cfg.name == "femnist":
        from graphfed.data.datasets import femnist

        # LEAF fixes the test rows per writer, so the split is natural: only validation is carved (from train).
        leaf, *per_writer = femnist.make_femnist_clients(cfg, split_rng)
        # Checked against the writers actually read (105 in the shared sample), not a constant: any LEAF
        # sample works, and num_clients can only confirm its size.
        _fixed_client_count(cfg, len(leaf.writers))
        train_s, val_s, test_s = (ClientSplit.from_lists(x, y, info.task) for x, y in per_writer)
        presplit = (train_s, val_s, test_s)
        xs, ys = [], []
        names = leaf.writers
        input_shape, output_dim, metric = (1, femnist.IMAGE_SIDE, femnist.IMAGE_SIDE), femnist.NUM_CLASSES, "accuracy"
        sizes = [int(split.counts.sum()) for split in presplit]
        description = (f"FEMNIST (LEAF): {len(names)} writers as clients, {femnist.NUM_CLASSES} classes, "
                       f"{sizes[0]} train / {sizes[1]} val / {sizes[2]} test images; test = LEAF test, val = "
                       f"{femnist.validation_fraction(cfg.split):.1%} of each writer's LEAF train "
                       f"({cfg.split_mode}); natural split (dataset.partition is not used)")
    else:  # digits
        from graphfed.data.datasets.digits import NUM_CLASSES, NUM_FEATURES, make_digits_clients

        xs, ys = make_digits_clients(cfg, part_rng)
        input_shape, output_dim, metric = (NUM_FEATURES,), NUM_CLASSES, "accuracy"
        description = f"sklearn digits: {len(xs)} clients, {_partition_description(cfg)}"

    train, val, test = presplit if presplit is not None else _split_clients(xs, ys, cfg, info.task, split_rng)
    novel = choose_novel_clients(train.num_clients, cfg.novel_fraction, novel_rng)
    return Federation(name=cfg.name, task=info.task, train=train, val=val, test=test,
                      input_shape=input_shape, output_dim=output_dim, client_graph=graph, novel_mask=novel,
                      client_names=names, metric=metric, description=description, client_groups=groups,
                      target_scale=target_scale)
