"""Datasets as federations: the registry of named datasets and ``build_federation(cfg, seed)``.

Each built-in dataset is one module under ``graphfed.data.datasets`` exposing ``build(cfg, streams)`` and a
``REGISTRY`` of the names it serves, listed once in ``BUILTIN`` below: a new dataset is one file and one line.
Users register their own from Python with :func:`register_dataset` (``graphfed.data.registry``).

All randomness of a build comes from ``np.random.default_rng(seed)``, split into independent child streams
(data generation, partition, per-client split, novel-client choice): one seed gives identical tensors.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

import numpy as np
import torch

from graphfed.config import ConfigError, DatasetConfig, printable
from graphfed.data.datasets import digits, femnist, fl_n, folder, images, metr_la, shakespeare, tpt48, traffic_h5
from graphfed.data.federation import ClientSplit, Federation, InputScaling
from graphfed.data.graphs import choose_novel_clients, knn_graph
from graphfed.data.registry import (
    DATASETS,
    DatasetInfo,
    Streams,
    federation_from_clients,
    register_dataset,
)
from graphfed.errors import DataError, DataMissingError, GraphfedError

__all__ = ["DATASETS", "ClientSplit", "DatasetInfo", "Federation", "InputScaling", "Streams", "build_federation",
           "feature_scaling", "federation_from_clients", "register_dataset", "standardized"]

#: the built-in dataset modules, each with its REGISTRY of names
BUILTIN = (digits, fl_n, tpt48, images, femnist, folder, metr_la, traffic_h5, shakespeare)
for _module in BUILTIN:
    for _info in _module.REGISTRY:
        register_dataset(_info.name, _info.build, _info.task, _info.description, shape=_info.shape)

#: datasets whose clients are dealt rows from a pool (what ``dataset.client_fraction`` scales)
PARTITIONED = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100")


def build_federation(cfg: DatasetConfig, seed: int) -> Federation:
    """Build the federation named by ``cfg.name``; the same (cfg, seed) gives identical tensors.

    Data files are input like a config: a file that is corrupt or out of range raises ``DataError`` with the
    loader's one-line message (which names the file); a missing one raises ``DataMissingError``."""
    try:
        return _build_federation(cfg, seed)
    except GraphfedError:
        raise
    except FileNotFoundError as err:
        raise DataMissingError(f"dataset {cfg.name}: {printable(str(err))}") from None
    except (ValueError, OSError, EOFError, zlib.error) as err:  # what a loader says about a file it read
        text = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DataError(f"dataset {cfg.name}: {printable(text)}") from None


def _build_federation(cfg: DatasetConfig, seed: int) -> Federation:
    if cfg.name not in DATASETS:
        raise ConfigError(f"dataset.name: unknown dataset {cfg.name!r}; allowed: {', '.join(sorted(DATASETS))}")
    if cfg.graph_knn and cfg.name not in ("fl60", "fln"):
        raise ConfigError(f"dataset.graph_knn: only fl60 and fln generate their client graph; {cfg.name} "
                          f"brings its own (or none). Remove dataset.graph_knn")
    if cfg.client_fraction is not None and cfg.name not in PARTITIONED:
        raise ConfigError(f"dataset.client_fraction: only datasets partitioned over clients ({', '.join(PARTITIONED)})"
                          f" take it; {cfg.name} has its own clients")
    streams = Streams.from_seed(seed)
    federation = DATASETS[cfg.name].build(cfg, streams)
    if not isinstance(federation, Federation):
        raise ConfigError(f"dataset {cfg.name}: its builder returned a {type(federation).__name__}, not a Federation")
    return _shared_choices(federation, cfg, streams)


def _shared_choices(fed: Federation, cfg: DatasetConfig, streams: Streams) -> Federation:
    """What every dataset shares: the novel clients (``dataset.novel_clients`` by name, else
    ``dataset.novel_fraction`` drawn from the novel stream) and the client graph ``dataset.graph`` asks for."""
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
    elif bool(fed.novel_mask.any()):  # the dataset holds out clients of its own (Shakespeare's novel plays)
        if cfg.novel_fraction > 0:
            raise ConfigError(f"dataset.novel_fraction: {fed.name} already holds out its own novel clients; set "
                              f"dataset.novel_fraction=0 or leave them out")
        changes["novel_mask"] = fed.novel_mask
    else:
        changes["novel_mask"] = choose_novel_clients(fed.num_clients, cfg.novel_fraction, streams.novel)
    if cfg.standardize != "none":  # with the novel clients known, before a graph built from the clients' data
        fed = standardized(replace(fed, novel_mask=changes.pop("novel_mask")), cfg.standardize)
    if cfg.graph == "none":
        changes["client_graph"] = None
    elif cfg.graph == "knn":
        changes["client_graph"] = knn_graph(client_profiles(fed), cfg.graph_k)
    return replace(fed, **changes)


def feature_scaling(fed: Federation, how: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, spread)``, each ``[N, F]`` (float64): the statistics ``dataset.standardize`` scales each client's
    flattened input features by, from training rows: each client's own (``client``: a client needs nothing but its
    rows) or every training client's pooled (``pooled``). A feature constant over those rows has spread 1 (it is
    only centred)."""
    owner, rows = fed.train.row_owners()
    x = fed.train.x[rows].flatten(1).to(torch.float64)
    if how == "client":
        counts = fed.train.counts.clamp_min(1).to(torch.float64).unsqueeze(1)
        mean = torch.zeros(fed.num_clients, x.shape[1], dtype=torch.float64).index_add_(0, owner, x) / counts
        square = torch.zeros_like(mean).index_add_(0, owner, (x - mean[owner]).square()) / counts
    else:
        pooled = x[~fed.novel_mask[owner]] if bool((~fed.novel_mask).any()) else x
        mean = pooled.mean(0, keepdim=True).expand(fed.num_clients, -1)
        square = (pooled - mean[:1]).square().mean(0, keepdim=True).expand(fed.num_clients, -1)
    spread = square.sqrt()
    return mean, torch.where(spread > 1e-12, spread, torch.ones_like(spread))


def standardized(fed: Federation, how: str) -> Federation:
    """Every client's train, val and test rows scaled by :func:`feature_scaling` (mean 0, standard deviation 1); the
    statistics are kept as the federation's ``input_scaling``."""
    mean, spread = feature_scaling(fed, how)

    def scaled(split: ClientSplit) -> ClientSplit:
        owner, rows = split.row_owners()
        x = split.x.clone()
        values = (split.x[rows].flatten(1).to(torch.float64) - mean[owner]) / spread[owner]
        x[rows] = values.to(split.x.dtype).view(len(rows), *split.x.shape[1:])
        return replace(split, x=x)

    return replace(fed, train=scaled(fed.train), val=scaled(fed.val), test=scaled(fed.test),
                   input_scaling=InputScaling(how, mean, spread))


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
