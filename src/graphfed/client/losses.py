"""The task losses every client kernel computes: per row and per client, for a batch of S clients."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graphfed.data.federation import Task


def per_row_loss(outputs: torch.Tensor, targets: torch.Tensor, task: Task) -> torch.Tensor:
    """Loss of every row: ``outputs [S, B, out]``, ``targets [S, B, ...]`` -> ``[S, B]``."""
    if task == "classification":
        num_clients, batch = outputs.shape[:2]
        return F.cross_entropy(outputs.reshape(num_clients * batch, -1), targets.reshape(-1),
                               reduction="none").view(num_clients, batch)
    return (outputs - targets.reshape(outputs.shape)).pow(2).flatten(2).mean(-1)


def per_client_loss(outputs: torch.Tensor, targets: torch.Tensor, task: Task) -> torch.Tensor:
    """Mean loss per client: ``outputs [S, B, out]``, ``targets [S, B, ...]`` -> ``[S]``."""
    return per_row_loss(outputs, targets, task).mean(1)
