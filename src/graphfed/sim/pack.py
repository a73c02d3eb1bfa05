"""Packs: several runs stepped in lockstep, their clients' training and evaluation served by one batched call each.

A pack's members are runs of one config but for their seed (every seed of a method): the same model, method options
and client rule, so their clients can share every kernel launch. Each member is a whole
:class:`~graphfed.sim.engine.Simulator` (its own federation, since seeds re-partition the data; its own sampling,
method, server steps, callbacks and run folder), whose executor is a :class:`PackView` into one
:class:`~graphfed.client.executor.ClientRuntime` over every member's clients (their rows concatenated: a pack holds S
runs' data on the device). The pack drives the members' run generators; the requests of the same kind, purpose and
round from several members become one call. Each client draws from its own run's streams (seed, round, purpose, its
id in its run), so a member's numbers are the numbers it gives alone; the summary's ``execution`` records the pack.

Not packed (:func:`pack_refusal`): clients of different architectures, attacks (a per-run forgery of uploads),
reproducible local-DP noise (keyed by a client's id), asynchronous rounds (each run dispatches on its own clock)
and Flower (clients run elsewhere).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from graphfed.client.autotune import choose_packing
from graphfed.client.evaluation import ClientScores
from graphfed.client.executor import ClientExecutor, ClientRuntime, ClientStateStore, ClientStreams, TrainResult
from graphfed.client.placement import deterministic_algorithms
from graphfed.config import RunConfig, dump_config
from graphfed.core import rng
from graphfed.data.federation import ClientSplit, Federation
from graphfed.errors import ConfigError, RunStoppedError
from graphfed.runs import RunResult
from graphfed.setup import Setup
from graphfed.sim.engine import Simulator
from graphfed.sim.requests import Evaluate, Request, Train, serve

log = logging.getLogger("graphfed")

__all__ = ["Pack", "PackView", "pack_key", "pack_refusal"]


def pack_key(config: RunConfig) -> str:
    """What members of one pack share: the whole config but its seed."""
    return dump_config(config.model_copy(update={"seed": 0}))


def pack_refusal(config: RunConfig) -> str | None:
    """Why a run of ``config`` cannot share its clients' calls with other runs (None: it can)."""
    if config.model.architectures is not None:
        return "clients of different architectures train different networks"
    if config.attack.kind != "none":
        return "an attack forges each run's own malicious clients' uploads"
    if config.privacy.mechanism == "local" and config.privacy.reproducible_noise:
        return "reproducible local-DP noise is keyed by each client's id in its own run"
    if config.train.server_mode != "sync":
        return "asynchronous rounds dispatch clients at times of their own run's clock"
    return None


def concat_splits(splits: list[ClientSplit]) -> ClientSplit:
    """One split holding every given split's clients, in order (their rows copied once into one storage)."""
    offsets = torch.cumsum(torch.tensor([0, *(len(split.x) for split in splits[:-1])]), 0)
    return ClientSplit(torch.cat([split.x for split in splits]), torch.cat([split.y for split in splits]),
                       torch.cat([split.starts + int(offset) for split, offset in zip(splits, offsets, strict=True)]),
                       torch.cat([split.counts for split in splits]))


def concat_federations(federations: list[Federation]) -> Federation:
    """The members' clients as one federation (names kept: a message about a client names it as its run does)."""
    first = federations[0]
    splits = {name: concat_splits([getattr(fed, name) for fed in federations]) for name in first.evaluation_splits}
    return Federation(name=first.name, task=first.task, train=concat_splits([fed.train for fed in federations]),
                      val=splits["val"], test=splits["test"], input_shape=first.input_shape,
                      output_dim=first.output_dim, novel_mask=torch.cat([fed.novel_mask for fed in federations]),
                      client_names=[name for fed in federations for name in fed.client_names],
                      metric=first.metric, backdoor_test=splits.get("backdoor_test"))


class PackStreams(ClientStreams):
    """Each client's streams are its own run's: (that run's seed, round, purpose, its id in that run)."""

    def __init__(self, seeds: list[int], offsets: list[int]) -> None:
        super().__init__(seeds[0])
        self.member_seeds, self.offsets = seeds, offsets

    def seeds(self, round_index: int, purpose: str, client_ids: torch.Tensor) -> list[int]:
        members = torch.bucketize(client_ids, torch.tensor(self.offsets[1:]), right=True).tolist()
        return [rng.stream_seed(self.member_seeds[member], round_index, purpose, int(client) - self.offsets[member])
                for client, member in zip(client_ids.tolist(), members, strict=True)]


class PackView(ClientExecutor):
    """One member's clients inside the pack's runtime: its client ids shifted by its offset. Calls made through
    the view alone (not gathered by the pack) are served at once, for this member only."""

    def __init__(self, pack: Pack, index: int, setup: Setup) -> None:
        self.pack, self.index, self.setup = pack, index, setup
        rule = setup.client_rule
        #: decided by the rule before the shared runtime exists (the simulator asks while it is built)
        self.exports_plain_models = not (rule.has_evaluation_network or rule.has_eval_forward)
        self.evaluated_weights: torch.Tensor | None = None

    @property
    def offset(self) -> int:
        return self.pack.offsets[self.index]

    def rows(self) -> torch.Tensor:
        count = self.pack.members[self.index].setup.federation.num_clients
        return torch.arange(self.offset, self.offset + count)

    def train(self, client_ids: torch.Tensor, start: torch.Tensor, round_index: int, purpose: str,
              steps: int | None = None, broadcast: dict[str, torch.Tensor] | None = None) -> TrainResult:
        return self.pack.serve_group([(self.index, Train(client_ids, start, round_index, purpose, steps,
                                                         broadcast))])[0]

    def evaluate(self, client_ids: torch.Tensor, weights: torch.Tensor, round_index: int) -> dict[str, ClientScores]:
        return self.pack.serve_group([(self.index, Evaluate(client_ids, weights, round_index))])[0]

    def state_dict(self) -> dict[str, Any]:
        """The member's rows of the shared client state: what its own runtime would checkpoint."""
        assert self.pack.runtime is not None
        store, rows = self.pack.runtime.store, self.rows()
        trained = store.trained[rows]
        return {"trained": trained.clone(),
                "tensors": {name: value[rows].clone() for name, value in store.tensors.items()} if trained.any()
                else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.pack.runtime is not None
        self.pack.runtime.store.load_rows(self.rows(), state)


class Pack:
    """``configs`` (one pack key, their seeds differ) run side by side, each writing to its ``out_dirs`` entry.

    ``batched``: share the clients' calls (None: as :func:`~graphfed.client.autotune.choose_packing` measures for the
    first run on this machine). Runs whose calls are not shared (a compute-bound model gains nothing from sharing,
    and a pack holds every run's data at once) simply run one after another, each built when it starts."""

    def __init__(self, configs: list[RunConfig], out_dirs: list[Path | None] | None = None,
                 batched: bool | None = None) -> None:
        keys = {pack_key(config) for config in configs}
        if len(keys) != 1:
            raise ConfigError("a pack's runs must differ in their seed only")
        refusal = pack_refusal(configs[0])
        if refusal is not None:
            raise ConfigError(f"these runs cannot be packed: {refusal}")
        self.configs = configs
        self.dirs = out_dirs if out_dirs is not None else [None] * len(configs)
        first = Simulator(configs[0], self.dirs[0], progress=False)
        if batched is None and len(configs) > 1:
            self.choice = choose_packing(first.setup.model, first.setup.spec, first.setup.federation.train,
                                         first.setup.client_rule, first.clients_per_round, len(configs)).record()
        else:
            self.choice = {"batched": bool(batched), "source": "asked", "seconds": {}}
        self.batched = bool(self.choice["batched"]) and len(configs) > 1
        self.members: list[Simulator] = [first]
        self.offsets: list[int] = [0]
        self.runtime: ClientRuntime | None = None
        self.clocks = [0.0] * len(configs)
        if self.batched:
            first.executor = PackView(self, 0, first.setup)
            for index, (config, out_dir) in enumerate(zip(configs[1:], self.dirs[1:], strict=True), start=1):
                self.offsets.append(self.offsets[-1] + self.members[-1].setup.federation.num_clients)
                self.members.append(Simulator(config, out_dir, progress=False, executor=self._view(index)))
            self.runtime = self._shared_runtime()
            self.choice["clients_per_chunk"] = self.chunk
            for index, member in enumerate(self.members):
                member.clock = self._clock(index)
        self._note(0)

    def _note(self, index: int, member: Simulator | None = None) -> None:
        """What member ``index``'s summary says of how it ran (``execution.pack``)."""
        member = member or self.members[index]
        member.execution = {**member.execution, "pack": {"runs": len(self.configs), "member": index, **self.choice}}

    def _view(self, index: int) -> Callable[[Setup], PackView]:
        return lambda setup: PackView(self, index, setup)

    def _clock(self, index: int) -> Callable[[], float]:
        return lambda: self.clocks[index]

    def _shared_runtime(self) -> ClientRuntime:
        """One runtime over every member's clients: member 0's network and client rule (the members' are the same
        config's), each client's streams its own run's. The members' own federations then read their rows from the
        shared storage (the pack holds every run's data once)."""
        first = self.members[0].setup
        federation = concat_federations([member.setup.federation for member in self.members])
        for index, member in enumerate(self.members):
            rows = torch.arange(self.offsets[index], self.offsets[index] + member.setup.federation.num_clients)
            own = member.setup.clients.federation
            member.setup.clients.federation = replace(
                own, **{name: getattr(federation, name).select(rows) for name in ("train", *own.evaluation_splits)})
            self._note(index)
        streams = PackStreams([member.config.seed for member in self.members], self.offsets)
        store = ClientStateStore(torch.arange(federation.num_clients), first.clients.device)
        runtime = ClientRuntime(first.model, first.spec, federation, first.client_rule, first.config.seed, store,
                                None, first.clients.simple_tuning(), first.clients.privacy, streams)
        # the chunking measured for the pack's calls (all members' clients at once)
        clients = first.clients.plan_execution(len(self.members) * self.members[0].clients_per_round)
        self.chunk = next(iter(clients.values()))["clients_per_chunk"]
        return runtime

    # ---- serving the members' requests ---------------------------------------------------------------------------
    def serve_group(self, group: list[tuple[int, Request]]) -> list[Any]:
        """Answer the requests of several members (same kind, purpose and round) with one call of the shared
        runtime; if that call stops (one member's non-finite update), each member is served alone, so the others
        get their answers and the member at fault its error. Answers are exceptions where the call raised."""
        try:
            return self._batched(group)
        except RunStoppedError:
            if len(group) == 1:
                raise
        answers: list[Any] = []
        for entry in group:
            try:
                answers.append(self._batched([entry])[0])
            except RunStoppedError as err:
                answers.append(err)
        return answers

    def _batched(self, group: list[tuple[int, Request]]) -> list[Any]:
        assert self.runtime is not None  # only a batched pack serves requests
        blocks, ids, position = [], [], 0
        for index, request in group:
            blocks.append((position, len(request.client_ids)))
            position += len(request.client_ids)
            ids.append(request.client_ids + self.offsets[index])
        first = group[0][1]
        client_ids = torch.cat(ids)
        if isinstance(first, Train):
            broadcasts = [request.broadcast for _, request in group]
            broadcast = ({name: torch.cat([b[name] for b in broadcasts if b is not None]) for name in first.broadcast}
                         if first.broadcast else None)
            result = serve(self.runtime, Train(client_ids, torch.cat([r.start for _, r in group]), first.round_index,
                                               first.purpose, first.steps, broadcast))
            return [TrainResult(torch.arange(count), result.client_ids[lo:lo + count] - self.offsets[index],
                                result.delta[lo:lo + count],
                                {name: value[lo:lo + count] for name, value in result.metrics.items()})
                    for (index, _), (lo, count) in zip(group, blocks, strict=True)]
        scores = serve(self.runtime, Evaluate(client_ids, torch.cat([r.weights for _, r in group]), first.round_index))
        answers = []
        for (index, _), (lo, count) in zip(group, blocks, strict=True):
            positions = torch.arange(lo, lo + count)
            view = self.members[index].executor
            view.evaluated_weights = (None if self.runtime.evaluated_weights is None
                                      else self.runtime.evaluated_weights[lo:lo + count])
            answers.append({split: value.select(positions) for split, value in scores.items()})
        return answers

    @staticmethod
    def _group_key(request: Request) -> tuple[Any, ...]:
        if isinstance(request, Train):
            return ("train", request.purpose, request.round_index, request.steps,
                    tuple(sorted(request.broadcast or {})))
        return ("evaluate", request.round_index)

    # ---- the lockstep loop ---------------------------------------------------------------------------------------
    def run(self, resume: list[bool] | None = None) -> list[RunResult]:
        """Every member's run to its end (``resume``: per member, continue from its checkpoint)."""
        resume = resume or [False] * len(self.configs)
        if not self.batched:
            return [self._alone(index).run(again) for index, again in enumerate(resume)]
        steps = {index: member.run_steps(again) for index, (member, again)
                 in enumerate(zip(self.members, resume, strict=True))}
        results: dict[int, RunResult] = {}
        pending: dict[int, Request] = {}
        with deterministic_algorithms(self.members[0].config.train.deterministic):
            for index in steps:
                self._advance(index, steps[index], None, pending, results, first=True)
            while pending:
                groups: dict[tuple[Any, ...], list[tuple[int, Request]]] = {}
                for index, request in pending.items():
                    groups.setdefault(self._group_key(request), []).append((index, request))
                for group in groups.values():
                    began = time.perf_counter()
                    try:
                        answers: list[Any] = self.serve_group(group)
                    except BaseException as err:  # an interrupt: every member sees it where it asked
                        answers = [err] * len(group)
                    share = (time.perf_counter() - began) / len(group)
                    for (index, _), answer in zip(group, answers, strict=True):
                        self.clocks[index] += share
                        self._advance(index, steps[index], answer, pending, results)
        return [results[index] for index in range(len(self.members))]

    def _alone(self, index: int) -> Simulator:
        """Member ``index`` run by itself (not shared), built when it starts and let go when it ends: one run's data
        in memory at a time (ten CIFAR-10 federations held at once would be gigabytes)."""
        member = self.members.pop() if self.members else Simulator(self.configs[index], self.dirs[index],
                                                                    progress=False)
        self._note(index, member)
        return member

    def _advance(self, index: int, member_steps: Any, answer: Any, pending: dict[int, Request],
                 results: dict[int, RunResult], first: bool = False) -> None:
        """Hand ``answer`` to member ``index`` and record what it asks next (or its result)."""
        began = time.perf_counter()
        try:
            if first:
                pending[index] = next(member_steps)
            elif isinstance(answer, BaseException):
                pending[index] = member_steps.throw(answer)
            else:
                pending[index] = member_steps.send(answer)
        except StopIteration as done:
            pending.pop(index, None)
            results[index] = done.value
        finally:
            self.clocks[index] += time.perf_counter() - began
