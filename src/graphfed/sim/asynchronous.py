"""Asynchronous rounds on the simulated clock: FedBuff's buffered server and FedAsync's mixing.

``train.server_mode: fedbuff`` (Nguyen et al., 2022, Algorithm 1): ``concurrency`` clients train at once, each from
the model of the moment it was dispatched. Their updates arrive in the order the clock (:mod:`graphfed.sim.clock`)
gives; each joins the buffer, and when ``buffer_size`` (K) have arrived the server takes one step on them, each
delta ``sent - trained`` (the change from the weights *that client was sent*, however old) weighted by
``s(tau) = (1 + tau) ** -staleness_exponent`` of its staleness ``tau``: the server steps taken since it was sent.
The method combines the weighted deltas with its own server rule (FedAvg's sample-weighted mean, a hypernetwork's
gradient step). Every arrival frees a slot, which goes at once to an idle client (seeded draw among those online;
a client whose update waits in the buffer is not sent again until the step that uses it).

``fedasync`` (Xie et al., 2019, Algorithm 1): a buffer of one, and the global model mixes with the arriving
client's model, ``x <- (1 - a) x + a x_client`` with ``a = mixing * s(tau)``: for methods with one global model.

A round of an asynchronous run is one server step: evaluations, checkpoints and ``train.rounds`` count server steps,
and ``rounds.jsonl``'s ``sim_seconds`` says when each happened. A dispatch trains at once in the simulator (its result
depends only on what it was sent) and its update is held until the clock says it arrives; clients dispatched at the
same moment train in one batched call.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from graphfed.client.executor import Collected, TrainResult, check_update
from graphfed.config import ConfigError, RunConfig
from graphfed.core import rng
from graphfed.errors import NonFiniteUpdateError, RunStoppedError
from graphfed.sim.clock import SimulatedClock
from graphfed.sim.requests import Collect, Steps, Submit, Train

if TYPE_CHECKING:
    from graphfed.sim.engine import Simulator


def staleness_weights(staleness: torch.Tensor, kind: str, exponent: float) -> torch.Tensor:
    """``s(tau)`` of each update's staleness (server steps since it was sent)."""
    if kind == "constant":
        return torch.ones(len(staleness), dtype=torch.float32)
    return (1.0 + staleness.to(torch.float64)).pow(-exponent).to(torch.float32)


@dataclass
class Dispatch:
    """One client's local training on its way to the server."""

    client: int
    version: int  #: server steps taken before it was sent
    finish: float  #: simulated seconds at which its update arrives
    sent: torch.Tensor  #: [dim] the weights it was sent
    delta: torch.Tensor  #: [dim] sent - trained
    metrics: dict[str, torch.Tensor]  #: each [1]

    def state(self) -> dict[str, Any]:
        return {"client": self.client, "version": self.version, "finish": self.finish, "sent": self.sent,
                "delta": self.delta, "metrics": self.metrics}

    @classmethod
    def load(cls, state: dict[str, Any]) -> Dispatch:
        return cls(int(state["client"]), int(state["version"]), float(state["finish"]), state["sent"],
                   state["delta"], dict(state["metrics"]))


def check_asynchronous(config: RunConfig, sim: Simulator) -> None:
    """``train.server_mode`` other than sync: the method, the engine and the privacy plan must allow it (one line)."""
    mode, method = config.train.server_mode, sim.setup.method
    if mode == "sync":
        return
    prefix = f"train.server_mode={mode}: {method.name}"
    refusal = type(method).asynchronous_refusal
    if refusal is not None:
        raise ConfigError(f"{prefix} does not run asynchronously: {refusal}; use train.server_mode=sync")
    if mode == "fedasync" and not (getattr(method, "sends_global_model", False) and hasattr(method, "global_weights")):
        raise ConfigError(f"{prefix}: fedasync mixes one global model with each arriving client model, and "
                          f"{method.name} has no one global model; use train.server_mode=fedbuff")
    if sim.privacy.active:
        raise ConfigError(f"{prefix}: the privacy accounting assumes each round's cohort is a Poisson sample of the "
                          f"clients (central) or counts uploads per round (local); asynchronous arrival follows the "
                          f"clients' speeds, which no accountant here covers; use train.server_mode=sync under DP")
    if sim.on_flower and config.train.time_budget is not None:
        raise ConfigError(f"train.time_budget counts simulated seconds; on Flower the updates of {mode} arrive on "
                          f"the wall clock: bound the run with train.rounds (server steps)")
    buffer = config.train.buffer_size or 0
    if buffer > len(sim.setup.federation.train_client_ids):
        raise ConfigError(f"train.buffer_size: {buffer} updates a step, but only "
                          f"{len(sim.setup.federation.train_client_ids)} clients train")


class AsyncServer:
    """The asynchronous server's in-flight work and buffer (checkpointed with :meth:`state`)."""

    def __init__(self, config: RunConfig, clock: SimulatedClock, train_ids: torch.Tensor,
                 clients_per_round: int) -> None:
        train = config.train
        self.config, self.clock, self.train_ids = config, clock, train_ids
        self.mode = train.server_mode
        self.buffer_size = 1 if self.mode == "fedasync" else train.buffer_size or clients_per_round
        self.concurrency = min(train.concurrency or 2 * self.buffer_size, len(train_ids))
        self.in_flight: list[Dispatch] = []
        self.buffer: list[Dispatch] = []
        self.version = 0  #: server steps taken
        self.waves = 0  #: batched dispatches made (each a Train call with its own seeds)
        self.picks = 0  #: clients dispatched (each draw its own stream)

    # ---- dispatch -----------------------------------------------------------------------------------------------
    def _pick(self, now: float, taken: set[int]) -> int | None:
        """An idle client, drawn uniformly among those online at ``now`` (else among those back online soonest)."""
        idle = [int(c) for c in self.train_ids.tolist() if int(c) not in taken]
        if not idle:
            return None
        back_at = {c: self.clock.next_online(c, now) for c in idle}  # now for those online
        soonest = min(back_at.values())
        online = [c for c in idle if back_at[c] == soonest]
        draw = torch.randint(len(online), (1,), generator=rng.generator(self.config.seed, self.picks, "dispatch"))
        self.picks += 1
        return online[int(draw)]

    def dispatch(self, sim: Simulator, count: int, now: float) -> Steps[None]:
        """Send ``count`` idle clients the method's weights of this moment and train them (one batched call)."""
        taken = {d.client for d in self.in_flight} | {d.client for d in self.buffer}
        chosen: list[int] = []
        for _ in range(count):
            client = self._pick(now, taken)
            if client is None:
                break
            chosen.append(client)
            taken.add(client)
        if not chosen:
            return
        client_ids = torch.tensor(sorted(chosen), dtype=torch.long)
        sent, broadcast = sim.send(client_ids, f"server step {self.version + 1}")
        result: TrainResult = yield Train(client_ids, sent, self.waves, "local_training", broadcast=broadcast)
        self.waves += 1
        check_update(result.delta, result.client_ids, sim.setup.spec.dim, self.version,
                     sim.setup.federation.client_names, sim.privacy.mechanism)
        for position, (row, client) in enumerate(zip(result.rows.tolist(), result.client_ids.tolist(), strict=True)):
            start = self.clock.next_online(client, now)
            self.in_flight.append(Dispatch(client, self.version, self.clock.finish(client, start), sent[row].clone(),
                                           result.delta[position].clone(),
                                           {name: value[position:position + 1].clone()
                                            for name, value in result.metrics.items()}))

    # ---- a round: until the next server step --------------------------------------------------------------------
    def round_steps(self, sim: Simulator) -> Steps[dict[str, float | None]]:
        """Run the clock to the server's next step (dispatching as slots free up); returns the step's statistics."""
        if not self.in_flight and not self.buffer:  # the run's start
            yield from self.dispatch(sim, self.concurrency, sim.tracker.sim_seconds)
        if not self.in_flight:
            raise RunStoppedError("asynchronous server: no client is training and the buffer cannot fill")
        while True:
            arrival = min(self.in_flight, key=lambda dispatch: (dispatch.finish, dispatch.client))
            self.in_flight.remove(arrival)
            sim.tracker.sim_seconds = max(sim.tracker.sim_seconds, arrival.finish)
            self.buffer.append(arrival)
            stats = self.server_step(sim) if len(self.buffer) >= self.buffer_size else None
            yield from self.dispatch(sim, 1, sim.tracker.sim_seconds)
            if stats is not None:
                return stats

    def server_step(self, sim: Simulator) -> dict[str, float | None]:
        """One step on the buffer: staleness-weighted deltas (FedBuff) or mixing (FedAsync)."""
        method, train = sim.setup.method, self.config.train
        buffer = sorted(self.buffer, key=lambda dispatch: dispatch.client)  # methods see clients in id order
        client_ids = torch.tensor([d.client for d in buffer], dtype=torch.long)
        sent = torch.stack([d.sent for d in buffer])
        delta = torch.stack([d.delta for d in buffer])
        metrics = {name: torch.cat([d.metrics[name] for d in buffer]) for name in buffer[0].metrics}
        staleness = torch.tensor([self.version - d.version for d in buffer], dtype=torch.long)
        weights = staleness_weights(staleness, train.staleness, train.staleness_exponent).to(delta.device)
        if self.mode == "fedbuff":
            method.update(client_ids, sent, delta * weights[:, None], metrics)
        else:  # x <- (1 - a) x + a x_client = x - a (x - x_client), x_client = sent - delta
            current = method.global_weights.detach().unsqueeze(0)  # type: ignore[attr-defined]
            mixing = train.mixing * weights[:, None]
            method.update(client_ids, current.expand(len(buffer), -1).clone(),
                          mixing * (current - (sent - delta)), metrics)
        rows = torch.arange(len(buffer))
        sim.tracker.bytes_up += sim.traffic.up(TrainResult(rows, client_ids, delta, metrics))
        self.version += 1
        self.buffer = []
        if sim.tracker.sim_seconds is not None:
            sim.tracker.sim_seconds += self.clock.config.server_seconds
        loss = float(metrics["loss_last"].mean())
        if not math.isfinite(loss):
            raise NonFiniteUpdateError(f"server step {self.version}: non-finite training loss")
        return {"train_loss": loss, "clients": len(buffer), "staleness_mean": float(staleness.float().mean()),
                "staleness_max": int(staleness.max())}

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` says of the asynchronous server."""
        train = self.config.train
        return {"server_mode": self.mode, "buffer_size": self.buffer_size, "concurrency": self.concurrency,
                "staleness": train.staleness, "staleness_exponent": train.staleness_exponent,
                **({"mixing": train.mixing} if self.mode == "fedasync" else {}), "server_steps": self.version,
                "dispatches": self.picks}

    # ---- checkpoints --------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"version": self.version, "waves": self.waves, "picks": self.picks,
                "in_flight": [d.state() for d in self.in_flight], "buffer": [d.state() for d in self.buffer]}

    def load(self, state: dict[str, Any]) -> None:
        self.version, self.waves, self.picks = int(state["version"]), int(state["waves"]), int(state["picks"])
        self.in_flight = [Dispatch.load(entry) for entry in state["in_flight"]]
        self.buffer = [Dispatch.load(entry) for entry in state["buffer"]]


class LiveAsyncServer(AsyncServer):
    """FedBuff / FedAsync with clients that answer in their own time (Flower nodes, :class:`Submit` and
    :class:`Collect`): training is submitted to ``concurrency`` idle clients and its updates join the buffer in the
    order they arrive on the wall clock. A client whose training ended without an update (its node failed, or did not
    answer within ``flower.round_timeout``) frees its slot and is sent a probe beyond ``concurrency`` (:meth:`fill`),
    so a stopped node delays its own update and nothing else, and trains again, from weights at most
    ``flower.round_timeout`` old, once it answers. An evaluation waits for no straggler either (the executor stops
    waiting for a node silent for ``flower.async_evaluation_wait`` times the median training reply time). Arrival
    order is the network's: unlike the simulator's, such a run is not reproducible to the bit.

    A checkpoint keeps the updates that arrived and were not yet used; the training in flight is lost with the
    ServerApp (a new one cannot collect its replies) and its clients are sent work again."""

    def __init__(self, config: RunConfig, clock: SimulatedClock, train_ids: torch.Tensor,
                 clients_per_round: int) -> None:
        super().__init__(config, clock, train_ids, clients_per_round)
        self.arrived: list[Dispatch] = []  #: updates collected and not yet in the buffer, in arrival order
        self.sent_to: dict[int, tuple[int, torch.Tensor]] = {}  #: client in flight -> (version, weights) it was sent
        self.started = self.last_arrival = time.monotonic()
        self.idle: list[int] = []  #: the clients free for work at the last look, answering ones
        self.unanswered: list[int] = []  #: idle clients whose last work timed out
        self.silent: dict[int, int] = {}  #: client whose work ended without an update -> the server step it was in
        self.probes: set[int] = set()  #: clients in flight whose last work had timed out (beyond concurrency)
        self.sent: dict[int, int] = {}  #: training messages each client's node was sent, as the executor counts

    def round_steps(self, sim: Simulator) -> Steps[dict[str, float | None]]:
        sim.tracker.sim_seconds = None  # updates arrive on the wall clock (rounds.jsonl: wall_seconds)
        patience = 2 * self.config.flower.round_timeout  # all work sent in that time has answered or timed out
        while True:
            while self.arrived and len(self.buffer) < self.buffer_size:
                self.buffer.append(self.arrived.pop(0))
            if len(self.buffer) >= self.buffer_size:
                stats: dict[str, Any] = self.server_step(sim)
                if self.version < self.config.train.rounds:  # after the last step no work would be used
                    yield from self.fill(sim)
                names = sim.setup.federation.client_names
                # whose node has not answered since its work was lost (graphfed status), and the work each was sent
                # (as of the step's last look at the nodes)
                return {**stats, "silent_clients": {names[c]: step for c, step in sorted(self.silent.items())},
                        "trainings_sent": {names[c]: n for c, n in sorted(self.sent.items())}}
            collected: Collected = yield Collect(wait=1.0)
            self.take(collected, sim)
            yield from self.fill(sim)
            if time.monotonic() - self.last_arrival > patience:
                raise RunStoppedError(f"asynchronous server: no update arrived in {patience:g} s (twice "
                                      f"flower.round_timeout), so no node is answering; start the run again to resume "
                                      f"from its last checkpoint")
            if not self.sent_to and not collected.arrived.client_ids.numel():
                time.sleep(0.2)  # no work out and none given: wait for a node to join or come back

    def take(self, collected: Collected, sim: Simulator) -> None:
        """The updates that arrived join the queue for the buffer; lost work frees its client."""
        result = collected.arrived
        if result.client_ids.numel():
            self.last_arrival = time.monotonic()
        check_update(result.delta, result.client_ids, sim.setup.spec.dim, self.version,
                     sim.setup.federation.client_names, sim.privacy.mechanism)
        for position, client in enumerate(result.client_ids.tolist()):
            if client not in self.sent_to:  # not this server's work (sent before a resume): never used
                continue
            version, sent = self.sent_to.pop(client)
            self.silent.pop(client, None)
            self.probes.discard(client)
            self.arrived.append(Dispatch(client, version, time.monotonic() - self.started, sent,
                                         result.delta[position].clone(),
                                         {name: value[position:position + 1].clone()
                                          for name, value in result.metrics.items()}))
        for client in collected.lost:
            self.sent_to.pop(client, None)
            self.probes.discard(client)
            self.silent.setdefault(client, self.version + 1)
        self.idle, self.unanswered, self.sent = collected.idle, collected.unanswered, collected.sent

    def fill(self, sim: Simulator) -> Steps[None]:
        """Submit training to idle answering clients until ``concurrency`` of them are training, and to each idle
        client whose last work timed out (a probe, beyond the limit: its message expires after
        ``flower.round_timeout`` and is sent again, so a node that comes back finds work at most that old)."""
        waiting = {d.client for d in self.buffer} | {d.client for d in self.arrived} | set(self.sent_to)
        pool = [client for client in self.idle if client not in waiting]
        working = len(set(self.sent_to) - self.probes)
        chosen: list[int] = []
        while pool and working + len(chosen) < self.concurrency:
            draw = torch.randint(len(pool), (1,), generator=rng.generator(self.config.seed, self.picks, "dispatch"))
            self.picks += 1
            chosen.append(pool.pop(int(draw)))
        probes = [client for client in self.unanswered if client not in waiting]
        self.idle = [client for client in self.idle if client not in chosen]
        self.unanswered = []
        if not chosen and not probes:
            return
        client_ids = torch.tensor(sorted(chosen + probes), dtype=torch.long)
        sent, broadcast = sim.send(client_ids, f"server step {self.version + 1}")
        yield Submit(client_ids, sent, self.version, broadcast)
        self.waves += 1
        self.probes |= set(probes)
        for row, client in enumerate(client_ids.tolist()):
            self.sent_to[client] = (self.version, sent[row].clone())

    def record(self) -> dict[str, Any]:
        return {**super().record(), "arrivals": "wall clock (Flower nodes)"}

    def state(self) -> dict[str, Any]:
        return {**super().state(), "in_flight": [], "arrived": [d.state() for d in self.arrived],
                "silent": [[client, step] for client, step in self.silent.items()]}

    def load(self, state: dict[str, Any]) -> None:
        super().load(state)
        self.arrived = [Dispatch.load(entry) for entry in state.get("arrived", [])]
        self.silent = {int(client): int(step) for client, step in state.get("silent", [])}


__all__ = ["AsyncServer", "Dispatch", "LiveAsyncServer", "check_asynchronous", "staleness_weights"]
