"""Everything a GPU machine should show, in one command: parity, throughput and the papers' budgets projected.

1. **parity**: every registered method on a tiny seeded config (the configs of ``tests/golden_runs.py``), once on
   the CPU and once on the device; the summaries must agree within :data:`PARITY_RTOL` / :data:`PARITY_ATOL`
   (GPU float sums differ from the CPU's in the last bits, and a few rounds of training carry that on), or else
   one round's weights must differ by no more than rounding does on the CPU itself (part 7). Always fp32.
2. **throughput**, on the device in one run: LeNet on CIFAR-10 Dir(0.1) (20 clients x 50 steps x batch 32) and
   pfl-research's CIFAR-10 setting (50 clients of 50 images drawn from 1,000, batch 10, its 2-layer CNN): graphfed
   (clients batched as a run's calibration chooses) against a sequential per-client loop (the PFLlib / FL-bench /
   Flower way) and the combined-batch floor (one network on every client's batch at once). The issue's targets:
   the pfl-research setting at >= 5x the loop and within 1.3x of the floor.
3. **projection**: each section of the ``paper-gpu`` suite (its first method) runs 3 rounds on the
   device, evaluating after each; the first round plus the steady round times the rest is the projected time per
   run (an upper bound: the real runs evaluate every 5-20 rounds, the projection every round).
4. **determinism**: a few methods twice with ``train.deterministic`` on and twice off on the device: whether the
   repeats agree bit for bit, what determinism costs in time, and the test score of a ``train.precision: bf16`` run
   beside the fp32 one.
5. **host_rows**: a few methods with their clients' rows on the device and left in host memory
   (``train.client_data: host``, for data larger than the device): equal summaries, and what the copies cost.
6. **profile**: graphfed's pfl-research round and a short FedAGHN CIFAR-10 round under torch.profiler: kernel
   launches, host waits and copies in the JSON, the op tables in ``profile-*.txt`` beside it.
7. **pack**: the FedAGHN CIFAR-10 Dir(0.1) section of ``paper-gpu.yaml`` at its own settings for a few rounds, its
   seeds run one after another and as packs of S = 5, 10, 20 (``graphfed.sim.pack``: every run's clients in one
   batched call per round): runs per hour of the paper's 200 rounds, projected from the steady rounds, and the ratio
   packed over sequential. The issue's target: >= 10x at S = 20. (The paper-budget runs themselves are ``graphfed
   bench paper-gpu --datasets fedaghn-cifar10-dir0.1 --methods fedaghn,local --seeds 5``,
   which packs each method's seeds and resumes by run.)
8. **floor**: FedAGHN's CIFAR-10 client step (CNN-BN, 20 clients x batch 32) at fp32, tf32 and bf16 against the
   same images as one network's batch (NCHW and channels-last) and the device's peak (a large matmul, a large
   copy): achieved TFLOP/s, a lower bound of GB/s, and ``graphfed_over_floor`` (``gpu_floor.py``), for the
   kernel a run's calibration chooses and for each batched kernel pinned (``kernel_over_floor``: vmap, grouped
   convolution, im2col + batched matmul). The issue's target: within 1.3x of the same-precision floor.
9. **sensitivity** (not in the default parts; any machine, ``--device cpu``): how far one round of each method's
   tiny config moves on the CPU when every op's result is off by a rounding-sized amount (:class:`RoundingNoise`):
   the yardstick parity uses where summaries differ. FLHA-GHN's deep width-4 networks on a few rows amplify
   rounding about 10^4-fold, FedAvg's MLP not at all.

``--precision tf32`` runs throughput, profile and projection with ``train.precision: tf32`` (TF32 tensor cores);
the default is full fp32, as parity.
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
from torch.utils._python_dispatch import TorchDispatchMode

from graphfed.client.autotune import choose_clients_per_chunk, synchronised_seconds
from graphfed.client.contract import LocalTraining, plain_sgd
from graphfed.client.placement import resolve_device, use_tensor_cores
from graphfed.config import RunConfig, apply_overrides, validate_config
from graphfed.core.params import ParamSpec
from graphfed.errors import ConfigError, DataMissingError
from graphfed.models.base import TargetModel
from graphfed.provenance import code_provenance
from graphfed.runs import RoundLog, atomic_write_text
from graphfed.sim.engine import Simulator
from graphfed.suites import load_suite, packaged_suites, suite_cells

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import cnn_throughput  # noqa: E402
import gpu_floor  # noqa: E402
from golden_runs import KEYS, config_of, merged, methods  # noqa: E402

RESULTS = HERE / "results"
PARITY_RTOL, PARITY_ATOL = 1e-2, 1e-3
#: a device's first-round difference up to this many times the CPU's own rounding sensitivity is rounding
ROUNDING_FACTOR = 20
QUICK_METHODS = ("fedavg", "panacea", "fedaghn")
#: a convolution with BatchNorm (cuDNN's algorithm choice), a hypernetwork with a GNN, attention over clients
DETERMINISM_METHODS = ("fedbn", "panacea", "fedaghn", "flha-ghn")
#: methods run with their clients' rows left in host memory (``train.client_data: host``) beside on the device
HOST_ROWS_METHODS = ("fedavg", "panacea", "fedaghn", "fedbn")
DEFAULT_PARTS = ("parity", "floor", "throughput", "projection", "determinism", "host_rows", "profile", "pack")
#: pack sizes the pack part measures (the quick CPU run: 1 and 2)
PACK_SIZES = (1, 5, 10, 20)
PARTS = (*DEFAULT_PARTS, "sensitivity")


def one_line(error: BaseException) -> str:
    """What broke, as the JSON records it: the exception's type and message."""
    return "".join(traceback.format_exception_only(error)).strip()


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


def first_round_weights(method: str, device: str, **train: Any) -> torch.Tensor:
    """Every client's evaluation weights after one round (on the host): what one round of the method computed."""
    simulator = Simulator(golden_config(method, device=device, **train), progress=False)
    simulator.run_round(0)
    every_client = torch.arange(simulator.setup.federation.num_clients, device="cpu")
    return simulator.setup.method.eval_weights(every_client).detach().cpu().double()


def parity(device: torch.device, quick: bool, record: Callable[[dict[str, Any]], None],
           only: list[str] | None = None) -> None:
    """Per method: the relative difference of one round's weights (float rounding is about 1e-7; a device bug is
    of order 1), and the whole tiny run's summary within the tolerance. Rounding differences can grow over the
    rounds of a tiny run whose scores move in steps of one test row, so the summary may differ where the round
    agrees: the first number says whether the method computes the same thing on both devices. Where the summaries
    differ, the round's difference is judged against the CPU's own :func:`rounding_sensitivity`: within
    :data:`ROUNDING_FACTOR` times it, the device computes what the CPU does up to rounding (``ok``). A round beyond
    it is run again with one local step (``one_step_relative_difference``): every step runs the same kernels, so a
    kernel that computes something else shows at step one, while a difference that grows only over several steps is
    rounding the training amplified (as a max-pool tie or a ReLU kink decided by the last bit would); ``ok`` stays
    strict."""
    for method in only or (QUICK_METHODS if quick else methods()):
        try:
            reference = first_round_weights(method, "cpu")
            drift = float((first_round_weights(method, str(device)) - reference).norm() / reference.norm())
            cpu = Simulator(golden_config(method, device="cpu"), progress=False).run().to_json()
            other = Simulator(golden_config(method, device=str(device)), progress=False).run().to_json()
            differing = compared(cpu, other)
            yardstick = rounding_sensitivity(method) if differing else None
            within_rounding = yardstick is not None and drift <= ROUNDING_FACTOR * max(yardstick, 1e-7)
            one_step = None
            if differing and not within_rounding:
                cpu_one_step = first_round_weights(method, "cpu", local_steps=1)
                one_step = float((first_round_weights(method, str(device), local_steps=1) - cpu_one_step).norm()
                                 / cpu_one_step.norm())
        except Exception as error:  # one method breaking on the device must not hide the others' parity
            record({"method": method, "ok": False, "error": one_line(error)})
            print(f"parity {method:14s} FAILED: {error}", flush=True)
            continue
        record({"method": method, "first_round_relative_difference": drift, "cpu_test_mean": cpu["test_mean"],
                "device_test_mean": other["test_mean"], "differing_fields": differing,
                "rounding_sensitivity": yardstick, "one_step_relative_difference": one_step,
                "ok": not differing or within_rounding})
        verdict = ("ok" if not differing else "DIFFERS: " + ", ".join(differing)
                   + f" (round 1 {'within' if within_rounding else 'beyond'} {ROUNDING_FACTOR}x the CPU's rounding "
                   f"sensitivity {yardstick:.1e}"
                   + (f"; with one local step {one_step:.1e}" if one_step is not None else "") + ")")
        print(f"parity {method:14s} round 1 relative difference {drift:.1e}; test cpu {cpu['test_mean']:.4f} "
              f"{device} {other['test_mean']:.4f} {verdict}", flush=True)


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


def device_workload(name: str, device: torch.device, quick: bool) -> cnn_throughput.Workload:
    """``lenet-cifar10`` or ``pfl-cifar10`` with its clients' rows, start weights and models on ``device``."""
    work = cnn_throughput.lenet_workload(0) if name == "lenet-cifar10" else cnn_throughput.pfl_workload(0)
    clients = 4 if quick else work.data.num_clients
    steps = 2 if quick else (50 if name == "lenet-cifar10" else work.training.steps)
    return cnn_throughput.Workload(
        name, work.data.select(torch.arange(clients)).to(device), lambda w=work: w.make_model().to(device),
        work.start[:clients].to(device), LocalTraining(steps, work.training.batch_size, work.training.lr),
        work.seeds[:clients])


def throughput(device: torch.device, quick: bool, repeats: int, precision: str) -> dict[str, Any]:
    use_tensor_cores(precision)  # the kernels are called directly here, not through a run's setup
    return {name: measure_workload(device_workload(name, device, quick), device, repeats)
            for name in ("lenet-cifar10", "pfl-cifar10")}


def profiled(device: torch.device, run: Callable[[], Any]) -> tuple[dict[str, Any], str]:
    """One call of ``run`` under torch.profiler: its wall time, how many kernels it launched, how often the host
    waited on the device or copied, and the op table by host time (where a launch-bound round goes)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    run()  # warm-up: cuDNN's algorithm search and the caching allocator land here, not in the profile
    with torch_profile(activities=activities) as prof:
        seconds = synchronised_seconds(run, device)
    events = prof.key_averages()
    calls = {event.key: event.count for event in events}
    counts = {"wall_seconds": seconds,
              "kernel_launches": sum(n for key, n in calls.items() if "LaunchKernel" in key),
              "host_waits": sum(n for key, n in calls.items() if "Synchronize" in key),
              "copies": sum(n for key, n in calls.items() if "Memcpy" in key),
              "aten_ops": sum(n for key, n in calls.items() if key.startswith("aten::"))}
    tables = "\n".join(events.table(sort_by=key, row_limit=35) for key in
                       ("self_cpu_time_total", "self_device_time_total" if device.type == "cuda" else "cpu_time_total"))
    return counts, tables


def profile(device: torch.device, quick: bool, record: Callable[[dict[str, Any]], None], out_dir: Path,
            precision: str) -> None:
    """Where the time of a launch-bound workload goes: graphfed's pfl-research round and one FedAGHN CIFAR-10 round
    (a short one: 20 of its 330 local steps), each profiled once; the op tables go beside the JSON."""
    use_tensor_cores(precision)  # before the calibration, which times the same kernels
    work = device_workload("pfl-cifar10", device, quick)
    model = calibrated_model(work)
    runs: dict[str, Callable[[], Any]] = {"pfl-cifar10": lambda: cnn_throughput.run_graphfed(work, model)}
    suite = load_suite(packaged_suites()["paper-gpu"])
    section = "panacea-metr-la" if quick else "fedaghn-cifar10-dir0.1"
    cell = next(iter(suite_cells(suite, [section], [suite.datasets[section].methods[0]], seeds=1)))
    overrides = ["train.rounds=3", f"train.device={device}", f"train.local_steps={2 if quick else 20}",
                 f"train.precision={precision}"]
    try:
        simulator = Simulator(validate_config(apply_overrides(
            cell.config.model_dump(mode="json", exclude_unset=True), overrides)), progress=False)
        rounds = iter(range(3))
        runs[section] = lambda: simulator.run_round(next(rounds))
    except DataMissingError as error:
        print(f"profile {section}: skipped ({str(error).split(';')[0]})", flush=True)
    for name, run in runs.items():
        counts, tables = profiled(device, run)
        atomic_write_text(out_dir / f"profile-{name}.txt", tables + "\n")
        record({"workload": name, **counts})
        print(f"profile {name}: {counts}", flush=True)


def calibrated_model(work: cnn_throughput.Workload) -> TargetModel:
    """The workload's model with the clients per chunk a run's calibration would choose on its device."""
    model = work.make_model()
    spec = ParamSpec.from_module(model)
    model.clients_per_chunk = choose_clients_per_chunk(model, spec, work.data, plain_sgd(
        spec, "classification", work.training), work.data.num_clients).clients_per_chunk
    return model


def measure_workload(work: cnn_throughput.Workload, device: torch.device, repeats: int) -> dict[str, Any]:
    """graphfed (batched as a run's calibration chooses), the per-client loop and the floor, on ``device``."""
    model = calibrated_model(work)
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
              "clients_per_chunk": model.clients_per_chunk, "best_seconds": best,
              "graphfed_over_loop": best["loop"] / best["graphfed"],
              "graphfed_over_floor": best["graphfed"] / best["floor"]}
    print(f"throughput {work.name}: graphfed {best['graphfed']:.3f} s, loop {best['loop']:.3f} s "
          f"({result['graphfed_over_loop']:.2f}x), floor {best['floor']:.3f} s "
          f"(graphfed/floor {result['graphfed_over_floor']:.2f})", flush=True)
    return result


def projection(device: torch.device, quick: bool, sections: list[str] | None,
               record: Callable[[dict[str, Any]], None], precision: str) -> None:
    """Three rounds of each section's first method, evaluated every round: the first round (CUDA's warm-up and
    cuDNN's algorithm search land there) and the steady round after it, projected to the section's rounds. A
    section whose data this machine lacks is recorded as skipped, with the reason."""
    suite = load_suite(packaged_suites()["paper-gpu"])
    for key, section in suite.datasets.items():
        if (quick and key != "panacea-metr-la") or (sections and key not in sections):
            continue
        cell = next(cell for cell in suite_cells(suite, [key], [section.methods[0]], seeds=1))
        rounds = cell.config.train.rounds
        row: dict[str, Any] = {"section": key, "method": cell.method, "rounds": rounds, "quick": quick}
        overrides = ["train.rounds=3", "train.eval_every=1", "train.checkpoint_every=3", f"train.device={device}",
                     f"train.precision={precision}"]
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


def pack(device: torch.device, quick: bool, record: Callable[[dict[str, Any]], None]) -> None:
    """Runs per hour of FedAGHN's CIFAR-10 Dir(0.1) section at the paper's budget, one run after another (S = 1) and
    packed: each size runs 2 rounds and 4 rounds, each evaluated at its last round only, and half their difference
    is the steady round of local training and aggregation (the first round's warm-up and the one evaluation cancel),
    projected to the section's rounds (its evaluations, every 10 rounds, not counted: the ratio is of the step that
    packs share)."""
    from graphfed.sim.pack import Pack

    suite = load_suite(packaged_suites()["paper-gpu"])
    key = "fedaghn-cifar10-dir0.1"
    cell = next(cell for cell in suite_cells(suite, [key], ["fedaghn"], seeds=1))
    rounds = cell.config.train.rounds
    extra = (["train.local_steps=2", "dataset.client_fraction=0.02", "model.options={channels: 4, hidden: 16}"]
             if quick else [])
    base = cell.config.model_dump(mode="json", exclude_unset=True)

    def pack_seconds(size: int, run_rounds: int) -> float:
        """The wall seconds of a pack of ``size`` runs of ``run_rounds`` rounds: its members' shares summed."""
        overrides = [f"train.rounds={run_rounds}", f"train.eval_every={run_rounds}",
                     f"train.checkpoint_every={run_rounds}", f"train.device={device}", *extra]
        configs = [validate_config(apply_overrides({**base, "seed": seed}, overrides)) for seed in range(size)]
        with tempfile.TemporaryDirectory() as out_dir:
            dirs = [Path(out_dir) / f"seed{seed}" for seed in range(size)]
            Pack(configs, list(dirs), batched=size > 1).run()
            return sum(RoundLog(folder).read()[-1]["wall_seconds"] for folder in dirs)

    sequential = None
    for size in (1, 2) if quick else PACK_SIZES:
        try:
            steady = (pack_seconds(size, 4) - pack_seconds(size, 2)) / 2
        except DataMissingError as error:
            record({"section": key, "runs": size, "skipped": str(error).split(";")[0]})
            return
        per_hour = size * 3600 / (steady * rounds)
        sequential = sequential or per_hour
        row = {"section": key, "runs": size, "rounds_projected": rounds, "steady_round_seconds": steady,
               "runs_per_hour": per_hour, "over_sequential": per_hour / sequential, "quick": quick}
        record(row)
        print(f"pack {key} S={size}: a round of all {size} runs {steady:.2f} s -> {per_hour:.1f} runs per hour at "
              f"{rounds} rounds ({row['over_sequential']:.2f}x one after another)", flush=True)


class RoundingNoise(TorchDispatchMode):
    """Every floating result of an op that computes (not a view, not in place) times ``1 + eps/2 z``, z ~ N(0, 1)
    from a seeded host generator: the CPU's own run with a rounding-sized difference in every op, which is what a
    GPU's other summation orders amount to. How far one round moves under it says how strongly a method's tiny
    config amplifies float rounding, so a device's difference can be judged against it."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if func.is_view or func._schema.is_mutable:
            return result
        if isinstance(result, tuple):
            return tuple(self.perturbed(item) for item in result)
        return self.perturbed(result)

    def perturbed(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.device.type != "cpu":
            return value
        noise = torch.randn(value.shape, generator=self.generator, dtype=value.dtype)
        return value * (1 + torch.finfo(value.dtype).eps / 2 * noise)  # half an ulp: 6e-8 in fp32, 1e-16 in fp64


def rounding_sensitivity(method: str) -> float:
    """The relative difference of one round's weights between the CPU run and the CPU run under
    :class:`RoundingNoise`: float rounding alone, amplified by the method's tiny config."""
    reference = first_round_weights(method, "cpu")
    with RoundingNoise():
        perturbed = first_round_weights(method, "cpu")
    return float((perturbed - reference).norm() / reference.norm())


def sensitivity(quick: bool, record: Callable[[dict[str, Any]], None], only: list[str] | None = None) -> None:
    """Each method's :func:`rounding_sensitivity` on the CPU (no device needed): the yardstick of the parity part."""
    for method in only or (QUICK_METHODS if quick else methods()):
        try:
            value = rounding_sensitivity(method)
        except Exception as error:  # e.g. a solver whose stopping rule the noise defeats: say so, go on
            record({"method": method, "error": one_line(error)})
            print(f"sensitivity {method:14s} FAILED: {error}", flush=True)
            continue
        record({"method": method, "rounding_sensitivity": value})
        print(f"sensitivity {method:14s} one round under rounding noise: relative difference {value:.1e}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="the device to measure (default cuda)")
    parser.add_argument("--quick", action="store_true", help="a shrunken version of every part (smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                        help=f"which parts, in which order (default: {','.join(DEFAULT_PARTS)})")
    parser.add_argument("--sections", default="", help="projection: these paper-gpu.yaml sections only")
    parser.add_argument("--methods", default="", help="parity: these methods only")
    parser.add_argument("--precision", choices=("fp32", "tf32"), default="fp32",
                        help="throughput and projection: train.precision (parity is always fp32)")
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
        "note": args.note, "precision": args.precision,
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
            elif part == "sensitivity":
                sensitivity(args.quick, appender(part), args.methods.split(",") if args.methods else None)
            elif part == "profile":
                profile(device, args.quick, appender(part), args.out.parent, args.precision)
            elif part == "pack":
                pack(device, args.quick, appender(part))
            elif part == "floor":
                gpu_floor.floor(device, args.quick, args.repeats, appender(part))
            elif part == "throughput":
                result["throughput"] = throughput(device, args.quick, args.repeats, args.precision)
            else:
                projection(device, args.quick, args.sections.split(",") if args.sections else None,
                           appender("projection"), args.precision)
        except Exception as error:  # a lease is short: measure what still works, name what broke
            failed.append(part)
            result.setdefault("errors", {})[part] = one_line(error)
            traceback.print_exc()
        save()
    print(f"-> {args.out}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
