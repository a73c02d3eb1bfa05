"""How many clients train at once: measured on this machine for each model and shape, like cuDNN's benchmark mode.

:func:`~graphfed.client.training.train_clients` trains S clients as one batched computation, split into chunks of
``model.clients_per_chunk`` clients (None: all S at once). Whether batching pays depends on the model, the batch
size and the device: a small MLP trains 6-15x faster all at once, while a convolutional model's activations
outgrow the CPU's caches. So for models that declare a chunk size and batch their clients' kernels on this device
(LeNet and the small CNNs; the BatchNorm networks run client by client on a CPU anyway), a run starts with a short
calibration: each candidate chunk size trains the run's own first clients (at most :data:`CALIBRATION_CLIENTS` on
a CPU, :data:`ACCELERATOR_CALIBRATION_CLIENTS` on a GPU) for :data:`CALIBRATION_STEPS` SGD steps of the run's batch
size, timed in interleaved rounds. The model's declared size is kept unless another beats it by more than the
timings' own spread (:func:`decide`): two sizes within noise of each other used to flip from run to run (a LeNet
chose 4, 1, 1, 4 over four runs), and the first pick stuck in the cache.

The choice is cached on disk (``$GRAPHFED_CACHE/autotune.json``) under a key of everything that changes the timing
(model class, parameter count, input shape, batch size, device, threads, torch version, precision, the engine's
sources), so a machine keeps its choice and the same config gives the same numbers run after run; a measurement
taken under load (or with a wide spread) is used once and not cached. Chunking changes nothing but float rounding
(clients are independent; ``tests/test_autotune.py`` checks every model). The run's ``summary.json`` records the
choice and how sure it was (``execution``), and ``train.clients_per_chunk`` pins it, e.g. to reproduce a run from
another machine bit for bit (on the same CPU kernels: ``code.cpu``). ``train.autotune: false`` keeps each model's
declared chunk size without measuring.

On an accelerator the same calibration first picks how the clients' convolutions run (``train.conv_kernel``:
``vmap``, one grouped convolution, or im2col + batched matrix products; :func:`choose_conv_kernel`): which of them
uses a GPU's tensor cores best depends on the shapes and the precision, so it is measured, not assumed.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from graphfed.client.contract import ClientRule, plain_sgd
from graphfed.client.training import train_clients, values_per_chunk
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.errors import ConfigError
from graphfed.models.base import CONV_KERNELS, TargetModel
from graphfed.paths import user_cache_dir

log = logging.getLogger(__name__)
#: what a calibration chooses between: chunk sizes, thread counts, convolution kernels
Option = TypeVar("Option", int, str)

#: chunk sizes tried on a CPU (those up to the number of clients trained at once, which is tried too)
CANDIDATES = (1, 2, 4, 8)
#: clients the calibration trains on a CPU: up to this many of the run's first (rounds of more clients keep the
#: size found here: chunks above 8 clients never won on the CPU grid, and the calibration stays under 2 s)
CALIBRATION_CLIENTS = 8
#: on an accelerator batching more clients fills the device (the first GPU run chose 4 of 50 small-CNN clients
#: from the CPU's candidates and trained at 1.4x a per-client loop): larger candidates, and ties go to the larger
ACCELERATOR_CANDIDATES = (1, 4, 16, 64, 256)
ACCELERATOR_CALIBRATION_CLIENTS = 256
#: SGD steps each timing covers (after one warm-up call per size)
CALIBRATION_STEPS = 1
#: timings of every size (interleaved, so a burst of load hits them all) before the choice is judged
CALIBRATION_ROUNDS = 5
#: while a size looks faster than the default without beating it beyond noise, more rounds, up to this many,
#: within CALIBRATION_SECONDS
CALIBRATION_MAX_ROUNDS = 9
CALIBRATION_SECONDS = 2.0
CACHE_NAME = "autotune.json"
#: a size must beat the model's default beyond noise (:func:`decide`), and its median by at least this, to be chosen
TOLERANCE = 0.05
#: above this load per core (other work on the machine), or this spread, a measurement is suspect: it is used for
#: this run but not cached, so the next run measures again
SUSPECT_LOAD_PER_CORE = 1.25
SUSPECT_SPREAD = 0.25


@dataclass(frozen=True)
class ChunkChoice:
    """How one model's clients are batched in this run, and why."""

    clients_per_chunk: int | None  #: None: all clients of a call at once
    source: str  #: "pinned" (train.clients_per_chunk), "model" (its declared size), "measured" or "cached"
    seconds_per_client: dict[int, float]  #: the calibration's median timing per candidate (empty unless measured)
    #: how sure the choice is: how it was decided, the timings' spread, rounds, the machine's load (measured only)
    certainty: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {"clients_per_chunk": self.clients_per_chunk, "source": self.source,
                "seconds_per_client": {str(size): seconds for size, seconds in self.seconds_per_client.items()},
                **({"certainty": self.certainty} if self.certainty else {})}


@cache
def _code_id() -> str:
    """The engine's sources (a cached choice is measured again when the code that trains changed)."""
    from graphfed.provenance import engine_hash

    return engine_hash()[:16]


def timing_key(model: TargetModel, spec: ParamSpec, data: ClientSplit, rule: ClientRule) -> str:
    """Everything that changes how long a chunk takes: the same key is the same measurement."""
    training = rule.setting.training
    device = data.device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return "|".join([type(model).__name__, str(spec.dim), "x".join(map(str, data.x.shape[1:])),
                     f"batch={training.batch_size}", f"precision={training.precision}", device_name,
                     f"threads={torch.get_num_threads()}", f"torch={torch.__version__}", f"code={_code_id()}"])


def machine_load() -> float:
    """The 1-minute load average per core (0 where the system does not say)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


@dataclass(frozen=True)
class Judged(Generic[Option]):
    """A calibration's outcome: the option its timings support, each option's median seconds, and how sure."""

    best: Option
    medians: dict[Option, float]
    #: how it was decided, the timings' spread and rounds, the machine's load around them, and ``suspect``
    certainty: dict[str, Any]


def judged(timed: Callable[[], dict[Option, list[float]]],
           choose: Callable[[dict[Option, list[float]]], tuple[Option, dict[str, Any]]]) -> Judged[Option]:
    """``timed()``'s timings judged by ``choose`` (e.g. :func:`decide`), with the machine's load around them: a
    measurement under load above :data:`SUSPECT_LOAD_PER_CORE` per core or with a spread above
    :data:`SUSPECT_SPREAD` is suspect (:func:`remember` then leaves it out of the cache)."""
    load = machine_load()
    timings = timed()
    best, certainty = choose(timings)
    certainty["load_per_core"] = round(max(load, machine_load()), 2)
    certainty["suspect"] = certainty["load_per_core"] > SUSPECT_LOAD_PER_CORE or certainty["spread"] > SUSPECT_SPREAD
    return Judged(best, {option: statistics.median(values) for option, values in timings.items()}, certainty)


def remember(cache_file: Path, key: str, outcome: Judged[Any], entry: dict[str, Any]) -> None:
    """Caches ``entry`` with the outcome's certainty unless the measurement was suspect: a measurement under load is
    this run's, not the machine's, and the next run measures again."""
    if not outcome.certainty["suspect"]:
        _write_cache(cache_file, key, {**entry, "certainty": outcome.certainty})


def choose_clients_per_chunk(model: TargetModel, spec: ParamSpec, data: ClientSplit, rule: ClientRule,
                             clients_at_once: int, autotune: bool = True, pinned: int | None = None,
                             cache_file: Path | None = None) -> ChunkChoice:
    """The chunk size for ``model`` when ``clients_at_once`` clients train per call, from ``data``'s first clients.

    ``pinned`` wins; models without a declared chunk size, runs with ``autotune`` off and calls that train a single
    client keep the declared size; a model whose clients run one by one on this device anyway (``loops_clients_on``)
    trains chunks of one (the same numbers, without stacking its clients' weights and gradients every step).
    Otherwise the cached measurement for this key, else a new one (cached unless suspect).
    """
    if pinned is not None:
        return ChunkChoice(pinned, "pinned", {})
    declared = model.clients_per_chunk
    on_cpu = data.device.type == "cpu"
    most = min(CALIBRATION_CLIENTS if on_cpu else ACCELERATOR_CALIBRATION_CLIENTS,
               max(1, values_per_chunk(data.device) // spec.dim))
    sample = min(clients_at_once, data.num_clients, most)
    if declared is None or not autotune or sample <= 1:
        return ChunkChoice(declared, "model", {})
    if model.loops_clients_on(data.device):  # one by one whatever the chunk: a chunk of one stacks nothing
        return ChunkChoice(1, "model", {})
    cache_file = user_cache_dir() / CACHE_NAME if cache_file is None else cache_file
    key = f"{timing_key(model, spec, data, rule)}|clients={sample}"
    cached = _read_cache(cache_file).get(key)
    if cached is not None:
        return ChunkChoice(cached["clients_per_chunk"], "cached",
                           {int(size): seconds for size, seconds in cached["seconds_per_client"].items()},
                           dict(cached.get("certainty", {})))
    candidates = CANDIDATES if on_cpu else ACCELERATOR_CANDIDATES
    default = min(declared, sample)
    sizes = sorted({size for size in candidates if size < sample} | {sample, default})
    outcome = judged(lambda: measure(model, spec, data.select(torch.arange(sample, device="cpu")), rule, sizes,
                                     default, on_cpu),
                     lambda timings: decide(timings, default, on_cpu))
    log.info("%s: %d clients per chunk, %s (median per client: %s)", type(model).__name__, outcome.best,
             outcome.certainty["decided"],
             ", ".join(f"{size}: {seconds * 1e3:.1f} ms" for size, seconds in outcome.medians.items()))
    remember(cache_file, key, outcome, {"clients_per_chunk": outcome.best, "seconds_per_client": {
        str(size): seconds for size, seconds in outcome.medians.items()}})
    return ChunkChoice(outcome.best, "measured", outcome.medians, outcome.certainty)


def decide(timings: dict[Option, list[float]], default: Option, on_cpu: bool, kept: str = "the default",
           prefer: Callable[[list[Option]], Option] | None = None) -> tuple[Option, dict[str, Any]]:
    """The chunk size (or other option) the timings support, and how sure: the model's ``default`` (named ``kept``
    in the record) unless another size beats it beyond noise, i.e. every one of its timings is below every timing of
    the default (with the interleaved rounds, a chance ordering of two equal sizes has odds 1 in 252 at 5 rounds) and
    its median is TOLERANCE below; among the sizes that do, the fastest (within TOLERANCE: ``prefer`` of those, by
    default the smallest on a CPU, the safe side; the largest on an accelerator, which amortises launches)."""
    medians = {size: statistics.median(values) for size, values in timings.items()}
    spread = max((max(values) - min(values)) / statistics.median(values) for values in timings.values())
    rounds = min(len(values) for values in timings.values())

    def beats_default(size: int) -> bool:
        return (max(timings[size]) < min(timings[default])
                and medians[size] < (1 - TOLERANCE) * medians[default])

    winners = [size for size in medians if size != default and beats_default(size)]
    if not winners:
        fastest = min(medians, key=medians.__getitem__)
        decided = (f"{kept} is the fastest" if fastest == default else
                   f"{kept} kept: {fastest} measured faster, within the timings' spread")
        return default, {"decided": decided, "spread": round(spread, 3), "rounds": rounds}
    fastest = min(medians[size] for size in winners)
    close = [size for size in winners if medians[size] <= fastest * (1 + TOLERANCE)]
    best = prefer(close) if prefer is not None else min(close) if on_cpu else max(close)  # type: ignore[type-var]
    margin = 1 - medians[best] / medians[default]
    return best, {"decided": f"{margin:.0%} faster than {kept} {default}, every timing below {kept}'s",
                  "spread": round(spread, 3), "rounds": rounds}


def measure(model: TargetModel, spec: ParamSpec, data: ClientSplit, rule: ClientRule, sizes: list[Option],
            default: Option | None = None, on_cpu: bool = True,
            setting: str = "clients_per_chunk") -> dict[Option, list[float]]:
    """Seconds per client of :data:`CALIBRATION_STEPS` plain SGD steps for each chunk size in ``sizes`` (or each
    value of another of the model's ``setting``, e.g. ``conv_kernel``): one warm-up each, then
    :data:`CALIBRATION_ROUNDS` interleaved rounds of one timing each, and more rounds (up to
    :data:`CALIBRATION_MAX_ROUNDS`, within :data:`CALIBRATION_SECONDS`) while a size looks faster than ``default``
    without clearing the spread.

    Plain SGD costs what the method's rule costs to within its extra terms (the forward and backward dominate).
    The global RNG is restored afterwards: a model with dropout draws the same masks with or without calibration.
    """
    training = replace(rule.setting.training, steps=CALIBRATION_STEPS)
    calibration = plain_sgd(spec, rule.setting.task, training)
    start = spec.flatten_module(model).detach().unsqueeze(0).repeat(data.num_clients, 1)
    seeds = list(range(data.num_clients))
    declared = getattr(model, setting)
    timings: dict[Option, list[float]] = {}
    devices = [data.device] if data.device.type == "cuda" else []

    def once() -> None:
        train_clients(model, spec, start, data, calibration, seeds)

    began = time.perf_counter()
    with torch.random.fork_rng(devices=devices):
        try:
            for size in sizes:
                setattr(model, setting, size)
                try:
                    once()  # warm-up: allocator, kernel selection
                except torch.OutOfMemoryError:  # this chunk does not fit the device: nor do larger ones
                    if not timings:
                        raise
                    torch.cuda.empty_cache()
                    break
                timings[size] = []
            for round_index in range(CALIBRATION_MAX_ROUNDS):
                if round_index >= CALIBRATION_ROUNDS and (
                        time.perf_counter() - began > CALIBRATION_SECONDS or default not in timings
                        or _settled(timings, default, on_cpu)):
                    break
                for size in timings:
                    setattr(model, setting, size)
                    timings[size].append(synchronised_seconds(once, data.device) / data.num_clients)
        finally:
            setattr(model, setting, declared)
    return timings


def _settled(timings: dict[Option, list[float]], default: Option, on_cpu: bool) -> bool:
    """Whether more rounds cannot change the choice: a size already beats the default, or none looks faster."""
    medians = {size: statistics.median(values) for size, values in timings.items()}
    best, _ = decide(timings, default, on_cpu)
    return best != default or all(medians[size] >= (1 - TOLERANCE) * medians[default] for size in medians)


@dataclass(frozen=True)
class KernelChoice:
    """How one model runs its clients' convolutions in this run (``train.conv_kernel``), and why."""

    conv_kernel: str | None  #: None: the model has no choice to make
    source: str  #: "pinned" (train.conv_kernel), "model" (its default on this device), "measured" or "cached"
    seconds_per_client: dict[str, float]  #: the calibration's median timing per kernel (empty unless measured)
    certainty: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {"conv_kernel": self.conv_kernel, "source": self.source,
                "seconds_per_client": dict(self.seconds_per_client),
                **({"certainty": self.certainty} if self.certainty else {})}


def choose_conv_kernel(model: TargetModel, spec: ParamSpec, data: ClientSplit, rule: ClientRule,
                       clients_at_once: int, autotune: bool = True, pinned: str = "auto",
                       cache_file: Path | None = None) -> KernelChoice:
    """How ``model`` runs many clients' convolutions (:data:`graphfed.models.base.CONV_KERNELS`).

    ``pinned`` (other than ``auto``) wins, and must be one of the model's. A CPU keeps the model's default: the
    grouped convolution trains LeNet within 1.05x of the compute floor there, and BatchNorm networks loop over their
    clients side by side (:mod:`graphfed.client.thread_choice`). On an accelerator each of the model's batched
    kernels (all but ``loop``, which is launch-bound there) trains the run's first clients in one chunk, timed as
    the chunk sizes are (:func:`measure`, :func:`decide`: the model's default unless another beats it beyond the
    timings' spread), and the choice is cached under the same key plus the kernels tried."""
    default = model.default_conv_kernel(data.device)
    if pinned != "auto":
        require_conv_kernel(model, pinned)
        return KernelChoice(pinned, "pinned", {})
    candidates = [kernel for kernel in model.conv_kernels if kernel != "loop"]
    sample = min(clients_at_once, data.num_clients, ACCELERATOR_CALIBRATION_CLIENTS,
                 max(1, values_per_chunk(data.device) // spec.dim))
    if data.device.type == "cpu" or not autotune or len(candidates) < 2 or sample <= 1 or default not in candidates:
        return KernelChoice(default, "model", {})
    return measured_conv_kernel(model, spec, data.select(torch.arange(sample, device="cpu")), rule, candidates,
                                default, user_cache_dir() / CACHE_NAME if cache_file is None else cache_file)


def require_conv_kernel(model: TargetModel, kernel: str) -> None:
    """ConfigError (one line, naming the model's kernels) unless ``model`` can run its clients' convolutions by
    ``kernel``."""
    if kernel not in model.conv_kernels:
        offered = ", ".join(model.conv_kernels) or "none (it has no convolutions to batch)"
        raise ConfigError(f"train.conv_kernel: {type(model).__name__} cannot run {kernel!r}; its kernels: {offered}")


def measured_conv_kernel(model: TargetModel, spec: ParamSpec, data: ClientSplit, rule: ClientRule,
                         candidates: list[str], default: str, cache_file: Path) -> KernelChoice:
    """The fastest of ``candidates`` training all of ``data``'s clients in one chunk (cached, or measured here and
    cached unless suspect); ties go to the earlier candidate (the model's order of preference)."""
    key = f"{timing_key(model, spec, data, rule)}|clients={data.num_clients}|conv kernels={','.join(candidates)}"
    cached = _read_cache(cache_file, _kernel_entry).get(key)
    if cached is not None:
        return KernelChoice(cached["conv_kernel"], "cached", dict(cached["seconds_per_client"]),
                            dict(cached.get("certainty", {})))
    on_cpu = data.device.type == "cpu"

    def timed() -> dict[str, list[float]]:
        declared_chunk, model.clients_per_chunk = model.clients_per_chunk, data.num_clients
        try:
            return measure(model, spec, data, rule, candidates, default, on_cpu, setting="conv_kernel")
        finally:
            model.clients_per_chunk = declared_chunk

    outcome = judged(timed, lambda timings: decide(timings, default, on_cpu, kept=f"the model's {default}",
                                                   prefer=lambda close: min(close, key=candidates.index)))
    log.info("%s: %s convolutions, %s (median per client: %s)", type(model).__name__, outcome.best,
             outcome.certainty["decided"],
             ", ".join(f"{kernel}: {seconds * 1e3:.2f} ms" for kernel, seconds in outcome.medians.items()))
    remember(cache_file, key, outcome, {"conv_kernel": outcome.best, "seconds_per_client": outcome.medians})
    return KernelChoice(outcome.best, "measured", outcome.medians, outcome.certainty)


#: local steps a pack's calibration times (at most; the run's own count if fewer)
PACK_CALIBRATION_STEPS = 2
#: runs whose clients the calibration's one call trains (at most): enough to show whether sharing pays, few enough
#: that a compute-bound model's calibration costs about one run's round, not the pack's
PACK_CALIBRATION_RUNS = 4
#: a pack shares its calls only when one call takes at most this share of the runs' calls one by one: a small gain
#: does not pay for holding every run's data at once (compute-bound models, e.g. a CNN on the CPU, gain nothing)
PACK_GAIN = 0.8


@dataclass(frozen=True)
class PackChoice:
    """Whether several runs' clients train faster in one call than run by run, as measured here."""

    batched: bool
    source: str  #: "measured" or "cached"
    seconds: dict[str, float]  #: "alone": one run's clients' steps; "packed": "trial_runs" runs' in one call

    def record(self) -> dict[str, Any]:
        return {"batched": self.batched, "source": self.source, "seconds": self.seconds}


def choose_packing(model: TargetModel, spec: ParamSpec, data: ClientSplit, rule: ClientRule, cohort: int, runs: int,
                   cache_file: Path | None = None) -> PackChoice:
    """Whether ``runs`` runs of ``cohort`` clients a round should train in one call: a few of the run's own local
    steps (:data:`PACK_CALIBRATION_STEPS`) timed for one run's clients and for :data:`PACK_CALIBRATION_RUNS` runs'
    clients in one call, best of two each. Packing pays where a round is kernel launches and Python, not arithmetic:
    it is chosen when the one call measures clearly faster per run (:data:`PACK_GAIN`) than a run alone. Cached like
    the chunk size."""
    cache_file = user_cache_dir() / CACHE_NAME if cache_file is None else cache_file
    key = (f"{timing_key(model, spec, data, rule)}|steps={rule.total_steps}|pack cohort={cohort} runs={runs} "
           f"gain={PACK_GAIN} trial={PACK_CALIBRATION_RUNS}x{PACK_CALIBRATION_STEPS}")
    cached = _read_cache(cache_file, _pack_entry).get(key)
    if cached is not None:
        return PackChoice(cached["batched"], "cached", {name: float(seconds) for name, seconds
                                                         in cached["seconds"].items()})
    training = replace(rule.setting.training, steps=min(rule.setting.training.steps, PACK_CALIBRATION_STEPS))
    calibration = plain_sgd(spec, rule.setting.task, training)
    alone = torch.arange(min(cohort, data.num_clients), device="cpu")
    trial_runs = min(runs, PACK_CALIBRATION_RUNS)
    timings: dict[str, float] = {}
    devices = [data.device] if data.device.type == "cuda" else []

    def one_round(clients: torch.Tensor) -> Callable[[], object]:
        start = spec.flatten_module(model).detach().unsqueeze(0).repeat(len(clients), 1)
        selected, seeds = data.select(clients), list(range(len(clients)))
        return lambda: train_clients(model, spec, start, selected, calibration, seeds)

    with torch.random.fork_rng(devices=devices):
        for name, clients in (("alone", alone), ("packed", alone.repeat(trial_runs))):
            run = one_round(clients)
            run()  # warm-up
            timings[name] = min(synchronised_seconds(run, data.device) for _ in range(2))
    batched = timings["packed"] / trial_runs <= PACK_GAIN * timings["alone"]
    seconds = {"alone": timings["alone"], "packed": timings["packed"], "trial_runs": trial_runs}
    log.info("packing %d runs: %s (one run's round %.1f ms, %d runs' in one call %.1f ms)", runs,
             "one call" if batched else "run by run", 1e3 * timings["alone"], trial_runs, 1e3 * timings["packed"])
    _write_cache(cache_file, key, {"batched": batched, "seconds": seconds})
    return PackChoice(batched, "measured", seconds)


def synchronised_seconds(run: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of ``run()``, waiting for a CUDA device's queued work before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - begin


def _chunk_entry(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("clients_per_chunk"), int)
            and value["clients_per_chunk"] >= 1 and isinstance(value.get("seconds_per_client"), dict))


def _pack_entry(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("batched"), bool) and isinstance(value.get("seconds"),
                                                                                             dict)


def _threads_entry(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("torch_threads"), int) and value["torch_threads"] >= 1
            and isinstance(value.get("seconds_per_round"), dict))


def _kernel_entry(value: Any) -> bool:
    return (isinstance(value, dict) and value.get("conv_kernel") in CONV_KERNELS
            and isinstance(value.get("seconds_per_client"), dict))


def _read_cache(path: Path, valid: Callable[[Any], bool] = _chunk_entry) -> dict[str, Any]:
    """The cached choices of one kind (``valid`` tells its entries); an unreadable or malformed cache counts as
    empty (it is only a cache)."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(entries, dict):
        return {}
    return {key: value for key, value in entries.items() if valid(value)}


def _write_cache(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Adds ``entry`` atomically (a temporary file renamed over the old one); a cache that cannot be written only
    costs a calibration next time."""
    entries = _read_cache(path, lambda value: any(valid(value) for valid in (_chunk_entry, _pack_entry,
                                                                             _threads_entry, _kernel_entry)))
    entries[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".autotune-", suffix=".json")
        with os.fdopen(fd, "w") as handle:
            json.dump(entries, handle, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as error:
        log.warning("could not write the autotune cache %s: %s", path, error)
