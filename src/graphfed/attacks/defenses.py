"""Defences: robust server aggregation for the FedAvg family, and Simple-Tuning on the clients.

Robust aggregation has the names and semantics of Flower's strategies (``flwr.serverapp.strategy``), applied to
the clients' updates (every client of a FedAvg-family round received the same global model, so aggregating
updates is aggregating models):

- ``fedavg``: the sample-weighted mean;
- ``fedmedian``: the coordinate-wise median, unweighted (``np.median``: the mean of the two middle values when
  the count is even);
- ``fedtrimmedavg``: per coordinate, drop the ``int(beta * n)`` smallest and largest values and average the rest,
  unweighted (``scipy.stats.trim_mean``);
- ``krum`` / ``multikrum``: score each update by the summed squared distances to its ``n - f - 2`` nearest others
  (at least 1), ``f = num_malicious_nodes``; keep the ``num_nodes_to_select`` lowest scores (1 for Krum) and take
  their sample-weighted mean;
- ``clipping_norm``: before aggregating, each update is scaled to an L2 norm of at most ``clipping_norm``
  (Flower's fixed clipping, without its noise).

Simple-Tuning (Qin et al., KDD 2023), the client-side backdoor defence, is :class:`SimpleTuning`: before evaluation,
a client re-initialises its classifier layer and retrains that layer alone on its own training rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch

from graphfed.client.contract import ClientSetting, HeadTraining
from graphfed.client.training import train_clients
from graphfed.data.federation import ClientSplit
from graphfed.models.base import TargetModel

Aggregation = Literal["fedavg", "fedmedian", "fedtrimmedavg", "krum", "multikrum"]


def clip_updates(updates: torch.Tensor, clipping_norm: float) -> torch.Tensor:
    """Each row scaled by ``min(1, clipping_norm / ||row||)``."""
    norms = updates.norm(dim=1, keepdim=True)
    return updates * (clipping_norm / norms.clamp_min(1e-12)).clamp(max=1.0)


def coordinate_median(updates: torch.Tensor) -> torch.Tensor:
    """Per-coordinate median of ``[n, dim]``; even ``n`` averages the two middle values (as numpy)."""
    ordered = updates.sort(dim=0).values
    n = len(updates)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def trimmed_mean(updates: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-coordinate mean after dropping the ``int(beta * n)`` smallest and largest values."""
    if not 0.0 <= beta < 0.5:
        raise ValueError("beta must be in [0, 0.5)")
    cut = int(beta * len(updates))
    return updates.sort(dim=0).values[cut:len(updates) - cut].mean(0)


def krum_select(updates: torch.Tensor, num_malicious: int, num_to_select: int) -> torch.Tensor:
    """Positions of the ``num_to_select`` updates with the lowest Krum scores (ties: the earlier client)."""
    distances = torch.cdist(updates.double(), updates.double()).pow(2)
    closest = max(1, len(updates) - num_malicious - 2)
    # each row's own zero distance sorts first; skip it, as Flower does
    scores = distances.sort(dim=1).values[:, 1:closest + 1].sum(1)
    return torch.sort(scores, stable=True).indices[:num_to_select]


def robust_aggregate(updates: torch.Tensor, num_examples: torch.Tensor, aggregation: Aggregation = "fedavg",
                     beta: float = 0.2, num_malicious_nodes: int = 0, num_nodes_to_select: int = 1,
                     clipping_norm: float | None = None) -> torch.Tensor:
    """The aggregate ``[dim]`` of client updates ``[n, dim]`` with sample counts ``num_examples [n]``."""
    from graphfed.core.mixing import weighted_mean

    if clipping_norm is not None:
        updates = clip_updates(updates, clipping_norm)
    if aggregation == "fedavg":
        return weighted_mean(updates, num_examples)
    if aggregation == "fedmedian":
        return coordinate_median(updates)
    if aggregation == "fedtrimmedavg":
        return trimmed_mean(updates, beta)
    if aggregation in ("krum", "multikrum"):
        keep = krum_select(updates, num_malicious_nodes, 1 if aggregation == "krum" else num_nodes_to_select)
        return weighted_mean(updates[keep], num_examples[keep])
    raise ValueError(f"unknown aggregation {aggregation!r}")


@dataclass(frozen=True)
class SimpleTuning:
    """Simple-Tuning: the head tensors reset to the run's initial head (``init_weights``, the model's seeded
    initialisation) and trained alone for ``steps`` SGD steps at ``lr`` on each client's training rows."""

    steps: int
    lr: float
    init_weights: torch.Tensor  # [dim]

    def apply(self, model: TargetModel, setting: ClientSetting, weights: torch.Tensor, train: ClientSplit,
              seeds: Sequence[int]) -> torch.Tensor:
        """``[S, dim]`` the clients' ``weights`` with a re-initialised, retrained head."""
        spec = setting.spec
        head = spec.index_of(setting.head)
        weights = weights.clone()
        weights[:, head] = self.init_weights[head]
        rule = HeadTraining(replace(setting, training=replace(setting.training, steps=self.steps, lr=self.lr)))
        return train_clients(model, spec, weights, train, rule, seeds).trained
