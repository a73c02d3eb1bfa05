"""Client work: the one local-training loop and the one evaluation routine in graphfed.

Both act on a batch of S clients at once: weights are rows of a ``[S, dim]`` tensor and data are the
clients' padded splits. The Flower client runs exactly these functions with S = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit, Task
from graphfed.models.base import TargetModel


@dataclass(frozen=True)
class LocalTraining:
    """How a client trains: plain mini-batch SGD, optionally with a proximal pull to the sent weights."""

    steps: int
    batch_size: int
    lr: float
    prox_mu: float = 0.0


def per_client_loss(outputs: torch.Tensor, targets: torch.Tensor, task: Task,
                    row_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean loss per client: ``outputs [S, B, out]``, ``targets [S, B, ...]`` -> ``[S]``."""
    num_clients, batch = outputs.shape[:2]
    if task == "classification":
        losses = F.cross_entropy(outputs.reshape(num_clients * batch, -1), targets.reshape(-1),
                                 reduction="none").view(num_clients, batch)
    else:
        losses = (outputs - targets.reshape(outputs.shape)).pow(2).flatten(2).mean(-1)
    if row_mask is None:
        return losses.mean(1)
    mask = row_mask.to(losses.dtype)
    return (losses * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def _gather_rows(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``tensor [S, M, *rest]``, ``index [S, B]`` -> ``[S, B, *rest]``."""
    rest = tensor.shape[2:]
    expanded = index.view(*index.shape, *([1] * len(rest))).expand(*index.shape, *rest)
    return torch.gather(tensor, 1, expanded)


def train_clients(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit,
                  training: LocalTraining, task: Task, generator: torch.Generator,
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run ``training.steps`` SGD steps for every client (row of ``start``) simultaneously.

    Mini-batches draw row indices uniformly (with replacement) below each client's sample count, from
    ``generator``, so the draw is reproducible and identical whether clients run together or alone.
    Returns the trained weights ``[S, dim]`` and per-client metrics (``loss_first``, ``loss_last``,
    ``num_examples``).
    """
    if start.shape != (data.num_clients, spec.dim):
        raise ValueError(f"start weights must be [{data.num_clients}, {spec.dim}], got {tuple(start.shape)}")
    counts = data.counts.clamp_min(1).to(torch.float32).unsqueeze(1)
    has_data = (data.counts > 0).to(torch.float32)
    anchor = start.detach()
    weights = start.detach().clone()
    first_loss = last_loss = torch.zeros(data.num_clients)
    for step in range(training.steps):
        index = (torch.rand(data.num_clients, training.batch_size, generator=generator) * counts).long()
        x_batch, y_batch = _gather_rows(data.x, index), _gather_rows(data.y, index)
        weights.requires_grad_(True)
        losses = per_client_loss(model.batched_forward(spec.unflatten(weights), x_batch), y_batch, task)
        objective = losses
        if training.prox_mu > 0:
            objective = objective + 0.5 * training.prox_mu * (weights - anchor).pow(2).sum(1)
        # Clients own disjoint rows of `weights`, so the gradient of the sum is each client's own gradient.
        (gradient,) = torch.autograd.grad((objective * has_data).sum(), weights)
        with torch.no_grad():
            weights = weights - training.lr * gradient
        if step == 0:
            first_loss = losses.detach()
        last_loss = losses.detach()
    metrics = {"loss_first": first_loss, "loss_last": last_loss,
               "num_examples": data.counts.to(torch.float32)}
    return weights.detach(), metrics


@dataclass
class ClientScores:
    """Per-client evaluation of personalised weights on one split."""

    metric: torch.Tensor  # [N] accuracy or MSE of each client
    loss: torch.Tensor  # [N]
    pooled: float  # the metric over all samples pooled together
    counts: torch.Tensor  # [N]


@torch.no_grad()
def evaluate_clients(model: TargetModel, spec: ParamSpec, weights: torch.Tensor, data: ClientSplit,
                     task: Task, max_elements: int = 20_000_000) -> ClientScores:
    """Each client's metric with its own weights on its own rows (padding rows masked out)."""
    per_client_rows = max(1, data.x[0].numel())
    chunk = max(1, max_elements // per_client_rows)
    metric_parts, loss_parts, correct_or_sq, elements = [], [], 0.0, 0.0
    for lo in range(0, data.num_clients, chunk):
        hi = min(lo + chunk, data.num_clients)
        part = ClientSplit(data.x[lo:hi], data.y[lo:hi], data.counts[lo:hi])
        mask = part.mask()
        outputs = model.batched_forward(spec.unflatten(weights[lo:hi]), part.x)
        loss_parts.append(per_client_loss(outputs, part.y, task, mask))
        rows = part.counts.to(torch.float32).clamp_min(1.0)
        if task == "classification":
            hits = ((outputs.argmax(-1) == part.y) & mask).to(torch.float32).sum(1)
            metric_parts.append(hits / rows)
            correct_or_sq += float(hits.sum())
            elements += float(part.counts.sum())
        else:
            sq = (outputs - part.y.reshape(outputs.shape)).pow(2).flatten(2)
            per_row = sq.sum(-1) * mask
            width = sq.shape[-1]
            metric_parts.append(per_row.sum(1) / (rows * width))
            correct_or_sq += float(per_row.sum())
            elements += float(part.counts.sum()) * width
    return ClientScores(metric=torch.cat(metric_parts), loss=torch.cat(loss_parts),
                        pooled=correct_or_sq / max(elements, 1.0), counts=data.counts)
