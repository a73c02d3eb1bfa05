"""The simulator: the one round loop of graphfed.

A round is a short pipeline of stages (:mod:`graphfed.sim.stages` names them): choose clients -> send (the method
personalises their weights) -> train (the executor) -> what arrives (dropout, stragglers, the central-DP release) ->
server update; every ``train.eval_every`` rounds the run observes (evaluates every client's personalised model and
hands the record to its callbacks, :mod:`graphfed.sim.observe`). Checkpoints are written atomically at round
boundaries; ``resume=True`` continues bit-identically because every random draw comes from a (seed, round,
purpose) stream and the method's state is saved whole.

The loop is written as a generator of :class:`Train` and :class:`Evaluate` requests: :meth:`Simulator.run` serves
them with the run's executor one by one, and a pack (:mod:`graphfed.sim.pack`) serves the requests of several runs
in one batched call each.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from graphfed import runs
from graphfed.client.evaluation import ClientScores, trivial_scores
from graphfed.client.executor import ClientExecutor, SubmittingExecutor, TrainResult, all_finite, check_update
from graphfed.client.metrics import HIGHER_IS_BETTER
from graphfed.client.placement import deterministic_algorithms
from graphfed.client.privacy import NOISE_LEVERS, PrivacyLedger, ServerGradientPrivacy
from graphfed.config import ConfigError, RunConfig, dump_config, runs_on_a_clock
from graphfed.core import rng
from graphfed.data.federation import Federation
from graphfed.errors import NonFiniteUpdateError, RunStoppedError
from graphfed.runs import RunResult
from graphfed.setup import Setup, build_setup, resolve_torch_threads
from graphfed.sim import checkpoint
from graphfed.sim.asynchronous import AsyncServer, LiveAsyncServer, check_asynchronous
from graphfed.sim.clock import SimulatedClock
from graphfed.sim.observe import (
    BestModels,
    Checkpointer,
    Progress,
    RoundLogWriter,
    RunCallback,
    Tracker,
    Trackers,
    announce,
    check_metrics,
    evaluation_record,
    mean_std,
    models_note,
)
from graphfed.sim.requests import Evaluate, Steps, Train, drive
from graphfed.sim.result import build_result
from graphfed.sim.stages import Arrivals, NoiseCheck, Participation, Traffic, central_release, check_privacy
from graphfed.sim.tracking import build_trackers

log = logging.getLogger("graphfed")

__all__ = ["Simulator", "run_config"]

#: collaboration-graph rows saved per evaluation; larger federations save a fixed sample of this many clients
GRAPH_ROWS = 512


class Simulator:
    """Runs one config to completion, writing to ``out_dir`` (``None``: in memory only)."""

    def __init__(self, config: RunConfig, out_dir: str | Path | None = None,
                 federation: Federation | None = None, progress: bool = True,
                 executor: Callable[[Setup], ClientExecutor] | None = None,
                 checkpoint_every: int | None = None) -> None:
        # Float sums depend on the intra-op thread count: record the count this run uses (this machine's, or one
        # thread each with clients side by side where that measures faster; not measured where the clients run
        # elsewhere, e.g. on Flower nodes), so its config.yaml reproduces its numbers bit for bit elsewhere.
        config, threads_choice = resolve_torch_threads(config, measure=executor is None)
        self.config = config
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.progress = progress
        self.setup = build_setup(config, federation)
        fed = self.setup.federation
        # `executor` builds where clients run (e.g. Flower nodes); default: in this process, vectorised.
        self.executor = executor(self.setup) if executor else self.setup.client_executor(config.seed)
        self.metrics = check_metrics(config, self.setup, self.executor)
        select_by = self.select_by = config.train.select_by or fed.default_select_by or fed.metric
        if select_by not in (fed.metric, *self.metrics):
            raise ConfigError(f"select_by: {select_by!r} (the folder's meta.yaml) is not scored; use {fed.metric} or "
                              f"one of its metrics: {', '.join(self.metrics) or 'none given'}")
        self.privacy = self.setup.clients.privacy
        #: rounds between checkpoints (the Flower engine passes ``flower.checkpoint_every``); a private run's after
        #: every round, so that a resume loses at most the round in flight (its releases are never made again)
        self.checkpoint_every = 1 if self.privacy.active else checkpoint_every or config.train.checkpoint_every
        #: a resumed run's novel-client adaptation in progress (the checkpoint's ``novel_adaptation``), or None
        self.novel_progress: dict[str, Any] | None = None
        self.tracker = Tracker(higher_is_better=HIGHER_IS_BETTER[select_by],
                               key="val_mean" if select_by == fed.metric else f"val_{select_by}_mean",
                               select_last=self.privacy.active and self.privacy.model_selection == "last")
        self.num_train_clients = len(fed.train_client_ids)
        if self.num_train_clients == 0:
            raise ConfigError("dataset.novel_fraction: every client is novel, none would train; lower it")
        self.clients_per_round = min(config.train.clients_per_round, self.num_train_clients)
        if self.clients_per_round < config.train.clients_per_round:
            log.warning("train.clients_per_round is %d but only %d clients train; each round samples all %d",
                        config.train.clients_per_round, self.num_train_clients, self.clients_per_round)
        check_privacy(config, self.setup, self.privacy)
        #: the mechanisms' randomness: the secure generator, or the seed's streams under reproducible_noise
        self.noise = self.privacy.noise_source(config.seed)
        #: every release the run made (the epsilon it reports composes these)
        self.ledger = PrivacyLedger()
        if self.privacy.mechanism == "central" and type(self.setup.method).private_server_gradient:
            self.setup.method.server_privacy = ServerGradientPrivacy(
                self.privacy, self.clients_per_round, self.noise, self.setup.method.server_steps_per_round())
        self.noise_check = NoiseCheck(self.privacy, self.setup.clients.init_weights, self.clients_per_round,
                                      config.train.rounds, self.setup.method.server_privacy is None,
                                      all_take_part=self.clients_per_round >= self.num_train_clients)
        self.participation = Participation(config, self.setup, self.privacy, self.noise, self.clients_per_round)
        self.arrivals = Arrivals(config, self.setup, self.participation.straggler_ids)
        self.traffic = Traffic(self.setup, self.privacy, self.clients_per_round)
        #: client speeds and availability: how long rounds take in simulated seconds (rounds.jsonl's sim_seconds)
        self.sim_clock = SimulatedClock(config.train.clock, fed.num_clients, config.train.local_steps, config.seed)
        check_asynchronous(config, self)
        #: FedBuff / FedAsync's in-flight work and buffer (None: synchronous rounds)
        # clients that answer in their own time (Flower nodes) arrive on the wall clock, others on the simulated one
        server = LiveAsyncServer if isinstance(self.executor, SubmittingExecutor) else AsyncServer
        self.async_server = (server(config, self.sim_clock, fed.train_client_ids, self.clients_per_round)
                             if config.train.server_mode != "sync" else None)
        self.stopped_at_time: int | None = None  # the round at which train.time_budget ended the run
        self.trackers = build_trackers(config, self.out_dir)  # a missing tracker package stops us here
        self.stopped_early: int | None = None  # the round an early stop ended the run at
        self.models_note = models_note(self)
        # each client's trivial predictor (majority class / mean target of its training rows) on its test rows
        self.trivial = trivial_scores(fed.train, fed.test, fed.task, fed.output_dim)
        # how many clients train at once on this machine (measured once per shape, cached): before round 1
        self.execution = self.setup.clients.plan_execution(self.clients_per_round)
        if threads_choice is not None:
            self.execution["threads"] = threads_choice
        #: what the run's elapsed time is read from (a pack gives each member its share of the time it spends)
        self.clock: Callable[[], float] = time.perf_counter
        self._segment_start = self.clock()

    @property
    def late_ids(self) -> torch.Tensor:
        return self.participation.late_ids

    @property
    def on_flower(self) -> bool:
        """Whether the clients run on Flower nodes (their state stays there, not in checkpoints)."""
        return self.executor.remote

    def sample_clients(self, round_index: int) -> torch.Tensor:
        return self.participation.choose(round_index)

    # ---- a round ------------------------------------------------------------------------------------------------
    def round_steps(self, round_index: int) -> Steps[dict[str, float | None]]:
        """One round's stages; returns its training statistics (None where a private run releases none)."""
        if self.async_server is not None:  # a round is one server step of FedBuff / FedAsync
            return (yield from self.async_server.round_steps(self))
        method, spec, tracker = self.setup.method, self.setup.spec, self.tracker
        central = self.privacy.mechanism == "central"
        client_ids = self.sample_clients(round_index)                                       # choose
        # the round lasts until its slowest client is done (under central DP the cohort, and so its duration, is
        # secret: the clock is not kept)
        tracker.sim_seconds = None if central else self.sim_clock.round_end(client_ids, tracker.sim_seconds or 0.0)
        sent, broadcast = self.send(client_ids, f"round {round_index + 1}")                # send
        result: TrainResult = (                                                             # train
            (yield Train(client_ids, sent, round_index, "local_training", broadcast=broadcast)) if len(client_ids)
            else TrainResult.nothing(spec.dim, sent.device))
        if self.privacy.mechanism == "local":  # the noised uploads are made: on disk before anything else
            self.ledger.count_uploads(result.client_ids)
            self._record_ledger(rounds=round_index + 1)
        names = self.setup.federation.client_names
        if self.config.train.dropout > 0:                                                  # what arrives
            result, lost = self.arrivals.lose(result, round_index)
            tracker.lose(round_index + 1, [names[i] for i in lost], "dropout")
        check_update(result.delta, result.client_ids, spec.dim, round_index, names, self.privacy.mechanism)
        # what the arrived clients were sent (every client arrived, the usual case: sent itself, not a copy of it)
        everyone = len(result.rows) == len(sent) and bool((result.rows == torch.arange(len(sent))).all())
        started = sent if everyone else sent[result.rows]
        if len(self.participation.straggler_ids):
            started, result, lost, late = self.arrivals.stragglers(started, result, round_index)
            tracker.lose(round_index + 1, [names[i] for i in lost], "straggler")
            tracker.late_uploads += late
        if len(result.client_ids) == 0 and not central:
            log.warning("round %d: no client update arrived; the server model is unchanged", round_index + 1)
            return {"train_loss": float("nan"), "clients": 0}
        if method.server_privacy is not None:                                               # server update
            method.server_privacy.begin_round(round_index)  # central DP inside the method's server step (DP-SGD)
            method.update(result.client_ids, started, result.delta, result.metrics)
        elif central:  # the method learns from the one release; an empty cohort releases the noise alone
            measured = self.noise_check.measure(result.delta)
            if measured is not None and self.out_dir is not None:  # raw updates: never the log or the summary
                runs.atomic_write_text(self.out_dir / runs.PRIVATE_DIAGNOSTICS,
                                       json.dumps({"noise_check": {"round": round_index + 1, **measured}}, indent=1)
                                       + "\n")
            released, next_clip = central_release(result, self.privacy, self.noise, tracker.clip_norm,
                                                  self.clients_per_round, round_index)
            tracker.clip_norm = next_clip if next_clip is not None else tracker.clip_norm
            method.central_update(released, self.clients_per_round)
        else:
            method.update(result.client_ids, started, result.delta, result.metrics)
        if central:
            self.ledger.central_releases += 1
            self._record_ledger(rounds=round_index + 1)
        tracker.bytes_up += self.traffic.up(result)
        if central:  # the cohort and its losses are private: neither is released
            return {"train_loss": None, "clients": None}
        if self.privacy.mechanism == "local":  # clients do not send their losses under local DP
            return {"train_loss": None, "clients": len(result.client_ids)}
        loss = float(result.metrics["loss_last"].mean())
        if not math.isfinite(loss):
            raise NonFiniteUpdateError(f"round {round_index + 1}: non-finite training loss")
        return {"train_loss": loss, "clients": len(result.client_ids)}

    def send(self, client_ids: torch.Tensor, when: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """What ``client_ids`` are sent (the method's weights for them and their rows of its broadcast arrays),
        checked finite and counted on the wire; ``when`` names the round or server step in an error."""
        method = self.setup.method
        sent = method.personalize(client_ids).detach()
        broadcast = {name: value.detach() for name, value in method.broadcast(client_ids).items()}
        if not all_finite(sent) or not all(all_finite(value) for value in broadcast.values()):
            advice = f"; under DP the noise is the likely cause: lower it with {NOISE_LEVERS}" * self.privacy.active
            raise NonFiniteUpdateError(f"{when}: the server produced non-finite weights{advice}")
        self.tracker.bytes_down += self.traffic.down(client_ids, broadcast)
        return sent, broadcast

    def run_round(self, round_index: int) -> dict[str, float | None]:
        return drive(self.round_steps(round_index), self.executor)

    def _record_ledger(self, rounds: int | None = None, novel_steps: int | None = None) -> None:
        """A private run's releases, in the run folder as soon as they are made (``rounds``: the training rounds,
        ``novel_steps``: the adaptation steps released so far): an interrupted run still counts them, and its resume
        starts after them."""
        self.ledger.rounds = self.ledger.rounds if rounds is None else rounds
        self.ledger.novel_steps = self.ledger.novel_steps if novel_steps is None else novel_steps
        if self.privacy.active and self.out_dir is not None:
            runs.atomic_write_text(self.out_dir / runs.PRIVACY_LEDGER, self.ledger.to_json())

    # ---- observing ----------------------------------------------------------------------------------------------
    def evaluation_steps(self, round_index: int) -> Steps[dict[str, Any]]:
        """Every client's personalised model on its val and test split (its client rule decides what that is)."""
        all_ids = torch.arange(self.setup.federation.num_clients, device="cpu")
        scores = yield Evaluate(all_ids, self.setup.method.eval_weights(all_ids), round_index)
        return evaluation_record(self, scores, round_index)

    def evaluate(self, round_index: int) -> dict[str, Any]:
        return drive(self.evaluation_steps(round_index), self.executor)

    def score_all(self, round_index: int) -> dict[str, ClientScores]:
        all_ids = torch.arange(self.setup.federation.num_clients, device="cpu")
        return self.executor.evaluate(all_ids, self.setup.method.eval_weights(all_ids), round_index)

    def novel_steps(self) -> Steps[tuple[float | None, float | None]]:
        """Embedding-only adaptation of novel clients (pFedHN Sec. 5.3) on a copy of the method state."""
        method, fed = self.setup.method, self.setup.federation
        novel_ids = fed.novel_client_ids
        rounds = self.config.train.novel_adapt_rounds
        if not len(novel_ids) or not rounds or not method.supports_novel_adaptation():
            return None, None
        if self.privacy.mechanism == "central":
            # the server adapts each novel client from that client's own raw update: no noised sum covers it
            log.info("novel-client adaptation is not run under privacy.mechanism=central: it reads each novel "
                     "client's raw update, outside the noised sum")
            return None, None
        saved = copy.deepcopy(method.state_dict())
        private = self.privacy.mechanism == "local"
        try:
            first = self._begin_novel_adaptation(novel_ids)
            for step in range(first, rounds):
                sent = method.personalize(novel_ids).detach()
                result = yield Train(novel_ids, sent, step, "novel")
                if private:  # noised where they are made, as training uploads are; on disk before anything else
                    self.ledger.count_uploads(result.client_ids)
                    self._record_ledger(novel_steps=step + 1)
                check_update(result.delta, result.client_ids, self.setup.spec.dim, step, fed.client_names,
                             self.privacy.mechanism)
                if len(result.client_ids):
                    method.adapt_novel(result.client_ids, sent[result.rows], result.delta)
                if private and self.out_dir is not None:  # a resume continues after this step, never repeats it
                    checkpoint.save_checkpoint(self.out_dir, checkpoint.novel_state_of(self, saved, step + 1))
            scores = yield Evaluate(novel_ids, method.eval_weights(novel_ids), rounds)
            return mean_std(scores["test"].metric)
        finally:
            method.load_state_dict(saved)

    def _begin_novel_adaptation(self, novel_ids: torch.Tensor) -> int:
        """Begin the adaptation, or continue the one a resumed checkpoint holds; the first step to run. Under DP it
        is after the last step whose uploads were made (the ledger's count, which may be past the checkpoint's: those
        steps' uploads were made and their effect lost, and they are not made again)."""
        method, progress = self.setup.method, self.novel_progress
        if progress is None:
            method.begin_novel_adaptation(novel_ids)
            first = 0
        else:
            method.load_state_dict(progress["method"])
            method.resume_novel_adaptation(novel_ids, progress["scratch"])
            first = int(progress["steps"])
        if self.ledger.novel_steps > first:
            log.warning("novel-client adaptation: the uploads of step(s) %d-%d were made before the interrupt and "
                        "their effect was lost; they are not made again (they count)", first + 1,
                        self.ledger.novel_steps)
            first = self.ledger.novel_steps
        if progress is not None or first:
            log.info("novel-client adaptation resumed after step %d of %d", first,
                     self.config.train.novel_adapt_rounds)
        return first

    def evaluate_novel_adapted(self) -> tuple[float | None, float | None]:
        return drive(self.novel_steps(), self.executor)

    def save_graphs(self, completed_rounds: int) -> torch.Tensor | None:
        """Collaboration graphs are a result: saved at every evaluation (methods that have them); returned for the
        trackers."""
        if self.out_dir is None:
            return None
        rows = self.graph_rows()
        graphs = self.setup.method.collaboration_graph(rows)
        if graphs is None:
            return None
        names = list(self.setup.spec.layers) if graphs.ndim == 3 else ["client graph"]
        fed = self.setup.federation
        runs.save_graphs(self.out_dir, completed_rounds, graphs, names, rows, fed.client_names, fed.novel_mask)
        return graphs

    def graph_rows(self) -> torch.Tensor | None:
        """Whose rows of the collaboration graph are saved: every client's up to ``GRAPH_ROWS`` clients; above,
        a fixed seeded sample of ``GRAPH_ROWS`` clients (a 10,000-client ``[L, N, N]`` graph would be gigabytes
        per evaluation, and computing every row costs N x N)."""
        num_clients = self.setup.federation.num_clients
        if num_clients <= GRAPH_ROWS:
            return None
        order = torch.randperm(num_clients, generator=rng.generator(self.config.seed, 0, "graph_rows"), device="cpu")
        return order[:GRAPH_ROWS].sort().values

    def account_time(self) -> None:
        """Add the time since the last call to the run's elapsed time (checkpointed with it)."""
        now = self.clock()
        self.tracker.elapsed += now - self._segment_start
        self._segment_start = now

    # ---- the loop -----------------------------------------------------------------------------------------------
    def run(self, resume: bool = False) -> RunResult:
        """Run the rounds (from the checkpoint with ``resume``), write the run directory, return the result."""
        with deterministic_algorithms(self.config.train.deterministic):
            return drive(self.run_steps(resume), self.executor)

    def run_steps(self, resume: bool = False) -> Steps[RunResult]:
        """The whole run, as the one writer of its folder (``runs.run_writer``: a second process is refused);
        its fate goes to the folder's status file."""
        if self.out_dir is None:
            return (yield from self._run_steps(resume, None))
        with runs.run_writer(self.out_dir) as claim:
            result = yield from self._run_steps(resume, claim)
            runs.write_status(self.out_dir, "completed" if result.completed else "stopped",
                              **({} if result.completed else {"reason": result.status}), rounds=result.rounds,
                              best_round=result.best_round, metric=result.metric, test_mean=result.test_mean,
                              scored_clients=result.scored_clients, training_clients=result.training_clients)
            return result

    def _run_steps(self, resume: bool, claim: runs.RunClaim | None) -> Steps[RunResult]:
        """The rounds, evaluations and callbacks; returns the result it wrote."""
        cfg = self.config
        start_round, history, callbacks = self._begin(resume, claim)
        status = "completed"
        progress = next(callback for callback in callbacks if isinstance(callback, Progress))
        try:
            for round_index in range(start_round, cfg.train.rounds):
                round_stats = yield from self.round_steps(round_index)
                completed = round_index + 1
                budget, now = cfg.train.time_budget, self.tracker.sim_seconds
                out_of_time = budget is not None and now is not None and now >= budget
                if completed % cfg.train.eval_every == 0 or completed == cfg.train.rounds or out_of_time:
                    record = yield from self.evaluation_steps(round_index)
                    self._observe(record, round_stats, history, callbacks)
                patience = cfg.train.patience
                stopping = patience is not None and self.tracker.since_improvement >= patience
                for callback in callbacks:
                    callback.round_done(completed, stopping or out_of_time)
                if out_of_time:
                    self.stopped_at_time = completed
                    log.info("train.time_budget: the simulated clock reached %.0f s (budget %g s) at round %d",
                             now, budget, completed)
                    break
                if stopping:
                    self.stopped_early = completed
                    log.info("early stop after round %d: %d evaluations without a validation gain above %g "
                             "(best: round %s)", completed, patience, cfg.train.min_delta,
                             self.tracker.best.get("round"))
                    break
        except RunStoppedError as err:  # non-finite or wrong-shaped updates, a solver short of its tolerance
            status = f"stopped: {err}"
            log.error("%s; last good checkpoint kept in %s", err, self.out_dir or "(no output directory)")
        finally:
            progress.close()  # an interrupt too: the terminal gets its line back
        self.account_time()
        novel_adapted = (yield from self.novel_steps()) if status == "completed" else (None, None)
        result = build_result(self, history, status, novel_adapted)
        for flag in result.flags:
            log.warning(flag)
        for callback in callbacks:
            callback.end(result)
        if self.out_dir:
            runs.write_result(self.out_dir, result)
            from graphfed.report.plots import plot_curves

            title = f"{self.setup.method.name} on {self.setup.federation.name}"
            plot_curves(history, self.out_dir / "plots" / "curves.png", self.setup.federation.metric, title=title)
            if runs_on_a_clock(cfg) and self.tracker.sim_seconds is not None:
                plot_curves(history, self.out_dir / "plots" / "curves_time.png", self.setup.federation.metric,
                            title=title, x="sim_seconds")
        return result

    def _observe(self, record: dict[str, Any], round_stats: dict[str, float | None], history: list[dict[str, Any]],
                 callbacks: list[RunCallback]) -> None:
        """An evaluation's record: selected (or not) as the run's result, kept, handed to the callbacks."""
        self.account_time()
        record.update(round_stats, bytes_up=self.tracker.bytes_up, bytes_down=self.tracker.bytes_down,
                      wall_seconds=self.tracker.elapsed, sim_seconds=self.tracker.sim_seconds)
        if self.config.train.dropout > 0 or len(self.participation.straggler_ids):
            # whose uploads were lost since the previous evaluation, by round (as a Flower run names its drops)
            since = history[-1]["round"] if history else 0
            record["dropped_clients"] = [{"round": r, "client": c, "reason": why} for r, c, why in
                                         self.tracker.dropped if r > since]
        if record[self.tracker.key] is None:
            log.warning("round %d: no client's evaluation arrived; round not used for model selection",
                        record["round"])
        else:
            self.tracker.offer(record, self.config.train.min_delta)
        history.append(record)
        graphs = self.save_graphs(record["round"])
        for callback in callbacks:
            callback.evaluated(record, graphs)

    def _begin(self, resume: bool, claim: runs.RunClaim | None) -> tuple[int, list[dict[str, Any]], list[RunCallback]]:
        """Prepare the run folder (or resume from its checkpoint), say what the run is, build its callbacks. Every
        refusal (``checkpoint.resume``) comes before ``claim`` starts the run and before any file of
        the folder changes."""
        cfg, fed, method = self.config, self.setup.federation, self.setup.method
        rounds_log = runs.RoundLog(self.out_dir) if self.out_dir else None
        start_round = checkpointed = 0
        if resume and self.out_dir:
            # onto this run's device, whichever device wrote it (GPU -> CPU and back)
            start_round = checkpointed = checkpoint.resume(self, self.out_dir)
            start_round = self._after_the_last_release(checkpointed)
        if claim is not None:
            claim.start()
        if self.out_dir and rounds_log:
            for stale in runs.remove_stale_temporaries(self.out_dir):
                log.info("removed %s, left by an interrupted write", stale)
            if resume:  # evaluations after the checkpoint scored a state the resume does not have
                rounds_log.truncate_after(checkpointed)
                log.info("resuming %s from round %d", self.out_dir, start_round)
            else:
                rounds_log.reset()
            runs.atomic_write_text(self.out_dir / runs.CONFIG, dump_config(cfg))
        announce(self)
        history: list[dict[str, Any]] = rounds_log.read() if rounds_log else []
        best_models = BestModels(self, self.models_note)
        callbacks: list[RunCallback] = [
            *([RoundLogWriter(rounds_log)] if rounds_log else []), Trackers(self.trackers, cfg), best_models,
            Progress(self.progress, start_round, cfg.train.rounds, f"{method.name} on {fed.name}", fed.metric),
            *([Checkpointer(self, self.out_dir, self.checkpoint_every, best_models)] if self.out_dir else [])]
        for callback in callbacks:
            callback.begin(history)
        self._segment_start = self.clock()
        return start_round, history, callbacks

    def _after_the_last_release(self, checkpointed: int) -> int:
        """The round a resume starts from: after the checkpoint's, or under DP after the last round whose releases
        the ledger counts, when the interrupted process made releases after its last checkpoint (their effect is
        lost with it; running them again would release them twice, beyond what the noise was sized for)."""
        released = self.ledger.rounds
        if not self.privacy.active or released <= checkpointed:
            return checkpointed
        log.warning("round(s) %d-%d released their updates before the interrupt but after the last checkpoint: they "
                    "are not run again (their releases count); training goes on from round %d with the model of "
                    "round %d", checkpointed + 1, released, released + 1, checkpointed)
        return released


def run_config(config: RunConfig, out_dir: str | Path | None = None, resume: bool = False,
               progress: bool = True, federation: Federation | None = None) -> RunResult:
    """Library entry point: build and run one config, return its result (what ``summary.json`` holds)."""
    return Simulator(config, out_dir, federation=federation, progress=progress).run(resume=resume)
