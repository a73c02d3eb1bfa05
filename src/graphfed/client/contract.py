"""The client contract: what a method's client side is (:class:`ClientRule`), what it may know
(:class:`ClientSetting`) and the one step it combines (:class:`LocalStep`).

Methods, attacks, the simulator and the Flower client all import this floor; it imports only models, data and
core. Weights are rows of a ``[S, dim]`` tensor (S clients at once), named per tensor as :data:`Weights`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Protocol

import torch

from graphfed.client.losses import per_client_loss
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit, Task
from graphfed.errors import ConfigError
from graphfed.models.base import TargetModel


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
    #: "fp32", "tf32" (CUDA tensor cores, see use_tensor_cores) or "bf16" (the model's forward and backward under
    #: autocast); weights, updates and server state stay fp32
    precision: str = "fp32"


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
    #: names of the normalisation layers' tensors (BatchNorm's affine weights and biases; FedBN keeps them local)
    norm: tuple[str, ...] = ()

    @property
    def body(self) -> tuple[str, ...]:
        return tuple(name for name in self.spec.names if name not in self.head)

    def require_head(self, method: str) -> tuple[str, ...]:
        """The head's tensors; a ValueError naming ``method`` when the model declares none."""
        if not self.head:
            raise ConfigError(f"{method} needs a model whose head has trainable tensors: declare it "
                              f"(TargetModel.head_module, or register_model(..., head='<output layer>')), and under a "
                              f"LoRA adapter let the adapter train it (model.options.adapter.targets: [..., head])")
        return self.head

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


class UpdateForgery(Protocol):
    """What malicious clients upload instead of their honest delta (an attack; see ``graphfed.attacks``)."""

    def forge(self, client_ids: torch.Tensor, delta: torch.Tensor, round_index: int) -> torch.Tensor:
        """``[S, dim]`` the uploaded deltas of ``client_ids``: honest rows unchanged."""
        ...


class EvaluationTuning(Protocol):
    """A change clients make to their weights right before evaluation (Simple-Tuning, a defence)."""

    def apply(self, model: TargetModel, setting: ClientSetting, weights: torch.Tensor, train: ClientSplit,
              seeds: Sequence[int]) -> torch.Tensor:
        """``[S, dim]`` the weights the clients evaluate with, from their ``[S, dim]`` evaluation weights."""
        ...


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
            if max(grad.numel() for grad in grads.values()) < IN_PLACE_MIN_VALUES:  # small: the plain expression
                return {name: (value - lr * grads[name]) if name in grads else value.detach()
                        for name, value in weights.items()}
            # a gradient autograd handed to two leaves (a pass-through add) must not be written into
            shared = {ptr for ptr, count in Counter(grad.data_ptr() for grad in grads.values()).items() if count > 1}
            return {name: sgd_update(value, grads[name], lr, grads[name].data_ptr() not in shared) if name in grads
                    else value.detach() for name, value in weights.items()}


#: gradient values (a tensor's, over all clients of a step) from which :meth:`LocalStep.descend` updates in place:
#: below, a fresh tensor is cheap (no page faults) and the bookkeeping of :func:`sgd_update` is not (a 16-unit MLP's
#: step paid 80 us for it). Both give the same bits on every CPU: the same two IEEE roundings, elementwise.
IN_PLACE_MIN_VALUES = 1 << 15


def sgd_update(value: torch.Tensor, grad: torch.Tensor, lr: float, owned: bool = False) -> torch.Tensor:
    """``value - lr * grad``; with ``owned`` (nobody else reads ``grad``), written into ``grad``'s own memory.

    The same two roundings as the expression (the product, then the difference), so the same bits; but a
    convolutional client's step no longer allocates two fresh weight-sized tensors per parameter (at LeNet
    32/64/512 on the CPU those page-faulted allocations were 45 % of a training step: benchmarks/cpu_grid.py). A
    view or an expanded gradient (a broadcast zero) is never written into."""
    if grad.shape != value.shape or grad.dtype != value.dtype:
        return value - lr * grad
    if not grad.is_contiguous():  # a batched linear layer's weight gradient comes transposed: one blocked copy
        grad = grad.contiguous()  # beats an elementwise pass over strided memory, and the copy is ours
    elif not owned or (grad._base is not None and grad._base.numel() != grad.numel()):
        return value - lr * grad  # (a view of a buffer of its own size, e.g. a client's gradient unsqueezed, is ours)
    return torch.sub(value, grad.mul_(lr), out=grad)


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
    # What a rule overrides, said explicitly (the executor skips the work of a hook a rule keeps at its default):
    #: trained clients evaluate with :meth:`eval_weights` (their own state), not the weights they receive
    evaluates_own_weights: ClassVar[bool] = False
    #: :meth:`evaluation_network` gives clients another network to evaluate than the one they train
    has_evaluation_network: ClassVar[bool] = False
    #: :meth:`eval_forward` replaces the model's forward for trained clients
    has_eval_forward: ClassVar[bool] = False
    #: evaluation fine-tuning (``eval_finetune_steps``) trains the head only (FedBABU), not every tensor
    finetunes_head_only: ClassVar[bool] = False

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

    def fuse(self, received: torch.Tensor, broadcast: dict[str, torch.Tensor],
             validation_losses: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor,
                                                                                dict[str, torch.Tensor]]:
        """The ``[S, dim]`` weights local training starts from and arrays to upload (see :meth:`upload_shapes`).
        FedFomo builds them from the models in ``broadcast``, scored by ``validation_losses(weights [S, K, dim]) ->
        [S, K]`` on each client's validation rows (called only by a rule that needs it). Default: the received
        weights, nothing extra."""
        return received, {}

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


def plain_sgd(spec: ParamSpec, task: Task, training: LocalTraining) -> ClientRule:
    """Mini-batch SGD on the task loss (the default rule), for a model whose head nothing reads."""
    return ClientRule(ClientSetting(spec, (), task, 0, training))


class PersonalModelRule(ClientRule):
    """A rule whose clients keep a personal model beside the one they upload (Ditto's v, pFedMe's theta): the
    track ``personal`` becomes the state after each round, and trained clients evaluate with it."""

    evaluates_own_weights = True

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"personal": received.clone()}

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        return tracks["model"], {"personal": self.spec.flatten(tracks["personal"], batch_dims=1)}

    def eval_weights(self, received: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return state["personal"]


class PersonalPartsRule(ClientRule):
    """Clients keep the tensors ``personal`` as their own: they train every tensor jointly, keep the personal ones as
    state between rounds and evaluate with them, and upload only the rest (the personal tensors' delta is zero and
    is not counted as uploaded). FedPer keeps the head, LG-FedAvg the body, FedBN the BatchNorm tensors."""

    evaluates_own_weights = True

    def __init__(self, setting: ClientSetting, personal: Sequence[str]) -> None:
        super().__init__(setting)
        self.personal = tuple(personal)

    @property
    def upload_dim(self) -> int:
        return self.spec.dim - self.setting.numel(self.personal)

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"personal": self.setting.pack(self.spec.unflatten(received), self.personal).clone()}

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": {**received, **self.setting.unpack(state["personal"], self.personal)}}

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        model = tracks["model"]
        upload = {name: received[name] if name in self.personal else value for name, value in model.items()}
        return upload, {"personal": self.setting.pack(model, self.personal)}

    def eval_weights(self, received: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        personal = self.setting.unpack(state["personal"], self.personal)
        return self.spec.flatten({**self.spec.unflatten(received), **personal}, batch_dims=1)


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
