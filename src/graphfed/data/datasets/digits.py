"""scikit-learn's 8x8 digits (1797 samples, 10 classes), partitioned over clients. Ships with the package."""

from __future__ import annotations

import numpy as np

from graphfed.config import ConfigError, DatasetConfig
from graphfed.data.federation import Federation
from graphfed.data.partition import dirichlet_partition, iid_partition, pathological_partition
from graphfed.data.registry import DatasetInfo, Streams, federation_from_clients, partition_description

DEFAULT_NUM_CLIENTS = 10
NUM_CLASSES = 10
NUM_FEATURES = 64


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All digits as (x [1797, 64] float32 in [0, 1], y [1797] int64)."""
    from sklearn.datasets import load_digits  # local import: sklearn is slow to import and only needed here

    bunch = load_digits()
    # Pixel intensities are integers 0..16 by construction of the dataset.
    x = (np.asarray(bunch.data, dtype=np.float32) / 16.0).clip(0.0, 1.0)
    return x, np.asarray(bunch.target, dtype=np.int64)


def partition_indices(labels: np.ndarray, cfg: DatasetConfig, num_clients: int,
                      rng: np.random.Generator) -> list[np.ndarray]:
    """Dispatch to the partition scheme named by ``cfg.partition``; with ``cfg.client_fraction``, each client then
    keeps a random subset of its rows, scaled so that the clients hold that share of all rows on average."""
    if cfg.partition == "iid":
        parts = iid_partition(labels, num_clients, rng)
    elif cfg.partition == "pathological":
        parts = pathological_partition(labels, num_clients, cfg.classes_per_client, rng)
    else:
        parts = dirichlet_partition(labels, num_clients, cfg.dirichlet_beta, rng,
                                    min_samples=cfg.min_samples_per_client)
    if cfg.client_fraction is None:
        return parts
    keep = cfg.client_fraction * num_clients
    if keep > 1 + 1e-9:
        raise ConfigError(f"dataset.client_fraction: {num_clients} clients x {cfg.client_fraction} is more than all "
                          f"the rows; at most {1 / num_clients:.4g}")
    return [np.sort(rng.permutation(part)[:max(1, round(len(part) * keep))]) for part in parts]


def make_digits_clients(cfg: DatasetConfig,
                        rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-client (features, labels) lists, partitioned over ``cfg.num_clients`` (default 10) clients."""
    x, y = load_digits_arrays()
    num_clients = cfg.num_clients or DEFAULT_NUM_CLIENTS
    parts = partition_indices(y, cfg, num_clients, rng)
    return [x[idx] for idx in parts], [y[idx] for idx in parts]


def build(cfg: DatasetConfig, streams: Streams) -> Federation:
    xs, ys = make_digits_clients(cfg, streams.partition)
    return federation_from_clients("digits", xs, ys, cfg, streams, "classification", NUM_CLASSES,
                                   input_shape=(NUM_FEATURES,),
                                   description=f"sklearn digits: {len(xs)} clients, {partition_description(cfg)}")


REGISTRY = (DatasetInfo("digits", "scikit-learn 8x8 digits, 10 classes, partitioned over clients (no graph)",
                        "classification", build),)
