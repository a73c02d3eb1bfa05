"""Everything a GPU machine should show, in one command: parity, throughput and the papers' budgets projected.

1. **parity**: every registered method on a tiny seeded config (the configs of ``tests/golden_runs.py``), once on
   the CPU and once on the device; the summaries must agree within :data:`PARITY_RTOL` / :data:`PARITY_ATOL`
   (GPU float sums differ from the CPU's in the last bits, and a few rounds of training carry that on).
2. **throughput**, on the device in one run: LeNet on CIFAR-10 Dir(0.1) (20 clients x 50 steps x batch 32) and
   pfl-research's CIFAR-10 setting (50 clients of 50 images drawn from 1,000, batch 10, its 2-layer CNN): graphfed
   (clients batched as a run's calibration chooses) against a sequential per-client loop (the PFLlib / FL-bench /
   Flower way) and the combined-batch floor (one network on every client's batch at once). The issue's targets:
   the pfl-research setting at >= 5x the loop and within 1.3x of the floor.
3. **projection**: each section of ``benchmarks/suites/paper-gpu.yaml`` (its first method) runs 2 rounds with one
   evaluation on the device; the time per run projected to the section's rounds (an upper bound: the real runs
   evaluate every 10-20 rounds, the projection every 2).

Writes ``benchmarks/results/gpu.json`` with the device's name and the torch / CUDA versions. On a machine without
the device it says so in one line and exits 0. ``--device cpu --quick`` runs a shrunken version of every part on the
CPU (what the test suite does, so the script cannot rot where no GPU is at hand).

    .venv/bin/python benchmarks/gpu.py                      # writes benchmarks/results/gpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from graphfed.client.autotune import choose_clients_per_chunk, synchronised_seconds
from graphfed.client.contract import LocalTraining, plain_sgd
from graphfed.client.placement import resolve_device
from graphfed.config import apply_overrides, validate_config
from graphfed.core.params import ParamSpec
from graphfed.errors import ConfigError
from graphfed.sim.engine import Simulator
from graphfed.suites import load_suite, suite_cells

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import cnn_throughput  # noqa: E402
from golden_runs import KEYS, config_of, methods  # noqa: E402

RESULTS = HERE / "results"
PARITY_RTOL, PARITY_ATOL = 1e-2, 1e-3
QUICK_METHODS = ("fedavg", "panacea", "fedaghn")


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= PARITY_ATOL + PARITY_RTOL * abs(b)


def parity(device: torch.device, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for method in QUICK_METHODS if quick else methods():
        summaries = {}
        for where in ("cpu", str(device)):
            config = validate_config({**config_of(method), "train": {**config_of(method)["train"], "device": where}})
            summaries[where] = Simulator(config, progress=False).run().to_json()
        cpu, other = summaries["cpu"], summaries[str(device)]
        differing = [key for key in KEYS if key not in ("bytes_up", "bytes_down", "num_params")
                     and not close(other.get(key), cpu.get(key))]
        rows.append({"method": method, "cpu_test_mean": cpu["test_mean"], "device_test_mean": other["test_mean"],
                     "differing_fields": differing, "ok": not differing})
        print(f"parity {method:14s} cpu {cpu['test_mean']} {device} {other['test_mean']} "
              f"{'ok' if not differing else 'DIFFERS: ' + ', '.join(differing)}", flush=True)
    return rows


def throughput(device: torch.device, quick: bool, repeats: int) -> dict[str, Any]:
    results = {}
    for name, work in (("lenet-cifar10", cnn_throughput.lenet_workload(0)),
                       ("pfl-cifar10", cnn_throughput.pfl_workload(0))):
        clients = 4 if quick else work.data.num_clients
        steps = 2 if quick else (50 if name == "lenet-cifar10" else work.training.steps)
        results[name] = measure_workload(cnn_throughput.Workload(
            name, work.data.select(torch.arange(clients)).to(device), lambda w=work: w.make_model().to(device),
            work.start[:clients].to(device), LocalTraining(steps, work.training.batch_size, work.training.lr),
            work.seeds[:clients]), device, repeats)
    return results


def measure_workload(work: cnn_throughput.Workload, device: torch.device, repeats: int) -> dict[str, Any]:
    """graphfed (batched as a run's calibration chooses), the per-client loop and the floor, on ``device``."""
    model = work.make_model()
    spec = ParamSpec.from_module(model)
    choice = choose_clients_per_chunk(model, spec, work.data, plain_sgd(spec, "classification", work.training),
                                      work.data.num_clients)
    model.clients_per_chunk = choice.clients_per_chunk
    indices = work.indices
    combined = [work.data.gather(indices[step]) for step in range(work.training.steps)]
    combined = [(x.flatten(0, 1), y.flatten(0, 1)) for x, y in combined]
    sides: dict[str, Callable[[], Any]] = {
        "graphfed": lambda: cnn_throughput.run_graphfed(work, model),
        "loop": lambda: cnn_throughput.run_loop(work, indices),
        "floor": lambda: cnn_throughput.run_floor(work, combined)}
    for run in sides.values():
        run()  # warm-up
    best = {side: min(synchronised_seconds(run, device) for _ in range(repeats)) for side, run in sides.items()}
    result = {"clients": work.data.num_clients, "steps": work.training.steps, "batch_size": work.training.batch_size,
              "clients_per_chunk": choice.clients_per_chunk, "best_seconds": best,
              "graphfed_over_loop": best["loop"] / best["graphfed"],
              "graphfed_over_floor": best["graphfed"] / best["floor"]}
    print(f"throughput {work.name}: graphfed {best['graphfed']:.3f} s, loop {best['loop']:.3f} s "
          f"({result['graphfed_over_loop']:.2f}x), floor {best['floor']:.3f} s "
          f"(graphfed/floor {result['graphfed_over_floor']:.2f})", flush=True)
    return result


def projection(device: torch.device, quick: bool) -> list[dict[str, Any]]:
    suite = load_suite(HERE / "suites" / "paper-gpu.yaml")
    rows = []
    for key, section in suite.datasets.items():
        if quick and key != "panacea-metr-la":
            continue
        cell = next(cell for cell in suite_cells(suite, [key], [section.methods[0]], seeds=1))
        overrides = ["train.rounds=2", "train.eval_every=2", "train.checkpoint_every=2", f"train.device={device}"]
        if quick:
            overrides += ["train.local_steps=2", "train.novel_adapt_rounds=1"]
        config = validate_config(apply_overrides(cell.config.model_dump(mode="json", exclude_unset=True), overrides))
        result = Simulator(config, progress=False).run()
        per_round = result.wall_seconds / 2
        rows.append({"section": key, "method": cell.method, "rounds": cell.config.train.rounds,
                     "seconds_per_round": per_round, "projected_minutes": per_round * cell.config.train.rounds / 60,
                     "quick": quick})
        print(f"projection {key} ({cell.method}): {per_round:.2f} s per round -> "
              f"{rows[-1]['projected_minutes']:.1f} min for {cell.config.train.rounds} rounds", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="the device to measure (default cuda)")
    parser.add_argument("--quick", action="store_true", help="a shrunken version of every part (smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="parity,throughput,projection")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu.json")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
    except ConfigError as error:
        print(f"no {args.device} device here, nothing measured ({error})")
        return 0
    result: dict[str, Any] = {
        "benchmark": "gpu", "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "torch": torch.__version__, "cuda": torch.version.cuda, "quick": args.quick,
        "parity_tolerance": {"rtol": PARITY_RTOL, "atol": PARITY_ATOL}}
    parts = args.parts.split(",")
    if "parity" in parts:
        result["parity"] = parity(device, args.quick)
    if "throughput" in parts:
        result["throughput"] = throughput(device, args.quick, args.repeats)
    if "projection" in parts:
        result["projection"] = projection(device, args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
