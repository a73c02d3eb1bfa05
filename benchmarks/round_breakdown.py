"""Where a CNN round's time goes: CIFAR-10 (JPEG) Dir(0.1), 20 clients, FedAvg, LeNet, 5 local steps, batch 32,
every client sampled and evaluated every round.

Each round is timed in parts by wrapping graphfed's own functions (no copy of the engine):

* ``train_kernel``: the model's forward + backward + SGD inside local training (``ClientRule.step``);
* ``train_gather``: building the mini-batches from the stored rows (``ClientSplit.gather``);
* ``evaluation_forward``: the model's forward on the evaluation blocks; ``evaluation_other``: the rest of
  evaluation (gathering blocks, metrics);
* ``server``: everything else in the round (personalize, update, bookkeeping).

Peak RSS (``ru_maxrss``) is compared with the size of the federation's data.

    .venv/bin/python benchmarks/round_breakdown.py     # writes benchmarks/results/round_breakdown.json
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from graphfed.client import evaluation as client_module
from graphfed.config import load_config
from graphfed.data.federation import ClientSplit
from graphfed.provenance import code_provenance
from graphfed.sim.engine import Simulator

RESULTS = Path(__file__).resolve().parent / "results"


def timed(totals: dict[str, float], key: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - begin

    return wrapper


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "round_breakdown.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_config(None, ["dataset.name=cifar10", "dataset.num_clients=20", "dataset.dirichlet_beta=0.1",
                                "model.name=lenet", "method.name=fedavg", "train.local_steps=5", "train.batch_size=32",
                                "train.lr=0.01", "train.clients_per_round=20", f"train.rounds={args.rounds + 1}",
                                f"torch_threads={args.threads}"])
    simulator = Simulator(config, progress=False)
    fed = simulator.setup.federation
    data_bytes = sum(split.x.nbytes + split.y.nbytes for split in (fed.train, fed.val, fed.test))
    totals: dict[str, float] = defaultdict(float)
    rule = simulator.setup.client_rule
    rule.step = timed(totals, "train_kernel", rule.step)  # type: ignore[method-assign]
    ClientSplit.gather = timed(totals, "train_gather", ClientSplit.gather)  # type: ignore[method-assign]
    original_evaluate = client_module.evaluate_clients
    model = simulator.setup.model
    plain_forward = model.batched_forward

    def evaluate(*a: Any, **k: Any) -> Any:
        model.batched_forward = timed(totals, "evaluation_forward", plain_forward)  # type: ignore[method-assign]
        try:
            return timed(totals, "evaluation", original_evaluate)(*a, **k)
        finally:
            model.batched_forward = plain_forward  # type: ignore[method-assign]

    from graphfed.client import executor as executor_module

    executor_module.evaluate_clients = evaluate  # type: ignore[assignment]
    simulator.run_round(0)
    simulator.evaluate(0)
    totals.clear()
    begin = time.perf_counter()
    for round_index in range(1, args.rounds + 1):
        simulator.run_round(round_index)
        simulator.evaluate(round_index)
    total = time.perf_counter() - begin
    parts = {"train_kernel": totals["train_kernel"], "train_gather": totals["train_gather"],
             "evaluation_forward": totals["evaluation_forward"],
             "evaluation_other": totals["evaluation"] - totals["evaluation_forward"]}
    parts["server"] = total - sum(parts.values())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    train_rows = int(fed.train.counts.sum())
    evaluation_rows = int(fed.val.counts.sum() + fed.test.counts.sum())
    result = {
        "setting": "CIFAR-10 (JPEG) Dir(0.1), 20 clients, FedAvg, LeNet, 5 local steps x batch 32, eval every round",
        "rounds_timed": args.rounds, "threads": args.threads, "seconds_per_round": total / args.rounds,
        "share": {key: value / total for key, value in parts.items()},
        "compute_share": (parts["train_kernel"] + parts["evaluation_forward"]) / total,
        "images_trained_per_round": 20 * 5 * 32, "images_evaluated_per_round": evaluation_rows,
        "train_rows": train_rows,
        "evaluation_over_training": (totals["evaluation"]) / (parts["train_kernel"] + parts["train_gather"]),
        "peak_rss_gib": peak / 2**30, "data_gib": data_bytes / 2**30,
        "peak_minus_data_gib": (peak - data_bytes) / 2**30,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result["code"] = code_provenance()  # the numbers are tied to the code that made them
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    shares = ", ".join(f"{key} {value:.0%}" for key, value in result["share"].items())
    print(f"{result['seconds_per_round']:.2f} s per round: {shares}; peak RSS {result['peak_rss_gib']:.2f} GiB "
          f"for {result['data_gib']:.2f} GiB of data -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
