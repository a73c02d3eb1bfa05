"""Everything a GPU machine should show, in one command: parity, throughput and the papers' budgets projected.

1. **parity**: every registered method on a tiny seeded config (the configs of ``tests/golden_runs.py``), once on
   the CPU and once on the device; the summaries must agree within :data:`PARITY_RTOL` / :data:`PARITY_ATOL`
   (GPU float sums differ from the CPU's in the last bits, and a few rounds of training carry that on).
2. **throughput**, on the device in one run: LeNet on CIFAR-10 Dir(0.1) (20 clients x 50 steps x batch 32) and
   pfl-research's CIFAR-10 setting (50 clients of 50 images drawn from 1,000, batch 10, its 2-layer CNN): graphfed
   (clients batched as a run's calibration chooses) against a sequential per-client loop (the PFLlib / FL-bench /
   Flower way) and the combined-batch floor (one network on every client's batch at once). The issue's targets:
   the pfl-research setting at >= 5x the loop and within 1.3x of the floor.
3. **projection**: each section of ``benchmarks/suites/paper-gpu.yaml`` (its first method) runs 3 rounds on the
   device, evaluating after each; the first round plus the steady round times the rest is the projected time per
   run (an upper bound: the real runs evaluate every 5-20 rounds, the projection every round).
4. **determinism**: a few methods twice with ``train.deterministic`` on and twice off on the device: whether the
   repeats agree bit for bit, what determinism costs in time, and the test score of a ``train.precision: bf16`` run
   beside the fp32 one.
5. **host_rows**: a few methods with their clients' rows on the device and left in host memory
   (``train.client_data: host``, for data larger than the device): equal summaries, and what the copies cost.

Parts run in the order ``--parts`` names them, and the JSON is rewritten after every row, so a run cut short keeps
what it measured. Writes ``benchmarks/results/gpu.json`` with the device's name, the torch / CUDA versions and the
code that measured. On a machine without the device it says so in one line and exits 0. ``--device cpu --quick``
runs a shrunken version of every part on the CPU (what the test suite does, so the script cannot rot where no GPU
is at hand).

    .venv/bin/python benchmarks/gpu.py                      # writes benchmarks/results/gpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from graphfed.client.autotune import choose_clients_per_chunk, synchronised_seconds
from graphfed.client.contract import LocalTraining, plain_sgd
from graphfed.client.placement import resolve_device
from graphfed.config import RunConfig, apply_overrides, validate_config
from graphfed.core.params import ParamSpec
from graphfed.errors import ConfigError, DataMissingError
from graphfed.provenance import code_provenance
from graphfed.runs import RoundLog, atomic_write_text
from graphfed.sim.engine import Simulator
from graphfed.suites import load_suite, suite_cells

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import cnn_throughput  # noqa: E402
from golden_runs import KEYS, config_of, merged, methods  # noqa: E402

RESULTS = HERE / "results"
PARITY_RTOL, PARITY_ATOL = 1e-2, 1e-3
QUICK_METHODS = ("fedavg", "panacea", "fedaghn")
#: a convolution with BatchNorm (cuDNN's algorithm choice), a hypernetwork with a GNN, attention over clients
DETERMINISM_METHODS = ("fedbn", "panacea", "fedaghn", "flha-ghn")
#: methods run with their clients' rows left in host memory (``train.client_data: host``) beside on the device
HOST_ROWS_METHODS = ("fedavg", "panacea", "fedaghn", "fedbn")
PARTS = ("parity", "throughput", "projection", "determinism", "host_rows")


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= PARITY_ATOL + PARITY_RTOL * abs(b)


def golden_config(method: str, **train: Any) -> RunConfig:
    """``method``'s tiny golden config with ``train`` options set."""
    return validate_config(merged(config_of(method), {"train": train}))


def compared(reference: dict[str, Any], other: dict[str, Any]) -> list[str]:
    return [key for key in KEYS if key not in ("bytes_up", "bytes_down", "num_params")
            and not close(other.get(key), reference.get(key))]


def first_round_weights(method: str, device: str) -> torch.Tensor:
    """Every client's evaluation weights after one round (on the host): what one round of the method computed."""
    simulator = Simulator(golden_config(method, device=device), progress=False)
    simulator.run_round(0)
    every_client = torch.arange(simulator.setup.federation.num_clients, device="cpu")
    return simulator.setup.method.eval_weights(every_client).detach().cpu().double()


def parity(device: torch.device, quick: bool, record: Callable[[dict[str, Any]], None],
           only: list[str] | None = None) -> None:
    """Per method: the relative difference of one round's weights (float rounding is about 1e-7; a device bug is
    of order 1), and the whole tiny run's summary within the tolerance. Rounding differences can grow over the
    rounds of a tiny run whose scores move in steps of one test row, so the summary may differ where the round
    agrees: the first number says whether the method computes the same thing on both devices."""
    for method in only or (QUICK_METHODS if quick else methods()):
        try:
            reference = first_round_weights(method, "cpu")
            drift = float((first_round_weights(method, str(device)) - reference).norm() / reference.norm())
            cpu = Simulator(golden_config(method, device="cpu"), progress=False).run().to_json()
            other = Simulator(golden_config(method, device=str(device)), progress=False).run().to_json()
        except Exception as error:  # one method breaking on the device must not hide the others' parity
            record({"method": method, "ok": False, "error": "".join(traceback.format_exception_only(error)).strip()})
            print(f"parity {method:14s} FAILED: {error}", flush=True)
            continue
        differing = compared(cpu, other)
        record({"method": method, "first_round_relative_difference": drift, "cpu_test_mean": cpu["test_mean"],
                "device_test_mean": other["test_mean"], "differing_fields": differing, "ok": not differing})
        print(f"parity {method:14s} round 1 relative difference {drift:.1e}; test cpu {cpu['test_mean']:.4f} "
              f"{device} {other['test_mean']:.4f} {'ok' if not differing else 'DIFFERS: ' + ', '.join(differing)}",
              flush=True)


def host_rows(device: torch.device, quick: bool, record: Callable[[dict[str, Any]], None]) -> None:
    """Each method with its clients' rows on the device and left in host memory (each read staged in pinned memory
    and copied over): the summaries must agree bit for bit (the same kernels read the same rows), and the time says
    what streaming costs on the tiny configs (a floor: their rows are few, the copies small)."""
    for method in HOST_ROWS_METHODS[:1] if quick else HOST_ROWS_METHODS:
        runs = {mode: Simulator(golden_config(method, device=str(device), client_data=mode), progress=False
                                ).run().to_json() for mode in ("device", "host")}
        differing = compared(runs["device"], runs["host"])
        row = {"method": method, "equal": not differing, "differing_fields": differing,
               **{f"{mode}_seconds": run["wall_seconds"] for mode, run in runs.items()}}
        record(row)
        print(f"host_rows {method:10s} {'equal' if not differing else 'DIFFERS: ' + ', '.join(differing)}; "
              f"{row['device_seconds']:.2f} s on the device, {row['host_seconds']:.2f} s from host memory",
              flush=True)


def determinism(device: torch.device, quick: bool, record: Callable[[dict[str, Any]], None]) -> None:
    """Each method twice with ``train.deterministic`` on and twice off: are the repeats equal bit for bit (every
    summary field), what does determinism cost, and how far is a bf16 run from the fp32 one."""
    for method in DETERMINISM_METHODS[:1] if quick else DETERMINISM_METHODS:
        def run(method: str = method, **train: Any) -> dict[str, Any]:
            return Simulator(golden_config(method, device=str(device), **train), progress=False).run().to_json()

        runs = {mode: [run(deterministic=mode == "deterministic") for _ in range(2)]
                for mode in ("deterministic", "default")}
        bf16 = run(precision="bf16")
        fields = [key for key in KEYS if key not in ("bytes_up", "bytes_down")]
        row = {"method": method,
               **{f"{mode}_repeat_equal": all(first.get(key) == second.get(key) for key in fields)
                  for mode, (first, second) in runs.items()},
               **{f"{mode}_seconds": min(run["wall_seconds"] for run in pair) for mode, pair in runs.items()},
               "fp32_test_mean": runs["default"][0]["test_mean"], "bf16_test_mean": bf16["test_mean"]}
        record(row)
        print(f"determinism {method:10s} repeats equal: deterministic {row['deterministic_repeat_equal']}, "
              f"default {row['default_repeat_equal']}; {row['deterministic_seconds']:.2f} s vs "
              f"{row['default_seconds']:.2f} s; test fp32 {row['fp32_test_mean']:.4f} bf16 "
              f"{row['bf16_test_mean']:.4f}", flush=True)


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


def projection(device: torch.device, quick: bool, sections: list[str] | None,
               record: Callable[[dict[str, Any]], None]) -> None:
    """Three rounds of each section's first method, evaluated every round: the first round (CUDA's warm-up and
    cuDNN's algorithm search land there) and the steady round after it, projected to the section's rounds. A
    section whose data this machine lacks is recorded as skipped, with the reason."""
    suite = load_suite(HERE / "suites" / "paper-gpu.yaml")
    for key, section in suite.datasets.items():
        if (quick and key != "panacea-metr-la") or (sections and key not in sections):
            continue
        cell = next(cell for cell in suite_cells(suite, [key], [section.methods[0]], seeds=1))
        rounds = cell.config.train.rounds
        row: dict[str, Any] = {"section": key, "method": cell.method, "rounds": rounds, "quick": quick}
        overrides = ["train.rounds=3", "train.eval_every=1", "train.checkpoint_every=3", f"train.device={device}"]
        if quick:
            overrides += ["train.local_steps=2", "train.novel_adapt_rounds=1"]
        config = validate_config(apply_overrides(cell.config.model_dump(mode="json", exclude_unset=True), overrides))
        try:
            with tempfile.TemporaryDirectory() as out_dir:
                Simulator(config, out_dir, progress=False).run()
                walls = [entry["wall_seconds"] for entry in RoundLog(Path(out_dir)).read()]
        except DataMissingError as error:
            record({**row, "skipped": str(error).split(";")[0]})
            print(f"projection {key}: skipped ({str(error).split(';')[0]})", flush=True)
            continue
        steady = (walls[2] - walls[0]) / 2  # a round plus its evaluation, once warm
        row.update(first_round_seconds=walls[0], seconds_per_round=steady,
                   projected_minutes=(walls[0] + steady * (rounds - 1)) / 60)
        record(row)
        print(f"projection {key} ({cell.method}): first round {walls[0]:.2f} s, then {steady:.2f} s per round -> "
              f"{row['projected_minutes']:.1f} min for {rounds} rounds", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="the device to measure (default cuda)")
    parser.add_argument("--quick", action="store_true", help="a shrunken version of every part (smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default=",".join(PARTS), help="which parts, in which order (default: all)")
    parser.add_argument("--sections", default="", help="projection: these paper-gpu.yaml sections only")
    parser.add_argument("--methods", default="", help="parity: these methods only")
    parser.add_argument("--note", default="", help="stored in the JSON (e.g. what data the machine held)")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu.json")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))} (choose from {', '.join(PARTS)})")
    try:
        device = resolve_device(args.device)
    except ConfigError as error:
        print(f"no {args.device} device here, nothing measured ({error})")
        return 0
    result: dict[str, Any] = {
        "benchmark": "gpu", "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "torch": torch.__version__, "cuda": torch.version.cuda, "quick": args.quick, "code": code_provenance(),
        "note": args.note,
        "parity_tolerance": {"rtol": PARITY_RTOL, "atol": PARITY_ATOL}}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every row: a run cut short still leaves what it measured
        atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")

    def appender(part: str) -> Callable[[dict[str, Any]], None]:
        def record(row: dict[str, Any]) -> None:
            result.setdefault(part, []).append(row)
            save()
        return record

    failed = []
    for part in parts:  # in the order given; a part that breaks is recorded and the next one still runs
        try:
            if part == "parity":
                parity(device, args.quick, appender(part), args.methods.split(",") if args.methods else None)
            elif part == "determinism":
                determinism(device, args.quick, appender(part))
            elif part == "host_rows":
                host_rows(device, args.quick, appender(part))
            elif part == "throughput":
                result["throughput"] = throughput(device, args.quick, args.repeats)
            else:
                projection(device, args.quick, args.sections.split(",") if args.sections else None,
                           appender("projection"))
        except Exception as error:  # a lease is short: measure what still works, name what broke
            failed.append(part)
            result.setdefault("errors", {})[part] = "".join(traceback.format_exception_only(error)).strip()
            traceback.print_exc()
        save()
    print(f"-> {args.out}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
