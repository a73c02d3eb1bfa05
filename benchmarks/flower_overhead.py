"""What running on Flower costs: per-round wall time of the same graphfed run on three engines.

* ``sim``: graphfed's vectorised simulator (:func:`graphfed.sim.engine.run_config`), all clients in one tensor;
* ``inprocess``: the Flower engine's server loop (:func:`graphfed.flower.app.run_on_grid`) on an in-process
  Grid (:class:`graphfed.flower.inprocess.InProcessGrid`): one Flower ``Message`` per client and round,
  serialised into ``ArrayRecord``/``ConfigRecord``, handled by the real ``ClientApp`` one client at a time,
  no network and no extra processes, i.e. protocol + serialisation + per-client (unvectorised) training;
* ``flwr-sim``: ``flwr run APP`` local simulation (a local SuperLink, the ServerApp in its own process,
  ClientApps in Ray actors, ``client-resources-num-cpus=1``).

Each run writes its usual run directory; per-round times are the differences of ``wall_seconds`` in
``rounds.jsonl`` (evaluation every round, so every round is train + evaluate; round 1 of the Flower engines
also asks every node for its client id). For ``flwr-sim`` the total wall time of the ``flwr run`` command is
split into start-up (launch until the ServerApp's round loop starts: local SuperLink, Ray, ServerApp process,
waiting for nodes; read from the run directory's ``config.yaml`` mtime), the loop, and shut-down (the rest).
The engines must agree on the result: the summary's ``test_mean`` is reported for each.

    .venv/bin/python benchmarks/flower_overhead.py                          # FL-N, 6 clients, 5 rounds
    .venv/bin/python benchmarks/flower_overhead.py --engines sim,inprocess --rounds 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from graphfed.config import RunConfig, dump_config, load_config
from graphfed.provenance import code_provenance
from graphfed.runs import RunResult, read_result

RESULTS = Path(__file__).resolve().parent / "results"
ENGINES = ("sim", "inprocess", "flwr-sim")
VENV_BIN = Path(sys.executable).parent  # not resolved: the venv's python is a symlink
MARKER_VAR = "GRAPHFED_FLOWER_BENCH_ID"
SMALL_OPTIONS = {
    "pfedhn": "method.options={hidden: 16, embedding_dim: 4}",
    "panacea": "method.options={embedding_dim: 8, gnn_hidden: 16, hypernet_hidden: 16, server_steps: 2}",
}


def bench_config(method: str, clients: int, rounds: int, local_steps: int, extra: list[str]) -> RunConfig:
    """FL-N with ``clients`` clients (no novel ones), every client every round, evaluation every round."""
    overrides = [
        "dataset.name=fln", f"dataset.num_clients={clients}", "dataset.novel_fraction=0",
        "model.options={hidden: 16}", f"method.name={method}", f"train.rounds={rounds}", "train.eval_every=1",
        f"train.clients_per_round={clients}", f"train.local_steps={local_steps}", "train.batch_size=32",
        "torch_threads=1", "flower.round_timeout=600", "flower.query_timeout=120", "flower.node_wait_timeout=300",
    ]
    if method in SMALL_OPTIONS:
        overrides.append(SMALL_OPTIONS[method])
    return load_config(None, [*overrides, *extra])


def round_times(out_dir: Path) -> list[float]:
    """Seconds per round from ``rounds.jsonl`` (cumulative ``wall_seconds`` -> differences)."""
    lines = [json.loads(line) for line in (out_dir / "rounds.jsonl").read_text().splitlines() if line.strip()]
    walls = [float(r["wall_seconds"]) for r in lines]
    return [b - a for a, b in zip([0.0, *walls[:-1]], walls, strict=True)]


def measured(out_dir: Path, launched: float, total: float, summary: RunResult) -> dict[str, Any]:
    """Split ``total`` seconds into start-up (launch until the round loop starts, i.e. until the run writes
    ``config.yaml``), the loop (``rounds.jsonl``) and the rest (novel clients, summary, plots, shut-down)."""
    rounds = round_times(out_dir)
    loop = sum(rounds)
    startup = (out_dir / "config.yaml").stat().st_mtime - launched
    return {"total_s": total, "startup_s": startup, "loop_s": loop, "shutdown_s": total - startup - loop,
            "round_s": rounds, "status": summary.status, "test_mean": summary.test_mean,
            "dropped_clients": len(summary.dropped_clients or [])}


def timed(run: Callable[[Path], RunResult], out_dir: Path) -> dict[str, Any]:
    launched, tick = time.time(), time.perf_counter()
    summary = run(out_dir)
    return measured(out_dir, launched, time.perf_counter() - tick, summary)


# ---- engines ----------------------------------------------------------------------------------------------
def run_sim(config: RunConfig, out_dir: Path, timeout: float) -> dict[str, Any]:
    from graphfed.sim.engine import run_config

    return timed(lambda out: run_config(config, out, progress=False), out_dir)


def run_inprocess(config: RunConfig, out_dir: Path, timeout: float) -> dict[str, Any]:
    from graphfed.flower import protocol
    from graphfed.flower.app import client_app, run_on_grid
    from graphfed.flower.inprocess import InProcessGrid

    def run(out: Path) -> dict[str, Any]:
        grid = InProcessGrid(client_app, config.dataset.num_clients or 0,
                             {protocol.RUN_CONFIG_KEY: dump_config(config)})
        return run_on_grid(grid, config, out)

    return timed(run, out_dir)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _marked(marker: str) -> list[int]:
    """Live processes whose environment carries ``MARKER_VAR=marker`` (all that one ``flwr run`` started)."""
    needle = f"{MARKER_VAR}={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (needle in (entry / "environ").read_bytes().split(b"\0")
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _reap(marker: str, grace: float = 20.0) -> list[int]:
    """SIGTERM, then SIGKILL, whatever carries the marker (the detached local SuperLink and its SuperExec)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _marked(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while _marked(marker) and time.monotonic() < deadline:
            time.sleep(0.5)
    return _marked(marker)


def run_flwr_sim(config: RunConfig, out_dir: Path, timeout: float) -> dict[str, Any]:
    """``flwr run`` local simulation with a private FLWR_HOME and SuperLink port; everything it leaves
    running is stopped afterwards."""
    from graphfed.flower.app_folder import write_app_folder

    work = out_dir.parent / f"{out_dir.name}-flwr"
    home, app = work / "flwr-home", work / "app"
    home.mkdir(parents=True)
    (home / "config.toml").write_text('[superlink]\ndefault = "sim"\n\n[superlink.sim]\n'
                                      'address = ":local-in-memory:"\n')
    write_app_folder(config, app, out_dir)
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLWR_", "RAY_"))}
    env.update({"FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
                "RAY_USAGE_STATS_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()), "PYTHONUNBUFFERED": "1",
                "PATH": os.pathsep.join([str(VENV_BIN), env.get("PATH", "")]), MARKER_VAR: marker})
    clients = config.dataset.num_clients
    args = [str(VENV_BIN / "flwr"), "run", str(app), "sim", "--federation-config",
            f"num-supernodes={clients} client-resources-num-cpus=1", "--stream"]
    log = work / "flwr-run.log"
    try:
        with log.open("wb") as out:
            launched, tick = time.time(), time.perf_counter()
            done = subprocess.run(args, env=env, cwd=work, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                  check=False)
            total = time.perf_counter() - tick
    except subprocess.TimeoutExpired:
        raise SystemExit(f"flwr run took over {timeout:.0f} s; log: {log}") from None
    finally:
        left = _reap(marker)
        if left:
            print(f"warning: processes {left} of the flwr run survived SIGKILL", file=sys.stderr)
    summary_path = out_dir / "summary.json"
    if not summary_path.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"flwr run (exit {done.returncode}) wrote no summary.json:\n{tail}")
    row = measured(out_dir, launched, total, read_result(out_dir))
    row["flwr_exit_code"] = done.returncode
    return row


RUNNERS: dict[str, Callable[[RunConfig, Path, float], dict[str, Any]]] = {
    "sim": run_sim, "inprocess": run_inprocess, "flwr-sim": run_flwr_sim}


# ---- report -----------------------------------------------------------------------------------------------
def add_derived(row: dict[str, Any]) -> None:
    rounds = row["round_s"]
    row["round1_s"] = rounds[0]
    row["later_round_s"] = statistics.fmean(rounds[1:]) if len(rounds) > 1 else None
    row["mean_round_s"] = statistics.fmean(rounds)


def table(rows: list[dict[str, Any]]) -> str:
    header = ("method", "engine", "total s", "start-up s", "round 1 s", "later rounds s/round", "x sim",
              "after loop s", "test_mean")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    sim_round = {r["method"]: r["later_round_s"] or r["mean_round_s"] for r in rows if r["engine"] == "sim"}
    for r in rows:
        later = f"{r['later_round_s']:.3f}" if r["later_round_s"] is not None else "-"
        ratio = (f"{(r['later_round_s'] or r['mean_round_s']) / sim_round[r['method']]:.0f}x"
                 if r["method"] in sim_round else "-")
        test = f"{r['test_mean']:.4f}" if r["test_mean"] is not None else "-"
        lines.append(f"| {r['method']} | {r['engine']} | {r['total_s']:.2f} | {r['startup_s']:.2f} | "
                     f"{r['round1_s']:.3f} | {later} | {ratio} | {r['shutdown_s']:.2f} | {test} |")
    return "\n".join(lines)


#: what a SuperNode's ClientApp process imports before it can answer one message (Flower starts one per message)
CLIENTAPP_IMPORTS = {"flwr alone": "import flwr.clientapp",
                     "graphfed's ClientApp": "import flwr.clientapp, graphfed.flower.app"}


def clientapp_start(out: Path, repeats: int = 7) -> None:
    """Seconds a fresh ClientApp process spends importing before it answers (median of ``repeats`` cold-ish starts),
    written into ``out`` beside the runs under ``clientapp_start``."""
    seconds = {}
    for name, code in CLIENTAPP_IMPORTS.items():
        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            times.append(time.perf_counter() - begin)
        seconds[name] = round(statistics.median(times), 3)
    document = json.loads(out.read_text()) if out.exists() else {}
    document["clientapp_start"] = {
        "median_seconds": seconds, "repeats": repeats, "load_average": os.getloadavg(), "code": code_provenance(),
        "per_round": "every node pays it twice per round (a train and an evaluate message), in parallel across nodes "
                     "but serially on a machine with fewer cores than nodes",
        "what_would_remove_it": "a ClientApp kept warm between messages; Flower 1.41 starts one process per message "
                                "by design (the SuperNode is the long-lived part), so graphfed cannot keep it warm; "
                                "the per-message cost is torch's import, which graphfed's ClientApp module cannot "
                                "avoid (it trains with torch)"}
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document["clientapp_start"]["median_seconds"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="fedavg,panacea", help="comma-separated graphfed methods")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, from {', '.join(ENGINES)}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=6, help="FL-N clients (= Flower nodes)")
    parser.add_argument("--local-steps", type=int, default=20)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="extra graphfed config override (repeatable)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per engine; the fastest loop counts")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per `flwr run`")
    parser.add_argument("--out", type=Path, default=RESULTS / "flower_overhead.json")
    parser.add_argument("--clientapp-start", action="store_true",
                        help="only measure a ClientApp process's start-up (written into --out beside the runs)")
    args = parser.parse_args()
    if args.clientapp_start:
        clientapp_start(args.out)
        return
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engine(s) {unknown}; choose from {list(ENGINES)}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    configs = {m: bench_config(m, args.clients, args.rounds, args.local_steps, args.overrides) for m in methods}
    torch.set_num_threads(1)  # as the configs' torch_threads, for the in-process engines

    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="flower_overhead_") as scratch:
        # Untimed warm-up: imports (matplotlib for the plots, torch_geometric, ...) happen once, here.
        from graphfed.sim.engine import run_config

        run_config(configs[methods[0]].model_copy(update={"train": configs[methods[0]].train.model_copy(
            update={"rounds": 1})}), Path(scratch) / "warm-up", progress=False)
        for method in methods:
            runs: dict[str, list[dict[str, Any]]] = {engine: [] for engine in engines}
            for repeat in range(args.repeats):  # engines interleaved, so they share the background load
                for engine in engines:
                    print(f"{method} on {engine} (run {repeat + 1} of {args.repeats}) ...", flush=True)
                    out_dir = Path(scratch) / f"{method}-{engine}-{repeat}"
                    runs[engine].append(RUNNERS[engine](configs[method], out_dir, args.timeout))
            for engine in engines:
                best = min(runs[engine], key=lambda r: r["loop_s"])
                best.update(method=method, engine=engine, repeats_loop_s=[r["loop_s"] for r in runs[engine]])
                add_derived(best)
                rows.append(best)
    results = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "workload": {"dataset": "fln", "clients": args.clients, "clients_per_round": args.clients,
                     "rounds": args.rounds, "eval_every": 1, "messages_per_round": 2 * args.clients,
                     "repeats": args.repeats, "local_steps": args.local_steps, "batch_size": 32,
                     "model": "mlp hidden 16", "method_options": {m: SMALL_OPTIONS.get(m) for m in methods},
                     "extra_overrides": args.overrides},
        "environment": {"torch": torch.__version__, "flwr": _flwr_version(), "python": platform.python_version(),
                        "platform": platform.platform(), "cpu_count": os.cpu_count(),
                        "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results["code"] = code_provenance()  # the numbers are tied to the code that made them
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(rows))
    print(f"wrote {args.out}")
    failed = [f"{r['method']}/{r['engine']}: {r['status']}" for r in rows if r["status"] != "completed"]
    if failed:
        raise SystemExit(f"runs that did not complete: {failed}")


def _flwr_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("flwr")
    except Exception:
        return None


if __name__ == "__main__":
    main()
