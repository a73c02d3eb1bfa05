"""Where client work runs. The round loop talks to a ``ClientExecutor``; it never knows whether clients
are rows of a tensor in this process (``ClientRuntime``) or Flower nodes on other machines."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from graphfed.client.contract import ClientRule, EvaluationTuning, HeadTraining, UpdateForgery, Weights
from graphfed.client.evaluation import ClientScores, evaluate_clients
from graphfed.client.privacy import NOISE_LEVERS, PrivacyPlan, privatize_uploads
from graphfed.client.training import train_clients, validation_feedback
from graphfed.core import rng
from graphfed.core.params import ParamSpec
from graphfed.data.federation import Federation
from graphfed.errors import InvalidUpdateError, NonFiniteUpdateError
from graphfed.models.base import TargetModel
from graphfed.models.family import ArchitectureFamily


def all_finite(values: torch.Tensor) -> bool:
    """Whether every value is finite, in one reduction: a sum is finite only if every term is (a NaN or an infinity
    makes it NaN or infinite), so a finite sum settles it; an infinite one (finite values can overflow it) is
    checked value by value. ``torch.isfinite(x).all()`` makes four passes and two boolean copies of ``x``: 0.5 s of
    a 3.7 s round at 100 clients x 0.88 M weights (``benchmarks/pfllib_side_by_side.py --profile``)."""
    if not values.is_floating_point() or values.numel() == 0:
        return True
    return bool(torch.isfinite(values.sum())) or bool(torch.isfinite(values).all())


def check_update(update: torch.Tensor, client_ids: torch.Tensor, dim: int, round_index: int,
                 client_names: list[str] | None = None, mechanism: str = "none") -> None:
    """Reject wrong-shaped or non-finite client weights/updates, naming the offending clients (by name when
    ``client_names`` is given, as every other message does). Under DP (``mechanism``) the noise is the likely
    cause of a non-finite update and the message says what lowers it; under central DP the round's cohort is
    secret, so it names no client.

    ``round_index`` is 0-based; messages number rounds from 1, as ``rounds.jsonl`` does.
    """
    if update.ndim != 2 or update.shape != (len(client_ids), dim):
        raise InvalidUpdateError(f"round {round_index + 1}: client update shape {tuple(update.shape)}, "
                                 f"({len(client_ids)}, {dim}) expected")
    if all_finite(update):
        return
    bad = ~torch.isfinite(update).all(dim=1)
    if bad.any():
        culprits = [client_names[i] if client_names is not None else str(i) for i in client_ids[bad].tolist()]
        source = ("a client of the round's secret cohort (central DP names none)" if mechanism == "central"
                  else f"client(s) {', '.join(culprits)}")
        advice = (f"; under DP the noise the model received is the likely cause: lower it with {NOISE_LEVERS}"
                  if mechanism != "none" else "")
        raise NonFiniteUpdateError(f"round {round_index + 1}: non-finite (NaN/Inf) update from {source}{advice}")


#: the trainings whose updates leave the client (local DP noises them), with the noise draw's purpose
UPLOADING = {"local_training": "privacy", "novel": "novel_privacy"}


@dataclass
class TrainResult:
    """The updates that arrived: ``rows`` indexes the asked-for clients, in order."""

    rows: torch.Tensor  # [K] positions into the requested client_ids
    client_ids: torch.Tensor  # [K]
    delta: torch.Tensor  # [K, dim], sent - trained, computed where the client trained
    metrics: dict[str, torch.Tensor]  # each [K]

    @classmethod
    def nothing(cls, dim: int, device: torch.device | str) -> TrainResult:
        """No update: a round whose (Poisson) cohort is empty."""
        empty = torch.zeros(0, dtype=torch.long, device="cpu")
        return cls(empty, empty, torch.zeros(0, dim, device=device),
                   {name: torch.zeros(0, device=device) for name in ("loss_first", "loss_last", "num_examples")})


@dataclass
class Collected:
    """What ended of the training submitted without waiting (:meth:`ClientExecutor.submit`) since the last look."""

    arrived: TrainResult  #: the updates that arrived, in arrival order (``rows`` unused)
    lost: list[int]  #: clients whose training ended without a usable update (error, timeout, rejected reply)
    idle: list[int]  #: clients free for new work now whose node answered its last work
    unanswered: list[int]  #: clients free for new work now whose node went silent (work timed out, or an evaluation
    #: gave up on it) and has not answered since
    sent: dict[int, int]  #: training messages each client's node was sent so far in this run


class ClientExecutor(ABC):
    """Runs clients' local training and evaluation for the round loop."""

    #: the clients run elsewhere (Flower nodes) and keep their state there, out of the server's checkpoints
    remote: bool = False

    @abstractmethod
    def train(self, client_ids: torch.Tensor, start: torch.Tensor, round_index: int, purpose: str,
              steps: int | None = None, broadcast: dict[str, torch.Tensor] | None = None) -> TrainResult:
        """Train ``client_ids`` from ``start`` (``[S, dim]``), each also receiving its rows of ``broadcast``;
        may return fewer clients than asked."""

    @abstractmethod
    def evaluate(self, client_ids: torch.Tensor, weights: torch.Tensor, round_index: int) -> dict[str, ClientScores]:
        """Scores on each client's val and test split of what the client evaluates, given the ``weights`` the
        server sends it (its client rule may replace them by its own state or fine-tune them first)."""

    def state_dict(self) -> dict[str, Any]:
        """Client state the server side must checkpoint (none where clients keep it themselves)."""
        return {}

    def result_fields(self) -> dict[str, Any]:
        """What only this executor knows about the run, for its result (``summary.json``): none by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError("this executor keeps no client state; the checkpoint holds some")


class SubmittingExecutor(ClientExecutor):
    """An executor whose clients answer in their own time (Flower nodes): besides ``train``, it can start training
    without waiting (:meth:`submit`) and hand over what ended (:meth:`collect`). An asynchronous server over it
    steps on updates in the order they arrive (:class:`graphfed.sim.asynchronous.LiveAsyncServer`)."""

    @abstractmethod
    def submit(self, client_ids: torch.Tensor, start: torch.Tensor, round_index: int,
               broadcast: dict[str, torch.Tensor] | None = None) -> None:
        """Start local training of ``client_ids`` from ``start [S, dim]`` and return at once."""

    @abstractmethod
    def collect(self, wait: float) -> Collected:
        """The submitted training that ended since the last look, waiting up to ``wait`` s for some to end."""


class ClientStreams:
    """The per-client random streams of one run: one seed per (round, purpose, client), so a client draws the same
    numbers whether it trains alone, in a batch, on a Flower node, or packed with other runs' clients."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def seeds(self, round_index: int, purpose: str, client_ids: torch.Tensor) -> list[int]:
        return rng.client_seeds(self.seed, round_index, purpose, client_ids)


class ClientStateStore:
    """What clients keep between rounds under their method's client rule: which clients have trained, and
    each one's named state tensors (Ditto's personal model, FedRep's head, ...).

    The simulator keeps one store for all ``N`` clients (``[N, ...]`` tensors, saved in checkpoints); a Flower
    node keeps a store for the one client it serves, persisted in its ``context.state``. Tensors are allocated
    the first time a client stores state; clients that never trained have none.
    """

    def __init__(self, client_ids: torch.Tensor, device: torch.device | None = None) -> None:
        self.client_ids = client_ids.to(device="cpu", dtype=torch.long)
        #: where the state tensors live (the clients' data device); the ids and the trained mask stay on the host
        self.device = torch.device("cpu") if device is None else device
        size = int(self.client_ids.max()) + 1 if len(self.client_ids) else 0
        self._row_of = torch.full((size,), -1, dtype=torch.long, device="cpu")
        self._row_of[self.client_ids] = torch.arange(len(self.client_ids), device="cpu")
        self.trained = torch.zeros(len(self.client_ids), dtype=torch.bool, device="cpu")
        self.tensors: dict[str, torch.Tensor] = {}

    def rows(self, client_ids: torch.Tensor) -> torch.Tensor:
        rows = self._row_of[client_ids] if len(self._row_of) else torch.full_like(client_ids, -1)
        if (rows < 0).any():
            raise KeyError(f"no client state kept here for client(s) {client_ids[rows < 0].tolist()}")
        return rows

    def has_trained(self, client_ids: torch.Tensor) -> torch.Tensor:
        return self.trained[self.rows(client_ids)]

    def get(self, client_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = self.rows(client_ids)
        return {name: value[rows] for name, value in self.tensors.items()}

    def put(self, client_ids: torch.Tensor, state: dict[str, torch.Tensor]) -> None:
        rows = self.rows(client_ids)
        for name, value in state.items():
            if name not in self.tensors:
                self.tensors[name] = torch.zeros(len(self.client_ids), *value.shape[1:], dtype=value.dtype,
                                                 device=value.device)
            self.tensors[name][rows] = value
        self.trained[rows] = True

    def state_dict(self) -> dict[str, Any]:
        return {"trained": self.trained.clone(), "tensors": {k: v.clone() for k, v in self.tensors.items()}}

    def load_rows(self, rows: torch.Tensor, state: dict[str, Any]) -> None:
        """Load ``state`` (one run's :meth:`state_dict`) into ``rows`` of this store (a pack keeps several runs'
        clients in one store)."""
        trained, tensors = _checked_state(state, len(rows))
        self.trained[rows] = trained.to("cpu")
        for name, value in tensors.items():
            if name not in self.tensors:
                self.tensors[name] = torch.zeros(len(self.client_ids), *value.shape[1:], dtype=value.dtype,
                                                 device=self.device)
            self.tensors[name][rows] = value.to(self.device)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        trained, tensors = _checked_state(state, len(self.trained))
        self.trained = trained.to(device="cpu", copy=True)
        self.tensors = {name: value.to(device=self.device, copy=True) for name, value in tensors.items()}


def _checked_state(state: dict[str, Any], clients: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A :meth:`ClientStateStore.state_dict` of ``clients`` clients, checked (it comes from a checkpoint: the caller
    turns the ValueError into a CheckpointError)."""
    trained, tensors = state["trained"], state["tensors"]
    if not isinstance(trained, torch.Tensor) or trained.dtype != torch.bool or trained.shape != (clients,):
        raise ValueError(f"client state must mark {clients} clients as trained or not")
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) and v.ndim >= 1 and len(v) == clients
                                                for v in tensors.values()):
        raise ValueError(f"client state tensors must each hold {clients} rows")
    return trained, tensors


class ClientRuntime(ClientExecutor):
    """Clients in this process, all trained at once. A Flower client is the same runtime with S = 1.

    ``rule`` is the method's client rule; ``store`` keeps the clients' state between rounds (default: every
    client of the federation, in memory). ``attack``: which clients are malicious and what they upload (their
    training rows are already rewritten in ``federation``); ``tuning``: Simple-Tuning before evaluation.
    """

    def __init__(self, model: TargetModel, spec: ParamSpec, federation: Federation, rule: ClientRule,
                 seed: int, store: ClientStateStore | None = None, attack: UpdateForgery | None = None,
                 tuning: EvaluationTuning | None = None, privacy: PrivacyPlan | None = None,
                 streams: ClientStreams | None = None) -> None:
        self.model, self.spec, self.federation = model, spec, federation
        self.rule, self.seed = rule, seed
        #: the clients' seeded streams (a pack's runtime maps each client to its own run's seed)
        self.streams = streams if streams is not None else ClientStreams(seed)
        self.attack, self.tuning = attack, tuning
        #: ``privacy.mechanism: local``: every upload is clipped and noised here, before it leaves the client, with
        #: noise from the client's own secure source (the seed determines it only under reproducible_noise)
        self.local_privacy = privacy if privacy is not None and privacy.mechanism == "local" else None
        self.mechanism = privacy.mechanism if privacy is not None else "none"
        self.noise = self.local_privacy.noise_source(seed) if self.local_privacy is not None else None
        self.training = rule.setting.training
        self.device = federation.train.device
        self.store = store if store is not None else ClientStateStore(torch.arange(federation.num_clients,
                                                                                   device="cpu"), self.device)
        self.evaluated_weights: torch.Tensor | None = None

    @property
    def exports_plain_models(self) -> bool:
        """Whether each client's scored model is the target network with its own weights (what ``models/`` saves);
        not where the rule evaluates another network or its own forward (FedRoD's two heads, FedCP's mixing...)."""
        return not (self.rule.has_evaluation_network or self.rule.has_eval_forward)

    def runtime_of(self, client_id: int) -> ClientRuntime:
        return self

    def plain_rule(self, steps: int, lr: float | None = None) -> ClientRule:
        """Plain SGD for ``steps`` steps (evaluation fine-tuning, novel-client adaptation)."""
        training = replace(self.training, steps=steps, lr=self.training.lr if lr is None else lr)
        return ClientRule(replace(self.rule.setting, training=training))

    def train(self, client_ids: torch.Tensor, start: torch.Tensor, round_index: int, purpose: str,
              steps: int | None = None, broadcast: dict[str, torch.Tensor] | None = None) -> TrainResult:
        # Only the round's local training follows the method's rule and changes client state; novel-client
        # adaptation trains plain SGD on a copy of the server state and leaves no trace on the clients.
        rule = self.rule if purpose == "local_training" else self.plain_rule(steps or self.training.steps)
        # One stream per (round, purpose, client): a client draws the same batches wherever it runs.
        seeds = self.streams.seeds(round_index, purpose, client_ids)
        state = None
        if purpose == "local_training":
            fresh = ~self.store.has_trained(client_ids)
            state = self._state_for(client_ids, start, fresh)
        begin, fused = start, {}
        if purpose == "local_training":
            begin, fused = rule.fuse(start, broadcast or {}, lambda weights: self.validation_losses(client_ids,
                                                                                                    weights))
        trained, metrics, new_state = train_clients(self.model, self.spec, begin,
                                                    self.federation.train.select(client_ids), rule, seeds, state,
                                                    broadcast)
        metrics.update(fused)
        # before any arithmetic broadcasts it
        check_update(trained, client_ids, self.spec.dim, round_index, self.federation.client_names, self.mechanism)
        if purpose == "local_training":
            self.store.put(client_ids, new_state)
        if self.training.feedback != "none" and purpose == "local_training":
            feedback_seeds = self.streams.seeds(round_index, "feedback", client_ids)
            validation = self.federation.val.select(client_ids)
            metrics["feedback"] = validation_feedback(self.model, self.spec, start, validation, self.federation.task,
                                                      self.training, feedback_seeds)
            metrics["feedback_seed"] = torch.tensor(feedback_seeds, dtype=torch.int64, device="cpu")
        delta = start - trained
        if self.local_privacy is not None and self.noise is not None and purpose in UPLOADING:
            delta = privatize_uploads(delta, self.local_privacy, self.noise, round_index, client_ids,
                                      UPLOADING[purpose])
            # losses depend on the client's data and are not privatised: they are not sent (the server logs none)
            metrics["loss_first"] = torch.zeros_like(metrics["loss_first"])
            metrics["loss_last"] = torch.zeros_like(metrics["loss_last"])
        if self.attack is not None and purpose == "local_training":
            delta = self.attack.forge(client_ids, delta, round_index)
        return TrainResult(torch.arange(len(client_ids), device="cpu"), client_ids, delta, metrics)

    def validation_losses(self, client_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``[S, K]``: the loss of each of ``weights [S, K, dim]`` on its client's validation rows."""
        count, candidates = weights.shape[:2]
        repeated = client_ids.repeat_interleave(candidates)
        scores = evaluate_clients(self.model, self.spec, weights.reshape(count * candidates, -1),
                                  self.federation.val.select(repeated), self.federation.task,
                                  precision=self.training.precision)
        return scores.loss.reshape(count, candidates)

    def _state_for(self, client_ids: torch.Tensor, start: torch.Tensor,
                   fresh: torch.Tensor) -> dict[str, torch.Tensor]:
        """Stored state of returning clients, :meth:`ClientRule.init_state` for first-timers."""
        initial = self.rule.init_state(start)
        if fresh.all() or not initial:
            return initial
        stored = self.store.get(client_ids)
        return {name: torch.where(fresh.to(value.device).view(-1, *[1] * (value.ndim - 1)), value, stored[name])
                for name, value in initial.items()}

    def evaluation_weights(self, client_ids: torch.Tensor, weights: torch.Tensor, round_index: int) -> torch.Tensor:
        """What each client evaluates with: clients that trained apply their rule (own state, fine-tuning);
        clients that never trained (novel clients) evaluate the weights they received, untouched."""
        trained = self.store.has_trained(client_ids)
        keeps_received = (not self.rule.evaluates_own_weights and not self.rule.eval_finetune_steps
                          and self.tuning is None)
        if not trained.any() or keeps_received:  # nothing to replace: no copy of [N, dim] weights
            return weights
        ids, rows = client_ids[trained], torch.nonzero(trained).flatten()
        own = self.rule.eval_weights(weights[rows], self.store.get(ids))
        if self.rule.eval_finetune_steps:
            finetune = self.plain_rule(self.rule.eval_finetune_steps, self.rule.eval_finetune_lr)
            if self.rule.finetunes_head_only:
                finetune = HeadTraining(finetune.setting)
            seeds = self.streams.seeds(round_index, "evaluation", ids)
            own = train_clients(self.model, self.spec, own, self.federation.train.select(ids), finetune, seeds).trained
        if self.tuning is not None:
            own = self.tuning.apply(self.model, self.rule.setting, own, self.federation.train.select(ids),
                                    self.streams.seeds(round_index, "tuning", ids))
        weights = weights.clone()
        weights[rows] = own
        return weights

    def evaluate(self, client_ids: torch.Tensor, weights: torch.Tensor, round_index: int) -> dict[str, ClientScores]:
        weights = self.evaluation_weights(client_ids, weights, round_index)
        self.evaluated_weights = weights  # what the clients just scored with (the run saves its best: models/)
        model, spec = self.model, self.spec
        # only rules that evaluate another network pay for the per-client seed streams (N of them per evaluation)
        if self.rule.has_evaluation_network:
            network = self.rule.evaluation_network(model, weights, self.federation.train.select(client_ids),
                                                   self.store.has_trained(client_ids),
                                                   self.streams.seeds(round_index, "evaluation", client_ids))
            if network is not None:
                model, spec, weights = network
        forward = None
        if self.rule.has_eval_forward:
            forward = self._rule_forward(client_ids)
        # scores go back to the host: the round loop's bookkeeping (means, masks by client) lives there
        return {split: evaluate_clients(model, spec, weights,
                                        getattr(self.federation, split).select(client_ids), self.federation.task,
                                        forward=forward, precision=self.training.precision).to("cpu")
                for split in self.federation.evaluation_splits}

    def _rule_forward(self, client_ids: torch.Tensor) -> Callable[[Weights, torch.Tensor, torch.Tensor], torch.Tensor]:
        """Predictions of the rule's ``eval_forward`` for clients that trained, the model's for the others."""
        train = self.federation.train.select(client_ids)
        trained = self.store.has_trained(client_ids).to(train.device)  # indexed by the blocks' owners, on the device
        state = self.store.get(client_ids)  # gathered once, indexed per chunk

        def forward(weights: Weights, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
            uses_rule = trained[owners]
            if not uses_rule.any():
                return self.model.batched_forward(weights, x)
            own = self.rule.eval_forward(self.model, weights, x, train.select(owners),
                                         {name: value[owners] for name, value in state.items()})
            if own is None:
                return self.model.batched_forward(weights, x)
            if uses_rule.all():  # the model's own forward would be thrown away
                return own
            plain = self.model.batched_forward(weights, x)
            return torch.where(uses_rule.view(-1, *[1] * (plain.ndim - 1)), own, plain)

        return forward

    def state_dict(self) -> dict[str, Any]:
        return self.store.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.store.load_state_dict(state)


class ArchitectureRuntime(ClientExecutor):
    """Clients of different architectures (``model.architectures``) in this process: one :class:`ClientRuntime` per
    architecture, each training and evaluating its clients vectorised. A client's network takes the first ``dim``
    values of its wire row (all of it for FLHA-GHN's GHN; its own architecture's parameters, zero-padded, for the
    ``own`` wire); its delta comes back padded with zeros. ``client_ids``: the clients kept here (a Flower node keeps
    one)."""

    def __init__(self, family: ArchitectureFamily, networks: list[TargetModel], rules: list[ClientRule],
                 federation: Federation, seed: int, wire_dim: int, client_ids: torch.Tensor | None = None,
                 attack: UpdateForgery | None = None, privacy: PrivacyPlan | None = None) -> None:
        self.family, self.wire_dim = family, wire_dim
        self.splits = federation.evaluation_splits
        self.device = federation.train.device
        kept = torch.arange(federation.num_clients, device="cpu") if client_ids is None else client_ids
        self.runtimes: dict[int, ClientRuntime] = {}
        for arch, (network, rule) in enumerate(zip(networks, rules, strict=True)):
            members = kept[family.assignment[kept] == arch]
            if len(members):
                self.runtimes[arch] = ClientRuntime(network, rule.spec, federation, rule, seed,
                                                    ClientStateStore(members, self.device), attack,
                                                    privacy=privacy)

    def runtime_of(self, client_id: int) -> ClientRuntime:
        """The runtime of ``client_id``'s architecture (its rule and its state store)."""
        return self._group(int(self.family.assignment[client_id]))

    def _group(self, arch: int) -> ClientRuntime:
        if arch not in self.runtimes:
            raise KeyError(f"no client of architecture {self.family.names[arch]} is kept here")
        return self.runtimes[arch]

    def train(self, client_ids: torch.Tensor, start: torch.Tensor, round_index: int, purpose: str,
              steps: int | None = None, broadcast: dict[str, torch.Tensor] | None = None) -> TrainResult:
        delta = torch.zeros(len(client_ids), self.wire_dim, device=start.device)
        metrics: dict[str, torch.Tensor] = {}
        for arch, positions in self.family.groups(client_ids):
            runtime = self._group(arch)
            dim = runtime.spec.dim
            part = runtime.train(client_ids[positions], start[positions, :dim], round_index, purpose, steps,
                                 None if broadcast is None else {k: v[positions] for k, v in broadcast.items()})
            delta[positions, :dim] = part.delta
            for name, value in part.metrics.items():
                if name not in metrics:
                    metrics[name] = torch.zeros(len(client_ids), *value.shape[1:], dtype=value.dtype,
                                                device=value.device)
                metrics[name][positions] = value
        return TrainResult(torch.arange(len(client_ids), device="cpu"), client_ids, delta, metrics)

    def evaluate(self, client_ids: torch.Tensor, weights: torch.Tensor, round_index: int) -> dict[str, ClientScores]:
        parts: dict[str, list[ClientScores]] = {split: [] for split in self.splits}
        order = []
        for arch, positions in self.family.groups(client_ids):
            runtime = self._group(arch)
            scores = runtime.evaluate(client_ids[positions], weights[positions, :runtime.spec.dim], round_index)
            for split in self.splits:
                parts[split].append(scores[split])
            order.append(positions)
        back = torch.argsort(torch.cat(order))  # group order -> the asked-for order
        return {split: ClientScores.concat(parts[split]).select(back) for split in self.splits}

    def state_dict(self) -> dict[str, Any]:
        return {self.family.names[arch]: runtime.state_dict() for arch, runtime in self.runtimes.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = {self.family.names[arch] for arch in self.runtimes}
        if set(state) != expected:
            raise ValueError(f"client state for architectures {sorted(state)}, {sorted(expected)} expected")
        for arch, runtime in self.runtimes.items():
            runtime.load_state_dict(state[self.family.names[arch]])
