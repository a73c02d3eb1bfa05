"""An empirical check beside the accountant's arithmetic: can an observer of the released model tell whether a
canary client took part?

The canary is client 0 with every training label reversed (``y -> C - 1 - y``: data that make its update stand
out). Runs with the canary and runs without it (client 0 with its own labels) train FedAvg on one FL-N federation
with seeds 0..n-1 (the seed draws sampling, batches and noise). Every client takes part in every round (q = 1: no
amplification by sampling, the plain Gaussian mechanism the accountant composes). After the run the observer holds
the released global model and scores the canary's rows: the model's cross-entropy on their true labels minus that
on their reversed labels (the more the model leans to the reversed labels, the more likely the canary took part).
The attack's AUC over the in- and out-runs is 1 when the canary is always detectable and 0.5 at chance. Without DP
the canary should be detectable; under client-level DP at epsilon 1 the AUC should be close to 0.5 (an epsilon-DP
mechanism bounds any test's true-positive rate by e^epsilon times its false-positive rate plus delta). A run whose
model the noise drove to NaN/Inf releases nothing an observer can score: it counts as a tie (score 0) and is
counted in the row.

    .venv/bin/python benchmarks/privacy_audit.py                   # -> benchmarks/results/privacy/audit.json
    .venv/bin/python benchmarks/privacy_audit.py --seeds 8         # quicker, noisier
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from sklearn.metrics import roc_auc_score
from torch.func import functional_call

from graphfed.config import load_config
from graphfed.data import build_federation
from graphfed.data.federation import Federation
from graphfed.provenance import code_provenance
from graphfed.sim.engine import Simulator

RESULTS = Path(__file__).resolve().parent / "results" / "privacy" / "audit.json"
BASE = ["dataset.name=fln", "dataset.num_clients=20", "dataset.novel_fraction=0", "model.options={hidden: 16}",
        "method.name=fedavg", "train.rounds=30", "train.clients_per_round=20", "train.local_steps=10",
        "train.batch_size=32", "train.lr=0.1", "train.eval_every=30", "torch_threads=1", "train.autotune=false"]
EPSILONS = (None, 8.0, 4.0, 2.0, 1.0)
DELTA = 1e-3
CANARY = 0


@functools.cache
def fixed_federation() -> Federation:
    """One federation for every run (built from seed 0): runs differ only in what the seed draws in training
    (sampling, batches, noise), so the attack faces the mechanism, not a new data set each time."""
    return build_federation(load_config(None, BASE).dataset, 0)


def attack_score(seed: int, with_canary: bool, mechanism: str, epsilon: float | None) -> float:
    overrides = [*BASE, f"seed={seed}"]
    if epsilon is not None:
        overrides += [f"privacy.mechanism={mechanism}", f"privacy.target_epsilon={epsilon}",
                      f"privacy.delta={DELTA}", "privacy.clip_norm=1.0"]
    config = load_config(None, overrides)
    federation = fixed_federation()
    if with_canary:
        config = load_config(None, [*overrides, "attack.kind=label_flip",
                                    f"attack.clients=[{federation.client_names[CANARY]}]"])
    simulator = Simulator(config, federation=federation, progress=False)
    simulator.run()
    setup = simulator.setup
    released = setup.method.global_weights.detach()
    x, y = federation.train.client(CANARY)  # the clean rows; the canary's are their reversal
    reversed_labels = federation.output_dim - 1 - y
    model = setup.clients.model
    logits = functional_call(model, setup.spec.unflatten(released), (x,))
    # how much more the model believes the reversed labels than the true ones: the canary's pull, with each run's
    # overall fit on these rows cancelled out
    cross_entropy = torch.nn.functional.cross_entropy
    return float(cross_entropy(logits, y) - cross_entropy(logits, reversed_labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=16, help="runs with and runs without the canary, each")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    for mechanism in ("local", "central"):
        for epsilon in EPSILONS:
            if epsilon is None and mechanism == "central":
                rows.append({**rows[0], "mechanism": "central"})  # no DP: the same runs for both mechanisms
                continue
            inside = [attack_score(seed, True, mechanism, epsilon) for seed in range(args.seeds)]
            outside = [attack_score(seed, False, mechanism, epsilon) for seed in range(args.seeds)]
            broken = sum(not math.isfinite(score) for score in inside + outside)
            scores = [score if math.isfinite(score) else 0.0 for score in inside + outside]
            auc = float(roc_auc_score([1] * len(inside) + [0] * len(outside), scores))
            rows.append({"mechanism": mechanism, "epsilon": epsilon, "auc": auc, "runs_in": len(inside),
                         "runs_out": len(outside), "non_finite_runs": broken,
                         "scores_in": scores[:len(inside)], "scores_out": scores[len(inside):]})
            print(f"{mechanism} epsilon={epsilon}: AUC {auc:.3f} ({time.monotonic() - started:.0f} s)", flush=True)
    document = {
        "description": (f"FedAvg on one FL-N federation (20 clients, all in every round, 30 rounds of 10 steps); "
                        f"the canary is client {CANARY} with reversed labels; the attack scores the released global "
                        f"model by its cross-entropy on the canary's rows with true minus reversed labels; AUC over "
                        f"{args.seeds} runs with and "
                        f"{args.seeds} without the canary (seeds 0..{args.seeds - 1}); DP at delta {DELTA}, clip "
                        f"1.0, noise calibrated to each epsilon by dp-accounting's PLD accountant. "
                        f"`python benchmarks/privacy_audit.py --seeds {args.seeds}`."),
        "config": BASE, "rows": rows, "seconds": round(time.monotonic() - started, 1), "code": code_provenance()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
