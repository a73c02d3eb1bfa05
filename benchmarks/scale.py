"""Many clients: per-round time and peak memory of the graph methods as the federation grows.

FL-N (Panacea's rotating two-class toy, 100 points per client, the FL-60 MLP) with a sparse client graph
(``dataset.graph_knn``: each client linked to its k nearest clients by angle; the paper's Bernoulli graph is
dense by construction). For each method and client count N, a fresh process builds the simulator, runs one
untimed warm-up round, then ``--rounds`` timed rounds of ``--clients-per-round`` clients, then one
evaluation of all N clients (timed on its own, and the collaboration graph the method would save). Peak RSS
is the process's ``ru_maxrss``.

The fitted exponent is the slope of log(per-round seconds) against log(N) over the client counts given;
graphfed's target is <= 1.2 for every method but pFedGAT, whose attention over all pairs is N^2 by definition.

    .venv/bin/python benchmarks/scale.py                          # N = 1,000 and 10,000 -> results/scale.json
    .venv/bin/python benchmarks/scale.py --clients 1000,3000 --methods fedavg,panacea
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from graphfed.provenance import code_provenance

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("fedavg", "panacea", "fedaghn", "pfedgat", "pfedhn")


def measure_one(method: str, num_clients: int, rounds: int, per_round: int, knn: int, seed: int) -> dict[str, Any]:
    """Runs in its own process (peak RSS is per process)."""
    import torch

    from graphfed.config import load_config
    from graphfed.sim.engine import Simulator

    torch.set_num_threads(2)
    config = load_config(None, [f"method.name={method}", "dataset.name=fln", f"dataset.num_clients={num_clients}",
                                f"dataset.graph_knn={knn}", "model.name=mlp", f"train.rounds={rounds + 1}",
                                f"train.clients_per_round={per_round}", "train.local_steps=10",
                                "train.batch_size=32", f"seed={seed}"])
    begin = time.perf_counter()
    simulator = Simulator(config, out_dir=None, progress=False)
    setup_seconds = time.perf_counter() - begin
    simulator.run_round(0)  # warm-up: first-call allocations, lazy imports
    times = []
    for round_index in range(1, rounds + 1):
        begin = time.perf_counter()
        simulator.run_round(round_index)
        times.append(time.perf_counter() - begin)
    begin = time.perf_counter()
    simulator.evaluate(rounds)
    evaluation_seconds = time.perf_counter() - begin
    begin = time.perf_counter()
    graph = simulator.setup.method.collaboration_graph(simulator.graph_rows())
    graph_seconds = time.perf_counter() - begin
    edges = simulator.setup.federation.client_graph
    return {"method": method, "clients": num_clients, "clients_per_round": per_round, "rounds_timed": rounds,
            "graph_edges": int((edges > 0).sum()) // 2 if edges is not None else 0,
            "setup_seconds": setup_seconds, "round_seconds": sorted(times)[len(times) // 2],
            "round_seconds_all": times, "evaluation_seconds": evaluation_seconds,
            "collaboration_graph_shape": list(graph.shape) if graph is not None else None,
            "collaboration_graph_seconds": graph_seconds,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def fitted_exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(seconds) on log(N)."""
    if len(points) < 2:
        return None
    xs, ys = [math.log(n) for n, _ in points], [math.log(t) for _, t in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
            / sum((x - mean_x) ** 2 for x in xs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1000,10000", help="comma-separated client counts N")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (the median counts)")
    parser.add_argument("--clients-per-round", type=int, default=20)
    parser.add_argument("--knn", type=int, default=10, help="dataset.graph_knn of the FL-N graph")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)  # child process
    args = parser.parse_args(argv)
    if args.one:
        result = measure_one(args.one[0], int(args.one[1]), args.rounds, args.clients_per_round, args.knn, args.seed)
        print(json.dumps(result))
        return 0
    counts = [int(n) for n in args.clients.split(",")]
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    cells = results.setdefault("cells", {})
    code_id = code_provenance()["code_id"]  # per cell: a resumed file may hold cells from other code
    for method in args.methods.split(","):
        for n in counts:
            command = [sys.executable, __file__, "--one", method, str(n), "--rounds", str(args.rounds),
                       "--clients-per-round", str(args.clients_per_round), "--knn", str(args.knn),
                       "--seed", str(args.seed)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                cells[f"{method}/{n}"] = {"method": method, "clients": n, "error": done.stderr.strip()[-2000:],
                                            "code_id": code_id}
                print(f"{method} N={n}: FAILED\n{done.stderr[-2000:]}")
            else:
                cell = json.loads(done.stdout.strip().splitlines()[-1])
                cells[f"{method}/{n}"] = {**cell, "code_id": code_id}
                print(f"{method} N={n}: {cell['round_seconds']:.3f} s/round, evaluation "
                      f"{cell['evaluation_seconds']:.2f} s, peak RSS {cell['peak_rss_gib']:.2f} GiB")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    exponents = {}
    for method in {cell["method"] for cell in cells.values()}:
        points = sorted((cell["clients"], cell["round_seconds"]) for cell in cells.values()
                        if cell["method"] == method and "round_seconds" in cell)
        exponents[method] = fitted_exponent(points)
    results["round_time_exponent"] = exponents
    results["settings"] = {"rounds": args.rounds, "clients_per_round": args.clients_per_round, "knn": args.knn,
                           "seed": args.seed, "model": "mlp (FL-60 target network)", "local_steps": 10,
                           "batch_size": 32}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("fitted exponent of per-round time in N:", {k: None if v is None else round(v, 2)
                                                      for k, v in exponents.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
