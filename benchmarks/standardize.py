"""``dataset.standardize``: none, client or pooled, measured on the tabular federations graphfed ships or teaches.

Which scaling to recommend depends on what separates the clients. Each federation below is written to a temporary
folder and run with FedAvg and Local (all clients every round, 40 rounds of 10 local steps, 5 seeds) under each
``dataset.standardize``; a cell's score is the run's test accuracy (mean over clients at its best validation
round). Against the best scaling of each (federation, method) the other two are tested with Welch's two-sided
t-test over the seeds, Holm-adjusted across the two comparisons, at 5 % (``graphfed.report.verdicts.standings``).

* ``example``: ``graphfed.data.datasets.folder.write_example_federation`` (8 clients, 3-class blobs, features on one
  scale);
* ``clinics``: the tutorial's six clinics (three features on one scale, two groups with different label mixes);
* ``hospitals-marker``: four hospitals whose label is a 0.002-sized marker beside raw cholesterol (about 300) and
  age (about 55): features on scales 1000x apart (the tests' federation);
* ``hospitals-site``: four hospitals with a column that is constant within a hospital (a site covariate, e.g. its
  assay's calibration or its altitude) which moves the label, and a feature each hospital records in its own units
  (the audit's finding: per-client scaling turns the constant column into 0 and removes what it says).

    .venv/bin/python benchmarks/standardize.py      # writes benchmarks/results/standardize.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

import numpy as np

from graphfed.config import load_config
from graphfed.data.datasets.folder import write_example_federation, write_federation
from graphfed.provenance import code_provenance
from graphfed.report.verdicts import standings
from graphfed.sim.engine import run_config

RESULTS = Path(__file__).resolve().parent / "results"
SCALINGS = ("none", "client", "pooled")
METHODS = ("fedavg", "local")


def clinics(root: Path) -> Path:
    """The tutorial's six clinics (docs/tutorial.md, section 3), written with write_federation."""
    rng = np.random.default_rng(0)
    clients = {}
    for client in range(6):
        group = client // 3
        splits = {}
        for split, rows in (("train", 120), ("val", 30), ("test", 30)):
            y = (rng.random(rows) < (0.25 if group == 0 else 0.75)).astype(np.int64)
            x = rng.normal(size=(rows, 3)) + y[:, None] * (1.0 + group)
            splits[split] = (x.astype(np.float32), y)
        clients[f"clinic{client}"] = splits
    return write_federation(root, clients, meta={"name": "clinics", "features": ["age", "bp", "marker"]})


def hospitals_marker(root: Path) -> Path:
    """The tests' hospitals (tests/test_scales_and_units.py): a small marker beside cholesterol and age."""
    rng = np.random.default_rng(0)
    clients = {}
    for c in range(4):
        splits = {}
        for split, n in (("train", 120), ("val", 40), ("test", 60)):
            y = (rng.random(n) < (0.8 if c % 2 else 0.2)).astype(np.int64)
            marker = np.where(y == 1, 1.0, -1.0) * 0.002 + 0.0005 * rng.standard_normal(n)
            rows = np.stack([300.0 + 60.0 * rng.standard_normal(n), 55 + 10 * rng.standard_normal(n), marker], 1)
            splits[split] = (rows.astype(np.float32), y)
        clients[f"hospital{c}"] = splits
    return write_federation(root, clients, meta={"name": "hospitals-marker",
                                                 "features": ["cholesterol", "age", "marker"]}, fmt="csv")


def hospitals_site(root: Path) -> Path:
    """Four hospitals: ``site`` is constant within a hospital and shifts the label's threshold; ``dose`` is recorded
    in each hospital's own units (x1, x10, x100, x1000), and ``age`` on one scale."""
    rng = np.random.default_rng(1)
    sites, units = (-1.5, -0.5, 0.5, 1.5), (1.0, 10.0, 100.0, 1000.0)
    clients = {}
    for c in range(4):
        splits = {}
        for split, n in (("train", 150), ("val", 50), ("test", 80)):
            dose, age = rng.standard_normal(n), rng.standard_normal(n)
            y = (dose + 0.5 * age + sites[c] + 0.3 * rng.standard_normal(n) > 0).astype(np.int64)
            rows = np.stack([np.full(n, 50.0 + 10.0 * sites[c]), units[c] * dose, 60 + 10 * age], 1)
            splits[split] = (rows.astype(np.float32), y)
        clients[f"hospital{c}"] = splits
    return write_federation(root, clients, meta={"name": "hospitals-site", "features": ["site", "dose", "age"]})


FEDERATIONS: dict[str, Callable[[Path], Path]] = {
    "example": lambda root: write_example_federation(root, num_clients=8, seed=0),
    "clinics": clinics, "hospitals-marker": hospitals_marker, "hospitals-site": hospitals_site}


def score(folder: Path, method: str, scaling: str, seed: int, rounds: int) -> float:
    clients = len(list((folder / "clients").iterdir()))
    config = load_config(None, ["dataset.name=folder", f"dataset.data_dir={folder}", "dataset.novel_fraction=0",
                                f"dataset.standardize={scaling}", f"method.name={method}", f"seed={seed}",
                                f"train.rounds={rounds}", "train.local_steps=10", "train.batch_size=16",
                                f"train.clients_per_round={clients}", "train.eval_every=5", "train.lr=0.05",
                                "model.options={hidden: 16}", "torch_threads=1"])
    result = run_config(config, progress=False)
    assert result.test_mean is not None
    return result.test_mean


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", type=Path, default=RESULTS / "standardize.json")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, write in FEDERATIONS.items():
            folder = write(Path(scratch) / name)
            for method in METHODS:
                per_seed = {scaling: [score(folder, method, scaling, seed, args.rounds) for seed in range(args.seeds)]
                            for scaling in SCALINGS}
                ranked = {s.method: s for s in standings(per_seed, higher_is_better=True)}
                for scaling, values in per_seed.items():
                    standing = ranked[scaling]
                    cells.append({"federation": name, "method": method, "standardize": scaling,
                                  "accuracy_mean": fmean(values), "accuracy_std": stdev(values),
                                  "per_seed": values, "against_the_best": standing.relation,
                                  "p_holm": standing.p_holm})
                    print(f"{name:17s} {method:7s} {scaling:7s} {100 * fmean(values):6.2f} ± "
                          f"{100 * stdev(values):5.2f} %  {standing.text()}", flush=True)
    record = {"benchmark": "standardize", "test": "Welch's two-sided t-test over seeds against the best scaling of "
              "each federation and method, Holm-adjusted across the two comparisons, at 5 %",
              "seeds": args.seeds, "rounds": args.rounds, "local_steps": 10, "batch_size": 16, "lr": 0.05,
              "model": "mlp, hidden 16", "cells": cells, "seconds": round(time.perf_counter() - started, 1),
              "code": code_provenance()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
