"""Flower runs that survive faults, on the in-process grid (the real processes: ``benchmarks/flower_faults.py``).

A ServerApp that dies resumes from its last checkpoint when started again, its clients' state read back from the
nodes' disks; a round with fewer replies than ``flower.min_replies`` stops the run, checkpoint kept, and a restart
finishes it; a SuperNode restarted under a new node id takes its client back, with its state, and the summary
lists the rounds the client missed. Where no update was lost, each ends with the simulator's numbers for the same
config (which keeps client state in memory: a node that lost its state would not match).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message

from conftest import without_wall_time
from graphfed.config import RunConfig, dump_config
from graphfed.flower import protocol
from graphfed.flower.app import run_on_grid
from graphfed.flower.client import client_app
from graphfed.flower.inprocess import InProcessGrid
from graphfed.flower.server import FLOWER_FIELDS
from graphfed.runs import RoundLog, RunResult, read_result
from graphfed.sim.engine import run_config
from test_flower import NUM_CLIENTS, flower_config


class ServerAppDied(Exception):
    """The ServerApp's process is gone (killed, its machine rebooted)."""


class FaultyGrid(InProcessGrid):
    """An in-process grid that runs ``events[(message type, round)]`` once, right after that round's messages of
    that type were answered (e.g. restart a node between rounds, or kill the ServerApp mid-round)."""

    def __init__(self, config: RunConfig, state_dir: Path, seed: int = 0,
                 events: dict[tuple[str, int], Callable[[FaultyGrid], None]] | None = None) -> None:
        super().__init__(client_app, NUM_CLIENTS, {protocol.RUN_CONFIG_KEY: dump_config(config)}, seed=seed,
                         state_dir=state_dir)
        self.events = dict(events or {})

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        replies = list(super().send_and_receive(messages, timeout=timeout))
        if messages and messages[0].metadata.group_id:
            event = self.events.pop((messages[0].metadata.message_type, int(messages[0].metadata.group_id)), None)
            if event is not None:
                event(self)
        return replies


def numbers(result: RunResult) -> dict[str, Any]:
    return {k: v for k, v in without_wall_time(result).items() if k not in (*FLOWER_FIELDS, "models_note")}


def faults_config(method: str, *overrides: str) -> RunConfig:
    return flower_config(method, "dataset.novel_fraction=0", f"train.clients_per_round={NUM_CLIENTS}",
                         "train.rounds=5", *overrides)


def die(grid: FaultyGrid) -> None:
    raise ServerAppDied


@pytest.mark.parametrize("method", ["ditto", "panacea"])
def test_a_serverapp_that_dies_mid_round_resumes_to_the_uninterrupted_numbers(method: str, tmp_path: Path) -> None:
    """Ditto keeps a personal model on each node, Panacea a hypernetwork on the server: the ServerApp dies after
    round 4's clients trained (their state for round 4 already on disk), a new ServerApp, with new node ids and
    fresh node contexts (a new ``flwr run``), continues from the round-3 checkpoint to the same numbers."""
    config = faults_config(method)
    clean = run_config(config, progress=False)  # the simulator: no fault, client state in memory
    with pytest.raises(ServerAppDied):
        run_on_grid(FaultyGrid(config, tmp_path / "nodes", events={("train", 4): die}), config, tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()
    assert [r["round"] for r in RoundLog(tmp_path / "run").read()] == [1, 2, 3]
    resumed = run_on_grid(FaultyGrid(config, tmp_path / "nodes", seed=1), config, tmp_path / "run")
    assert resumed.status == "completed"
    assert numbers(resumed) == numbers(clean)
    assert [r["round"] for r in RoundLog(tmp_path / "run").read()] == [1, 2, 3, 4, 5]


def test_never_resume_starts_again_at_round_one(tmp_path: Path) -> None:
    config = faults_config("fedavg", "flower.resume=never", "train.rounds=3")
    with pytest.raises(ServerAppDied):
        run_on_grid(FaultyGrid(config, tmp_path / "nodes", events={("train", 3): die}), config, tmp_path / "run")
    again = run_on_grid(FaultyGrid(config, tmp_path / "nodes", seed=1), config, tmp_path / "run")
    assert again.status == "completed" and again.wall_seconds is not None
    assert [r["round"] for r in RoundLog(tmp_path / "run").read()] == [1, 2, 3]


def test_too_few_replies_stop_the_run_and_a_restart_finishes_it(tmp_path: Path) -> None:
    """``flower.min_replies``: a node that stops answering in round 2 leaves 5 of 6 replies; the run stops with one
    line in its status, its round-1 checkpoint kept; started again with every node up, it ends as a run that met no
    fault (Ditto: the clients that trained in the failed round rewind their state)."""
    config = faults_config("ditto", "flower.min_replies=6")
    clean = run_config(config, progress=False)  # the simulator: no fault, client state in memory
    grid = FaultyGrid(config, tmp_path / "nodes")
    grid.answers_left[grid.node_of_partition(3)] = 3  # identity, round-1 training and evaluation
    stopped = run_on_grid(grid, config, tmp_path / "run")
    assert stopped.status == ("stopped: round 2: 5 of 6 training replies arrived, flower.min_replies is 6; start the "
                              "run again to resume from its last checkpoint")
    assert read_result(tmp_path / "run").status == stopped.status
    resumed = run_on_grid(FaultyGrid(config, tmp_path / "nodes", seed=1), config, tmp_path / "run")
    assert resumed.status == "completed"
    assert numbers(resumed) == numbers(clean)
    # round 2 was run again in full after the restart: no client missed it in the run the summary describes
    assert resumed.missed_rounds == {} and resumed.resumed_at == [1]


def test_a_restarted_supernode_takes_its_client_back_with_its_state(tmp_path: Path) -> None:
    """Node 2 is restarted between rounds 2 and 3 (a new node id, an empty context, the same disk): it is admitted
    again, and Ditto's personal model it reads back from disk gives exactly the numbers of a run without restart."""
    config = faults_config("ditto")
    clean = run_config(config, progress=False)
    new_nodes: list[int] = []

    def restart(grid: FaultyGrid) -> None:
        new_nodes.append(grid.restart(grid.node_of_partition(2)))

    restarted = run_on_grid(FaultyGrid(config, tmp_path / "nodes", events={("evaluate", 2): restart}), config, None)
    assert numbers(restarted) == numbers(clean)
    assert [(r["round"], r["client"], r["new_node"]) for r in restarted.readmitted] == [(3, 2, new_nodes[0])]
    assert restarted.missed_rounds == {} and restarted.dropped_clients == []


def test_a_node_down_for_a_round_is_listed_with_the_round_it_missed(tmp_path: Path) -> None:
    """Node 4 dies during round 2 (no reply: dropped, its evaluation missing) and comes back under a new id before
    round 3; the summary names the round it missed and the round it came back; the round-2 scores say they cover 5
    of 6 clients."""
    config = faults_config("fedavg")

    def crash(grid: FaultyGrid) -> None:
        grid.silent.add(grid.node_of_partition(4))

    def come_back(grid: FaultyGrid) -> None:
        grid.restart(grid.node_of_partition(4))

    grid = FaultyGrid(config, tmp_path / "nodes", events={("evaluate", 1): crash, ("evaluate", 2): come_back})
    result = run_on_grid(grid, config, tmp_path / "run")
    assert result.status == "completed"
    assert result.missed_rounds == {list(result.per_client or {})[4]: [2]}
    assert [(r["round"], r["client"]) for r in result.readmitted] == [(3, 4)]
    coverage = {r["round"]: r["scored_clients"] for r in RoundLog(tmp_path / "run").read()}
    assert coverage == {1: 6, 2: 5, 3: 6, 4: 6, 5: 6}
    assert result.training_clients == 6 and result.scored_clients == coverage[result.best_round]


def test_a_node_drops_client_state_that_a_resume_rewound_past(tmp_path: Path) -> None:
    """Attempt 0 wrote rounds 0-5, the run resumed at round 4 (attempt 1 wrote round 4), then at round 6 (attempt
    2): attempt 0's rounds 4 and 5 are stale (attempt 1 ran those rounds again, even where this client did not
    train), attempt 1's round 4 stands; a file from an attempt the server never made is dropped too."""
    from flwr.app import ConfigRecord

    from graphfed.flower.client import state_files

    names = [*(f"round-{r:06d}-000.pt" for r in range(6)), "round-000004-001.pt", "round-000002-007.pt",
             "notes.txt"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    config = ConfigRecord({protocol.RESUMES_KEY: "4,6"})
    kept = [(round_index, attempt) for round_index, attempt, _ in state_files(tmp_path, config)]
    assert kept == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 1)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*names[:4], "round-000004-001.pt", "notes.txt"])
