"""Peak memory of an imbalanced bring-your-own federation: one 600,000-row client beside 19 tiny ones.

Real federations are that imbalanced. The folder (written to a temporary directory; 32 float32 features, 5
classes, 50 rows per tiny client) is run with FedAvg through the ``graphfed run`` CLI, as a user would: all 20
clients per round, 10 local steps, evaluation every round. The CLI runs in a child process whose peak RSS
(``ru_maxrss``) is reported beside the size of the data itself and of the padded copy graphfed used to make
(every client padded to the largest: 20 x 600,000 rows).

    .venv/bin/python benchmarks/imbalanced_folder.py        # writes benchmarks/results/imbalanced_folder.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from graphfed.data.datasets.folder import write_federation
from graphfed.provenance import code_provenance
from graphfed.runs import read_result

RESULTS = Path(__file__).resolve().parent / "results"
FEATURES, CLASSES, TINY_ROWS = 32, 5, 50


def write_folder(root: Path, big_rows: int, tiny_clients: int, seed: int) -> int:
    """The federation; returns its data size in bytes (x float32 + y int64, every split)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32)
    total = 0
    clients = {}
    for index, rows in enumerate([big_rows] + [TINY_ROWS] * tiny_clients):
        splits = {}
        for split, share in (("train", 0.8), ("val", 0.1), ("test", 0.1)):
            count = max(2, int(rows * share))
            y = rng.integers(0, CLASSES, count)
            x = (centres[y] + rng.normal(size=(count, FEATURES))).astype(np.float32)
            splits[split] = (x, y)
            total += x.nbytes + y.nbytes
        clients[f"client{index:02d}"] = splits
    write_federation(root, clients, meta={"task": "classification", "name": "imbalanced"})
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big-rows", type=int, default=600_000)
    parser.add_argument("--tiny-clients", type=int, default=19)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "imbalanced_folder.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "federation"
        data_bytes = write_folder(folder, args.big_rows, args.tiny_clients, args.seed)
        clients = args.tiny_clients + 1
        graphfed = Path(sys.executable).parent / "graphfed"
        config = Path(tmp) / "config.yaml"
        config.write_text("seed: 0\n", encoding="utf-8")
        command = [str(graphfed), "run", str(config), "--set", "dataset.name=folder",
                   "--set", f"dataset.data_dir={folder}",
                   "--set", "method.name=fedavg", "--set", "model.name=mlp", "--set", f"train.rounds={args.rounds}",
                   "--set", f"train.clients_per_round={clients}", "--set", "train.local_steps=10",
                   "--set", "train.eval_every=1", "--set", "torch_threads=2", "--out", str(Path(tmp) / "run"),
                   "--no-progress"]
        begin = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - begin
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
            return 1
        summary = read_result(Path(tmp) / "run")
    train_rows_big = max(2, int(args.big_rows * 0.8))
    padded_bytes = clients * train_rows_big * (FEATURES * 4 + 8)  # the train split alone, padded
    result: dict[str, Any] = {
        "clients": clients, "big_client_rows": args.big_rows, "tiny_client_rows": TINY_ROWS, "features": FEATURES,
        "rounds": args.rounds, "seconds": seconds, "peak_rss_gib": peak / 2**30, "data_gib": data_bytes / 2**30,
        "padded_train_split_gib_before": padded_bytes / 2**30,
        "peak_minus_data_gib": (peak - data_bytes) / 2**30, "under_1_gib": peak < 2**30,
        "test_mean": summary.test_mean,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result["code"] = code_provenance()  # the numbers are tied to the code that made them
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"imbalanced folder: peak RSS {result['peak_rss_gib']:.2f} GiB for {result['data_gib']:.2f} GiB of data "
          f"(padding the train split alone used to take {result['padded_train_split_gib_before']:.2f} GiB); "
          f"{seconds:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
