"""Client-graph helpers: build adjacency matrices and pick the held-out ("novel") clients."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F


def knn_graph(features: torch.Tensor, k: int) -> torch.Tensor:
    """Symmetric 0/1 adjacency [N, N] linking each row to its ``k`` most cosine-similar other rows.

    Used to infer a client graph from client updates when none is given. ``features`` is [N, d] (extra
    trailing dims are flattened). The graph is the union of the directed k-NN edges (i~j if either picks
    the other), so degrees can exceed ``k``. The diagonal is zero; ``k`` is clipped to ``N - 1``.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    n = features.shape[0]
    adj = torch.zeros((n, n), dtype=torch.float32, device=features.device)
    k = min(k, n - 1)
    if k <= 0:
        return adj
    # Rows of zeros normalise to zero vectors (cosine 0 to everything) instead of producing NaNs.
    unit = F.normalize(features.reshape(n, -1).to(torch.float32), dim=1)
    sim = unit @ unit.T
    sim.fill_diagonal_(float("-inf"))
    nbrs = sim.topk(k, dim=1).indices
    adj.scatter_(1, nbrs, 1.0)
    adj = torch.maximum(adj, adj.T)
    adj.fill_diagonal_(0.0)
    return adj


def edges_to_adjacency(edges: np.ndarray | torch.Tensor | Sequence[tuple[int, int]], n: int,
                       weights: np.ndarray | torch.Tensor | Sequence[float] | None = None) -> torch.Tensor:
    """Undirected adjacency [n, n] (float32) from ``edges`` of shape [E, 2] (pairs of node indices).

    Each edge sets both (u, v) and (v, u) to its weight (1 by default); self-loops are dropped so the
    diagonal stays zero. A repeated edge keeps its last weight.
    """
    e = torch.as_tensor(np.asarray(edges, dtype=np.int64) if not isinstance(edges, torch.Tensor) else edges)
    e = e.to(torch.int64).reshape(-1, 2)
    if e.numel() and (int(e.min()) < 0 or int(e.max()) >= n):
        raise ValueError(f"edge endpoints must lie in [0, {n}), got range [{int(e.min())}, {int(e.max())}]")
    if weights is None:
        w = torch.ones(e.shape[0], dtype=torch.float32)
    else:
        w = torch.as_tensor(
            np.asarray(weights, dtype=np.float32) if not isinstance(weights, torch.Tensor) else weights
        ).to(torch.float32).reshape(-1)
        if w.shape[0] != e.shape[0]:
            raise ValueError(f"got {e.shape[0]} edges but {w.shape[0]} weights")
    adj = torch.zeros((n, n), dtype=torch.float32)
    adj[e[:, 0], e[:, 1]] = w
    adj[e[:, 1], e[:, 0]] = w
    adj.fill_diagonal_(0.0)
    return adj


def choose_novel_clients(n: int, fraction: float, rng: np.random.Generator) -> torch.Tensor:
    """Bool mask [n] marking ``round(fraction * n)`` random clients as novel (unseen during training).

    At least one client is novel when ``fraction > 0`` and at least one stays in training when ``n >= 2``,
    so a small positive fraction is never silently a no-op and training never has zero clients.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"novel fraction must be in [0, 1), got {fraction}")
    count = round(fraction * n)
    if fraction > 0:
        count = max(count, 1)
        if n >= 2:
            count = min(count, n - 1)
    mask = torch.zeros(n, dtype=torch.bool)
    if count:
        mask[torch.as_tensor(rng.choice(n, size=count, replace=False))] = True
    return mask
