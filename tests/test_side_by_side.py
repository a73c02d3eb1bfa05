"""Clients side by side (graphfed.client.side_by_side): on one intra-op thread, clients of a network that runs its
clients one by one train and score on worker threads and give the bits of one client after another; with more
intra-op threads nothing leaves the calling thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from graphfed.client import evaluation, side_by_side, training
from graphfed.client.contract import LocalTraining, plain_sgd
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.errors import ConfigError
from graphfed.models import build_model
from graphfed.models.base import TargetModel


@pytest.fixture
def threads() -> Iterator[None]:
    """Restores torch's intra-op thread count after a test that sets it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _clients(model_name: str) -> tuple[TargetModel, ParamSpec, ClientSplit, torch.Tensor]:
    torch.manual_seed(0)
    shape = SimpleNamespace(name="x", task="classification", input_shape=(3, 32, 32), output_dim=4)
    model = build_model(model_name, shape, {"width": 4} if model_name == "resnet-like" else {})  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    generator = torch.Generator().manual_seed(2)
    xs = [torch.randn(rows, 3, 32, 32, generator=generator) for rows in (23, 9, 40, 30, 12)]
    ys = [torch.randint(0, 4, (len(x),), generator=generator) for x in xs]
    start = spec.flatten_module(model).unsqueeze(0).repeat(5, 1) + 0.01 * torch.randn(5, spec.dim, generator=generator)
    model.clients_per_chunk = 1
    return model, spec, ClientSplit.from_lists(xs, ys, "classification"), start


def _recording_threads(monkeypatch: pytest.MonkeyPatch, module: object, name: str,
                       intra_op: list[int] | None = None) -> list[str]:
    """Names of the threads ``module.name`` runs on, from now on (and into ``intra_op``, torch's intra-op thread
    count on each)."""
    ran_on: list[str] = []
    original = getattr(module, name)

    def recording(*args: object, **kwargs: object) -> object:
        ran_on.append(threading.current_thread().name)
        if intra_op is not None:
            intra_op.append(torch.get_num_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return ran_on


@pytest.mark.kernel_paths
@pytest.mark.parametrize("model_name", ["cnn-bn", "resnet-like"])
def test_clients_trained_side_by_side_get_one_after_anothers_bits(
        model_name: str, monkeypatch: pytest.MonkeyPatch, threads: None) -> None:
    model, spec, data, start = _clients(model_name)
    rule = plain_sgd(spec, "classification", LocalTraining(steps=3, batch_size=16, lr=0.1))
    seeds = [3, 4, 5, 6, 7]
    intra_op: list[int] = []
    ran_on = _recording_threads(monkeypatch, training, "train_one_module", intra_op)
    torch.set_num_threads(1)
    monkeypatch.setenv(side_by_side.WORKERS_VARIABLE, "1")
    alone = training.train_clients(model, spec, start, data, rule, seeds)
    assert ran_on == [threading.current_thread().name] * 5
    ran_on.clear()
    monkeypatch.setenv(side_by_side.WORKERS_VARIABLE, "3")
    together = training.train_clients(model, spec, start, data, rule, seeds)
    assert len(ran_on) == 5 and all(name.startswith("graphfed-client") for name in ran_on)
    assert torch.equal(alone.trained, together.trained)
    for key in ("loss_first", "loss_last", "num_examples"):
        assert torch.equal(alone.metrics[key], together.metrics[key]), key
    assert not torch.equal(alone.trained, start)
    # what makes the comparison above a comparison of the same kernels: every client, on the calling thread or a
    # worker, ran on one intra-op thread (a convolution sums in a thread-count-dependent order)
    assert intra_op == [1] * 10


def test_more_intra_op_threads_keep_every_client_on_the_calling_thread(
        monkeypatch: pytest.MonkeyPatch, threads: None) -> None:
    model, spec, data, start = _clients("cnn-bn")
    rule = plain_sgd(spec, "classification", LocalTraining(steps=2, batch_size=8, lr=0.1))
    ran_on = _recording_threads(monkeypatch, training, "train_one_module")
    monkeypatch.setenv(side_by_side.WORKERS_VARIABLE, "3")
    torch.set_num_threads(2)
    assert side_by_side.side_by_side_workers(torch.device("cpu")) == 1
    torch.set_num_threads(1)
    assert side_by_side.side_by_side_workers(torch.device("cpu")) == 3
    assert side_by_side.side_by_side_workers(torch.device("cuda")) == 1  # an accelerator's queue is no core
    torch.set_num_threads(2)
    training.train_clients(model, spec, start, data, rule, [1, 2, 3, 4, 5])
    assert ran_on == [threading.current_thread().name] * 5


@pytest.mark.kernel_paths
@pytest.mark.parametrize("model_name", ["cnn-bn", "resnet-like"])
def test_clients_scored_side_by_side_get_one_after_anothers_bits(
        model_name: str, monkeypatch: pytest.MonkeyPatch, threads: None) -> None:
    model, spec, data, weights = _clients(model_name)
    own_weights = spec.flatten_module(model).clone()
    torch.set_num_threads(1)
    ran_on = _recording_threads(monkeypatch, evaluation, "_block_outputs")
    monkeypatch.setenv(side_by_side.WORKERS_VARIABLE, "1")
    alone = evaluation.evaluate_clients(model, spec, weights, data, "classification")
    assert ran_on == [threading.current_thread().name] * 5
    ran_on.clear()
    monkeypatch.setenv(side_by_side.WORKERS_VARIABLE, "3")
    together = evaluation.evaluate_clients(model, spec, weights, data, "classification")
    assert len(ran_on) == 5 and all(name.startswith("graphfed-client") for name in ran_on)
    assert torch.equal(alone.loss, together.loss) and torch.equal(alone.metric_sum, together.metric_sum)
    assert len(set(alone.loss.tolist())) == 5  # five clients, five different scores: none mixed up with another
    assert torch.equal(spec.flatten_module(model), own_weights)  # the workers scored on copies of the model


def test_results_come_back_in_the_items_order_however_long_each_takes() -> None:
    import time

    def slow_for_early_items(item: int) -> int:
        time.sleep(0.02 * (5 - item))
        return item * item

    assert list(side_by_side.map_side_by_side(slow_for_early_items, range(6), 3)) == [0, 1, 4, 9, 16, 25]


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_wrong_worker_count_in_the_environment_is_named(value: str, monkeypatch: pytest.MonkeyPatch,
                                                          threads: None) -> None:
    monkeypatch.setenv(side_by_side.WORKERS_VARIABLE, value)
    torch.set_num_threads(1)
    with pytest.raises(ConfigError, match=f"GRAPHFED_CLIENT_WORKERS={value!r}: give a whole number"):
        side_by_side.side_by_side_workers(torch.device("cpu"))


def test_bench_gives_each_of_its_jobs_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cells run by ``graphfed bench --jobs N`` are N processes: each runs its clients side by side on its share of
    the cores, not on all of them (N x cores workers would fight over the cores); a count the user pinned stays."""
    from graphfed import bench

    monkeypatch.delenv(side_by_side.WORKERS_VARIABLE, raising=False)
    monkeypatch.setattr(bench, "usable_cores", lambda: 8)
    assert bench._cell_environment(None, 1) == {}
    assert bench._cell_environment(None, 2) == {side_by_side.WORKERS_VARIABLE: "4"}
    assert bench._cell_environment(None, 16) == {side_by_side.WORKERS_VARIABLE: "1"}
    monkeypatch.setenv(side_by_side.WORKERS_VARIABLE, "3")
    assert bench._cell_environment(None, 2) == {}


def test_a_run_with_clients_side_by_side_gives_every_number_of_the_run_one_after_another(
        monkeypatch: pytest.MonkeyPatch, threads: None) -> None:
    """A FedAvg CNN-BN run at ``torch_threads: 1`` with two workers and with one: the same summary, field for field,
    and the record of how it ran says which."""
    from graphfed.config import validate_config
    from graphfed.sim.engine import run_config

    config = validate_config({
        "seed": 1, "torch_threads": 1, "method": {"name": "fedavg"},
        "dataset": {"name": "mnist", "num_clients": 4, "client_fraction": 0.01, "novel_fraction": 0.0},
        "model": {"name": "cnn-bn", "options": {"channels": 4, "hidden": 16}},
        "train": {"rounds": 2, "clients_per_round": 4, "local_steps": 3, "batch_size": 8, "lr": 0.05,
                  "eval_every": 1}})
    summaries = {}
    ran_on = _recording_threads(monkeypatch, training, "train_one_module")
    for workers in ("1", "2"):
        monkeypatch.setenv(side_by_side.WORKERS_VARIABLE, workers)
        summaries[workers] = run_config(config, None, progress=False).model_dump()
        assert len(ran_on) == 8  # 4 clients x 2 rounds, each trained as a module
        assert all(name.startswith("graphfed-client") == (workers == "2") for name in ran_on), ran_on
        ran_on.clear()
    assert summaries["1"]["execution"]["cnn-bn"]["clients_side_by_side"] == 1
    assert summaries["2"]["execution"]["cnn-bn"]["clients_side_by_side"] == 2
    assert summaries["1"]["execution"]["cnn-bn"]["clients_per_chunk"] == 1
    how_it_ran = {"wall_seconds", "peak_rss_mb", "execution", "code", "cell_seconds"}
    for field, value in summaries["1"].items():
        if field not in how_it_ran:
            assert summaries["2"][field] == value, field
    assert summaries["1"]["test_mean"] is not None
