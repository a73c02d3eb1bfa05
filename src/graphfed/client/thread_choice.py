"""How a CPU runs the clients of a network that trains them one by one: one client at a time on every intra-op
thread, or one intra-op thread each and clients side by side (:mod:`graphfed.client.side_by_side`). Measured on
this machine at a run's start and cached, like the chunk size (:mod:`graphfed.client.autotune`).

Small convolutions split poorly over threads: on 2 cores a BatchNorm CNN's clients trained one per core ran
1.06-1.50x a PFLlib-style loop, and one client on both cores 0.92-1.03x (``benchmarks/cpu_grid.py --realistic``).
Scoring is the other way round: a client's whole split is one large batch that splits well over threads (a 20-client
CIFAR-10 test split: 6.9 s side by side, 4.9 s on 2 threads). Which wins depends on the network, the batch, the
machine and how much of a round is scoring, so a run whose config leaves ``torch_threads`` unset times both counts on
the run's own network, rule and batch size, on synthetic rows of the dataset's shape (the data are not read yet):
a few local steps of a few clients, and a scoring of :data:`SCORED_ROWS` rows each. The round it projects weighs
the two as the config does (clients per round x local steps; every client's validation and test rows every
``eval_every`` rounds, taken as :data:`SCORED_ROWS` each). A few steps separate the two only by a few % here,
within the timings' spread, while whole rounds separate them clearly, so the choice starts from the count that wins
the phase the round spends most of its time in (side by side for local training, the default threads for scoring)
and takes the other only where it beats that beyond the spread (:func:`graphfed.client.autotune.decide`).

The thread count changes how float sums split, so the choice is part of the run: its ``config.yaml`` records the
``torch_threads`` it ran with (and reproduces it bit for bit), ``summary.json`` records the timings
(``execution.threads``), and the cache keeps a machine's choice so the same config gives the same numbers run after
run (a measurement under load is used once and not cached, as the chunk size's)."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from graphfed.client.autotune import (
    CACHE_NAME,
    CALIBRATION_ROUNDS,
    _read_cache,
    _threads_entry,
    decide,
    judged,
    remember,
    timing_key,
)
from graphfed.client.contract import ClientRule
from graphfed.client.evaluation import evaluate_clients
from graphfed.client.side_by_side import on_one_thread, side_by_side_workers
from graphfed.client.training import train_clients
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.models.base import TargetModel
from graphfed.paths import user_cache_dir

log = logging.getLogger(__name__)

#: local steps each timing trains per client (the rule's own count if fewer)
CHOICE_STEPS = 2
#: rows a client's validation or test split is taken to hold (the data are not read when the choice is made)
SCORED_ROWS = 128


@dataclass(frozen=True)
class RoundShape:
    """How much of a round is local training and how much scoring, from the config."""

    client_steps: int  #: clients per round x local steps
    scored_rows: float  #: rows scored per round: every client's validation and test rows, every eval_every rounds



@dataclass(frozen=True)
class ThreadsChoice:
    """The intra-op threads a run uses on a CPU, and why."""

    torch_threads: int
    source: str  #: "measured" or "cached"
    seconds_per_round: dict[int, float]  #: a projected round's median seconds at each thread count tried
    clients_side_by_side: int  #: clients that run at once on one thread each
    certainty: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {"torch_threads": self.torch_threads, "source": self.source,
                "seconds_per_round": {str(threads): s for threads, s in self.seconds_per_round.items()},
                "clients_side_by_side": self.clients_side_by_side,
                **({"certainty": self.certainty} if self.certainty else {})}


def synthetic_clients(input_shape: tuple[int, ...], clients: int, rows: int, classes: int) -> ClientSplit:
    """``clients`` clients of ``rows`` random rows of ``input_shape`` (seeded: timing only)."""
    generator = torch.Generator().manual_seed(0)
    xs = [torch.randn(rows, *input_shape, generator=generator) for _ in range(clients)]
    ys = [torch.randint(0, classes, (rows,), generator=generator) for _ in range(clients)]
    return ClientSplit.from_lists(xs, ys, "classification")


def choose_torch_threads(model: TargetModel, spec: ParamSpec, rule: ClientRule, input_shape: tuple[int, ...],
                         classes: int, shape: RoundShape, cache_file: Path | None = None) -> ThreadsChoice:
    """The thread count for a classification run of ``model`` on ``input_shape`` rows under ``rule`` (built with
    at most :data:`CHOICE_STEPS` local steps) with rounds of ``shape`` on this CPU, at today's threads
    (``torch.get_num_threads()``, which it leaves as it found it): those threads, or 1 with clients side by side
    where a round projects faster beyond noise. The caller asks only for a network that loops its clients on a
    CPU."""
    threads = torch.get_num_threads()
    workers = on_one_thread(lambda: side_by_side_workers(torch.device("cpu")))
    cache_file = user_cache_dir() / CACHE_NAME if cache_file is None else cache_file
    data = synthetic_clients(input_shape, 2 * workers, SCORED_ROWS, classes)
    key = (f"{timing_key(model, spec, data, rule)}|steps={rule.total_steps}|threads or side by side: "
           f"{workers} workers, rounds of {shape.client_steps} client steps and {shape.scored_rows:g} scored rows")
    cached = _read_cache(cache_file, _threads_entry).get(key)
    if cached is not None:
        return ThreadsChoice(cached["torch_threads"], "cached",
                             {int(n): seconds for n, seconds in cached["seconds_per_round"].items()}, workers,
                             dict(cached.get("certainty", {})))
    phases: dict[int, list[tuple[float, float]]] = {}

    def timed() -> dict[int, list[float]]:
        phases.update(_measure(model, spec, data, rule, (threads, 1), shape))
        return {n: [training + scoring for training, scoring in rounds] for n, rounds in phases.items()}

    def choose(timings: dict[int, list[float]]) -> tuple[int, dict[str, Any]]:
        training_share = statistics.median(training / (training + scoring) for training, scoring in phases[threads])
        prior = 1 if training_share >= 0.5 else threads  # the count that wins the round's larger phase
        best, certainty = decide(timings, prior, on_cpu=True, kept="the larger phase's count")
        return best, {**certainty, "training_share": round(training_share, 3), "prior": prior}

    outcome = judged(timed, choose)
    log.info("%s: %s (a round's median: %s)", type(model).__name__,
             f"{workers} clients side by side on one thread each" if outcome.best == 1 else f"{threads} threads",
             ", ".join(f"{n} threads {seconds:.2f} s" for n, seconds in outcome.medians.items()))
    remember(cache_file, key, outcome, {"torch_threads": outcome.best, "seconds_per_round": {
        str(n): seconds for n, seconds in outcome.medians.items()}})
    return ThreadsChoice(outcome.best, "measured", outcome.medians, workers, outcome.certainty)


def _measure(model: TargetModel, spec: ParamSpec, data: ClientSplit, rule: ClientRule,
             thread_counts: tuple[int, ...], shape: RoundShape) -> dict[int, list[tuple[float, float]]]:
    """A round's projected seconds of local training and of scoring at each thread count: the rule's steps of
    ``data``'s clients and a scoring of their rows timed apart, weighed by ``shape``; a warm-up each, then
    :data:`CALIBRATION_ROUNDS` interleaved rounds. torch's RNG and threads are restored."""
    start = spec.flatten_module(model).detach().unsqueeze(0).repeat(data.num_clients, 1)
    seeds = list(range(data.num_clients))
    client_steps, rows = data.num_clients * rule.total_steps, int(data.counts.sum())
    declared, model.clients_per_chunk = model.clients_per_chunk, 1  # as plan_execution sets it for such networks

    def train() -> None:
        train_clients(model, spec, start, data, rule, seeds)

    def score() -> None:
        evaluate_clients(model, spec, start, data, "classification", precision=rule.setting.training.precision)

    def seconds(work: Callable[[], None], threads: int) -> float:
        began = time.perf_counter()
        on_one_thread(work) if threads == 1 else work()
        return time.perf_counter() - began

    def projected(threads: int) -> tuple[float, float]:
        return (shape.client_steps * seconds(train, threads) / client_steps,
                shape.scored_rows * seconds(score, threads) / rows)

    timings: dict[int, list[tuple[float, float]]] = {n: [] for n in thread_counts}
    with torch.random.fork_rng(devices=[]):
        try:
            for n in thread_counts:
                projected(n)  # warm-up: allocator, kernel selection, the worker pool
            for _ in range(CALIBRATION_ROUNDS):
                for n in thread_counts:
                    timings[n].append(projected(n))
        finally:
            model.clients_per_chunk = declared
    return timings

