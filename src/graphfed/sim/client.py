"""Client work: the one local-training loop and the one evaluation routine in graphfed.

Both act on a batch of S clients at once: weights are rows of a ``[S, dim]`` tensor and data are the
clients' padded splits. The Flower client runs exactly these functions with S = 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from graphfed.core.params import ParamSpec
from graphfed.core.rng import unit_direction as rng_direction
from graphfed.data.federation import ClientSplit, Task
from graphfed.models.base import TargetModel


@dataclass(frozen=True)
class LocalTraining:
    """How a client trains: plain mini-batch SGD, optionally with a proximal pull to the sent weights."""

    steps: int
    batch_size: int
    lr: float
    prox_mu: float = 0.0
    #: what the client reports about the sent weights besides its update (pFedGAT): "none",
    #: "val_gradient" (dL_val/d sent) or "val_loss_pair" (L_val at sent +- feedback_mu * u, u from a seed)
    feedback: str = "none"
    feedback_mu: float = 1e-3


def per_client_loss(outputs: torch.Tensor, targets: torch.Tensor, task: Task,
                    row_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean loss per client: ``outputs [S, B, out]``, ``targets [S, B, ...]`` -> ``[S]``."""
    if task == "classification":
        num_clients, batch = outputs.shape[:2]
        losses = F.cross_entropy(outputs.reshape(num_clients * batch, -1), targets.reshape(-1),
                                 reduction="none").view(num_clients, batch)
    else:
        losses = (outputs - targets.reshape(outputs.shape)).pow(2).flatten(2).mean(-1)
    if row_mask is None:
        return losses.mean(1)
    # where, not multiply: padding rows may hold anything (NaN * 0 is NaN).
    return torch.where(row_mask, losses, 0.0).sum(1) / row_mask.sum(1).clamp_min(1)


def _gather_rows(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``tensor [S, M, *rest]``, ``index [S, B]`` -> ``[S, B, *rest]``."""
    rest = tensor.shape[2:]
    expanded = index.view(*index.shape, *([1] * len(rest))).expand(*index.shape, *rest)
    return torch.gather(tensor, 1, expanded)


def draw_batch_indices(counts: torch.Tensor, steps: int, batch_size: int,
                       batch_seeds: Sequence[int]) -> torch.Tensor:
    """``[S, steps, batch]`` row indices, uniform with replacement below each client's count.

    Client ``i`` draws from its own generator seeded with ``batch_seeds[i]``, so its batches do not
    depend on which other clients train alongside it (the simulator and a Flower client agree).
    """
    if len(batch_seeds) != len(counts):
        raise ValueError(f"need one batch seed per client: {len(counts)} clients, {len(batch_seeds)} seeds")
    uniform = torch.stack([torch.rand(steps, batch_size, generator=torch.Generator().manual_seed(int(seed)))
                           for seed in batch_seeds]) if len(batch_seeds) else torch.zeros(0, steps, batch_size)
    # Clients without rows get index 0 and are masked out of the forward pass below.
    return (uniform * counts.clamp_min(1).to(torch.float32).view(-1, 1, 1)).long()


def train_clients(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit,
                  training: LocalTraining, task: Task, batch_seeds: Sequence[int],
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run ``training.steps`` SGD steps for every client (row of ``start``) simultaneously.

    Mini-batches come from :func:`draw_batch_indices` with one seed per client. Returns the trained
    weights ``[S, dim]`` and per-client metrics (``loss_first``, ``loss_last``, ``num_examples``).
    Clients with no training rows keep their start weights.
    """
    if start.shape != (data.num_clients, spec.dim):
        raise ValueError(f"start weights must be [{data.num_clients}, {spec.dim}], got {tuple(start.shape)}")
    batch_index = draw_batch_indices(data.counts, training.steps, training.batch_size, batch_seeds)
    has_rows = data.counts > 0
    has_data = has_rows.to(torch.float32)
    every_client_has_rows = bool(has_rows.all())
    # One leaf per named tensor for the whole loop: slicing a flat row every step would add a backward
    # node per tensor per step. Flattened once at the end.
    anchor = spec.unflatten(start.detach())
    weights = {name: value.clone() for name, value in anchor.items()}
    first_loss = last_loss = torch.zeros(data.num_clients)
    for step in range(training.steps):
        index = batch_index[:, step]
        x_batch, y_batch = _gather_rows(data.x, index), _gather_rows(data.y, index)
        if not every_client_has_rows:  # never let a client without rows read its padding
            x_batch = torch.where(has_rows.view(-1, *[1] * (x_batch.ndim - 1)), x_batch, 0.0)
            y_batch = torch.where(has_rows.view(-1, *[1] * (y_batch.ndim - 1)), y_batch, 0).to(y_batch.dtype)
        leaves = [value.requires_grad_(True) for value in weights.values()]
        losses = per_client_loss(model.batched_forward(weights, x_batch), y_batch, task)
        objective = losses
        if training.prox_mu > 0:
            distance = sum((weights[n] - anchor[n]).pow(2).flatten(1).sum(1) for n in weights)
            objective = objective + 0.5 * training.prox_mu * distance
        # Clients own disjoint slices of every leaf, so the gradient of the sum is each client's own gradient.
        total = objective.sum() if every_client_has_rows else (objective * has_data).sum()
        gradients = torch.autograd.grad(total, leaves)
        with torch.no_grad():
            weights = {name: leaf - training.lr * grad
                       for (name, leaf), grad in zip(weights.items(), gradients, strict=True)}
        if step == 0:
            first_loss = losses.detach()
        if step == training.steps - 1:
            last_loss = losses.detach()
    metrics = {"loss_first": first_loss * has_data, "loss_last": last_loss * has_data,
               "num_examples": data.counts.to(torch.float32)}
    return spec.flatten(weights, batch_dims=1), metrics


def validation_feedback(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit, task: Task,
                        training: LocalTraining, seeds: Sequence[int]) -> torch.Tensor:
    """What a client tells the server about the weights it was sent, measured on its validation split.

    ``val_gradient``: ``[S, dim]``, the gradient of its validation loss at ``start`` (as large as a model).
    ``val_loss_pair``: ``[S, 2]``, its validation loss at ``start + mu*u`` and ``start - mu*u`` with ``u`` a
    unit direction drawn from ``seeds[i]`` (two scalars; the server redraws ``u`` from the same seed).
    """
    mask = data.mask()

    def losses(weights: torch.Tensor) -> torch.Tensor:
        return per_client_loss(model.batched_forward(spec.unflatten(weights), data.x), data.y, task, mask)

    if training.feedback == "val_gradient":
        leaf = start.detach().clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad(losses(leaf).sum(), leaf)
        return gradient
    if training.feedback == "val_loss_pair":
        directions = torch.stack([rng_direction(seed, spec.dim) for seed in seeds])
        with torch.no_grad():
            step = training.feedback_mu * directions
            return torch.stack([losses(start + step), losses(start - step)], dim=1)
    raise ValueError(f"unknown client feedback {training.feedback!r}; allowed: none, val_gradient, val_loss_pair")


#: The fields of ClientScores, in order (what travels between machines).
SCORE_FIELDS = ("metric", "loss", "counts", "metric_sum", "metric_elements", "abs_error_sum")


@dataclass
class ClientScores:
    """Per-client evaluation of personalised weights on one split.

    ``metric_sum`` / ``metric_elements`` are each client's numerator and denominator (correct predictions
    and rows, or squared errors and values), so scores computed on different machines can be merged and
    pooled exactly. Regression also keeps the absolute errors, for the MAE users read in their own units.
    """

    metric: torch.Tensor  # [N] accuracy or MSE of each client
    loss: torch.Tensor  # [N]
    counts: torch.Tensor  # [N] rows per client
    metric_sum: torch.Tensor  # [N]
    metric_elements: torch.Tensor  # [N]
    abs_error_sum: torch.Tensor  # [N] sum of |prediction - target| (regression; zero for classification)

    @property
    def mae(self) -> torch.Tensor:
        """[N] mean absolute error of each client (regression)."""
        return self.abs_error_sum / self.metric_elements.clamp_min(1.0)

    @property
    def pooled(self) -> float:
        """The metric over all samples of these clients pooled together."""
        return float(self.metric_sum.double().sum() / self.metric_elements.double().sum().clamp_min(1.0))

    def select(self, index: torch.Tensor) -> ClientScores:
        return ClientScores(*(getattr(self, name)[index] for name in SCORE_FIELDS))

    @staticmethod
    def concat(parts: list[ClientScores]) -> ClientScores:
        return ClientScores(*(torch.cat([getattr(p, name) for p in parts]) for name in SCORE_FIELDS))



@torch.no_grad()
def evaluate_clients(model: TargetModel, spec: ParamSpec, weights: torch.Tensor, data: ClientSplit,
                     task: Task, max_elements: int = 20_000_000) -> ClientScores:
    """Each client's metric with its own weights on its own rows (padding rows masked out).

    Clients go in chunks (one at a time for models that loop over clients anyway), each chunk cut to its
    largest client, so little compute is spent on padding when client sizes differ a lot (Dirichlet splits).
    """
    per_client_rows = max(1, data.x[0].numel())
    chunk = 1 if model.clients_in_loop else max(1, max_elements // per_client_rows)
    parts = []
    for lo in range(0, data.num_clients, chunk):
        hi = min(lo + chunk, data.num_clients)
        width = max(1, int(data.counts[lo:hi].max()))
        part = ClientSplit(data.x[lo:hi, :width], data.y[lo:hi, :width], data.counts[lo:hi])
        mask = part.mask()
        outputs = model.batched_forward(spec.unflatten(weights[lo:hi]), part.x)
        rows = part.counts.to(torch.float32)
        if task == "classification":
            metric_sum = ((outputs.argmax(-1) == part.y) & mask).to(torch.float32).sum(1)
            metric_elements = rows
            abs_error_sum = torch.zeros_like(rows)
        else:
            error = (outputs - part.y.reshape(outputs.shape)).flatten(2)
            metric_sum = torch.where(mask, error.pow(2).sum(-1), 0.0).sum(1)
            abs_error_sum = torch.where(mask, error.abs().sum(-1), 0.0).sum(1)
            metric_elements = rows * error.shape[-1]
        parts.append(ClientScores(metric=metric_sum / metric_elements.clamp_min(1.0),
                                  loss=per_client_loss(outputs, part.y, task, mask), counts=part.counts,
                                  metric_sum=metric_sum, metric_elements=metric_elements,
                                  abs_error_sum=abs_error_sum))
    return ClientScores.concat(parts)
