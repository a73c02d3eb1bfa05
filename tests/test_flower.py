"""The Flower engine driven by an in-process Grid: same numbers as the simulator, robust to bad nodes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conftest import (
    TINY_METHOD_DATA,
    TINY_METHOD_OPTIONS,
    on_kernel_paths,
    single_architecture_methods,
    without_wall_time,
)
from graphfed.config import RunConfig, dump_config, load_config
from graphfed.flower import protocol
from graphfed.flower.app import client_app, run_on_grid
from graphfed.flower.inprocess import InProcessGrid
from graphfed.flower.server import FLOWER_FIELDS
from graphfed.runs import RunResult
from graphfed.sim.engine import run_config

NUM_CLIENTS = 6
FLOWER_BASE = [
    "dataset.name=fln", f"dataset.num_clients={NUM_CLIENTS}", "dataset.novel_fraction=0.2",
    "train.rounds=3", "train.eval_every=1", "train.clients_per_round=3", "train.local_steps=5",
    "train.batch_size=16", "train.novel_adapt_rounds=2", "model.options={hidden: 8}",
]
SMALL_SERVER = {
    **{name: options.removeprefix("method.options=") for name, options in TINY_METHOD_OPTIONS.items()},
    "pfedgat": "{heads: 2, head_dim: 4}",
    "pfedgat-loss-only": "{heads: 2, head_dim: 4, feedback: loss_only}",
}


def flower_config(method: str, *overrides: str) -> RunConfig:
    """A tiny Flower run of ``method`` (``pfedgat-loss-only``: pFedGAT with scalar feedback)."""
    extra = [f"method.options={SMALL_SERVER[method]}"] if method in SMALL_SERVER else []
    name = method.removesuffix("-loss-only")
    return load_config(None, [*FLOWER_BASE, f"method.name={name}", *extra, *TINY_METHOD_DATA.get(name, []),
                              *overrides])


def grid_for(config: RunConfig, seed: int = 0) -> InProcessGrid:
    return InProcessGrid(client_app, NUM_CLIENTS, {protocol.RUN_CONFIG_KEY: dump_config(config)}, seed=seed)


def comparable(summary: RunResult) -> dict[str, Any]:
    # models stay on Flower's nodes: only the simulator saves them (models_note says which)
    return {k: v for k, v in without_wall_time(summary).items() if k not in (*FLOWER_FIELDS, "models_note")}


@pytest.mark.parametrize("method", on_kernel_paths([*single_architecture_methods(), "pfedgat-loss-only"], ("fedavg",)))
def test_flower_engine_gives_the_simulators_numbers(method: str) -> None:
    """3 rounds on FL-N with 6 clients: every metric of the summary equals the simulator's, exactly, for every
    registered method (pFedGAT's validation feedback travels in the reply too; client-rule state such as
    Ditto's personal model or FedRep's head lives in each node's context.state). A node trains its client alone
    where the simulator batches it with others: each client is its own problem of a batched product, computed by
    the same kernel whatever the batch count (FedAvg's case is re-run under MKL's AVX2 path: ``kernel_paths``)."""
    config = flower_config(method)
    simulated = run_config(config, progress=False)
    grid = grid_for(config)
    on_flower = run_on_grid(grid, config, None)
    assert on_flower.dropped_clients == []
    assert comparable(on_flower) == comparable(simulated)
    assert on_flower.test_mean is not None
    # every method scores its novel clients, except Local, which has no model for them (and says so)
    assert (on_flower.novel_mean is None) == (on_flower.novel_none_reason is not None) == (method == "local")


def test_node_ids_do_not_matter_only_partition_ids_do() -> None:
    """Other random node ids, same partition ids -> same numbers (the QUERY maps nodes to clients)."""
    config = flower_config("fedavg")
    first = run_on_grid(grid_for(config, seed=1), config, None)
    second = run_on_grid(grid_for(config, seed=2), config, None)
    assert comparable(first) == comparable(second)


def test_each_node_receives_its_own_personalised_weights() -> None:
    """pFedHN: TRAIN messages of one round carry different weights, one message per selected node."""
    config = flower_config("pfedhn", "train.rounds=1")
    grid = grid_for(config)
    run_on_grid(grid, config, None)
    train_messages = [m for m in grid.sent if m.metadata.message_type == "train" and m.metadata.group_id == "1"
                      and m.content["config"]["purpose"] == "local_training"]
    assert len(train_messages) == 3
    assert len({m.metadata.dst_node_id for m in train_messages}) == 3
    weights = [protocol.record_weights(m.content["arrays"]) for m in train_messages]
    assert not torch.equal(weights[0], weights[1])
    client_ids = [int(m.content["config"]["client-id"]) for m in train_messages]
    for message, client_id in zip(train_messages, client_ids, strict=True):
        assert grid.node_of_partition(client_id) == message.metadata.dst_node_id


def test_failing_and_silent_nodes_are_dropped_and_the_run_goes_on() -> None:
    """A node answering with an error and one never answering are dropped (logged) each round they are
    selected; the run completes and bytes_up counts only updates that arrived."""
    config = flower_config("fedavg", "train.rounds=4", "dataset.novel_fraction=0", "train.clients_per_round=6")
    grid = grid_for(config)
    grid.failing.add(grid.node_of_partition(1))
    grid.answers_left[grid.node_of_partition(4)] = 2  # the QUERY and round 1's TRAIN, then it vanishes
    summary = run_on_grid(grid, config, None)
    assert summary.status == "completed"
    dropped = {(d["round"], d["client"]) for d in summary.dropped_clients}
    assert {(r, 1) for r in range(1, 5)} | {(r, 4) for r in range(2, 5)} <= dropped
    reasons = " ".join(d["reason"] for d in summary.dropped_clients)
    assert "error reply" in reasons and "no reply" in reasons
    dim = 2 * 8 + 8 + 8 * 8 + 8 + 8 * 2 + 2
    # round 1: 5 updates arrive (client 4 still alive); rounds 2-4: 4 each; x dim float32 values
    assert summary.bytes_up == (5 + 3 * 4) * dim * 4
    assert summary.test_mean is not None  # evaluation averages over the clients that answered


def test_nan_and_wrong_shape_replies_are_rejected_never_aggregated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client replying NaN and one replying a too-short update are rejected; the global model stays finite
    and equals the average of the valid updates only."""
    config = flower_config("fedavg", "train.rounds=1", "dataset.novel_fraction=0", "train.clients_per_round=6")
    original = protocol.train_reply

    def corrupt(delta: torch.Tensor, metrics: dict[str, torch.Tensor], client_id: int, uploads: list[str]) -> Any:
        if client_id == 2:
            delta = torch.full_like(delta, float("nan"))
        if client_id == 3:
            delta = delta[:, :-1]
        return original(delta, metrics, client_id, uploads)

    monkeypatch.setattr(protocol, "train_reply", corrupt)
    grid = grid_for(config)
    executors: list[Any] = []
    from graphfed.flower import server

    original_train = server.FlowerExecutor.train

    def spy(self: server.FlowerExecutor, *args: Any, **kwargs: Any) -> Any:
        result = original_train(self, *args, **kwargs)
        executors.append(result)
        return result

    monkeypatch.setattr(server.FlowerExecutor, "train", spy)
    summary = run_on_grid(grid, config, None)
    reasons = {d["client"]: d["reason"] for d in summary.dropped_clients}
    assert "non-finite" in reasons[2]
    assert "shape" in reasons[3]
    assert executors[0].client_ids.tolist() == [0, 1, 4, 5]
    assert torch.isfinite(executors[0].delta).all()
    assert summary.status == "completed"


def test_client_state_persists_in_context_state() -> None:
    """Per-client counters live in each node's context.state, not in Python globals."""
    config = flower_config("fedavg", "dataset.novel_fraction=0", "train.clients_per_round=6")
    grid = grid_for(config)
    run_on_grid(grid, config, None)
    counts = [int(ctx.state["graphfed"]["rounds-trained"]) for ctx in grid.contexts.values()]
    assert counts == [3] * NUM_CLIENTS


def test_a_node_with_an_out_of_range_partition_id_is_ignored() -> None:
    """A node claiming a client id the federation does not have is not used; the others run."""
    config = flower_config("fedavg", "train.rounds=1", "dataset.novel_fraction=0")
    grid = grid_for(config)
    rogue = grid.node_of_partition(5)
    grid.contexts[rogue].node_config["partition-id"] = 99
    summary = run_on_grid(grid, config, None)
    assert summary.status == "completed"
    # Evaluation asks every client; client 5 has no node that answered the QUERY correctly.
    assert any(d["client"] == 5 and "no node" in d["reason"] for d in summary.dropped_clients)


@pytest.mark.parametrize(("given", "message"), [
    (99, "node config partition-id=99 is outside the federation's clients 0..5"),
    (-1, "node config partition-id=-1 is outside the federation's clients 0..5"),
    ("abc", "node config partition-id='abc' is not a client number"),
    (2.5, "node config partition-id=2.5 is not a client number"),
    (True, "node config partition-id=True is not a client number")])
def test_a_supernode_with_a_bad_partition_id_logs_one_line_on_its_side(
        given: object, message: str, caplog: pytest.LogCaptureFixture) -> None:
    """The node's side of a bad ``partition-id``: the ClientApp refuses it with one line naming the value and how to
    start the node, and the line Flower's ClientApp runner logs for it carries that line, not a traceback."""
    import logging

    from flwr.app import Message
    from flwr.common import Context, RecordDict

    from graphfed.config import dump_config
    from graphfed.errors import ConfigError
    from graphfed.flower import protocol
    from graphfed.flower.client import query

    config = flower_config("fedavg", "train.rounds=1")
    context = Context(run_id=1, node_id=7, node_config={"partition-id": given, "num-partitions": NUM_CLIENTS},
                      state=RecordDict(), run_config={protocol.RUN_CONFIG_KEY: dump_config(config)})
    with pytest.raises(ConfigError) as refused:
        query(Message(RecordDict({}), dst_node_id=7, message_type="query"), context)
    line = str(refused.value)
    assert line.startswith(message) and "--node-config \"partition-id=<0..5> num-partitions=6\"" in line
    assert len(line.splitlines()) == 1
    with caplog.at_level(logging.ERROR, logger="flwr"):
        logging.getLogger("flwr").error("%s raised an exception", "ClientApp", exc_info=refused.value)
    assert caplog.records[0].getMessage() == f"ClientApp raised an exception: {line}"
    assert "Traceback" not in caplog.text


def test_a_round_where_no_evaluation_arrives_does_not_end_the_run() -> None:
    """Every node failing its messages: rounds complete without updates or scores, the run still finishes
    with a summary (no model-selection round), instead of crashing the ServerApp."""
    config = flower_config("fedavg", "train.rounds=2", "dataset.novel_fraction=0")
    grid = grid_for(config)
    grid.failing.update(grid.contexts)
    summary = run_on_grid(grid, config, None)
    assert summary.status == "completed"
    assert summary.best_round is None and summary.bytes_up == 0
    assert {d["client"] for d in summary.dropped_clients} == set(range(NUM_CLIENTS))
