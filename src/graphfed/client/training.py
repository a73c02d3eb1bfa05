"""The one local-training loop of graphfed (:func:`train_clients`) and the validation feedback pFedGAT's
clients report: both act on S clients at once. The Flower client runs exactly these functions with S = 1."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from graphfed.client.contract import ClientRule, LocalResult, LocalStep, LocalTraining
from graphfed.client.evaluation import scoring_blocks, sum_by_client
from graphfed.client.losses import per_client_loss, per_row_loss
from graphfed.client.placement import autocast
from graphfed.client.side_by_side import map_side_by_side, side_by_side_workers
from graphfed.core.params import ParamSpec
from graphfed.core.rng import unit_direction as rng_direction
from graphfed.data.federation import ClientSplit, Task
from graphfed.models.base import TargetModel


def draw_batch_indices(counts: torch.Tensor, steps: int, batch_size: int,
                       batch_seeds: Sequence[int]) -> torch.Tensor:
    """``[S, steps, batch]`` row indices, uniform with replacement below each client's count.

    Client ``i`` draws from its own generator seeded with ``batch_seeds[i]``, so its batches do not
    depend on which other clients train alongside it (the simulator and a Flower client agree).
    """
    if len(batch_seeds) != len(counts):
        raise ValueError(f"need one batch seed per client: {len(counts)} clients, {len(batch_seeds)} seeds")
    # drawn on the host from per-client CPU generators: the same batches on every device
    uniform = torch.stack([torch.rand(steps, batch_size, generator=torch.Generator().manual_seed(int(seed)),
                                      device="cpu")
                           for seed in batch_seeds]) if len(batch_seeds) else torch.zeros(0, steps, batch_size,
                                                                                          device="cpu")
    # Clients without rows get index 0 and are masked out of the forward pass below.
    return (uniform * counts.cpu().clamp_min(1).to(torch.float32).view(-1, 1, 1)).long().to(counts.device)


def label_histogram(data: ClientSplit, num_classes: int) -> torch.Tensor:
    """``[S, classes]`` count of each label among each client's training rows."""
    owner, rows = data.row_owners()
    counts = torch.zeros(data.num_clients * num_classes, device=data.device)
    counts.index_add_(0, owner * num_classes + data.read_targets(rows), torch.ones(len(rows), device=data.device))
    return counts.view(data.num_clients, num_classes)


#: weights trained at once (clients x parameters) on a CPU: above it, clients train a chunk at a time
TRAINING_VALUES_PER_CHUNK = 4_000_000
#: on an accelerator the bound is its memory, not a cache: 500 M values (2 GB per fp32 copy of a chunk's weights)
ACCELERATOR_VALUES_PER_CHUNK = 500_000_000


def values_per_chunk(device: torch.device) -> int:
    """Weights (clients x parameters) one training call holds at once on ``device``."""
    return TRAINING_VALUES_PER_CHUNK if device.type == "cpu" else ACCELERATOR_VALUES_PER_CHUNK


def train_clients(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit, rule: ClientRule,
                  batch_seeds: Sequence[int], state: dict[str, torch.Tensor] | None = None,
                  broadcast: dict[str, torch.Tensor] | None = None, out: torch.Tensor | None = None) -> LocalResult:
    """The one local-training loop: every client (row of ``start``) trains simultaneously under ``rule`` (whose
    setting says how: steps, batch size, learning rate, task).

    Mini-batches come from :func:`draw_batch_indices` with one seed per client. Returns the trained weights
    ``[S, dim]``, per-client metrics (``loss_first``, ``loss_last``, ``num_examples``) and the clients' new
    state. Clients with no training rows keep their start weights. ``out``: a ``[S, dim]`` tensor the trained weights
    are written into (chunks write their rows of it: no copy of every client's weights to join them).
    """
    if start.shape != (data.num_clients, spec.dim):
        raise ValueError(f"start weights must be [{data.num_clients}, {spec.dim}], got {tuple(start.shape)}")
    per_chunk = max(1, values_per_chunk(start.device) // spec.dim)
    if model.clients_per_chunk is not None:
        per_chunk = min(per_chunk, model.clients_per_chunk)
    if data.num_clients > per_chunk:
        # Clients are independent: large models train a chunk of clients at a time, so the weights, gradients
        # and updates of a step stay cache-sized (50 clients x 1.6M parameters rewritten per step are
        # memory-bound); results equal all-at-once training up to float rounding.
        trained = torch.empty(start.shape, dtype=start.dtype, device=start.device) if out is None else out

        def train_chunk(rows: torch.Tensor) -> LocalResult:
            first, last = int(rows[0]), int(rows[-1]) + 1  # chunks are consecutive clients: a view of their rows
            return train_clients(model, spec, start[rows], data.select(rows), rule,
                                 [batch_seeds[i] for i in rows.tolist()],
                                 None if state is None else {k: v[rows] for k, v in state.items()},
                                 None if broadcast is None else {k: v[rows] for k, v in broadcast.items()},
                                 out=trained[first:last])

        chunks = torch.arange(data.num_clients, device="cpu").split(per_chunk)
        # One-client chunks that train as modules (each on its own copy of the network) may run side by side
        # (graphfed.client.side_by_side): the same kernels on one thread each, so the same bits
        as_modules = per_chunk == 1 and bool((data.counts > 0).all()) and trains_as_a_module(
            model, rule, data.select(chunks[0]), state, broadcast)
        parts = list(map_side_by_side(train_chunk, chunks, side_by_side_workers(data.device) if as_modules else 1))
        return LocalResult(trained,
                           {key: torch.cat([part.metrics[key] for part in parts]) for key in parts[0].metrics},
                           {key: torch.cat([part.state[key] for part in parts]) for key in parts[0].state})
    if trains_as_a_module(model, rule, data, state, broadcast):
        return written_to(train_one_module(model, spec, start, data, rule, batch_seeds), out)
    training, task = rule.setting.training, rule.setting.task
    steps, per_step = rule.total_steps, rule.batches_per_step
    batch_index = draw_batch_indices(data.counts, steps * per_step, training.batch_size, batch_seeds)
    has_rows = data.counts > 0
    every_client_has_rows = bool(has_rows.all())
    has_data = None if every_client_has_rows else has_rows.to(torch.float32)
    label_counts = label_histogram(data, rule.setting.output_dim) if rule.uses_label_counts else None
    # One leaf per named tensor for the whole loop: slicing a flat row every step would add a backward
    # node per tensor per step. Flattened once at the end.
    received = spec.unflatten(start.detach())
    state = rule.init_state(start.detach()) if state is None else state
    tracks = rule.start(received, state)
    first_loss = last_loss = torch.zeros(data.num_clients, device=start.device)
    local = LocalStep(model, task, 0, [], has_data, training.lr, label_counts, data, broadcast or {})
    for step in range(steps):
        batches = [data.gather(batch_index[:, step * per_step + draw]) for draw in range(per_step)]
        local = LocalStep(model, task, step, batches, has_data, training.lr, label_counts, data, broadcast or {})
        with autocast(training.precision, start.device):
            tracks, losses = rule.step(local, tracks, received)
        if step == 0:
            first_loss = losses.detach()
        if step == steps - 1:
            last_loss = losses.detach()
    uploads = rule.uploads(tracks, local)
    trained, new_state = rule.finish(tracks, received, state)
    trained_flat = spec.flatten({name: value.detach() for name, value in trained.items()}, batch_dims=1,
                                out=out if every_client_has_rows else None)
    if not every_client_has_rows:  # a client without rows trained nothing and keeps what it had
        keep = ~has_rows
        trained_flat = torch.where(keep.unsqueeze(1), start.detach(), trained_flat)
        if out is not None:
            trained_flat = out.copy_(trained_flat)
        new_state = {key: torch.where(keep.view(-1, *[1] * (value.ndim - 1)), state[key], value)
                     for key, value in new_state.items()}
    zero_if_no_data = has_rows.to(torch.float32)
    metrics = {"loss_first": first_loss * zero_if_no_data, "loss_last": last_loss * zero_if_no_data,
               "num_examples": data.counts.to(torch.float32), **{k: v.detach() for k, v in uploads.items()}}
    return LocalResult(trained_flat, metrics, {key: value.detach() for key, value in new_state.items()})


def written_to(result: LocalResult, out: torch.Tensor | None) -> LocalResult:
    """``result`` with its trained weights in ``out`` (when given)."""
    if out is None:
        return result
    return LocalResult(out.copy_(result.trained), result.metrics, result.state)


def trains_as_a_module(model: TargetModel, rule: ClientRule, data: ClientSplit,
                       state: dict[str, torch.Tensor] | None, broadcast: dict[str, torch.Tensor] | None) -> bool:
    """Whether this call is one client of a model that trains its clients one by one, under plain SGD: then a real
    module with its parameters as leaves (:func:`train_one_module`) computes the same step as the functional path,
    bit for bit, and faster (no re-parametrisation per step, no fresh weight tensors: benchmarks/cpu_grid.py)."""
    return (data.num_clients == 1 and model.loops_clients_on(data.device) and type(rule) is ClientRule
            and rule.prox_mu == 0 and rule.batches_per_step == 1 and not rule.uses_label_counts
            and rule.setting.training.steps >= 1 and rule.setting.training.precision != "bf16" and not state
            and not broadcast
            and bool(data.counts[0] > 0) and next(model.buffers(), None) is None)


def train_one_module(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit, rule: ClientRule,
                     batch_seeds: Sequence[int]) -> LocalResult:
    """Plain SGD of one client as a per-client loop writes it (a copy of the module, ``backward``, an update in
    place), with :func:`train_clients`' batches, loss and update roundings (the product, then the difference): the
    same trained weights and metrics as the functional path."""
    training, task = rule.setting.training, rule.setting.task
    local = copy.deepcopy(model)  # in the model's own mode, as functional_call runs it
    parameters = [local.get_parameter(tensor.name) for tensor in spec.tensors]
    with torch.no_grad():
        torch._foreach_copy_(parameters, list(spec.unflatten(start[0].detach()).values()))
    batch_index = draw_batch_indices(data.counts, training.steps, training.batch_size, batch_seeds)
    layout = model.images_layout_on(start.device)  # as the model's own client loop lays its images out
    losses: list[torch.Tensor] = []
    for step in range(training.steps):
        x, y = data.gather(batch_index[:, step])
        images = x[0] if x.ndim != 5 else x[0].contiguous(memory_format=layout)
        loss = per_client_loss(local(images).unsqueeze(0), y, task)
        loss.sum().backward()
        with torch.no_grad():
            stepped = [parameter for parameter in parameters if parameter.grad is not None]  # unused: zero gradient
            grads = [parameter.grad for parameter in stepped]
            torch._foreach_mul_(grads, training.lr)
            torch._foreach_sub_(stepped, grads)
        for parameter in stepped:
            parameter.grad = None
        if step in (0, training.steps - 1):
            losses.append(loss.detach())
    trained = spec.flatten_module(local).unsqueeze(0)
    metrics = {"loss_first": losses[0], "loss_last": losses[-1], "num_examples": data.counts.to(torch.float32)}
    return LocalResult(trained, metrics, {})


def validation_feedback(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit, task: Task,
                        training: LocalTraining, seeds: Sequence[int]) -> torch.Tensor:
    """What a client tells the server about the weights it was sent, measured on its validation split.

    ``val_gradient``: ``[S, dim]``, the gradient of its validation loss at ``start`` (as large as a model).
    ``val_loss_pair``: ``[S, 2]``, its validation loss at ``start + mu*u`` and ``start - mu*u`` with ``u`` a
    unit direction drawn from ``seeds[i]`` (two scalars; the server redraws ``u`` from the same seed).
    """
    blocks = list(scoring_blocks(model, data, spec.dim))  # a validation split: small enough to keep

    def losses(weights: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(data.num_clients, dtype=weights.dtype, device=weights.device)
        for block in blocks:
            with autocast(training.precision, weights.device):
                outputs = model.batched_forward(spec.unflatten(weights[block.owner]), block.x).float()
            total = total + sum_by_client(per_row_loss(outputs, block.y, task), block, data.num_clients)
        return total / data.counts.clamp_min(1)

    if training.feedback == "val_gradient":
        leaf = start.detach().clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad(losses(leaf).sum(), leaf)
        return gradient
    if training.feedback == "val_loss_pair":
        directions = torch.stack([rng_direction(seed, spec.dim) for seed in seeds]).to(start.device)
        with torch.no_grad():
            step = training.feedback_mu * directions
            return torch.stack([losses(start + step), losses(start - step)], dim=1)
    raise ValueError(f"unknown client feedback {training.feedback!r}; allowed: none, val_gradient, val_loss_pair")
