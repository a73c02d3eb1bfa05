"""Does the chunk-size calibration pick the same plan every time? Five fresh calibrations per realistic cell.

The realistic LeNet of ``cpu_grid.py --realistic`` (PFLlib's CIFAR-10 CNN: 32 / 64 / 512 / 10) on the real CIFAR-10
Dir(0.1) clients of 20 and 100-client splits, 50 and 10 local steps, batch 10 and 32: each cell's calibration
(``graphfed.client.autotune.choose_clients_per_chunk``, as a run makes it at its start) is run five times, each with
an empty cache (as on a new machine), and its pick, its time and how sure it was are recorded. The BatchNorm networks
train one client at a time on a CPU whatever the chunk size, so they have nothing to calibrate.

    .venv/bin/python benchmarks/calibration_repeat.py    # -> benchmarks/results/calibration_repeat.json (~1 minute)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_grid import DATA, REALISTIC_MODELS, cifar_clients, cifar_model, fresh_calibration
from graphfed.client.contract import LocalTraining
from graphfed.core.params import ParamSpec
from graphfed.provenance import code_provenance
from graphfed.runs import atomic_write_text

OUT = Path(__file__).resolve().parent / "results" / "calibration_repeat.json"
CELLS = ((20, 50), (100, 10))  # (clients of the split, local steps)
BATCHES = (10, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(2)
    name, options = REALISTIC_MODELS[0]
    cells: list[dict[str, Any]] = []
    for clients, steps in CELLS:
        data = cifar_clients(clients, DATA)
        for batch in BATCHES:
            picks = []
            for _ in range(args.repeats):
                torch.manual_seed(0)
                model = cifar_model(name, options)
                choice, seconds = fresh_calibration(model, ParamSpec.from_module(model), data,
                                                    LocalTraining(steps, batch, 0.05), data.num_clients)
                picks.append({"clients_per_chunk": choice.clients_per_chunk, "seconds": round(seconds, 3),
                              "certainty": choice.record().get("certainty")})
            chosen = {pick["clients_per_chunk"] for pick in picks}
            cells.append({"model": name, "clients": clients, "steps": steps, "batch": batch, "picks": picks,
                          "same_every_time": len(chosen) == 1})
            print(f"{name} {clients} clients x {steps} steps, batch {batch}: "
                  f"{[pick['clients_per_chunk'] for pick in picks]} in "
                  f"{[pick['seconds'] for pick in picks]} s", flush=True)
    result = {"benchmark": "calibration_repeat", "code": code_provenance(), "threads": 2, "repeats": args.repeats,
              "cells": cells, "all_same": all(cell["same_every_time"] for cell in cells)}
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
