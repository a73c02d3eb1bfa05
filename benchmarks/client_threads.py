"""What training loop-client networks (CNN-BN, ResNet-like) on the CPU could gain from running clients side by side,
one intra-op thread each, instead of one client at a time on every thread (today's path, ``train_clients``).

Real CIFAR-10 Dir(0.1) clients (8 of a 20-client split), 50 plain-SGD steps, batch 10 and 32, 2 threads: graphfed's
``train_clients`` (one client at a time, 2 intra-op threads) against the same clients trained by
``graphfed.client.training.train_one_module`` on 2 Python threads with 1 intra-op thread each, interleaved in
alternating order, best of ``--repeats``. It also records whether the side-by-side weights equal a 1-thread run's
and a 2-thread run's bit for bit: convolutions sum in a thread-count-dependent order, so it keeps a run's numbers
only at ``torch_threads: 1``, which is where graphfed now uses it (``graphfed.client.side_by_side``; the realistic
cells of ``cpu_grid.py`` time it against the loop).

    .venv/bin/python benchmarks/client_threads.py      # -> benchmarks/results/client_threads.json (~5 minutes)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_grid import DATA, cifar_clients, cifar_model
from graphfed.client.contract import LocalTraining, plain_sgd
from graphfed.client.training import train_clients, train_one_module
from graphfed.core.params import ParamSpec
from graphfed.provenance import code_provenance

OUT = Path(__file__).resolve().parent / "results" / "client_threads.json"
MODELS = (("cnn-bn", {}), ("resnet-like", {"width": 8}))


def measure(model_name: str, options: dict[str, Any], batch: int, clients: int, repeats: int) -> dict[str, Any]:
    data = cifar_clients(20, DATA).select(torch.arange(clients))
    torch.manual_seed(0)
    model = cifar_model(model_name, options)
    spec = ParamSpec.from_module(model)
    model.clients_per_chunk = 1
    start = spec.flatten_module(model).unsqueeze(0).repeat(clients, 1)
    rule = plain_sgd(spec, "classification", LocalTraining(50, batch, 0.05))
    seeds = list(range(clients))
    pool = ThreadPoolExecutor(2)

    def one(client: int) -> torch.Tensor:
        rows = torch.tensor([client])
        return train_one_module(model, spec, start[rows], data.select(rows), rule, [seeds[client]]).trained[0]

    def one_at_a_time(threads: int) -> torch.Tensor:
        torch.set_num_threads(threads)
        return train_clients(model, spec, start, data, rule, seeds).trained

    def side_by_side() -> torch.Tensor:
        torch.set_num_threads(1)
        try:
            return torch.stack(list(pool.map(one, range(clients))))
        finally:
            torch.set_num_threads(2)

    sides = {"one_at_a_time": lambda: one_at_a_time(2), "side_by_side": side_by_side}
    outputs = {name: run() for name, run in sides.items()}
    single_thread = one_at_a_time(1)
    best = dict.fromkeys(sides, float("inf"))
    for repeat in range(repeats):
        for name, run in (sides.items() if repeat % 2 == 0 else reversed(sides.items())):
            begin = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - begin)
    torch.set_num_threads(2)
    return {"model": model_name, "options": options, "clients": clients, "steps": 50, "batch": batch,
            "seconds": {name: round(seconds, 3) for name, seconds in best.items()},
            "speedup": round(best["one_at_a_time"] / best["side_by_side"], 3),
            "side_by_side_equals_1_thread": bool(torch.equal(outputs["side_by_side"], single_thread)),
            "side_by_side_equals_2_threads": bool(torch.equal(outputs["side_by_side"], outputs["one_at_a_time"]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    cells = []
    for model_name, options in MODELS:
        for batch in (10, 32):
            cell = measure(model_name, options, batch, args.clients, args.repeats)
            cells.append(cell)
            print(f"{model_name:12s} batch {batch:3d}: one at a time {cell['seconds']['one_at_a_time']:.2f} s, side by "
                  f"side {cell['seconds']['side_by_side']:.2f} s: {cell['speedup']:.2f}x; equals 1 thread "
                  f"{cell['side_by_side_equals_1_thread']}, 2 threads {cell['side_by_side_equals_2_threads']}",
                  flush=True)
    document = {"benchmark": "client_threads", "threads": 2, "cells": cells, "code": code_provenance()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
