"""The engine-agnostic method contract.

A method is a server-side strategy. Engines (the simulator, the Flower ServerApp) drive it:

1. ``sent = method.personalize(client_ids)`` — the weights each selected client starts from.
2. The engine runs the clients' local training under the method's client rule (``Method.client_rule``:
   per-client state, local objective, upload, evaluation weights) and computes ``delta = sent - trained``.
3. ``method.update(client_ids, sent, delta, metrics)`` — the server learns from the deltas.
4. ``method.eval_weights(client_ids)`` — personalised weights used for evaluation.

Methods never loop over rounds or clients, never touch files or logging, and keep all their state in
attributes that :meth:`state_dict` can save (modules, optimizers, tensors, generators, numbers).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from graphfed.client.contract import ClientRule, ClientSetting
from graphfed.client.privacy import ServerGradientPrivacy
from graphfed.core.hypergrad import hypergradient_step
from graphfed.core.params import ParamSpec
from graphfed.data.federation import Task
from graphfed.models.base import TargetModel
from graphfed.models.family import ArchitectureFamily


class MethodOptions(BaseModel):
    """Base for each method's typed options (``method.options`` in the config)."""

    # strict types, as the run config: `hypernet_hidden: true` is an error, not a hypernetwork one unit wide
    model_config = ConfigDict(extra="forbid", strict=True)


@dataclass
class MethodContext:
    """What a method may know about the federation. No client data: only shapes, ids and the graph."""

    spec: ParamSpec
    init_weights: torch.Tensor  # [dim], the seeded initialisation of the target model
    num_clients: int
    train_client_ids: torch.Tensor
    novel_client_ids: torch.Tensor
    client_graph: torch.Tensor | None  # [N, N] or None when no graph is given
    task: Task
    seed: int
    head: tuple[str, ...] = ()  # the target model's head tensors (``TargetModel.head_names``)
    #: where the method keeps its state (``train.device``); it is built under ``torch.device(device)``, so tensors and
    #: modules it creates without naming a device land there
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: the clients' architectures where they differ (``model.architectures``), else None
    architectures: ArchitectureFamily | None = None

    def head_index(self) -> torch.Tensor:
        """Flat coordinates of the head tensors, in spec order."""
        return self.spec.index_of(self.head)


class Method(ABC):
    """Server-side strategy. Subclasses set ``name``, ``Options`` and implement the two hooks."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type[MethodOptions]] = MethodOptions
    #: what travels between server and clients when clients run different architectures (``models.family``):
    #: "shared" (one architecture only: the method refuses ``model.architectures``), "own", "ghn" or "teacher"
    architectures: ClassVar[str] = "shared"
    #: why the method has no model for a client that never trained (Local: nothing is shared), or None. Such a
    #: method reports no novel-client score ("—"), never the score of an untrained model.
    no_novel_model: ClassVar[str | None] = None
    #: whether weights travel between server and clients at all (Local's never do: its bytes are 0)
    communicates: ClassVar[bool] = True
    #: whether ``update`` can learn from an upload that arrives rounds late (``train.stragglers``): it receives the
    #: weights the client was sent back then beside its delta, as asynchronous FL does (FedBuff); a method that
    #: sets this False loses late uploads instead
    accepts_late_uploads: ClassVar[bool] = True
    #: why the method cannot take updates as they arrive (``train.server_mode: fedbuff | fedasync``), or None: it
    #: can (one line, after "does not run asynchronously: ")
    asynchronous_refusal: ClassVar[str | None] = (
        "its server step has not been defined for updates that were sent at different server steps")
    #: where it can: what it does with an update that arrives stale (``graphfed describe``, the method reference)
    asynchronous: ClassVar[str] = ""
    #: why ``privacy.mechanism: central`` cannot protect this method's clients (None: it can). Central DP noises a
    #: sum once (FedAvg's update) or, for a hypernetwork, each client's gradient on the server's parameters
    #: (``private_server_gradient``); a server that mixes the individual uploads into each client's model has
    #: neither a sum nor shared parameters to noise.
    central_privacy_refusal: ClassVar[str | None] = (
        "its server computes each client's model from the individual uploads (models mixed by similarity, "
        "attention or a solved graph), not from a sum or from server parameters alone; use privacy.mechanism=local")
    #: True: ``central`` runs as DP-SGD on the server's parameters (each client's gradient contribution clipped,
    #: the sum noised: :class:`graphfed.client.privacy.ServerGradientPrivacy`), not as a noised mean of updates
    private_server_gradient: ClassVar[bool] = False
    #: how the server weighs the clients whose uploads it combines, and where that comes from (the paper's
    #: algorithm box where it has one): one sentence, in ``graphfed describe`` and the method reference
    server_weighting: ClassVar[str] = ""
    #: what the method does with LoRA adapters (``model.options.adapter``): one sentence, in ``graphfed describe``
    #: and the method reference. Under an adapter a method's weights are the adapters alone (the frozen base never
    #: trains or travels), so a method agnostic to the model does with them what it does with any weights.
    adapters: ClassVar[str] = ("its weights are the adapters: it trains, sends and combines the clients' LoRA factors "
                               "as it does any model's weights, factor by factor; the frozen base never travels")

    def __init__(self, context: MethodContext, options: MethodOptions) -> None:
        self.context = context
        self.options = options
        #: set by the engine under ``privacy.mechanism: central`` when ``private_server_gradient``
        self.server_privacy: ServerGradientPrivacy | None = None
        self.generator = torch.Generator().manual_seed(context.seed)
        # Subclasses build their networks after this: seed their initialisation from the run seed.
        torch.manual_seed(context.seed)
        #: human-readable facts the engine should log once (e.g. "inferring the client graph")
        self.notes: list[str] = []

    def central_privacy_problem(self) -> str | None:
        """Why ``privacy.mechanism: central`` cannot protect this method as configured (None: it can)."""
        return type(self).central_privacy_refusal

    def server_steps_per_round(self) -> int:
        """Server optimiser steps a round takes on the same uploads (central DP splits its noise over them)."""
        return 1

    @classmethod
    def client_feedback(cls, options: MethodOptions) -> tuple[str, float]:
        """What clients report about the weights they received besides their update, and its perturbation size
        (``LocalTraining.feedback`` / ``feedback_mu``); it arrives in ``update``'s metrics as ``feedback`` (and
        ``feedback_seed`` per client). Default: nothing."""
        return "none", 1e-3

    @classmethod
    def client_rule(cls, options: MethodOptions, setting: ClientSetting) -> ClientRule:
        """The client side of this method, built from its options alone: the simulator and every Flower node
        build it the same way. Default: plain SGD on the local loss from the received weights."""
        return ClientRule(setting)

    @classmethod
    def client_networks(cls, options: MethodOptions,
                        family: ArchitectureFamily) -> tuple[ParamSpec, torch.Tensor, list[TargetModel]]:
        """Mixed architectures: the wire's spec and initial row, and the network each architecture's clients train
        (its parameters are the first values of a wire row). Default, the ``own`` wire: each architecture's
        parameters, zero-padded to the largest."""
        if cls.architectures != "own":
            raise TypeError(f"method '{cls.name}' runs one architecture on every client")
        return ParamSpec([("weights", (family.max_dim,))]), torch.zeros(family.max_dim), list(family.models)

    @abstractmethod
    def personalize(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``[S, dim]`` weights to send to ``client_ids`` this round (may carry autograd graph)."""

    @abstractmethod
    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        """Learn from ``delta = sent - trained`` (``[S, dim]``) and per-client ``metrics`` (``[S]`` each)."""

    def central_update(self, mean_delta: torch.Tensor, expected_clients: float) -> None:
        """``privacy.mechanism: central``: learn from the round's one release, the noised mean of the clipped updates.

        Args:
            mean_delta: ``[dim]``, ``(sum of clipped deltas + noise) / expected_clients``; a round whose Poisson
                cohort was empty releases the noise alone, and it arrives here as any other.
            expected_clients: the cohort's expected size (public), for a server that needs a count: the actual
                cohort is as private as the updates.
        """
        raise TypeError(f"method '{self.name}' has no server step on a released mean")

    def reads_client_graph(self) -> bool:
        """Whether the server reads ``context.client_graph`` (a graph built from the clients' data, e.g.
        ``dataset.graph=knn``, is then private input outside any DP mechanism)."""
        return False

    def broadcast(self, client_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Arrays each selected client receives besides its weights (``[S, ...]`` each; FedPAC's global class
        centroids, FedCP's policy network). Their client rule reads them; bytes down count them."""
        return {}

    @torch.no_grad()
    def eval_weights(self, client_ids: torch.Tensor) -> torch.Tensor:
        """Personalised weights used to evaluate ``client_ids`` (default: what would be sent)."""
        return self.personalize(client_ids).detach()

    #: whether novel clients adapt before they are scored (:meth:`adapt_novel`): each then makes
    #: ``train.novel_adapt_rounds`` uploads, which local DP must count
    adapts_novel_clients: ClassVar[bool] = False

    def supports_novel_adaptation(self) -> bool:
        return self.adapts_novel_clients

    def begin_novel_adaptation(self, client_ids: torch.Tensor) -> None:
        """Called once before a series of :meth:`adapt_novel` calls for the same novel clients."""
        raise TypeError(f"method '{self.name}' has no novel-client adaptation")

    def adapt_novel(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor) -> None:
        """Update only what describes ``client_ids`` (e.g. their embeddings) from their deltas."""
        raise TypeError(f"method '{self.name}' has no novel-client adaptation")

    def novel_adaptation_state(self) -> dict[str, Any]:
        """The scratch state of an adaptation in progress (its optimiser, its leaves), beside :meth:`state_dict`:
        what a checkpoint between two :meth:`adapt_novel` steps needs to continue it."""
        raise TypeError(f"method '{self.name}' has no novel-client adaptation")

    def resume_novel_adaptation(self, client_ids: torch.Tensor, state: dict[str, Any]) -> None:
        """:meth:`begin_novel_adaptation` for ``client_ids``, then the scratch state a checkpoint saved with
        :meth:`novel_adaptation_state` (the method's own state already loaded)."""
        raise TypeError(f"method '{self.name}' has no novel-client adaptation")

    def collaboration_graph(self, client_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """The client graph the method uses, if it has one: rows ``client_ids`` (all clients by default) of its
        ``[N, N]`` matrix, or ``[L, rows, N]`` with one matrix per layer."""
        return None

    # ---- state --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for key, value in vars(self).items():
            if key.startswith("_"):  # scratch state (e.g. a novel-client adaptation in progress)
                continue
            if isinstance(value, nn.Module | torch.optim.Optimizer):
                state[key] = value.state_dict()
            elif isinstance(value, torch.Tensor):
                state[key] = value.detach().clone()
            elif isinstance(value, torch.Generator):
                state[key] = value.get_state()
            elif isinstance(value, int | float | bool):
                state[key] = value
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, saved in state.items():
            current = getattr(self, key)
            if isinstance(current, nn.Module | torch.optim.Optimizer):
                current.load_state_dict(saved)
            elif isinstance(current, torch.Generator):
                current.set_state(saved.cpu() if isinstance(saved, torch.Tensor) else saved)
            elif isinstance(current, torch.Tensor):
                if not isinstance(saved, torch.Tensor) or saved.shape != current.shape:
                    shape = tuple(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
                    raise ValueError(f"state '{key}': {shape} where {tuple(current.shape)} is expected")
                with torch.no_grad():  # in place: optimizers keep pointing at the same parameters
                    current.copy_(saved)
            elif type(saved) is not type(current):
                raise ValueError(f"state '{key}': a {type(saved).__name__} where a {type(current).__name__} "
                                 f"is expected")
            else:
                setattr(self, key, saved)


class EmbeddingHypernetworkOptions(MethodOptions):
    novel_lr: float = Field(default=1e-2, gt=0, description="Adam lr of novel-client embedding adaptation")


class EmbeddingHypernetwork(Method):
    """A method that generates weights from learnable client embeddings (pFedHN, Panacea).

    Novel clients are adapted as in pFedHN Sec. 5.3: everything is frozen except the novel clients'
    embeddings, which follow the hypergradient of their own deltas (Adam, ``options.novel_lr``).
    """
    server_weighting = ("no mean of models: the server steps its hypernetwork on the sum of the round's "
                        "hypergradients, each client's delta at weight 1 / |S| (pFedHN's Algorithm 1)")
    adapters = ("the hypernetwork's output is each client's adapter: it writes the client's LoRA factors (a few "
                "thousand numbers) from the client's embedding, the client trains them on the frozen base and sends "
                "back their change, which steps the hypernetwork")

    embeddings: nn.Embedding
    optimizer: torch.optim.Optimizer
    #: every client's model is a function of the server's parameters alone, so central DP is DP-SGD on them
    central_privacy_refusal = None
    asynchronous_refusal = None
    asynchronous = ("a client's weights are generated when it is dispatched, from the hypernetwork of that moment; "
                    "each buffer's server step moves the current hypernetwork along the staleness-weighted deltas "
                    "(the gradient at today's parameters, as for stragglers)")
    private_server_gradient = True

    def server_step(self, sent: torch.Tensor, direction: torch.Tensor, extra_loss: torch.Tensor | None = None) -> None:
        """One step of the server's optimiser on ``(d sent / d params)^T direction`` (+ ``extra_loss``'s gradient);
        under central DP each client's contribution is clipped and the sum noised."""
        if self.server_privacy is None:
            hypergradient_step(self.optimizer, sent, direction, extra_loss)
        else:
            self.server_privacy.step(self.optimizer, sent, direction, extra_loss)

    @abstractmethod
    def weights_from_embeddings(self, embeddings: torch.Tensor, client_ids: torch.Tensor) -> torch.Tensor:
        """``[S, dim]`` weights of ``client_ids`` given the full ``[N, d]`` embedding table."""

    def personalize(self, client_ids: torch.Tensor) -> torch.Tensor:
        return self.weights_from_embeddings(self.embeddings.weight, client_ids)

    adapts_novel_clients = True

    def begin_novel_adaptation(self, client_ids: torch.Tensor) -> None:
        self._novel_embeddings = self.embeddings.weight[client_ids].detach().clone().requires_grad_(True)
        self._novel_optimizer = torch.optim.Adam([self._novel_embeddings], lr=self.options.novel_lr)

    def novel_adaptation_state(self) -> dict[str, Any]:
        return {"embeddings": self._novel_embeddings.detach().clone(), "optimizer": self._novel_optimizer.state_dict()}

    def resume_novel_adaptation(self, client_ids: torch.Tensor, state: dict[str, Any]) -> None:
        self.begin_novel_adaptation(client_ids)
        with torch.no_grad():
            self._novel_embeddings.copy_(state["embeddings"])
        self._novel_optimizer.load_state_dict(state["optimizer"])

    def adapt_novel(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor) -> None:
        # Only the novel rows are leaves; every other embedding and all networks are constants here.
        table = self.embeddings.weight.detach().index_put((client_ids,), self._novel_embeddings)
        hypergradient_step(self._novel_optimizer, self.weights_from_embeddings(table, client_ids),
                           delta / len(client_ids))
        with torch.no_grad():
            self.embeddings.weight[client_ids] = self._novel_embeddings
