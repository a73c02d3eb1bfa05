"""Flower deployments under faults: real ``flower-superlink`` / ``flower-supernode`` processes on 127.0.0.1, a
fault injected mid-run, and what the run made of it, written to ``benchmarks/results/faults.json``.

Each scenario starts a fresh deployment (the process harness of ``tests/test_flower_processes.py``: private
``FLWR_HOME``, free ports, every process marked and reaped), runs Ditto (clients keep a personal model on their
node: a lost or rewound state shows in the numbers) on FL-N with one client per node, every client every round,
evaluation every round, and injects its fault once round ``--fault-after`` has been evaluated:

* ``none``: no fault, the reference;
* ``node_killed``: SIGKILL one SuperNode (and its ClientApp) for good;
* ``node_restarted``: SIGKILL one SuperNode, start it again a few seconds later with the same partition id and
  state folder (Flower gives it a new node id);
* ``node_paused``: a straggler: SIGSTOP one SuperNode for a minute, then SIGCONT (it keeps its node id);
* ``node_paused_fedbuff``: the same minute under ``train.server_mode: fedbuff`` (every node training at once, a
  server step per 2 updates, as many updates and evaluations as the synchronous run): the other nodes keep training
  through the pause. Both paused scenarios record the TRAIN messages each node took
  during the pause (``trains_during_pause``, from the SuperNodes' logs);
* ``min_replies_stop``: ``flower.min_replies`` = every node; SIGKILL one SuperNode: the round short of a reply stops
  the run; restart the node and ``flwr run`` again: it resumes;
* ``serverapp_killed``: SIGKILL the ServerApp process; ``flwr run`` the same app again (``flower.resume: auto``);
* ``superlink_restarted``: SIGKILL the SuperLink (started with ``--database``) and start it again on the same
  ports and database file; the SuperNodes reconnect. Then what the docs tell an operator: ``flwr run`` the app
  again at once. Whichever ServerApp goes on (the first may reconnect to the restarted SuperLink), the other is
  refused by the run folder's writer lock: each round is trained once;
* ``rerun_while_running``: no fault, but ``flwr run`` the same app a second time while its first ServerApp trains
  (an operator or a supervisor retrying): the second ServerApp is refused with one line, the first completes;
* ``superlink_restarted_first_goes_on``: the SuperLink killed and restarted at once on its ``--database``; once the
  first ServerApp has evaluated a round after the restart (it reconnected), ``flwr run`` again: the second
  ServerApp is refused with one line while the first completes (``first_went_on`` says whether the first did
  reconnect: if it ended with its SuperLink instead, the case was not reached and the record says so);
* ``resume_after_end``: no fault; once the run completed, ``graphfed run CONFIG --out RESULTS --resume`` with the
  run's own config and with a changed one (an operator's retry): each is refused with one line, ``graphfed status``
  still says completed and every file of the results folder is byte for byte what it was;
* ``sim_stragglers``: the simulator's model of slow clients (``train.stragglers: 0.25``, one round late);
* ``nodes_20``: no fault, 20 SuperNodes, for the per-round cost of a larger federation on this machine, beside
  the same config on graphfed's simulator and on the in-process grid (Flower's messages, no processes).

For each: the summary's status, the rounds run (and any logged twice), clients dropped / rounds missed / clients
re-admitted / resume points, how many clients the reported score covers, whether the numbers equal the reference's
(``same_numbers``: test and validation means and every client's scores), ``flwr run``'s exit codes (they do not tell
whether the run survived), what ``graphfed status`` says with its exit code (it does: ``status_ok`` checks it
against the summary), how many ServerApps were refused as second writers, and wall times per round.

    .venv/bin/python benchmarks/flower_faults.py                 # every scenario, 4 nodes, 5 rounds (~27 min)
    .venv/bin/python benchmarks/flower_faults.py --scenarios none,node_restarted --rounds 4
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the process harness the deployment tests use

from flower_overhead import round_times  # noqa: E402
from graphfed.config import RunConfig, dump_config, load_config  # noqa: E402
from graphfed.flower.app_folder import write_app_folder  # noqa: E402
from graphfed.provenance import code_provenance  # noqa: E402
from test_flower_processes import VENV_BIN, Deployment, Processes, free_ports, marked_processes  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "faults.json"
SCENARIOS = ("none", "node_killed", "node_restarted", "node_paused", "node_paused_fedbuff", "min_replies_stop",
             "serverapp_killed",
             "superlink_restarted", "rerun_while_running", "superlink_restarted_first_goes_on", "resume_after_end",
             "sim_stragglers", "nodes_20")
RESTARTS = ("superlink_restarted", "superlink_restarted_first_goes_on")
#: ``graphfed status``'s exit code for each final state of a run (the table in the docs)
STATUS_EXIT = {"completed": 0, "stopped": 3, "failed": 1}
REFUSED = "another process is writing this run"
PAUSE_SECONDS = 60.0  # node_paused: how long the SuperNode is stopped (SIGSTOP), longer than Flower's heartbeat wait
VICTIM = 1  # the partition whose node is killed
RUN_TIMEOUT = 900.0
CONFIG = """\
seed: 0
torch_threads: 1
dataset: {{name: fln, num_clients: {clients}, novel_fraction: 0}}
model: {{name: mlp, options: {{hidden: 8}}}}
method: {{name: ditto}}
train: {{rounds: {rounds}, eval_every: {eval_every}, clients_per_round: {clients}, local_steps: 5, batch_size: 16\
{train_extra}}}
flower: {{round_timeout: {round_timeout}, query_timeout: 120, node_wait_timeout: 300{flower_extra}}}
"""
#: what two runs of the same config must agree on when no update was lost
NUMBERS = ("test_mean", "test_std", "val_mean", "best_round", "final_test_mean", "per_client")


def deploy(workdir: Path, nodes: int, database: bool) -> Deployment:
    procs = Processes(workdir)
    superlink_port, *node_ports = free_ports(1 + nodes)
    home = workdir / "flwr-home"
    home.mkdir(parents=True)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "dep"\n\n[superlink.dep]\n'
                                      f'address = "127.0.0.1:{superlink_port}"\ninsecure = true\n')
    dep = Deployment(procs, home, superlink_port, node_ports, workdir / "superlink.db" if database else None)
    dep.start_superlink()
    dep.ensure_supernodes()
    return dep


def rounds_done(results: Path) -> int:
    path = results / "rounds.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        time.sleep(0.2)


def trains_received(dep: Deployment, nodes: int) -> dict[str, int]:
    """TRAIN messages each SuperNode has taken so far (Flower logs "Receiving: train message" for each)."""
    return {str(node): dep.procs.get(f"supernode{node}").log.read_bytes().count(b"Receiving: train message")
            for node in range(nodes)}


def serverapp_pids(dep: Deployment) -> list[int]:
    return [pid for pid, args in marked_processes(dep.procs.marker) if "flwr-serverapp" in args]


def scenario(name: str, workdir: Path, nodes: int, rounds: int, fault_after: int) -> dict[str, Any]:
    if name == "sim_stragglers":
        return simulated_stragglers(workdir, nodes, rounds)
    dep = deploy(workdir, nodes, database=name in RESTARTS)
    config_path = workdir / "run.yaml"
    extra = f", min_replies: {nodes}" if name == "min_replies_stop" else ""
    if name == "node_paused_fedbuff":  # as many updates (2 a step) and evaluations as the synchronous run
        steps = rounds * nodes // 2
        config_path.write_text(CONFIG.format(clients=nodes, rounds=steps, eval_every=steps // rounds,
                                             train_extra=f", server_mode: fedbuff, buffer_size: 2, "
                                                         f"concurrency: {nodes}",
                                             round_timeout=120, flower_extra=extra))
    else:
        config_path.write_text(CONFIG.format(clients=nodes, rounds=rounds, eval_every=1, train_extra="",
                                             round_timeout=120, flower_extra=extra))
    app, results = workdir / "app", workdir / "results"
    write_app_folder(load_config(config_path, []), app, results)
    record: dict[str, Any] = {"scenario": name, "nodes": nodes, "rounds": rounds, "exit_codes": []}
    started = time.monotonic()
    try:
        run = dep.procs.start("flwr-run", [str(VENV_BIN / "flwr"), "run", str(app), "dep", "--stream"],
                              dep.cli_env())
        reruns = []
        if name == "rerun_while_running":
            wait_until(lambda: rounds_done(results) >= fault_after or not run.alive(), RUN_TIMEOUT,
                       f"round {fault_after} evaluated")
            record["fault_at_round"] = rounds_done(results)
            reruns.append(dep.procs.start("flwr-run-again", [str(VENV_BIN / "flwr"), "run", str(app), "dep",
                                                            "--stream"], dep.cli_env()))
        elif name not in ("none", "nodes_20", "resume_after_end"):
            wait_until(lambda: rounds_done(results) >= fault_after or not run.alive(), RUN_TIMEOUT,
                       f"round {fault_after} evaluated")
            record["fault_at_round"] = rounds_done(results)
            before = trains_received(dep, nodes)
            inject(name, dep)
            if name.startswith("node_paused"):
                after = trains_received(dep, nodes)
                record["trains_during_pause"] = {node: after[node] - before[node] for node in after}
            if name == "superlink_restarted_first_goes_on":
                # the first ServerApp reconnected if it evaluates another round; then a second one must be refused
                wait_until(lambda: rounds_done(results) > record["fault_at_round"] or not serverapp_pids(dep),
                           RUN_TIMEOUT, "the first ServerApp to go on or end")
                record["first_went_on"] = bool(serverapp_pids(dep)) and rounds_done(results) > \
                    record["fault_at_round"]
                reruns.append(dep.procs.start("flwr-run-again", [str(VENV_BIN / "flwr"), "run", str(app), "dep",
                                                                "--stream"], dep.cli_env()))
            if name == "superlink_restarted":  # what the docs say to do: flwr run again, at once
                reruns.append(dep.procs.start("flwr-run-again", [str(VENV_BIN / "flwr"), "run", str(app), "dep",
                                                                "--stream"], dep.cli_env()))
            if name == "serverapp_killed":
                run.popen.wait(timeout=RUN_TIMEOUT)
                record["exit_codes"].append(run.popen.returncode)
                run = dep.procs.start("flwr-run-again", [str(VENV_BIN / "flwr"), "run", str(app), "dep",
                                                         "--stream"], dep.cli_env())
        run.popen.wait(timeout=RUN_TIMEOUT)
        record["exit_codes"].append(run.popen.returncode)
        # `flwr run --stream` ends when its stream does (a SuperLink restart cuts it): the ServerApp may go on
        wait_until(lambda: (results / "summary.json").exists() or not serverapp_pids(dep), RUN_TIMEOUT,
                   "the ServerApp to finish")
        if name == "min_replies_stop":
            # the round short of replies stopped the run, its checkpoint kept: bring the node back, run it again
            record["first_status"] = json.loads((results / "summary.json").read_text())["status"]
            dep.start_supernode(VICTIM)
            run = dep.procs.start("flwr-run-again", [str(VENV_BIN / "flwr"), "run", str(app), "dep", "--stream"],
                                  dep.cli_env())
            run.popen.wait(timeout=RUN_TIMEOUT)
            record["exit_codes"].append(run.popen.returncode)
        for again in reruns:
            again.popen.wait(timeout=RUN_TIMEOUT)
            record["exit_codes"].append(again.popen.returncode)
        # every ServerApp of this deployment has ended (one may have gone on after its `flwr run` stream was cut)
        wait_until(lambda: not serverapp_pids(dep), RUN_TIMEOUT, "every ServerApp to end")
        record["wall_seconds"] = round(time.monotonic() - started, 1)
        outputs = [proc.log.read_text(errors="replace") for proc in dep.procs.procs if proc.name.startswith("flwr-run")]
        record["serverapps_refused"] = sum(output.count(REFUSED) > 0 for output in outputs)
        # what an operator reads of a refusal: its lines in the streamed ServerApp log, and no traceback anywhere
        record["refusal_lines"] = sorted({line.strip() for output in outputs for line in output.splitlines()
                                          if REFUSED in line})
        record["tracebacks_in_logs"] = sum(output.count("Traceback (most recent call last)") for output in outputs)
        summary_path = results / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        rounds_log = [json.loads(line) for line in (results / "rounds.jsonl").read_text().splitlines()]
        record.update({
            "status": summary.get("status", "no summary.json (the ServerApp did not finish)"),
            "rounds_run": summary.get("rounds"), "rounds_logged": [r["round"] for r in rounds_log],
            "clients_dropped": sorted({d["client"] for d in summary.get("dropped_clients") or []}),
            "drop_counts": summary.get("drop_counts"), "missed_rounds": summary.get("missed_rounds"),
            "readmitted": summary.get("readmitted"), "resumed_at": summary.get("resumed_at"),
            "trainings_sent": summary.get("trainings_sent"), "asynchronous": summary.get("asynchronous"),
            "scored_clients": summary.get("scored_clients"), "training_clients": summary.get("training_clients"),
            "coverage_by_round": {r["round"]: r.get("scored_clients") for r in rounds_log},
            "seconds_per_round": seconds_per_round(results, 2),
            "numbers": {key: summary.get(key) for key in NUMBERS},
        })
        logged = record["rounds_logged"]
        record["rounds_logged_twice"] = sorted({r for r in logged if logged.count(r) > 1})
        if name == "resume_after_end":
            record["resumes_refused"] = resume_after_end(results)
        record.update(status_of(results, summary))
    finally:
        record["left_running"] = dep.procs.stop()
    if name == "nodes_20":
        record["same_config_elsewhere"] = other_engines(load_config(config_path, []), workdir)
    return record


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def resume_after_end(results: Path) -> list[dict[str, Any]]:
    """``graphfed run --resume`` on the finished run, with its own config and a changed one: the exit code and
    output of each, what ``graphfed status`` said after, and whether the folder kept every byte."""
    before = folder_bytes(results)
    tried = []
    for label, extra in (("same config", []), ("changed config", ["--set", "train.lr=0.5"])):
        done = subprocess.run([str(VENV_BIN / "graphfed"), "run", str(results / "config.yaml"), "--out", str(results),
                               "--resume", "--no-progress", *extra], capture_output=True, text=True, timeout=300)
        told = subprocess.run([str(VENV_BIN / "graphfed"), "status", str(results)], capture_output=True, text=True,
                              timeout=120)
        output = (done.stdout + done.stderr).strip()
        tried.append({"config": label, "exit": done.returncode, "lines": len(output.splitlines()), "output": output,
                      "status_exit": told.returncode, "status_line": told.stdout.strip(),
                      "folder_unchanged": folder_bytes(results) == before})
    return tried


def status_of(results: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """What ``graphfed status`` tells a supervisor about the run, and whether its exit code fits the summary."""
    told = subprocess.run([str(VENV_BIN / "graphfed"), "status", str(results)], capture_output=True, text=True,
                          timeout=120)
    state = str(summary.get("status", "none")).split(":")[0]
    return {"status_line": told.stdout.strip(), "status_exit": told.returncode,
            "status_ok": told.returncode == STATUS_EXIT.get(state, 3)}


def simulated_stragglers(workdir: Path, nodes: int, rounds: int) -> dict[str, Any]:
    """The simulator's model of a slow client (``train.stragglers``): one client in four uploads a round late."""
    config_path = workdir / "run.yaml"
    config_path.write_text(CONFIG.format(clients=nodes, rounds=rounds, eval_every=1, train_extra="", round_timeout=120,
                                         flower_extra=""))
    from graphfed.sim.engine import run_config

    result = run_config(load_config(config_path, ["train.stragglers=0.25", "train.straggler_delay=1"]),
                        progress=False)
    return {"scenario": "sim_stragglers", "nodes": nodes, "rounds": rounds, "engine": "simulator",
            "status": result.status, "stragglers": result.stragglers, "late_uploads": result.late_uploads,
            "lost_uploads": result.lost_uploads, "numbers": {key: getattr(result, key) for key in NUMBERS}}


def other_engines(config: RunConfig, workdir: Path) -> dict[str, float | None]:
    """Seconds per round (train + evaluate) of the same config on graphfed's simulator and on Flower's message path
    in one process (the in-process grid: serialisation and one client at a time, no processes)."""
    from graphfed.flower import protocol
    from graphfed.flower.app import run_on_grid
    from graphfed.flower.client import client_app
    from graphfed.flower.inprocess import InProcessGrid
    from graphfed.sim.engine import run_config

    run_config(config, workdir / "sim", progress=False)
    grid = InProcessGrid(client_app, config.dataset.num_clients or 0, {protocol.RUN_CONFIG_KEY: dump_config(config)},
                         state_dir=workdir / "inprocess-state")
    run_on_grid(grid, config, workdir / "inprocess")
    return {"simulator_seconds_per_round": seconds_per_round(workdir / "sim", 3),
            "inprocess_grid_seconds_per_round": seconds_per_round(workdir / "inprocess", 3)}


def seconds_per_round(out_dir: Path, digits: int) -> float | None:
    """Mean seconds per round (train + evaluate) from ``rounds.jsonl``, round 1 left out: it also asks every node
    for its client id."""
    times = round_times(out_dir)[1:]
    return round(statistics.fmean(times), digits) if times else None


def inject(name: str, dep: Deployment) -> None:
    procs = dep.procs
    if name in ("node_killed", "node_restarted"):
        procs.get(f"supernode{VICTIM}").signal_group(signal.SIGKILL)
        if name == "node_restarted":
            time.sleep(5.0)
            dep.start_supernode(VICTIM)
    elif name == "min_replies_stop":
        procs.get(f"supernode{VICTIM}").signal_group(signal.SIGKILL)
    elif name.startswith("node_paused"):  # a straggler: the node stops answering for a while, then carries on as itself
        victim = procs.get(f"supernode{VICTIM}")
        victim.signal_group(signal.SIGSTOP)
        time.sleep(PAUSE_SECONDS)
        victim.signal_group(signal.SIGCONT)
    elif name == "serverapp_killed":
        pids = serverapp_pids(dep)
        if not pids:
            raise RuntimeError("no flwr-serverapp process found to kill")
        for pid in pids:
            subprocess.run(["kill", "-9", str(pid)], check=False)
    elif name in RESTARTS:
        superlink = procs.get("superlink")
        superlink.popen.send_signal(signal.SIGKILL)  # the SuperLink alone: its SuperExec and ServerApp stay
        superlink.popen.wait(timeout=30)
        if name == "superlink_restarted":
            time.sleep(3.0)  # (at once otherwise: within the first ServerApp's retries, so that it may reconnect)
        dep.start_superlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fault-after", type=int, default=2, help="inject once this many rounds are evaluated")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    code = code_provenance()  # the code that runs the scenarios, taken before they start (the tree may change after)
    names = [name for name in args.scenarios.split(",") if name]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    records = {record["scenario"]: record for record in previous.get("scenarios", [])}
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"graphfed-faults-{name}-") as workdir:
            nodes, rounds = (20, 2) if name == "nodes_20" else (args.nodes, args.rounds)
            print(f"{name}: {nodes} nodes, {rounds} rounds ...", flush=True)
            try:
                records[name] = scenario(name, Path(workdir), nodes, rounds, args.fault_after)
            except Exception as err:  # a scenario that breaks is a finding too: record it, go on
                records[name] = {"scenario": name, "nodes": nodes, "rounds": rounds,
                                 "status": f"harness error: {type(err).__name__}: {err}"[:300]}
            # each scenario keeps the code that ran it (a later run of other scenarios leaves it as it was)
            records[name]["code"] = {key: code[key] for key in ("code_id", "git_commit", "dirty")}
            print(json.dumps({k: v for k, v in records[name].items() if k != "numbers"}), flush=True)
    reference = records.get("none", {}).get("numbers")
    for record in records.values():
        if record.get("nodes") == args.nodes and "numbers" in record and reference:
            record["same_numbers_as_none"] = record["numbers"] == reference
        record["survived"] = str(record.get("status")) == "completed"
    import flwr
    import torch

    document = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                            "flwr": flwr.__version__, "cpus": __import__("os").cpu_count()},
                "method": "ditto", "dataset": "fln (one client per SuperNode, every client every round)",
                "scenarios": [records[name] for name in SCENARIOS if name in records]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document["code"] = code  # the code of this invocation; each scenario names its own under "code"
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
