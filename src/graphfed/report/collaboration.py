"""Summaries of collaboration graphs: who gives weight to whom (FedAGHN Table 4, pFedGAT Fig. 3).

A collaboration graph is ``[L, N, N]`` (one row-stochastic matrix per layer; row i holds the weights client i's
personalised model gives every client), as saved in a run's ``graphs/round_XXXX.npz``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GroupWeights:
    """Average weight a client gives itself, a client of its own group, and a client of another group."""

    self_weight: float
    similar: float
    other: float


def group_weights(matrices: np.ndarray, groups: np.ndarray) -> GroupWeights:
    """Mean over layers and clients of the self weight, and of the weight per same-group / other-group client.

    Per-client averages (not sums) so the three numbers are comparable whatever the group sizes are.
    """
    matrices = np.asarray(matrices, dtype=np.float64)
    if matrices.ndim == 2:
        matrices = matrices[None]
    n = matrices.shape[-1]
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"groups must have {n} entries (one per client), got shape {groups.shape}")
    mean_graph = matrices.mean(axis=0)
    is_self = np.eye(n, dtype=bool)
    same_group = (groups[:, None] == groups[None, :]) & ~is_self
    other_group = groups[:, None] != groups[None, :]
    if not same_group.any() or not other_group.any():
        raise ValueError("need at least two clients in some group and at least two groups")
    return GroupWeights(self_weight=float(mean_graph[is_self].mean()), similar=float(mean_graph[same_group].mean()),
                        other=float(mean_graph[other_group].mean()))


def max_deviation_from_uniform(matrices: np.ndarray) -> float:
    """``max |W_ij - 1/N|`` over layers and entries, in units of ``1/N`` (0 = exactly uniform)."""
    matrices = np.asarray(matrices, dtype=np.float64)
    n = matrices.shape[-1]
    return float(np.abs(matrices - 1.0 / n).max() * n)


__all__ = ["GroupWeights", "group_weights", "max_deviation_from_uniform"]
