"""What a supervisor relies on: one writer per run folder, a fate it can read without logs (``graphfed status`` and
``status.json``), a headline compared only over the same clients, and every lost upload named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ConfigFactory, read_rounds
from graphfed.cli import app
from graphfed.errors import RunInUseError
from graphfed.runs import STATUS, read_result, run_fate, run_writer, writer_holding
from graphfed.sim.engine import Simulator
from graphfed.sim.observe import Tracker

#: a process that holds a run folder as its writer until killed (what a live ServerApp or `graphfed run` does)
HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from graphfed.runs import run_writer
    with run_writer(Path(sys.argv[1])) as claim:
        claim.start()
        print("holding", flush=True)
        time.sleep(float(sys.argv[2]))
""")


def hold(folder: Path, seconds: float = 120.0) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(seconds)], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    return holder


def status(folder: Path, *options: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["status", str(folder), *options])
    return result.exit_code, result.output.strip()


def test_a_second_writer_is_refused_with_one_line_and_touches_nothing(make_config: ConfigFactory,
                                                                      tmp_path: Path) -> None:
    config = make_config("fedavg", "train.rounds=2", "train.eval_every=1")
    Simulator(config, tmp_path, progress=False).run()
    holder = hold(tmp_path)  # the writer now (its status.json says so)
    before = {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir() if path.is_file()}
    try:
        with pytest.raises(RunInUseError, match=rf"another process is writing this run \(pid {holder.pid} on "):
            Simulator(config, tmp_path, progress=False).run(resume=True)
        result = CliRunner().invoke(app, ["run", "demo", "--out", str(tmp_path), "--overwrite", "--no-progress"])
        assert result.exit_code == 4, result.output
        assert len(result.output.strip().splitlines()) == 1 and "refused so that no round is trained twice" in \
            result.output
        assert {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()
                if path.is_file() and path.name in before} == before
        assert status(tmp_path)[0] == 5 and status(tmp_path)[1].startswith(f"running: pid {holder.pid} on ")
    finally:
        holder.kill()
        holder.wait()
    # the operating system released the killed writer's lock: the run is the next writer's again
    assert writer_holding(tmp_path) is None
    assert Simulator(config, tmp_path, progress=False).run().completed


def test_status_tells_each_fate_with_its_exit_code(make_config: ConfigFactory, tmp_path: Path) -> None:
    done = tmp_path / "done"
    result = Simulator(make_config("fedavg", "train.rounds=2", "train.eval_every=1"), done, progress=False).run()
    code, line = status(done)
    assert code == 0 and line.startswith(f"completed: test accuracy {100 * result.test_mean:.4g} % at round ")
    assert f"scored on {result.training_clients} of {result.training_clients} training clients" in line
    assert json.loads((done / STATUS).read_text())["state"] == "completed"

    assert status(tmp_path / "empty-but-there")[0] == 2  # not a directory
    (tmp_path / "empty").mkdir()
    assert status(tmp_path / "empty") == (2, f"{tmp_path / 'empty'}: no run here")

    # a writer killed outright (SIGKILL, a power cut) says nothing; its lock is gone, its status says running
    killed = tmp_path / "killed"
    holder = hold(killed)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    code, line = status(killed)
    assert code == 3 and f"its writer (pid {holder.pid} on" in line and "ended without finishing" in line


def test_a_stopped_and_a_failed_run_say_so(make_config: ConfigFactory, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from graphfed.methods.fedavg import FedAvg

    stopped = tmp_path / "stopped"
    result = Simulator(make_config("fedavg", "train.rounds=3", "train.eval_every=1", "train.lr=1e30"), stopped,
                       progress=False).run()
    assert not result.completed
    code, line = status(stopped)
    assert code == 3 and line.startswith("stopped: ") and "non-finite" in line

    def broken(*args: object) -> None:
        raise ZeroDivisionError("a bug in a method")

    monkeypatch.setattr(FedAvg, "update", broken)
    failed = tmp_path / "failed"
    with pytest.raises(ZeroDivisionError):
        Simulator(make_config("fedavg", "train.rounds=2"), failed, progress=False).run()
    assert status(failed) == (1, "failed: ZeroDivisionError: a bug in a method")


def test_status_waits_for_a_running_writer(tmp_path: Path) -> None:
    holder = hold(tmp_path, seconds=1.5)
    begin = time.monotonic()
    code, line = status(tmp_path, "--wait", "--interval", "0.2")
    holder.wait()
    assert time.monotonic() - begin > 0.5  # it waited for the writer's end
    # the holder let go without saying how its run ended: a writer that vanished, resumable
    assert code == 3 and "ended without finishing; no checkpoint yet" in line


def test_one_writer_per_process_too(tmp_path: Path) -> None:
    """Two runs in one process (a pack, a notebook) writing one folder: the second is refused as well."""
    with run_writer(tmp_path) as claim:
        claim.start()
        with pytest.raises(RunInUseError), run_writer(tmp_path):
            pass
    assert run_fate(tmp_path)[0] == "stopped"  # the first writer let go without a final word


def _files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def _flower_checkpoint(folder: Path) -> None:
    """The run's checkpoint as a Flower ServerApp writes it (the clients' state stays on the nodes)."""
    from graphfed.sim.checkpoint import load_checkpoint, save_checkpoint

    state = load_checkpoint(folder)
    state["clients"] = {"flower": {}}
    save_checkpoint(folder, state)


def _corrupt_checkpoint(folder: Path) -> None:
    path = folder / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("case", ["finished", "other config", "flower checkpoint", "corrupt checkpoint", "in use"])
def test_a_refused_resume_changes_no_file_and_the_run_stays_completed(case: str, make_config: ConfigFactory,
                                                                      tmp_path: Path) -> None:
    """Everything that can refuse ``--resume`` refuses before the run's writer starts: one line with its exit code,
    every file of the folder byte for byte as it was, and ``graphfed status`` still says completed (exit 0)."""
    overrides = ["train.rounds=2", "train.eval_every=1", "train.checkpoint_every=1"]
    config = make_config("fedavg", *overrides)
    Simulator(config, tmp_path, progress=False).run()
    {"flower checkpoint": _flower_checkpoint, "corrupt checkpoint": _corrupt_checkpoint}.get(case, lambda _: None)(
        tmp_path)
    before = _files(tmp_path)
    config_file = tmp_path / "config.yaml"
    arguments = ["run", str(config_file), "--out", str(tmp_path), "--resume", "--no-progress",
                 *(["--set", "train.lr=0.5"] if case == "other config" else [])]
    expected = {"finished": (3, "holds a run that finished (2 rounds); there is nothing to resume"),
                "other config": (3, "the checkpoint was written by a different config"),
                "flower checkpoint": (3, "is a Flower run's that finished all 2 rounds; there is nothing to resume"),
                "corrupt checkpoint": (3, "is corrupt (its checksum does not match its contents)"),
                "in use": (4, "another process is writing this run")}[case]
    if case == "in use":
        with run_writer(tmp_path):  # held in this process: the CLI's run is a second writer
            result = CliRunner().invoke(app, arguments)
    else:
        result = CliRunner().invoke(app, arguments)
    assert (result.exit_code, len(result.output.strip().splitlines())) == (expected[0], 1), result.output
    assert expected[1] in " ".join(result.output.split())
    assert _files(tmp_path) == before
    assert status(tmp_path)[0] == 0 and status(tmp_path)[1].startswith("completed: ")


# ---- the headline over the same clients ---------------------------------------------------------------------
def offered(*records: dict[str, object]) -> Tracker:
    tracker = Tracker(higher_is_better=True)
    for record in records:
        tracker.offer(record)
    return tracker


def test_a_round_scored_on_fewer_clients_never_beats_one_scored_on_all() -> None:
    """The straggler case of the Flower fault study: round 4 scored 3 of 4 clients (0.90), round 6 all 4 (0.80)."""
    partial = {"round": 4, "val_mean": 0.90, "unscored_clients": ["3"]}
    full = {"round": 6, "val_mean": 0.80}
    assert offered(partial, full).best["round"] == 6
    assert offered(full, partial).best["round"] == 6
    # same clients: the higher score wins, as before
    assert offered({"round": 2, "val_mean": 0.5}, full).best["round"] == 6
    assert offered({"round": 2, "val_mean": 0.9}, full).best["round"] == 2
    assert offered(partial, {"round": 8, "val_mean": 0.95, "unscored_clients": ["3"]}).best["round"] == 8
    # a different client missing: not compared, the best so far stays
    assert offered(partial, {"round": 8, "val_mean": 0.99, "unscored_clients": ["1"]}).best["round"] == 4


def test_an_incomparable_round_is_no_evaluation_without_a_gain() -> None:
    tracker = offered({"round": 2, "val_mean": 0.8}, {"round": 4, "val_mean": 0.9, "unscored_clients": ["1"]})
    assert tracker.since_improvement == 0 and tracker.best["round"] == 2
    tracker.offer({"round": 6, "val_mean": 0.7})
    assert tracker.since_improvement == 1


# ---- every lost upload named --------------------------------------------------------------------------------
def test_dropout_names_each_lost_upload_by_round(make_config: ConfigFactory, tmp_path: Path) -> None:
    config = make_config("fedavg", "train.dropout=0.4", "train.rounds=6", "train.eval_every=2")
    result = Simulator(config, tmp_path, progress=False).run()
    assert result.lost_uploads and len(result.dropped_clients) == result.lost_uploads
    assert all(drop["reason"] == "dropout" for drop in result.dropped_clients)
    assert sum(len(rounds) for rounds in result.missed_rounds.values()) == result.lost_uploads
    names = set(read_result(tmp_path).per_client)
    assert set(result.missed_rounds) <= names
    records = read_rounds(tmp_path)
    # each evaluation names the uploads lost since the one before: together, every one of them, once
    listed = [(drop["round"], drop["client"]) for record in records for drop in record["dropped_clients"]]
    assert sorted(listed) == sorted((d["round"], d["client"]) for d in result.dropped_clients)
    assert all(prev["round"] < drop["round"] <= record["round"] for prev, record in zip(
        [{"round": 0}, *records], records, strict=False) for drop in record["dropped_clients"])
    shown = CliRunner().invoke(app, ["show", str(tmp_path)]).output
    client = next(iter(result.missed_rounds))
    assert f"{result.lost_uploads} training upload(s) lost" in shown and client in shown


def test_a_late_upload_lost_is_named_as_a_straggler(make_config: ConfigFactory) -> None:
    config = make_config("fedavg", "train.stragglers=0.5", "train.straggler_delay=0", "train.rounds=4")
    result = Simulator(config, progress=False).run()
    assert result.lost_uploads and {drop["reason"] for drop in result.dropped_clients} == {"straggler"}
    assert set(result.missed_rounds) <= set(result.stragglers or [])


def test_a_serverapp_waits_for_a_writer_letting_go_and_refuses_one_that_goes_on(tmp_path: Path) -> None:
    """After a SuperLink restart the first ServerApp either ends (and lets go within moments) or reconnects and
    goes on: `flwr run` again at once must neither be refused by the first case nor run beside the second."""
    from graphfed.flower.app import wait_for_the_other_writer

    letting_go = hold(tmp_path / "ending", seconds=1.0)
    wait_for_the_other_writer(tmp_path / "ending", seconds=30.0)
    assert letting_go.wait(timeout=5) == 0
    going_on = hold(tmp_path / "going-on")
    try:
        begin = time.monotonic()
        with pytest.raises(RunInUseError, match="another process is writing this run"):
            wait_for_the_other_writer(tmp_path / "going-on", seconds=0.5)
        assert time.monotonic() - begin >= 0.5
    finally:
        going_on.kill()
        going_on.wait()


def test_a_second_serverapp_is_refused_with_one_line_and_no_traceback(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A ServerApp for a run another process writes raises Flower's app-exit exception: Flower records the run as
    failed with the line as its details and exits 203 ("run start rejected"); the line Flower logs for it (with
    ``exc_info``, as its ServerApp runner does) is one line naming the run and the holder, no traceback, while a
    bug keeps its traceback; the run folder is untouched."""
    import logging

    from flwr.app import Context
    from flwr.app.exception import AppExitException
    from flwr.common import RecordDict

    from graphfed.config import dump_config
    from graphfed.flower import protocol
    from graphfed.flower.app import RUN_START_REJECTED, RunRefusedError, main
    from test_flower import flower_config, grid_for

    config = flower_config("fedavg", "train.rounds=1")
    holder = hold(tmp_path)
    before = _files(tmp_path)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={protocol.RUN_CONFIG_KEY: dump_config(config.model_copy(update={
                          "flower": config.flower.model_copy(update={"writer_wait": 0.2})})),
                                  protocol.OUT_DIR_KEY: str(tmp_path)})
    try:
        with pytest.raises(RunRefusedError) as refused:
            main(grid_for(config), context)
    finally:
        holder.kill()
        holder.wait()
    assert isinstance(refused.value, AppExitException) and refused.value.exit_code == RUN_START_REJECTED == 203
    line = str(refused.value)
    assert line.startswith(f"refused: {tmp_path}: another process is writing this run (pid {holder.pid} on ")
    with caplog.at_level(logging.ERROR, logger="flwr"):  # what Flower's ServerApp runner logs for it
        logging.getLogger("flwr").error("%s raised an exception", "ServerApp", exc_info=refused.value)
        logging.getLogger("flwr").error("%s raised an exception", "ServerApp", exc_info=ValueError("a real crash"))
    refusal, crash = caplog.records
    assert refusal.exc_info is None and refusal.getMessage() == f"ServerApp raised an exception: {line}"
    assert crash.exc_info is not None and "ValueError: a real crash" in caplog.text  # a bug keeps its exception
    assert _files(tmp_path) == before
