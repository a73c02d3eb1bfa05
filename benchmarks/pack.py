"""Packs on the CPU: ten seeds of a cell run one after another, then as one pack, in the same process; the ratio is
the speed-up a suite gets from ``graphfed bench`` / ``compare --seeds`` packing them (``graphfed.sim.pack``).

Cells (the paper suite's settings, fewer rounds: the ratio is per round): FL-60 with Panacea, FedAvg and Ditto
(MLP, 5 of 48 clients a round, 50 local steps), TPT-48 with Panacea, METR-LA with FedAvg on the GRU (10 of 165
sensors, 10 steps), and CIFAR-10 Dir(0.1) with FedAvg on LeNet (20 clients, 5 steps). Each pack's runs are checked
against the same runs alone, field for field (timings aside). The pack decides for itself whether to share calls
(``graphfed.client.autotune.choose_packing``), as a user's would; its choice is recorded.

    .venv/bin/python benchmarks/pack.py                    # -> benchmarks/results/pack.json (about 30 minutes)
    .venv/bin/python benchmarks/pack.py --threads 2 --out benchmarks/results/pack_2threads.json
    .venv/bin/python benchmarks/pack.py --quick --out /tmp/pack.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

from graphfed.config import RunConfig, load_config
from graphfed.provenance import code_provenance
from graphfed.runs import RunResult, atomic_write_text
from graphfed.sim import requests
from graphfed.sim.engine import run_config
from graphfed.sim.pack import Pack

RESULTS = Path(__file__).resolve().parent / "results" / "pack.json"
DATA = str((Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve())
FL60 = ["dataset.name=fl60", "dataset.novel_fraction=0.2", "model.name=mlp",
        "model.options={hidden: 16, num_layers: 3}", "train.clients_per_round=5", "train.local_steps=50",
        "train.batch_size=64", "train.lr=0.05", "train.eval_every=10"]
TPT48 = ["dataset.name=tpt48", f"dataset.data_dir={DATA}", "dataset.novel_fraction=0.2", "model.name=mlp",
         "model.options={hidden: 16, num_layers: 3}", "train.clients_per_round=5", "train.local_steps=50",
         "train.batch_size=64", "train.lr=0.1", "train.eval_every=20"]
METR = ["dataset.name=metr-la-week", f"dataset.data_dir={DATA}", "dataset.novel_fraction=0.2", "model.name=gru",
        "model.options={hidden: 100}", "train.clients_per_round=10", "train.local_steps=10", "train.batch_size=32",
        "train.lr=0.3", "train.eval_every=10"]
CIFAR = ["dataset.name=cifar10", f"dataset.data_dir={DATA}", "dataset.num_clients=20", "dataset.partition=dirichlet",
         "dataset.dirichlet_beta=0.1", "model.name=lenet", "model.options={}", "train.clients_per_round=20",
         "train.local_steps=5", "train.batch_size=32", "train.lr=0.05", "train.eval_every=5"]
#: (cell, method, base overrides, rounds, the target ratio of the issue)
CELLS = [("fl60", "panacea", FL60, 60, 4.0), ("fl60", "fedavg", FL60, 60, 4.0), ("fl60", "ditto", FL60, 60, 4.0),
         ("tpt48", "panacea", TPT48, 60, 4.0), ("metr-la-week", "fedavg", METR, 20, 4.0),
         ("cifar10-lenet", "fedavg", CIFAR, 5, 1.0)]
SKIP = {"wall_seconds", "peak_rss_mb", "execution", "code", "device"}


def comparable(result: RunResult) -> dict[str, Any]:
    return {key: value for key, value in result.model_dump(mode="json").items() if key not in SKIP}


def measure(method: str, base: list[str], rounds: int, seeds: int, threads: int = 1,
            repeats: int = 1) -> dict[str, Any]:
    configs: list[RunConfig] = [load_config(None, [*base, f"method.name={method}", f"train.rounds={rounds}",
                                                   f"torch_threads={threads}", f"seed={seed}"])
                                for seed in range(seeds)]
    one_round = [config.model_copy(update={"train": config.train.model_copy(update={"rounds": 1})})
                 for config in configs]
    # warm-up, as a user's machine is after its first run: data cached, kernels loaded, the chunk size and the
    # packing calibrated (both cached per machine; the first pack of a config pays about one run's round for it)
    run_config(one_round[0], progress=False)
    Pack(one_round)
    client_seconds = [0.0]
    serve = requests.serve

    def timed_serve(executor: Any, request: Any) -> Any:  # the clients' share of a run alone: what a pack shares
        began = time.perf_counter()
        try:
            return serve(executor, request)
        finally:
            client_seconds[0] += time.perf_counter() - began

    def one_after_another() -> tuple[float, float, list[RunResult]]:
        client_seconds[0] = 0.0
        requests.serve = timed_serve
        begin = time.perf_counter()
        try:
            alone = [run_config(config, progress=False) for config in configs]
        finally:
            requests.serve = serve
        return time.perf_counter() - begin, client_seconds[0], alone

    def as_one_pack() -> tuple[float, list[RunResult]]:
        begin = time.perf_counter()
        packed = Pack(configs).run()
        return time.perf_counter() - begin, packed

    # the two sides alternate which goes first, each after a collection, and each keeps its best time: a drift of
    # the machine, or the garbage the other side left, then lands on both sides rather than on whichever ran second
    sequential, together, client_share, equal = float("inf"), float("inf"), 0.0, True
    each: dict[str, list[float]] = {"sequential": [], "packed": []}
    for repeat in range(repeats):
        sides = ["sequential", "packed"] if repeat % 2 == 0 else ["packed", "sequential"]
        for side in sides:
            gc.collect()
            if side == "sequential":
                seconds, in_clients, alone = one_after_another()
                if seconds < sequential:
                    sequential, client_share = seconds, in_clients / seconds
            else:
                seconds, packed = as_one_pack()
                together = min(together, seconds)
            each[side].append(round(seconds, 2))
        equal = equal and all(comparable(a) == comparable(b) for a, b in zip(alone, packed, strict=True))
    return {"seeds": seeds, "rounds": rounds, "repeats": repeats, "sequential_seconds": round(sequential, 2),
            "packed_seconds": round(together, 2), "speedup": round(sequential / together, 2),
            # the rest of a run alone (server update, sampling, bookkeeping) stays per run in a pack: it bounds the
            # speed-up at 1 / (1 - client_share)
            "client_share_alone": round(client_share, 3),
            "pack": packed[0].execution["pack"], "equal_to_alone": equal, "seconds_each_repeat": each}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds, 4 rounds, the FL-60 cells only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every run, alone and packed")
    parser.add_argument("--repeats", type=int, default=3,
                        help="times each side is measured, alternating which goes first; the best of each is kept")
    parser.add_argument("--only", default=None,
                        help="comma-separated cells (e.g. cifar10-lenet/fedavg) to re-measure into an existing --out")
    args = parser.parse_args()
    result: dict[str, Any] = {"benchmark": "pack", "code": code_provenance(), "quick": args.quick,
                              "threads": args.threads, "cells": {}}
    only = set(args.only.split(",")) if args.only else None
    if only and args.out.exists():  # the other cells stay as measured; each cell records its own code id
        result["cells"] = json.loads(args.out.read_text())["cells"]
    for cell, method, base, rounds, target in CELLS:
        if (args.quick and cell != "fl60") or (only and f"{cell}/{method}" not in only):
            continue
        row = measure(method, base, 4 if args.quick else rounds, 3 if args.quick else 10, args.threads,
                      1 if args.quick else args.repeats)
        row["target_speedup"] = target
        row["code_id"] = code_provenance()["code_id"]
        result["cells"][f"{cell}/{method}"] = row
        print(f"{cell}/{method}: {row['seeds']} seeds x {row['rounds']} rounds: one after another "
              f"{row['sequential_seconds']:.1f} s, packed {row['packed_seconds']:.1f} s: {row['speedup']:.2f}x "
              f"(target {target:g}x; shared calls {row['pack']['batched']}; clients' share alone "
              f"{row['client_share_alone']:.0%}; equal {row['equal_to_alone']})",
              flush=True)
        atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
