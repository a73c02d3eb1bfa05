"""Client work: the one local-training loop and the one evaluation routine in graphfed.

Both act on a batch of S clients at once: weights are rows of a ``[S, dim]`` tensor and data are the
clients' splits (rows stored once, gathered per mini-batch or evaluation block). The Flower client runs
exactly these functions with S = 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from graphfed.core.params import ParamSpec
from graphfed.core.rng import unit_direction as rng_direction
from graphfed.data.federation import ClientSplit, RowBlocks, Task
from graphfed.models.base import TargetModel


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


def block_plan(data: ClientSplit, dim: int, max_elements: int = 4_000_000) -> tuple[int, int]:
    """``(block_rows, blocks_per_chunk)`` for walking ``data`` in blocks: blocks about one mean client long (at most
    256 rows, so a client wastes at most one partly filled block), and as many blocks per chunk as fit in
    ``max_elements`` values of inputs plus one weight copy per block. The default (16 MB of inputs) bounds a CNN's
    activations to a few hundred MB: LeNet's first layer holds 4x its input."""
    mean_rows = -(-data.num_rows // max(data.num_clients, 1))
    block_rows = int(min(max(mean_rows, 1), 256))
    per_block = block_rows * math.prod(data.x.shape[1:]) + dim
    return block_rows, max(1, max_elements // per_block)


def scoring_blocks(model: TargetModel, data: ClientSplit, dim: int,
                   max_elements: int = 4_000_000) -> Iterator[RowBlocks]:
    """The rows a model is scored (or its features read) on, in blocks whose outputs do not depend on the blocking.

    Rows of a model without batch statistics are independent: fixed-size blocks (:func:`block_plan`). A model with
    batch statistics (BatchNorm) sees each client's whole split as one block with no padding row, so its statistics
    cover exactly the client's rows whatever their order (a split is stored class-sorted: blocks of it would each
    see a few classes)."""
    if not model.batch_statistics:
        yield from data.blocks(*block_plan(data, dim, max_elements))
        return
    for client in range(data.num_clients):
        start, count = int(data.starts[client]), int(data.counts[client])
        if count == 0:
            continue  # nothing to score; its sums stay zero
        rows = slice(start, start + count)
        yield RowBlocks(torch.tensor([client]), data.x[rows].unsqueeze(0), data.y[rows].unsqueeze(0),
                        torch.ones(1, count, dtype=torch.bool))


def sum_by_client(values: torch.Tensor, block: RowBlocks, num_clients: int) -> torch.Tensor:
    """``[S]``: per client, the sum of ``values [P, B]`` over the real rows of its blocks (where, not multiply:
    a block's padding rows may hold anything, and NaN * 0 is NaN)."""
    per_block = torch.where(block.mask, values, 0.0).sum(1)
    return torch.zeros(num_clients, dtype=per_block.dtype).index_add(0, block.owner, per_block)


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


@dataclass(frozen=True)
class LocalTraining:
    """How a client trains: the K mini-batch SGD steps every client rule runs inside the one loop."""

    steps: int
    batch_size: int
    lr: float
    #: what the client reports about the sent weights besides its update (pFedGAT): "none",
    #: "val_gradient" (dL_val/d sent) or "val_loss_pair" (L_val at sent +- feedback_mu * u, u from a seed)
    feedback: str = "none"
    feedback_mu: float = 1e-3


#: Named tensors with a leading client axis, ``{name: [S, *shape]}`` (one model per client).
Weights = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ClientSetting:
    """What a client rule may know: where each tensor lives, which tensors are the model's head, the task."""

    spec: ParamSpec
    head: tuple[str, ...]  # names of the head (output layer) tensors, declared by the target model
    task: Task
    output_dim: int  # classes, or flattened target size
    training: LocalTraining
    #: the client's own architecture where clients run different ones (``model.architectures``) and the network it
    #: trains is not that architecture (FLHA-GHN trains its GHN, FLHA-distillation a shared teacher); else None
    architecture: TargetModel | None = None

    @property
    def body(self) -> tuple[str, ...]:
        return tuple(name for name in self.spec.names if name not in self.head)

    def numel(self, names: Sequence[str]) -> int:
        shapes = {t.name: t.numel for t in self.spec.tensors}
        return sum(shapes[name] for name in names)

    def pack(self, weights: Weights, names: Sequence[str]) -> torch.Tensor:
        """``[S, n]``: the tensors ``names`` of ``weights`` flattened side by side (e.g. a head kept as state)."""
        return torch.cat([weights[name].flatten(1) for name in names], dim=1)

    def unpack(self, flat: torch.Tensor, names: Sequence[str]) -> Weights:
        """Inverse of :meth:`pack`."""
        shapes = {t.name: t.shape for t in self.spec.tensors}
        sizes = [self.numel([name]) for name in names]
        return {name: part.reshape(len(flat), *shapes[name])
                for name, part in zip(names, flat.split(sizes, dim=1), strict=True)}


def require_grad(weights: Weights) -> Weights:
    """Fresh autograd leaves for one step (detached from the previous step's graph)."""
    return {name: value.detach().requires_grad_(True) for name, value in weights.items()}


class LocalStep:
    """One step of the one local-training loop, as a client rule sees it: this step's mini-batch(es), the
    model's per-client loss on them, and an SGD update. Rules combine these; they never loop themselves."""

    def __init__(self, model: TargetModel, task: Task, index: int, batches: list[tuple[torch.Tensor, torch.Tensor]],
                 has_data: torch.Tensor | None, lr: float, label_counts: torch.Tensor | None, data: ClientSplit,
                 broadcast: dict[str, torch.Tensor]) -> None:
        self.model, self.task, self.index, self.batches = model, task, index, batches
        self.has_data = has_data  # [S] float, None when every client has rows
        self.lr = lr
        #: [S, classes] training-label histogram of each client (classification), for rules that need priors
        self.label_counts = label_counts
        #: the clients' whole training split (for what a rule computes over all its rows, e.g. class centroids)
        self.data = data
        #: arrays the server sent each client besides its weights (``Method.broadcast``), each ``[S, ...]``
        self.broadcast = broadcast

    def outputs(self, weights: Weights, batch: int = 0) -> torch.Tensor:
        """``[S, B, out]`` model outputs of every client's weights on its ``batch``-th mini-batch."""
        return self.model.batched_forward(weights, self.batches[batch][0])

    def features(self, weights: Weights, batch: int = 0) -> torch.Tensor:
        """``[S, B, F]`` what the head reads (the body's output) on the ``batch``-th mini-batch."""
        return self.model.batched_forward(weights, self.batches[batch][0], features_only=True)

    def loss(self, weights: Weights, batch: int = 0, outputs: torch.Tensor | None = None) -> torch.Tensor:
        """``[S]`` mean task loss of each client on its ``batch``-th mini-batch (``outputs`` if already computed)."""
        outputs = self.outputs(weights, batch) if outputs is None else outputs
        return per_client_loss(outputs, self.batches[batch][1], self.task)

    def gradients(self, weights: Weights, objective: torch.Tensor, names: Sequence[str] | None = None,
                  create_graph: bool = False) -> Weights:
        """Each client's gradient of its own ``objective [S]`` with respect to ``weights[names]`` (all by default).

        Clients own disjoint slices of every leaf, so one backward pass of the sum gives every client its own
        gradient; clients without training rows contribute nothing."""
        names = list(weights) if names is None else list(names)
        total = objective.sum() if self.has_data is None else (objective * self.has_data).sum()
        leaves = [weights[name] for name in names]
        # a tensor the loss never reads (a GHN head of a layer type this architecture lacks) has zero gradient
        grads = torch.autograd.grad(total, leaves, create_graph=create_graph, allow_unused=True,
                                    materialize_grads=True)
        return dict(zip(names, grads, strict=True))

    def descend(self, weights: Weights, objective: torch.Tensor, lr: float | None = None,
                names: Sequence[str] | None = None) -> Weights:
        """One SGD step on ``objective`` for ``weights[names]``; the other tensors are carried over unchanged."""
        lr = self.lr if lr is None else lr
        grads = self.gradients(weights, objective, names)
        with torch.no_grad():
            return {name: (value - lr * grads[name]) if name in grads else value.detach()
                    for name, value in weights.items()}


def squared_distance(a: Weights, b: Weights, names: Sequence[str] | None = None) -> torch.Tensor:
    """``[S]`` ||a - b||^2 per client over ``names`` (all of ``a`` by default)."""
    return sum((a[n] - b[n]).pow(2).flatten(1).sum(1) for n in (names or list(a)))  # type: ignore[return-value]


class ClientRule:
    """The client side of a method: what a client keeps between rounds, how it trains, what it uploads and
    which weights it evaluates with. The default is mini-batch SGD on the task loss from the received weights,
    optionally with FedProx's proximal pull ``prox_mu / 2 * ||w - w_received||^2``.

    A rule plugs into the one loop of :func:`train_clients` through three hooks:

    - :meth:`start`: the *tracks* (named weight sets that train, e.g. Ditto's global and personal model) from
      the received weights and the client's state;
    - :meth:`step`: one local step on the tracks (built from :class:`LocalStep`'s loss and SGD update);
    - :meth:`finish`: the trained model whose ``delta = received - trained`` is uploaded, and the new state.

    State is named per-client tensors (``[S, ...]``), created by :meth:`init_state` from the received weights the
    first time a client trains. Clients that never trained have no state and evaluate with the weights they
    receive (the "no fine-tuning" novel-client protocol); :meth:`eval_weights` and the evaluation fine-tuning
    apply only to clients that trained.
    """

    #: mini-batches drawn per local step (Per-FedAvg uses 2 or 3)
    batches_per_step: int = 1
    #: whether :class:`LocalStep` should carry each client's training-label histogram (FedRoD's priors)
    uses_label_counts: bool = False

    def __init__(self, setting: ClientSetting, prox_mu: float = 0.0, eval_finetune_steps: int = 0,
                 eval_finetune_lr: float | None = None) -> None:
        self.setting = setting
        self.prox_mu = prox_mu
        #: before evaluation, trained clients take this many plain SGD steps from their evaluation weights
        self.eval_finetune_steps = eval_finetune_steps
        self.eval_finetune_lr = setting.training.lr if eval_finetune_lr is None else eval_finetune_lr

    @property
    def spec(self) -> ParamSpec:
        return self.setting.spec

    @property
    def total_steps(self) -> int:
        """Loop steps per round (K, plus any phase a rule adds, e.g. FedRep's head epochs)."""
        return self.setting.training.steps

    @property
    def upload_dim(self) -> int:
        """Values a client uploads per round (bytes are counted from it)."""
        return self.spec.dim

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        """State of clients training for the first time, from the ``[S, dim]`` weights they received."""
        return {}

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": received}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        """One local step; returns the new tracks and each client's task loss ``[S]`` (for the metrics)."""
        model = require_grad(tracks["model"])
        losses = local.loss(model)
        objective = losses
        if self.prox_mu > 0:
            objective = objective + 0.5 * self.prox_mu * squared_distance(model, received)
        return {"model": local.descend(model, objective)}, losses

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        """The trained weights whose delta is uploaded, and the state kept until the next round."""
        return tracks["model"], state

    def eval_weights(self, received: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[S, dim]`` weights that trained clients evaluate with (default: the received ones)."""
        return received

    def evaluation_network(self, model: TargetModel, received: torch.Tensor, train: ClientSplit,
                           trained: torch.Tensor, seeds: Sequence[int],
                           ) -> tuple[TargetModel, ParamSpec, torch.Tensor] | None:
        """``(network, its spec, [S, its dim] weights)`` clients evaluate with when that is not the network they
        train (FLHA-GHN: their architecture with generated weights; FLHA-distillation: their architecture distilled
        from the shared teacher); ``received`` are their evaluation weights in ``model``'s terms, ``trained [S]``
        marks who took part in training, ``seeds`` one stream per client. None: ``model`` itself."""
        return None

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-client shape of each array a client uploads besides its delta (checked on arrival)."""
        return {}

    def uploads(self, tracks: dict[str, Weights], local: LocalStep) -> dict[str, torch.Tensor]:
        """Arrays (``[S, *shape]``, see :meth:`upload_shapes`) uploaded with the delta; they reach
        ``Method.update`` in its ``metrics``."""
        return {}

    def eval_forward(self, model: TargetModel, weights: Weights, x: torch.Tensor, train: ClientSplit,
                     state: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Outputs ``[S, B, out]`` a trained client predicts with, when that is more than its model's forward
        (KNN-Per mixes in a nearest-neighbour vote over its own training rows, FedCP routes features through
        two heads); ``None``: the model's forward."""
        return None


class PersonalModelRule(ClientRule):
    """A rule whose clients keep a personal model beside the one they upload (Ditto's v, pFedMe's theta): the
    track ``personal`` becomes the state after each round, and trained clients evaluate with it."""

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"personal": received.clone()}

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        return tracks["model"], {"personal": self.spec.flatten(tracks["personal"], batch_dims=1)}

    def eval_weights(self, received: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return state["personal"]


class HeadTraining(ClientRule):
    """SGD on the head tensors only; the body stays as received (FLHA-GHN's head refinement, Simple-Tuning)."""

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        head = self.setting.head
        model = {name: value.detach().requires_grad_(name in head) for name, value in tracks["model"].items()}
        losses = local.loss(model)
        return {"model": local.descend(model, losses, names=head)}, losses


class LocalResult(NamedTuple):
    trained: torch.Tensor  # [S, dim], what the client's delta is computed from
    metrics: dict[str, torch.Tensor]  # each [S]; the rule's uploads too, each [S, *shape]
    state: dict[str, torch.Tensor]  # the clients' new state (empty for stateless rules)


def label_histogram(data: ClientSplit, num_classes: int) -> torch.Tensor:
    """``[S, classes]`` count of each label among each client's training rows."""
    owner, rows = data.row_owners()
    counts = torch.zeros(data.num_clients * num_classes)
    counts.index_add_(0, owner * num_classes + data.y[rows], torch.ones(len(rows)))
    return counts.view(data.num_clients, num_classes)


#: weights trained at once (clients x parameters): above it, clients train a chunk at a time
TRAINING_VALUES_PER_CHUNK = 4_000_000


def train_clients(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit,
                  training: LocalTraining, task: Task, batch_seeds: Sequence[int], rule: ClientRule | None = None,
                  state: dict[str, torch.Tensor] | None = None,
                  broadcast: dict[str, torch.Tensor] | None = None) -> LocalResult:
    """The one local-training loop: every client (row of ``start``) trains simultaneously under ``rule``.

    Mini-batches come from :func:`draw_batch_indices` with one seed per client. Returns the trained weights
    ``[S, dim]``, per-client metrics (``loss_first``, ``loss_last``, ``num_examples``) and the clients' new
    state. Clients with no training rows keep their start weights.
    """
    if start.shape != (data.num_clients, spec.dim):
        raise ValueError(f"start weights must be [{data.num_clients}, {spec.dim}], got {tuple(start.shape)}")
    per_chunk = max(1, TRAINING_VALUES_PER_CHUNK // spec.dim)
    if data.num_clients > per_chunk:
        # Clients are independent: large models train a chunk of clients at a time, so the weights, gradients
        # and updates of a step stay cache-sized (50 clients x 1.6M parameters rewritten per step are
        # memory-bound); results equal all-at-once training up to float rounding.
        parts = [train_clients(model, spec, start[rows], data.select(rows), training, task,
                               [batch_seeds[i] for i in rows.tolist()], rule,
                               None if state is None else {k: v[rows] for k, v in state.items()},
                               None if broadcast is None else {k: v[rows] for k, v in broadcast.items()})
                 for rows in torch.arange(data.num_clients).split(per_chunk)]
        return LocalResult(torch.cat([part.trained for part in parts]),
                           {key: torch.cat([part.metrics[key] for part in parts]) for key in parts[0].metrics},
                           {key: torch.cat([part.state[key] for part in parts]) for key in parts[0].state})
    if rule is None:
        rule = ClientRule(ClientSetting(spec, (), task, 0, training))
    elif rule.setting.training != training or rule.setting.task != task:
        raise ValueError("train_clients: the rule was built for other local training than it is asked to run")
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
    first_loss = last_loss = torch.zeros(data.num_clients)
    local = LocalStep(model, task, 0, [], has_data, training.lr, label_counts, data, broadcast or {})
    for step in range(steps):
        batches = [data.gather(batch_index[:, step * per_step + draw]) for draw in range(per_step)]
        local = LocalStep(model, task, step, batches, has_data, training.lr, label_counts, data, broadcast or {})
        tracks, losses = rule.step(local, tracks, received)
        if step == 0:
            first_loss = losses.detach()
        if step == steps - 1:
            last_loss = losses.detach()
    uploads = rule.uploads(tracks, local)
    trained, new_state = rule.finish(tracks, received, state)
    trained_flat = spec.flatten({name: value.detach() for name, value in trained.items()}, batch_dims=1)
    if not every_client_has_rows:  # a client without rows trained nothing and keeps what it had
        keep = ~has_rows
        trained_flat = torch.where(keep.unsqueeze(1), start.detach(), trained_flat)
        new_state = {key: torch.where(keep.view(-1, *[1] * (value.ndim - 1)), state[key], value)
                     for key, value in new_state.items()}
    zero_if_no_data = has_rows.to(torch.float32)
    metrics = {"loss_first": first_loss * zero_if_no_data, "loss_last": last_loss * zero_if_no_data,
               "num_examples": data.counts.to(torch.float32), **{k: v.detach() for k, v in uploads.items()}}
    return LocalResult(trained_flat, metrics, {key: value.detach() for key, value in new_state.items()})


def validation_feedback(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit, task: Task,
                        training: LocalTraining, seeds: Sequence[int]) -> torch.Tensor:
    """What a client tells the server about the weights it was sent, measured on its validation split.

    ``val_gradient``: ``[S, dim]``, the gradient of its validation loss at ``start`` (as large as a model).
    ``val_loss_pair``: ``[S, 2]``, its validation loss at ``start + mu*u`` and ``start - mu*u`` with ``u`` a
    unit direction drawn from ``seeds[i]`` (two scalars; the server redraws ``u`` from the same seed).
    """
    blocks = list(scoring_blocks(model, data, spec.dim))  # a validation split: small enough to keep

    def losses(weights: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(data.num_clients, dtype=weights.dtype)
        for block in blocks:
            outputs = model.batched_forward(spec.unflatten(weights[block.owner]), block.x)
            total = total + sum_by_client(per_row_loss(outputs, block.y, task), block, data.num_clients)
        return total / data.counts.clamp_min(1)

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
                     task: Task, max_elements: int = 4_000_000,
                     forward: Callable[[Weights, torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None,
                     ) -> ClientScores:
    """Each client's metric with its own weights on its own rows.

    Rows go in fixed-size blocks of one client each (:meth:`ClientSplit.blocks`), so the work per chunk does not
    depend on how unequal the clients are; a model with batch statistics sees each client's whole split at once
    (:func:`scoring_blocks`). ``forward``, if given, may replace the model's outputs for a chunk
    of blocks; it receives the blocks' weights, inputs and owners (positions of their clients in ``data``).
    """
    num_clients = data.num_clients
    metric_sum, loss_sum, abs_error_sum = (torch.zeros(num_clients) for _ in range(3))
    # Every client holding the same weights (a global model): one network on all blocks' rows at once, the
    # cheapest forward there is. Not for models whose outputs depend on the batch.
    shared = (forward is None and not model.batch_statistics and len(weights) > 1
              and (weights.stride(0) == 0 or all(torch.equal(rows, weights[:1].expand_as(rows))
                                                 for rows in weights.split(256))))
    for block in scoring_blocks(model, data, spec.dim, max_elements):
        if shared:
            rows = block.x.reshape(1, -1, *block.x.shape[2:])
            outputs = model.batched_forward(spec.unflatten(weights[:1]), rows).view(*block.mask.shape, -1)
        else:
            block_weights = spec.unflatten(weights[block.owner])
            outputs = forward(block_weights, block.x, block.owner) if forward is not None else None
            if outputs is None:
                outputs = model.batched_forward(block_weights, block.x)
        loss_sum += sum_by_client(per_row_loss(outputs, block.y, task), block, num_clients)
        if task == "classification":
            correct = (outputs.argmax(-1) == block.y).to(torch.float32)
            metric_sum += sum_by_client(correct, block, num_clients)
        else:
            error = (outputs - block.y.reshape(outputs.shape)).flatten(2)
            metric_sum += sum_by_client(error.pow(2).sum(-1), block, num_clients)
            abs_error_sum += sum_by_client(error.abs().sum(-1), block, num_clients)
    rows = data.counts.to(torch.float32)
    metric_elements = rows if task == "classification" else rows * math.prod(data.y.shape[1:])
    return ClientScores(metric=metric_sum / metric_elements.clamp_min(1.0), loss=loss_sum / rows.clamp_min(1.0),
                        counts=data.counts, metric_sum=metric_sum, metric_elements=metric_elements,
                        abs_error_sum=abs_error_sum)
