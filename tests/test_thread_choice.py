"""How a CPU runs a BatchNorm network's clients when the config leaves ``torch_threads`` unset
(graphfed.client.thread_choice): measured, cached, recorded in the run's config, and reproduced by it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import without_wall_time
from golden_runs import config_of
from graphfed.client import autotune, thread_choice
from graphfed.client.contract import LocalTraining, plain_sgd
from graphfed.config import RunConfig, validate_config
from graphfed.core.params import ParamSpec
from graphfed.models import build_model
from graphfed.setup import resolve_torch_threads
from graphfed.sim.engine import Simulator

SHAPE = (3, 16, 16)
ROUND = thread_choice.RoundShape(client_steps=40, scored_rows=256)


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """torch on two intra-op threads (a user's default on 2 cores), an empty cache, two side-by-side workers."""
    before = torch.get_num_threads()
    monkeypatch.setenv("GRAPHFED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GRAPHFED_CLIENT_WORKERS", "2")
    monkeypatch.setattr(autotune, "machine_load", lambda: 0.0)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def planted_timings(faster: int | None, calls: list[tuple[int, ...]], scoring: float = 0.0) -> Any:
    """A stand-in for the measurement: ``faster`` threads train in half the time of the other count (None: both the
    same), and a round scores for ``scoring`` seconds at either count."""
    def measure(model: Any, spec: Any, data: Any, rule: Any, counts: tuple[int, ...],
                shape: Any) -> dict[int, list[tuple[float, float]]]:
        calls.append(counts)
        return {n: [(0.01 if n == faster or faster is None else 0.02, scoring)] * 5 for n in counts}
    return measure


def network() -> tuple[Any, ParamSpec, Any]:
    torch.manual_seed(0)
    stub = type("Shape", (), {"name": "x", "task": "classification", "input_shape": SHAPE, "output_dim": 4})
    model = build_model("cnn-bn", stub, {})  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    return model, spec, plain_sgd(spec, "classification", LocalTraining(2, 8, 0.05))


def bn_config(**changes: Any) -> RunConfig:
    """The golden FedBN run (CNN-BN on four MNIST clients) with its threads unset and the autotune on."""
    config = validate_config(config_of("fedbn"))
    return config.model_copy(update={"torch_threads": None,
                                     "train": config.train.model_copy(update={"autotune": True, **changes})})


def test_side_by_side_is_chosen_when_it_measures_faster_and_the_choice_is_cached(
        two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    monkeypatch.setattr(thread_choice, "_measure", planted_timings(1, calls))
    model, spec, rule = network()
    first = thread_choice.choose_torch_threads(model, spec, rule, SHAPE, 4, ROUND)
    again = thread_choice.choose_torch_threads(model, spec, rule, SHAPE, 4, ROUND)
    assert (first.torch_threads, first.source, first.clients_side_by_side) == (1, "measured", 2)
    assert (again.torch_threads, again.source) == (1, "cached")
    assert calls == [(2, 1)]  # the default threads against one thread each, measured once
    assert torch.get_num_threads() == 2


def test_a_round_of_another_shape_is_measured_anew_not_given_the_first_shapes_choice(
        two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice depends on how a round splits between training and scoring: a config whose rounds are mostly
    scoring is measured on its own, never handed the cached choice of a training-heavy config on the same network;
    each shape's choice is then cached under its own key."""
    calls: list[tuple[int, ...]] = []
    monkeypatch.setattr(thread_choice, "_measure", planted_timings(None, calls, scoring=0.05))
    model, spec, rule = network()
    training_heavy = thread_choice.choose_torch_threads(model, spec, rule, SHAPE, 4, ROUND)
    scoring_heavy = thread_choice.choose_torch_threads(model, spec, rule, SHAPE, 4,
                                                       thread_choice.RoundShape(client_steps=4, scored_rows=9000))
    assert (training_heavy.source, scoring_heavy.source) == ("measured", "measured") and calls == [(2, 1), (2, 1)]
    again = thread_choice.choose_torch_threads(model, spec, rule, SHAPE, 4, ROUND)
    assert again.source == "cached" and len(calls) == 2


def test_the_default_threads_are_kept_when_side_by_side_is_not_faster(two_threads: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(thread_choice, "_measure", planted_timings(2, []))
    model, spec, rule = network()
    assert thread_choice.choose_torch_threads(model, spec, rule, SHAPE, 4, ROUND).torch_threads == 2


@pytest.mark.parametrize(("scoring", "chosen"), [(0.0, 1), (0.05, 2)])
def test_within_noise_the_count_that_wins_the_rounds_larger_phase_is_kept(
        two_threads: None, monkeypatch: pytest.MonkeyPatch, scoring: float, chosen: int) -> None:
    """Equal timings: a round of local training keeps clients side by side, a round mostly scoring the default
    threads (each wins its phase on whole rounds: benchmarks/cpu_grid.py --realistic)."""
    monkeypatch.setattr(thread_choice, "_measure", planted_timings(None, [], scoring))
    model, spec, rule = network()
    choice = thread_choice.choose_torch_threads(model, spec, rule, SHAPE, 4, ROUND)
    assert choice.torch_threads == chosen and choice.certainty["prior"] == chosen


def test_a_measurement_under_load_is_used_once_and_not_cached(two_threads: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    monkeypatch.setattr(thread_choice, "_measure", planted_timings(1, calls))
    monkeypatch.setattr(autotune, "machine_load", lambda: 3.0)
    model, spec, rule = network()
    first = thread_choice.choose_torch_threads(model, spec, rule, SHAPE, 4, ROUND)
    second = thread_choice.choose_torch_threads(model, spec, rule, SHAPE, 4, ROUND)
    assert first.certainty["suspect"] and (first.source, second.source) == ("measured", "measured")
    assert len(calls) == 2


def test_the_real_measurement_weighs_training_and_scoring_and_restores_the_threads(
        two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    model, spec, rule = network()
    data = thread_choice.synthetic_clients(SHAPE, 4, 16, 4)
    timings = thread_choice._measure(model, spec, data, rule, (2, 1), ROUND)
    assert sorted(timings) == [1, 2] and all(len(rounds) == 5 and min(min(phases) for phases in rounds) > 0
                                             for rounds in timings.values())
    assert torch.get_num_threads() == 2 and model.clients_per_chunk == network()[0].clients_per_chunk
    # planted: training takes 20 ms a call (8 client-steps), scoring 10 ms (64 rows); a round projects each phase
    # by its own weight
    monkeypatch.setattr(thread_choice, "train_clients", lambda *args, **kwargs: time.sleep(0.02))
    monkeypatch.setattr(thread_choice, "evaluate_clients", lambda *args, **kwargs: time.sleep(0.01))
    training, scoring = zip(*thread_choice._measure(model, spec, data, rule, (2,),
                                                     thread_choice.RoundShape(80, 640))[2], strict=True)
    assert min(training) >= 0.2 and max(training) < 0.4
    assert min(scoring) >= 0.1 and max(scoring) < 0.2


def test_only_an_unset_count_of_a_network_that_loops_its_clients_is_measured(two_threads: None,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    monkeypatch.setattr(thread_choice, "_measure", planted_timings(1, calls))
    pinned = bn_config().model_copy(update={"torch_threads": 2})
    assert resolve_torch_threads(pinned) == (pinned, None)
    batched = bn_config().model_copy(update={"model": bn_config().model.model_copy(update={"name": "lenet"})})
    assert resolve_torch_threads(batched)[0].torch_threads == 2  # LeNet batches its clients: nothing to choose
    off = bn_config(autotune=False)
    assert resolve_torch_threads(off)[0].torch_threads == 2
    assert calls == []
    chosen, record = resolve_torch_threads(bn_config())
    assert chosen.torch_threads == 1 and record is not None and record["torch_threads"] == 1 and calls == [(2, 1)]


def test_a_run_records_its_choice_and_its_config_reproduces_its_numbers(two_threads: None, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(thread_choice, "_measure", planted_timings(1, []))
    chosen = Simulator(bn_config(), tmp_path / "chosen", progress=False)
    result = chosen.run()
    assert chosen.config.torch_threads == 1
    summary = json.loads((tmp_path / "chosen" / "summary.json").read_text())
    assert summary["execution"]["threads"]["torch_threads"] == 1
    assert "torch_threads: 1" in (tmp_path / "chosen" / "config.yaml").read_text()
    pinned = Simulator(bn_config().model_copy(update={"torch_threads": 1}), None, progress=False).run()
    assert without_wall_time(result) == without_wall_time(pinned)


def test_a_run_that_chose_one_thread_leaves_the_next_run_the_processs_own_count(
        two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One process, two runs (as `compare` makes them): the BatchNorm run measures and takes one thread; the next
    run, of an MLP with its threads unset, starts from the process's two threads again, not from the run before."""
    monkeypatch.setattr(thread_choice, "_measure", planted_timings(1, []))
    assert Simulator(bn_config(), None, progress=False).config.torch_threads == 1
    assert torch.get_num_threads() == 1  # the BatchNorm run's clients train on one thread each
    mlp = validate_config(config_of("fedavg")).model_copy(update={"torch_threads": None})
    assert Simulator(mlp, None, progress=False).config.torch_threads == 2
    assert torch.get_num_threads() == 2
