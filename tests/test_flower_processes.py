"""The Flower engine in real Flower processes: ``flwr run`` local simulation (Ray) and a deployment of one
``flower-superlink`` and three ``flower-supernode`` processes on 127.0.0.1, one of them killed mid-run.

Every process gets a private ``FLWR_HOME`` under the test's temporary folder, free ports picked here, and a
marker variable in its environment (inherited by everything it spawns: SuperExec, ServerApp, ClientApp
processes, Ray workers). Teardown stops what the test started and then every process that still carries the
marker, so nothing outlives the test; ``test_*`` functions assert that too. Exit codes of ``flwr run`` say
little (it exits 0 when the ServerApp crashes), so the tests read the ``summary.json`` the ServerApp writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import read_rounds
from graphfed.config import load_config
from graphfed.flower.app_folder import write_app_folder
from graphfed.sim.engine import run_config

#: The virtual environment's bin folder (flwr, flower-superlink, flower-supernode, graphfed). Not resolved:
#: the interpreter is a symlink out of the venv.
VENV_BIN = Path(sys.executable).parent
MARKER_VAR = "GRAPHFED_FLOWER_TEST_ID"
NUM_NODES = 3
#: Generous limits: two cores, one of them possibly busy, and every Flower message starts a fresh process.
SUPERLINK_START_TIMEOUT = 60.0
RUN_TIMEOUT = 300.0
KILL_TRIGGER_TIMEOUT = 200.0
STOP_GRACE = 20.0
LOG_NOISE = ("httpx: HTTP Request", "push-logs")

#: The smallest useful federation: FL-N with 3 clients, no novel ones, 5 local steps. A healthy round takes
#: 10-30 s here (every message starts a ClientApp process); the round timeout only has to catch a hung run,
#: and a dead node is answered for by the SuperLink ("Node Unavailable") long before it.
BASE_YAML = """\
seed: 0
torch_threads: 1
dataset: {{name: fln, num_clients: {clients}, novel_fraction: 0}}
model: {{name: mlp, options: {{hidden: 8}}}}
method: {{name: {method}{options}}}
train: {{rounds: 2, eval_every: {eval_every}, clients_per_round: {clients}, local_steps: 5, batch_size: 16}}
flower: {{round_timeout: 120, query_timeout: 120, node_wait_timeout: 150}}
"""
PANACEA_OPTIONS = ", options: {embedding_dim: 8, gnn_hidden: 16, hypernet_hidden: 16, server_steps: 2}"


# ---- process handling ---------------------------------------------------------------------------------------
def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the kernel reports free on 127.0.0.1 (bound to port 0, then released)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in ports:
            ports.append(port)
    return ports


def _log_tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return "(no log)"
    kept = [line for line in path.read_text(errors="replace").splitlines() if not any(n in line for n in LOG_NOISE)]
    return "\n".join(kept[-lines:]) or "(empty log)"


def marked_processes(marker: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose environment carries ``MARKER_VAR=marker``: (pid, command line)."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != "Z":
            found.append((int(entry.name), args[:160]))
    return found


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the process and everything it spawned (each Proc leads its own session/group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)


@dataclass
class Processes:
    """The Flower processes of one test: started in their own sessions with logs in files; ``stop()`` ends
    them (SIGTERM, then SIGKILL after a grace period) and every other process carrying the marker."""

    workdir: Path
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    procs: list[Proc] = field(default_factory=list)

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """The environment every flwr process needs here: private FLWR_HOME, no telemetry, no update checks,
        no runtime pip installs, the venv's executables first on PATH, and the marker."""
        home.mkdir(parents=True, exist_ok=True)
        env = {key: value for key, value in os.environ.items() if not key.startswith(("FLWR_", "RAY_"))}
        env.update({
            "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
            "RAY_USAGE_STATS_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PYTHONUNBUFFERED": "1", "VIRTUAL_ENV": str(VENV_BIN.parent),
            "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]), MARKER_VAR: self.marker,
        })
        env.update(extra)
        return env

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            popen = subprocess.Popen(args, cwd=self.workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def get(self, name: str) -> Proc:
        return next(p for p in reversed(self.procs) if p.name == name)

    def tails(self, lines: int = 40) -> str:
        """The end of every log (HTTP request noise filtered out), for failure messages."""
        return "\n".join(f"----- {p.name} (exit {p.popen.poll()}) -----\n{_log_tail(p.log, lines)}"
                         for p in self.procs)

    def wait(self, proc: Proc, timeout: float, what: str) -> None:
        try:
            proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{what}: `{proc.name}` still running after {timeout:.0f} s\n{self.tails()}")

    def stop(self) -> list[tuple[int, str]]:
        """SIGTERM our processes' groups newest first (supernodes before the superlink), then every marked
        straggler; SIGKILL what is still there after the grace period. Returns what survived even that."""
        for proc in reversed(self.procs):
            if proc.alive():
                proc.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for proc in reversed(self.procs):
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.signal_group(signal.SIGKILL)
                proc.popen.wait(timeout=10)
        # Detached processes (the local SuperLink of `flwr run`) and whatever they spawned.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            _signal_all([pid for pid, _ in marked_processes(self.marker)], sig)
            deadline = time.monotonic() + STOP_GRACE
            while marked_processes(self.marker) and time.monotonic() < deadline:
                time.sleep(0.5)
        return marked_processes(self.marker)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    yield procs
    procs.stop()


# ---- graphfed side ----------------------------------------------------------------------------------------
def write_app(tmp_path: Path, name: str, method: str, *overrides: str, eval_every: int = 2,
              cli: bool = True) -> tuple[Path, Path]:
    """A Flower App folder made by the real ``graphfed flower-app`` CLI (or, ``cli=False``, by the function
    behind it, ~10 s faster on a busy machine); returns (app folder, results folder)."""
    options = PANACEA_OPTIONS if method == "panacea" else ""
    config = tmp_path / f"{name}.yaml"
    config.write_text(BASE_YAML.format(clients=NUM_NODES, method=method, options=options, eval_every=eval_every))
    app, results = tmp_path / f"{name}-app", tmp_path / f"{name}-results"
    if not cli:
        write_app_folder(load_config(config, list(overrides)), app, results)
        return app, results
    args = [str(VENV_BIN / "graphfed"), "flower-app", str(config), "--out", str(app), "--results", str(results)]
    for override in overrides:
        args += ["--set", override]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, f"graphfed flower-app failed:\n{done.stdout}\n{done.stderr}"
    assert (app / "pyproject.toml").is_file()
    return app, results


def read_summary(results: Path, procs: Processes) -> dict[str, Any]:
    path = results / "summary.json"
    assert path.is_file(), f"the ServerApp wrote no {path}\n{procs.tails()}"
    return json.loads(path.read_text())


def run_flwr(procs: Processes, name: str, args: list[str], env: dict[str, str]) -> str:
    """``flwr ARGS`` to completion (the exit code is not checked: ``flwr run`` exits 0 on ServerApp crashes);
    returns its output."""
    proc = procs.start(name, [str(VENV_BIN / "flwr"), *args], env)
    procs.wait(proc, RUN_TIMEOUT, f"flwr {args[0]}")
    return proc.log.read_text(errors="replace")


# ---- (A) flwr run, local simulation -----------------------------------------------------------------------
@pytest.mark.slow
def test_flwr_run_local_simulation_runs_panacea_and_leaves_nothing_behind(tmp_path: Path,
                                                                           processes: Processes) -> None:
    """`graphfed flower-app` + `flwr run APP sim` (3 simulated SuperNodes on Ray, 2 rounds of Panacea): the
    ServerApp writes a completed summary with a sensible accuracy, its log reaches the `--stream` output,
    and stopping the auto-started local SuperLink leaves no flwr/Ray process running."""
    app, results = write_app(tmp_path, "sim", "panacea", "train.eval_every=1")
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "sim"\n\n[superlink.sim]\n'
                                      'address = ":local-in-memory:"\n')
    (port,) = free_ports(1)
    env = processes.env(home, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(port))
    output = run_flwr(processes, "flwr-run-sim", [
        "run", str(app), "sim", "--federation-config", f"num-supernodes={NUM_NODES} client-resources-num-cpus=1",
        "--stream"], env)

    summary = read_summary(results, processes)
    assert summary["status"] == "completed", processes.tails()
    assert summary["method"] == "panacea" and summary["rounds"] == 2
    assert summary["dropped_clients"] == []
    assert isinstance(summary["test_mean"], float) and summary["test_mean"] >= 0.5, summary
    assert [r["round"] for r in read_rounds(results)] == [1, 2]
    assert "graphfed run completed" in output, processes.tails()

    # The local SuperLink runs detached from `flwr run`; it and its SuperExec are still up until stopped
    # (seeing them here also shows that the marker finds processes this test did not start itself).
    lingering = " ".join(args for _, args in marked_processes(processes.marker))
    assert "flower-superlink" in lingering, f"expected the local SuperLink to outlive `flwr run`: {lingering!r}"
    survivors = processes.stop()
    assert survivors == [], f"still running after SIGTERM/SIGKILL: {survivors}"


# ---- (B) deployment: flower-superlink + flower-supernode processes ------------------------------------------
@dataclass
class Deployment:
    """One ``flower-superlink`` and one ``flower-supernode`` process per node port (partition i on node i, its
    client state in its own folder); ``database``: the SuperLink keeps its state in that file (it survives a
    restart) instead of in memory. ``benchmarks/flower_faults.py`` drives the same deployment."""

    procs: Processes
    home: Path
    superlink_port: int
    node_ports: list[int]
    database: Path | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.node_ports)

    def cli_env(self) -> dict[str, str]:
        return self.procs.env(self.home)

    def start_superlink(self) -> None:
        database = ["--database", str(self.database)] if self.database else []
        proc = self.procs.start("superlink", [
            str(VENV_BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port",
            str(self.superlink_port), "--disable-runtime-dependency-installation", *database], self.cli_env())
        deadline = time.monotonic() + SUPERLINK_START_TIMEOUT
        while time.monotonic() < deadline:
            assert proc.alive(), f"flower-superlink exited\n{self.procs.tails()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.superlink_port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"flower-superlink not healthy after {SUPERLINK_START_TIMEOUT:.0f} s\n{self.procs.tails()}")

    def start_supernode(self, partition: int) -> None:
        # Own FLWR_HOME per node: nodes install the same app bundle, and flwr's install is not safe to race.
        env = self.procs.env(self.home.parent / f"node{partition}-home")
        self.procs.start(f"supernode{partition}", [
            str(VENV_BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.superlink_port}",
            "--host", "127.0.0.1", "--port", str(self.node_ports[partition]),
            "--node-config", f"partition-id={partition} num-partitions={self.num_nodes} "
                             f"state-dir=\"{self.home.parent / f'node{partition}-state'}\""], env)

    def ensure_supernodes(self) -> None:
        """(Re)start any supernode that is not running (a test before may have killed one)."""
        for partition in range(self.num_nodes):
            names = [p.name for p in self.procs.procs]
            if f"supernode{partition}" not in names or not self.procs.get(f"supernode{partition}").alive():
                self.start_supernode(partition)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    workdir = tmp_path_factory.mktemp("deployment")
    procs = Processes(workdir)
    superlink_port, *node_ports = free_ports(1 + NUM_NODES)
    home = workdir / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "dep"\n\n[superlink.dep]\n'
                                      f'address = "127.0.0.1:{superlink_port}"\ninsecure = true\n')
    dep = Deployment(procs, home, superlink_port, node_ports)
    try:
        dep.start_superlink()
        dep.ensure_supernodes()  # the ServerApp waits for them (flower.node_wait_timeout)
        yield dep
    finally:
        survivors = procs.stop()
        assert survivors == [], f"still running after SIGTERM/SIGKILL: {survivors}"


@pytest.mark.slow
def test_deployment_superlink_and_three_supernodes_run_fedavg(deployment: Deployment) -> None:
    """`flwr run APP dep` against a real SuperLink with 3 SuperNodes (partition ids 0-2), 2 rounds of FedAvg:
    every client is found through its QUERY reply, nobody is dropped, the run completes."""
    deployment.ensure_supernodes()
    app, results = write_app(deployment.procs.workdir, "fedavg", "fedavg", cli=False)
    output = run_flwr(deployment.procs, "flwr-run-fedavg", ["run", str(app), "dep", "--stream"],
                      deployment.cli_env())

    summary = read_summary(results, deployment.procs)
    assert summary["status"] == "completed", deployment.procs.tails()
    assert summary["rounds"] == 2 and summary["num_clients"] == NUM_NODES
    # no update lost: the only drops are client 2's evaluations in the pause, which did not wait for it
    dropped = summary["dropped_clients"]
    assert all(d["client"] == 2 and "silent" in d["reason"] for d in dropped), dropped
    assert summary["test_mean"] is not None
    assert "3 of 3 clients have a node" in output, deployment.procs.tails()


@pytest.mark.slow
def test_deployment_run_survives_a_killed_supernode(deployment: Deployment) -> None:
    """3 rounds of FedAvg (evaluated after round 3). The moment the SuperNode of client 2 has received its
    round-2 TRAIN message, it is SIGKILLed with its ClientApp process (no reply, no goodbye). The server gets
    the SuperLink's "Node Unavailable" error reply (or its round timeout), drops client 2 in round 2, logs it
    in the ServerApp log, and completes rounds 2 and 3 with clients 0 and 1; summary.json names client 2,
    and only client 2, as dropped, from round 2 on."""
    deployment.ensure_supernodes()
    procs = deployment.procs
    app, results = write_app(procs.workdir, "kill", "fedavg", "train.rounds=3", eval_every=3, cli=False)
    victim = procs.get("supernode2")
    seen_before = victim.log.stat().st_size  # the node's log also holds earlier runs
    run = procs.start("flwr-run-kill", [str(VENV_BIN / "flwr"), "run", str(app), "dep", "--stream"],
                      deployment.cli_env())

    # Flower logs "Receiving: train message" as a node takes a message, before it starts the ClientApp
    # process (seconds): the second one of this run is round 2's (clients_per_round = all 3).
    deadline = time.monotonic() + KILL_TRIGGER_TIMEOUT
    while True:
        with victim.log.open("rb") as log:
            log.seek(seen_before)
            if log.read().count(b"Receiving: train message") >= 2:
                break
        if time.monotonic() > deadline or not run.alive():
            pytest.fail(f"supernode2 never received its round-2 TRAIN message (flwr run exit {run.popen.poll()})"
                        f"\n{procs.tails()}")
        time.sleep(0.1)
    victim.signal_group(signal.SIGKILL)
    procs.wait(run, RUN_TIMEOUT, "the run after the kill")

    summary = read_summary(results, procs)
    assert summary["status"] == "completed", procs.tails()
    assert summary["rounds"] == 3
    assert [r["round"] for r in read_rounds(results)] == [3]
    dropped = summary["dropped_clients"]
    assert {d["client"] for d in dropped} == {2}, dropped
    assert {2, 3} <= {d["round"] for d in dropped}, dropped
    assert min(d["round"] for d in dropped) == 2, dropped
    output = run.log.read_text(errors="replace")
    assert "round 2: client 2 dropped" in output, procs.tails()
    assert "graphfed run completed" in output, procs.tails()


@pytest.mark.slow
def test_deployment_fedbuff_keeps_the_other_nodes_training_while_one_is_stopped(deployment: Deployment) -> None:
    """FedBuff on 3 SuperNodes (3 training at once, a server step per update, 40 steps, evaluation every 8). Once step
    8 is evaluated, client 2's SuperNode is SIGSTOPped for 30 s (the 60 s of ``benchmarks/flower_faults.py``'s
    ``node_paused_fedbuff``, shortened for the suite). The server does not wait for it: the other two nodes take
    training all through the pause while client 2 takes none; after SIGCONT it answers the message it held (a stale
    update, weighed down by its staleness) and trains again. Nothing is lost: the run completes, every step logged
    once, the only drops client 2's evaluations in the pause (not waited for), and ``graphfed status`` says who was
    sent how much. (A node silent for longer than ``flower.round_timeout`` is dropped and probed:
    ``tests/test_flower_async.py``.)"""
    deployment.ensure_supernodes()
    procs = deployment.procs
    app, results = write_app(procs.workdir, "fedbuff", "fedavg", "train.rounds=40", "train.server_mode=fedbuff",
                             "train.buffer_size=1", "train.concurrency=3", eval_every=8, cli=False)
    run = procs.start("flwr-run-fedbuff", [str(VENV_BIN / "flwr"), "run", str(app), "dep", "--stream"],
                      deployment.cli_env())
    deadline = time.monotonic() + KILL_TRIGGER_TIMEOUT
    while not (results / "rounds.jsonl").exists() or not read_rounds(results):
        if time.monotonic() > deadline or not run.alive():
            pytest.fail(f"step 8 was never evaluated (flwr run exit {run.popen.poll()})\n{procs.tails()}")
        time.sleep(0.1)
    victim = procs.get("supernode2")

    def trains_received() -> dict[str, int]:  # Flower logs "Receiving: train message" as a node takes one
        return {str(node): procs.get(f"supernode{node}").log.read_bytes().count(b"Receiving: train message")
                for node in range(NUM_NODES)}

    before = trains_received()
    victim.signal_group(signal.SIGSTOP)
    time.sleep(30.0)
    during = trains_received()
    victim.signal_group(signal.SIGCONT)
    procs.wait(run, RUN_TIMEOUT, "the run after the pause")

    summary = read_summary(results, procs)
    assert summary["status"] == "completed", procs.tails()
    assert [r["round"] for r in read_rounds(results)] == [8, 16, 24, 32, 40]
    for client in ("0", "1"):  # the others took training all through the pause
        assert during[client] - before[client] >= 2, (before, during)
    assert during["2"] == before["2"], (before, during)  # stopped: it took nothing
    assert trains_received()["2"] > during["2"]  # back: it trained again
    # no update lost: the only drops are client 2's evaluations in the pause, which did not wait for it
    dropped = summary["dropped_clients"]
    assert all(d["client"] == 2 and "silent" in d["reason"] for d in dropped), dropped
    assert set(summary["trainings_sent"]) == {"0", "1", "2"}
    told = subprocess.run([str(VENV_BIN / "graphfed"), "status", str(results)], capture_output=True, text=True,
                          timeout=60)
    assert told.returncode == 0 and "fedbuff: 40 server steps" in told.stdout, told.stdout


@pytest.mark.slow
def test_deployment_a_second_serverapp_for_the_same_run_is_refused(deployment: Deployment) -> None:
    """The one-writer rule on loopback: `flwr run` the App while its first ServerApp is training (what an operator
    does after a SuperLink restart whose ServerApp reconnected). The second ServerApp is refused with one line
    before it asks any node for anything; the first trains each round once and completes; `graphfed status`
    tells a supervisor both fates (running, then completed) by exit code."""
    deployment.ensure_supernodes()
    procs = deployment.procs
    app, results = write_app(procs.workdir, "twice", "fedavg", "train.rounds=4", "flower.writer_wait=5", eval_every=1,
                             cli=False)
    first = procs.start("flwr-run-first", [str(VENV_BIN / "flwr"), "run", str(app), "dep", "--stream"],
                        deployment.cli_env())
    deadline = time.monotonic() + KILL_TRIGGER_TIMEOUT
    while not ((results / "rounds.jsonl").exists() and (results / "rounds.jsonl").read_text().strip()):
        if time.monotonic() > deadline or not first.alive():
            pytest.fail(f"the first ServerApp never logged round 1\n{procs.tails()}")
        time.sleep(0.2)
    status = subprocess.run([str(VENV_BIN / "graphfed"), "status", str(results)], capture_output=True, text=True)
    assert status.returncode == 5 and status.stdout.startswith("running: pid "), status

    second = run_flwr(procs, "flwr-run-second", ["run", str(app), "dep", "--stream"], deployment.cli_env())
    assert "another process is writing this run" in second, procs.tails()
    procs.wait(first, RUN_TIMEOUT, "the first run")
    summary = read_summary(results, procs)
    assert summary["status"] == "completed", procs.tails()
    assert [r["round"] for r in read_rounds(results)] == [1, 2, 3, 4]  # each round trained and logged once
    status = subprocess.run([str(VENV_BIN / "graphfed"), "status", str(results)], capture_output=True, text=True)
    assert status.returncode == 0 and status.stdout.startswith("completed: test accuracy "), status


@pytest.mark.slow
def test_secagg_plus_fedavg_on_real_supernodes_matches_the_plain_run(deployment: Deployment) -> None:
    """`flower.secure_aggregation: true`: `graphfed flower-app` writes the SecAgg+ app; 2 rounds of FedAvg through
    Flower's SecAgg+ workflow (3 SuperNodes, every client in every round) end where the simulator's plain run
    does, within SecAgg+'s quantisation (2 * 8 / 2^22 per value of the mean update), and the summary states it."""
    deployment.ensure_supernodes()
    workdir = deployment.procs.workdir
    app, results = write_app(workdir, "secagg", "fedavg", "flower.secure_aggregation=true", "train.rounds=2")
    assert 'serverapp = "graphfed.flower.secagg:server_app"' in (app / "pyproject.toml").read_text()
    output = run_flwr(deployment.procs, "flwr-run-secagg", ["run", str(app), "dep", "--stream"],
                      deployment.cli_env())
    summary = read_summary(results, deployment.procs)
    assert summary["status"] == "completed", deployment.procs.tails()
    assert "SecAgg+" in output or "secagg" in output.lower(), deployment.procs.tails()
    assert summary["secure_aggregation"]["max_error_per_value"] == 2 * 8.0 / 2**22
    plain = run_config(load_config(workdir / "secagg.yaml", ["flower.secure_aggregation=true", "train.rounds=2"]),
                       progress=False)
    assert summary["best_round"] == plain.best_round and summary["scored_clients"] == NUM_NODES
    assert summary["test_mean"] == pytest.approx(plain.test_mean, abs=0.01)
    assert summary["val_mean"] == pytest.approx(plain.val_mean, abs=0.01)


# ---- (C) deployment with TLS and SuperNode authentication ---------------------------------------------------
def write_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1/localhost signed by it: (ca, cert, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, server_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "graphfed test CA")])

    def certificate(subject: x509.Name, key: ec.EllipticCurvePrivateKey, is_ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(hours=2))
                   .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
        if not is_ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    paths = folder / "ca.crt", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(certificate(ca_name, ca_key, True).public_bytes(serialization.Encoding.PEM))
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    paths[1].write_bytes(certificate(server_name, server_key, False).public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return paths


def write_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's EC key pair in OpenSSH format, what Flower's node authentication reads: (private, public)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public


@pytest.mark.slow
def test_tls_with_supernode_authentication_admits_registered_nodes_only(tmp_path: Path,
                                                                        processes: Processes) -> None:
    """A SuperLink with TLS (a CA and server certificate generated here) and --enable-supernode-auth: the three
    nodes whose public keys were registered with `flwr supernode register` connect over TLS and complete a
    graphfed run; a fourth node with an unregistered key, claiming client 1, is refused and never serves."""
    import ssl

    ca, cert, key = write_certificates(tmp_path)
    port, *node_ports = free_ports(2 + NUM_NODES)
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "tls"\n\n[superlink.tls]\naddress = "127.0.0.1:{port}"\n'
                                      f'root-certificates = "{ca}"\n')
    superlink = processes.start("superlink", [
        str(VENV_BIN / "flower-superlink"), "--ssl-ca-certfile", str(ca), "--ssl-certfile", str(cert),
        "--ssl-keyfile", str(key), "--enable-supernode-auth", "--host", "127.0.0.1", "--port", str(port),
        "--disable-runtime-dependency-installation"], processes.env(home))
    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + SUPERLINK_START_TIMEOUT
    while True:
        assert superlink.alive(), f"flower-superlink exited\n{processes.tails()}"
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/health", timeout=2, context=context) as reply:
                if reply.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"TLS SuperLink not healthy\n{processes.tails()}")
        time.sleep(0.5)

    def start_node(name: str, private_key: Path, partition: int, node_port: int) -> Proc:
        return processes.start(name, [
            str(VENV_BIN / "flower-supernode"), "--root-certificates", str(ca), "--superlink", f"127.0.0.1:{port}",
            "--auth-supernode-private-key", str(private_key), "--host", "127.0.0.1", "--port", str(node_port),
            "--node-config", f"partition-id={partition} num-partitions={NUM_NODES}"],
            processes.env(tmp_path / f"{name}-home"))

    for partition in range(NUM_NODES):
        private, public = write_node_key(tmp_path, f"node{partition}")
        registered = run_flwr(processes, f"register{partition}", ["supernode", "register", str(public), "tls"],
                              processes.env(home))
        assert "registered successfully" in registered, processes.tails()
        start_node(f"supernode{partition}", private, partition, node_ports[partition])
    intruder_key, _ = write_node_key(tmp_path, "intruder")
    intruder = start_node("intruder", intruder_key, 1, node_ports[NUM_NODES])
    processes.wait(intruder, SUPERLINK_START_TIMEOUT, "the unregistered node")
    assert intruder.popen.returncode != 0
    assert "Failed to activate SuperNode" in intruder.log.read_text(errors="replace"), processes.tails()

    app, results = write_app(tmp_path, "tls", "fedavg", cli=False)
    output = run_flwr(processes, "flwr-run-tls", ["run", str(app), "tls", "--stream"], processes.env(home))
    summary = read_summary(results, processes)
    assert summary["status"] == "completed", processes.tails()
    assert summary["dropped_clients"] == [] and summary["test_mean"] is not None
    assert "3 of 3 clients have a node" in output, processes.tails()
