"""Asynchronous rounds on Flower (``train.server_mode: fedbuff`` with an in-process grid): the server submits training
to idle nodes and steps on the updates in the order they arrive, so a stopped node delays its own update only."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from flwr.app import Message, RecordDict
from typer.testing import CliRunner

from graphfed.cli import app
from graphfed.config import ConfigError
from graphfed.flower import protocol
from graphfed.flower.app import run_on_grid
from graphfed.flower.inprocess import InProcessGrid
from graphfed.runs import RoundLog, run_fate
from test_flower import flower_config, grid_for

ASYNC = ["dataset.novel_fraction=0", "train.server_mode=fedbuff", "train.buffer_size=2", "train.concurrency=4",
         "flower.round_timeout=0.5"]


def training(message: Message) -> bool:
    return message.metadata.message_type == "train"


def test_a_stopped_node_delays_only_its_own_update(tmp_path: Path) -> None:
    """Six nodes, four training at once, a step per two updates. Client 1's node stops (it holds its messages, like
    a SIGSTOPped SuperNode) at its second training message, while each other node's training takes 0.1 s; it goes on
    after the others were sent 12 messages. The server steps on without it, drops its update once the 0.5 s
    timeout passes, keeps one fresh message waiting for it, and uses its update once it answers; every round is
    logged once, and ``graphfed status`` tells it while running and at the end."""
    config = flower_config("fedavg", "train.rounds=16", *ASYNC)
    grid = grid_for(config)
    victim, out = grid.node_of_partition(1), tmp_path / "run"
    trains: list[tuple[int, int, bool]] = []  # (node, server version it was sent at, victim stopped)
    fates: list[str] = []

    def on_push(message: Message) -> None:
        if not training(message):
            return
        node, stopped = message.metadata.dst_node_id, victim in grid.stopped
        trains.append((node, int(message.content["config"]["round"]), stopped))
        if node == victim and sum(n == victim for n, _, _ in trains) == 2:
            grid.stop(victim)
        elif stopped and node != victim:
            time.sleep(0.1)  # the others' training takes time: the victim's 0.5 s run out meanwhile
            fates.append(run_fate(out)[1])
            if sum(s and n != victim for n, _, s in trains) == 12:
                grid.go_on(victim)

    grid.on_push = on_push
    summary = run_on_grid(grid, config, out)
    assert summary.status == "completed" and summary.rounds == 16
    assert [record["round"] for record in RoundLog(out).read()] == list(range(1, 17))  # each round once
    stopped_at = next(version for node, version, stopped in trains if stopped)
    back_at = max(version for node, version, stopped in trains if stopped)
    assert back_at - stopped_at >= 4  # the server stepped at least 4 times while the victim was stopped
    timeouts = [d for d in summary.dropped_clients if d["client"] == 1 and "no reply in 0.5 s" in d["reason"]]
    assert timeouts and summary.drop_counts["timeout"] >= 1
    assert all(d["client"] == 1 for d in summary.dropped_clients)  # nobody else lost anything
    # the victim came back: trained again from weights newer than those it stopped on, and its update arrived
    assert any(node == victim and version > stopped_at for node, version, _ in trains[-20:])
    records = RoundLog(out).read()
    assert max(record["staleness_max"] for record in records) >= 2  # updates from weights two steps old and more
    silent = [record["silent_clients"] for record in records]
    assert any("1" in names for names in silent) and silent[-1] == {}
    assert summary.trainings_sent["1"] >= 3 and set(summary.trainings_sent) == {str(c) for c in range(6)}
    assert any("running" in fate and "no answer from 1 (since step" in fate for fate in fates)
    status = CliRunner().invoke(app, ["status", str(out)])
    assert status.exit_code == 0
    assert "fedbuff: 16 server steps" in status.output and "training messages per node" in status.output
    assert summary.asynchronous["arrivals"] == "wall clock (Flower nodes)"


def test_a_message_waiting_for_a_stopped_node_expires_with_the_timeout() -> None:
    """The grid never delivers a message whose time to live ran out while its node was stopped (a SuperLink drops
    it): a node that comes back does not train on weights older than ``flower.round_timeout``."""
    config = flower_config("fedavg", *ASYNC)
    grid = grid_for(config)
    node = grid.node_of_partition(0)
    grid.stop(node)
    message = Message(RecordDict({}), dst_node_id=node, message_type="query", ttl=0.05)
    (message_id,) = grid.push_messages([message])
    time.sleep(0.1)
    grid.go_on(node)
    assert list(grid.pull_messages([message_id])) == []


def test_a_lying_node_is_rejected_and_the_others_step_on(tmp_path: Path) -> None:
    """A node that answers NaN is dropped at every arrival (``invalid_reply``); the buffer fills from the others
    and the model stays finite."""
    config = flower_config("fedavg", "train.rounds=6", *ASYNC)
    grid = grid_for(config)

    def poison(content: RecordDict, message: Message) -> RecordDict:
        if training(message):
            delta = protocol.record_weights(content["delta"])
            content["delta"] = protocol.weights_record(torch.full_like(delta, math.nan))
        return content

    grid.tamper[grid.node_of_partition(2)] = poison
    summary = run_on_grid(grid, config, tmp_path / "run")
    assert summary.status == "completed" and summary.rounds == 6
    assert summary.drop_counts["invalid_reply"] >= 1
    assert {d["client"] for d in summary.dropped_clients} == {2}
    assert summary.test_mean is not None and math.isfinite(summary.test_mean)


def test_nodes_that_all_go_silent_stop_the_run_and_a_restart_resumes_it(tmp_path: Path) -> None:
    """Every node stops answering after a few messages: no update arrives for twice ``flower.round_timeout``, the
    run stops with one line and its checkpoint; started again with the nodes back, it resumes after the checkpoint
    and logs each round once."""
    config = flower_config("fedavg", "train.rounds=8", *ASYNC)
    grid = grid_for(config, seed=3)
    for partition in range(6):
        grid.answers_left[grid.node_of_partition(partition)] = 6
    stopped = run_on_grid(grid, config, tmp_path / "run")
    assert not stopped.completed and "no update arrived in 1 s" in stopped.status
    state, line = run_fate(tmp_path / "run")
    assert state == "stopped" and "no node is answering" in line
    done = [record["round"] for record in RoundLog(tmp_path / "run").read()]
    assert done and done[-1] < 8
    resumed = run_on_grid(grid_for(config, seed=4), config, tmp_path / "run")
    assert resumed.status == "completed" and resumed.resumed_at == [done[-1]]
    assert [record["round"] for record in RoundLog(tmp_path / "run").read()] == list(range(1, 9))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["asynchronous"]["server_steps"] == 8


def test_fedasync_and_a_time_budget_on_flower_say_what_they_need() -> None:
    budget = flower_config("fedavg", *ASYNC, "train.time_budget=60")
    with pytest.raises(ConfigError, match="time_budget counts simulated seconds"):
        run_on_grid(grid_for(budget), budget, None)
    mixing = flower_config("fedavg", "train.rounds=3", *ASYNC[:1], "train.server_mode=fedasync",
                           "flower.round_timeout=0.5")
    summary = run_on_grid(grid_for(mixing), mixing, None)
    assert summary.completed and summary.asynchronous["server_mode"] == "fedasync"


def test_inprocess_grid_replies_name_the_message_they_answer() -> None:
    grid: InProcessGrid = grid_for(flower_config("fedavg"))
    node = grid.node_of_partition(0)
    (message_id,) = grid.push_messages([Message(RecordDict({}), dst_node_id=node, message_type="query")])
    (reply,) = grid.pull_messages([message_id])
    assert reply.metadata.reply_to_message_id == message_id


def test_an_update_is_as_stale_as_the_steps_since_its_client_was_sent_work() -> None:
    """The live server dates an arriving update by the server step its client was sent work at, not by the step it
    arrives in: sent at step 3, arriving at step 7, it weighs s(4)."""
    from types import SimpleNamespace

    from graphfed.client.executor import Collected, TrainResult
    from graphfed.sim.asynchronous import LiveAsyncServer
    from graphfed.sim.clock import SimulatedClock

    config = flower_config("fedavg", *ASYNC)
    server = LiveAsyncServer(config, SimulatedClock(config.train.clock, 6, 5, 0), torch.arange(6), 3)
    server.sent_to[4] = (3, torch.zeros(2))
    server.version = 7
    sim = SimpleNamespace(setup=SimpleNamespace(spec=SimpleNamespace(dim=2),
                                                federation=SimpleNamespace(client_names=[str(c) for c in range(6)])),
                          privacy=SimpleNamespace(mechanism="none"))
    metrics = {name: torch.ones(1) for name in ("loss_first", "loss_last", "num_examples")}
    arrived = TrainResult(torch.tensor([0]), torch.tensor([4]), torch.ones(1, 2), metrics)
    server.take(Collected(arrived, [], [], [], {4: 1}), sim)  # type: ignore[arg-type]
    assert [(d.client, d.version) for d in server.arrived] == [(4, 3)] and server.sent_to == {}


def test_an_evaluation_does_not_wait_the_timeout_for_a_stopped_node(tmp_path: Path) -> None:
    """Client 1's node is stopped from its first training message on and ``flower.round_timeout`` is 300 s: the
    first evaluation ends once the other nodes have answered and the stopped one has been silent for 3x the median
    training reply time, scoring without it; later ones do not wait for it at all (it has not answered since); the
    run completes every step without it."""
    config = flower_config("fedavg", "train.rounds=4", *ASYNC[:-1], "flower.round_timeout=300")
    grid = grid_for(config)
    victim = grid.node_of_partition(1)

    def on_push(message: Message) -> None:
        if training(message) and message.metadata.dst_node_id == victim:
            grid.stop(victim)

    grid.on_push = on_push
    summary = run_on_grid(grid, config, tmp_path / "run")
    assert summary.status == "completed" and summary.rounds == 4
    missed = [d for d in summary.dropped_clients if d["client"] == 1]
    assert len(missed) == 4 and "silent for over 3x the nodes' median" in missed[0]["reason"], missed
    assert all("not answered since it went silent" in d["reason"] for d in missed[1:]), missed
    assert [record["scored_clients"] for record in RoundLog(tmp_path / "run").read()] == [5, 5, 5, 5]


def test_an_executor_that_trains_when_asked_refuses_to_submit() -> None:
    """Only a SubmittingExecutor (Flower's) starts training without waiting; the simulator's clients say so."""
    from graphfed.sim.engine import Simulator
    from graphfed.sim.requests import Collect, serve

    simulator = Simulator(flower_config("fedavg", *ASYNC), None, progress=False)
    with pytest.raises(TypeError, match="trains when asked: it cannot collect"):
        serve(simulator.executor, Collect(wait=0.0))
    assert type(simulator.async_server).__name__ == "AsyncServer"  # its clock, not the wall's
