"""FL-N: the synthetic rotating two-class toy of Panacea (Sec. IV-1), after GRDA's toy generator.

Client ``t`` draws an angle ``w_t ~ U[0, 2*pi)`` and a radius ``r_t = 1 + 6 * w_t / (2*pi)``. Its two
classes are centred at ``+r_t * [cos w_t, sin w_t]`` (label 1) and ``-r_t * [cos w_t, sin w_t]`` (label 0);
points are N(mean, I) restricted to the unit disc around the mean. Clients with close angles have similar
decision boundaries, and the client graph links them more often:
``A_uv ~ Bernoulli(0.5 cos(w_u - w_v) + 0.5)``.
"""

from __future__ import annotations

import numpy as np
import torch

from graphfed.config import DatasetConfig
from graphfed.core.memory import check_fits
from graphfed.data.federation import Federation
from graphfed.data.registry import DatasetInfo, Streams, federation_from_clients, fixed_client_count

# Acceptance probability of a 2-D standard normal inside the unit disc is 1 - exp(-1/2) ~ 0.39; drawing
# 3x the need per batch makes a second batch rare and a 50th one astronomically unlikely.
_OVERSAMPLE = 3.0
_MAX_BATCHES = 50


def _unit_disc_offsets(count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` draws of N(0, I_2) conditioned on norm <= 1, by batched rejection sampling."""
    kept: list[np.ndarray] = []
    have = 0
    for _ in range(_MAX_BATCHES):
        if have >= count:
            break
        batch = rng.standard_normal((int((count - have) * _OVERSAMPLE) + 16, 2))
        batch = batch[np.einsum("ij,ij->i", batch, batch) <= 1.0]
        kept.append(batch)
        have += len(batch)
    if have < count:
        raise RuntimeError(f"rejection sampling produced {have} of {count} points in {_MAX_BATCHES} batches")
    return np.concatenate(kept)[:count]


def make_fl_n(num_clients: int, rng: np.random.Generator, samples_per_class: int = 50,
              knn: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate FL-N.

    Returns ``(xs, ys, adjacency, angles)``: xs float32 [T, 2 * samples_per_class, 2], ys int64
    [T, 2 * samples_per_class] (rows shuffled per client), adjacency float32 [T, T] symmetric 0/1 with zero
    diagonal, angles float64 [T] in [0, 2*pi). ``knn > 0`` replaces the paper's Bernoulli graph (dense: about
    half of all pairs are edges) by a sparse one: each client linked to its ``knn`` nearest clients by angle.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if samples_per_class < 1:
        raise ValueError(f"samples_per_class must be >= 1, got {samples_per_class}")
    t, s = num_clients, samples_per_class

    angles = rng.uniform(0.0, 2.0 * np.pi, size=t)
    radius = 1.0 + 6.0 * angles / (2.0 * np.pi)
    direction = np.stack([np.cos(angles), np.sin(angles)], axis=1)  # [T, 2]
    means = np.stack([-radius[:, None] * direction, radius[:, None] * direction], axis=1)  # [T, 2 cls, 2]

    # Offsets are i.i.d. and independent of the mean, so one pooled rejection sampler serves all groups.
    offsets = _unit_disc_offsets(t * 2 * s, rng).reshape(t, 2, s, 2)
    xs = (means[:, :, None, :] + offsets).reshape(t, 2 * s, 2)
    ys = np.broadcast_to(np.repeat(np.array([0, 1], dtype=np.int64), s), (t, 2 * s))
    # Shuffle rows within each client so a chronological split does not hand train one class only.
    perm = np.argsort(rng.random((t, 2 * s)), axis=1)
    xs = np.take_along_axis(xs, perm[:, :, None], axis=1).astype(np.float32)
    ys = np.take_along_axis(ys, perm, axis=1).astype(np.int64)

    if knn > 0:
        return xs, ys, nearest_by_angle(angles, knn), angles
    prob = 0.5 * np.cos(angles[:, None] - angles[None, :]) + 0.5
    upper = np.triu(rng.random((t, t)) < prob, k=1)
    adjacency = (upper | upper.T).astype(np.float32)
    return xs, ys, adjacency, angles


def nearest_by_angle(angles: np.ndarray, k: int) -> np.ndarray:
    """``[T, T]`` 0/1 adjacency linking every client to its ``k`` nearest clients by angle on the circle
    (symmetrised), in O(T k) work: on a circle the k nearest are among the k before and k after in angle order."""
    t = len(angles)
    k = min(k, t - 1)
    order = np.argsort(angles)
    offsets = np.concatenate([np.arange(-k, 0), np.arange(1, k + 1)])
    candidates = order[(np.arange(t)[:, None] + offsets[None, :]) % t]  # [T, 2k] by sorted position
    gap = np.abs(angles[order][:, None] - angles[candidates])
    gap = np.minimum(gap, 2 * np.pi - gap)
    nearest = np.take_along_axis(candidates, np.argsort(gap, axis=1, kind="stable")[:, :k], axis=1)
    adjacency = np.zeros((t, t), dtype=np.float32)
    adjacency[np.repeat(order, k), nearest.reshape(-1)] = 1.0
    adjacency = np.maximum(adjacency, adjacency.T)
    np.fill_diagonal(adjacency, 0.0)
    return adjacency


FL60_CLIENTS = 60


def build(cfg: DatasetConfig, streams: Streams) -> Federation:
    """``fl60`` (the paper's 60 clients) and ``fln`` (``dataset.num_clients`` clients)."""
    if cfg.name == "fl60":
        fixed_client_count(cfg, FL60_CLIENTS)
    num_clients = cfg.num_clients or FL60_CLIENTS
    # the paper's graph draws a float64 uniform per pair; either graph is held as a dense float32 matrix
    check_fits(num_clients**2 * (4 if cfg.graph_knn else 14),
               f"the FL-N client graph of {num_clients:,} clients ({'dense' if not cfg.graph_knn else 'kNN'})",
               "use dataset.graph_knn (a sparse kNN graph) or fewer clients (dataset.num_clients)")
    xs, ys, adjacency, _ = make_fl_n(num_clients, streams.generate, knn=cfg.graph_knn)
    graph_text = (f"each client linked to its {cfg.graph_knn} nearest by angle" if cfg.graph_knn
                  else "graph edges ~ Bernoulli(0.5 cos(angle gap) + 0.5)")
    return federation_from_clients(
        cfg.name, list(xs), list(ys), cfg, streams, "classification", 2, input_shape=(2,),
        client_graph=torch.as_tensor(adjacency, dtype=torch.float32),
        description=f"FL-N synthetic: {num_clients} clients x 100 points in 2-D, 2 classes on a rotating axis; "
                    f"{graph_text}")


REGISTRY = (
    DatasetInfo("fl60", "FL-N synthetic rotating two-class toy with 60 clients and a cosine-angle graph",
                "classification", build),
    DatasetInfo("fln", "FL-N synthetic toy with dataset.num_clients clients (default 60)", "classification", build),
)
