"""graphfed's local training against a sequential per-client loop, over models x clients x batch sizes (CPU).

The loop is written the way PFLlib and FL-bench clients train: per client, a fresh copy of the model loaded with
the start weights, ``model.train()``, a ``DataLoader`` over the client's own tensors (``steps`` full batches of
``batch_size`` rows drawn with replacement, as graphfed draws them), ``torch.optim.SGD`` with ``zero_grad /
backward / step``, client after client. graphfed is one call of
:func:`graphfed.client.training.train_clients` for all clients (their weights as rows of one tensor), its clients
batched as a run's start-of-run calibration chooses (``graphfed.client.autotune``; the calibration's own time is
reported as ``calibration_s``). Both sides run the same number of SGD steps of the same batch size from the same
start weights on the same client data (not the same batches: the loop draws its own), once as warm-up, then
``--repeats`` times alternating; the best time counts. ``ratio`` = loop seconds / graphfed seconds: above 1,
graphfed is faster. The loop also runs a second time as its own side (``noise_ratio`` = loop / loop again): how far
timing noise alone moves a ratio on this machine, the yardstick for cells near 1.0.

Grid: models {mlp, lenet, cnn-bn, resnet-like} x clients trained together {20, 100, 50 (the pfl-research round of
50 clients out of 1,000)} x batch {10, 32}, 50 rows per client (pfl-research's CIFAR-10 clients), 5 local steps.

Realistic cells (``--realistic``; written under ``realistic``): what users run on CIFAR-10, where a step is
arithmetic, not overhead: PFLlib's default CIFAR-10 CNN (conv5x5 3->32, pool, conv5x5 32->64, pool, fc 1600->512,
fc 512->10: graphfed's ``lenet`` at 32 / 64 / 512 / 10), ``cnn-bn`` and ``resnet-like`` (width 8), on the real
CIFAR-10 Dir(0.1) splits of 20 and 100 clients (each client's own training rows), 50 and 10 local steps, batch 10
and 32. The loop there is the one PFLlib and FL-bench write: ``copy.deepcopy`` of the model per client, a shuffling
``DataLoader`` over the client's tensors (epochs until the steps are done), ``SGD``, ``zero_grad / backward /
step``, the module called as a module, on the images as they come (NCHW). For a network graphfed hands its images
in another layout (CNN-BN: channels-last on a CPU), the loop also runs a second time with its batches in that layout
(``loop_in_layout_s``): how much of graphfed's edge is the layout. graphfed runs as a run at the default settings
does: the chunk size a fresh calibration of the run's own kind picks and, for a network that trains its clients one
at a time (CNN-BN, ResNet-like), the thread count a fresh measurement picks (``graphfed.client.thread_choice``: the
default threads, or one each with clients side by side); each choice, its time and its certainty are recorded. All
sides run interleaved, best of ``--repeats``. The grid's cells make the same two choices.

    .venv/bin/python benchmarks/cpu_grid.py             # writes benchmarks/results/cpu_grid.json
    .venv/bin/python benchmarks/cpu_grid.py --realistic --out benchmarks/results/cpu_realistic.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from graphfed.client.autotune import ChunkChoice, choose_clients_per_chunk
from graphfed.client.contract import LocalTraining, plain_sgd
from graphfed.client.side_by_side import on_one_thread
from graphfed.client.thread_choice import CHOICE_STEPS, SCORED_ROWS, RoundShape, ThreadsChoice, choose_torch_threads
from graphfed.client.training import train_clients
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.models import build_model
from graphfed.models.base import TargetModel
from graphfed.provenance import code_provenance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_throughput import machine_info

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("mlp", "lenet", "cnn-bn", "resnet-like")
CLIENTS = (20, 100, 50)
BATCHES = (10, 32)
ROWS_PER_CLIENT = 50
CLASSES = 10


def federation_shape(model: str) -> SimpleNamespace:
    shape = (784,) if model == "mlp" else (3, 32, 32)
    return SimpleNamespace(name="grid", task="classification", input_shape=shape, output_dim=CLASSES)


def client_data(model: str, clients: int, seed: int) -> ClientSplit:
    generator = torch.Generator().manual_seed(seed)
    shape = federation_shape(model).input_shape
    xs = [torch.randn(ROWS_PER_CLIENT, *shape, generator=generator) for _ in range(clients)]
    ys = [torch.randint(0, CLASSES, (ROWS_PER_CLIENT,), generator=generator) for _ in range(clients)]
    return ClientSplit.from_lists(xs, ys, "classification")


def run_graphfed(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit,
                 training: LocalTraining) -> torch.Tensor:
    rule = plain_sgd(spec, "classification", training)
    return train_clients(model, spec, start, data, rule, list(range(data.num_clients))).trained


def client_copy(model: TargetModel, spec: ParamSpec, start: torch.Tensor, client: int,
                training: LocalTraining) -> tuple[TargetModel, torch.optim.SGD]:
    """What a per-client loop starts each client with: a deep copy of the model holding the client's start weights,
    in training mode, and a fresh SGD optimizer over it."""
    local = copy.deepcopy(model)
    local.load_state_dict(dict(spec.unflatten(start[client])), strict=False)
    local.train()
    return local, torch.optim.SGD(local.parameters(), lr=training.lr)


def run_loop(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit,
             training: LocalTraining) -> torch.Tensor:
    trained = []
    for client in range(data.num_clients):
        local, optimizer = client_copy(model, spec, start, client, training)
        x, y = data.client(client)
        # full batches drawn with replacement, as graphfed draws them: both sides process steps x batch rows (a
        # shuffled pass over 50 rows in batches of 32 would alternate 32- and 18-row batches, 18 % less work)
        rows = TensorDataset(x, y)
        loader = DataLoader(rows, batch_size=training.batch_size,
                            sampler=RandomSampler(rows, replacement=True,
                                                  num_samples=training.steps * training.batch_size))
        for batch_x, batch_y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(functional_call(local, dict(local.named_parameters()), (batch_x,)),
                                               batch_y)
            loss.backward()
            optimizer.step()
        trained.append(spec.flatten_module(local))
    return torch.stack(trained)


#: (model, options) of the realistic cells: PFLlib's CIFAR-10 CNN in graphfed's LeNet, CNN-BN, ResNet-like
REALISTIC_MODELS = (("lenet", {"channels": 32, "channels2": 64, "hidden": 512, "hidden2": 10}), ("cnn-bn", {}),
                    ("resnet-like", {"width": 8}))
#: (clients, local steps) of the realistic cells: a round of 20 clients x 50 steps and of 100 clients x 10 steps
REALISTIC_ROUNDS = ((20, 50), (100, 10))
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def cifar_clients(clients: int, data_dir: Path) -> ClientSplit:
    """The training rows of each client of CIFAR-10 Dir(0.1) over ``clients`` clients (seed 0), as a run has them."""
    from graphfed.config import load_config
    from graphfed.data import build_federation

    config = load_config(None, ["dataset.name=cifar10", f"dataset.data_dir={data_dir}",
                                f"dataset.num_clients={clients}", "dataset.partition=dirichlet",
                                "dataset.dirichlet_beta=0.1", "dataset.novel_fraction=0"])
    return build_federation(config.dataset, config.seed).train


def cifar_model(model_name: str, options: dict[str, Any]) -> TargetModel:
    """A CIFAR-10 network (3x32x32 images, 10 classes) as a run on CIFAR-10 builds it."""
    return build_model(model_name, SimpleNamespace(name="cifar10", task="classification",  # type: ignore[arg-type]
                                                   input_shape=(3, 32, 32), output_dim=CLASSES), options)


def run_module_loop(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit,
                    training: LocalTraining, layout: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """PFLlib's / FL-bench's client loop: a deep copy of the model per client, a shuffling DataLoader over its
    rows (as many epochs as the steps take), SGD, backward, step; the module called as a module, on each batch in
    ``layout`` (PFLlib's: the layout the data come in)."""
    trained = []
    for client in range(data.num_clients):
        local, optimizer = client_copy(model, spec, start, client, training)
        x, y = data.client(client)
        # full batches as graphfed draws them; a client with fewer rows than a batch trains on all of them
        loader = DataLoader(TensorDataset(x, y), batch_size=training.batch_size, shuffle=True,
                            drop_last=len(x) >= training.batch_size)
        done = 0
        while done < training.steps and len(x):
            for batch_x, batch_y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(local(batch_x.contiguous(memory_format=layout)), batch_y).backward()
                optimizer.step()
                done += 1
                if done == training.steps:
                    break
        trained.append(spec.flatten_module(local))
    return torch.stack(trained)


def fresh_calibration(model: TargetModel, spec: ParamSpec, data: ClientSplit, training: LocalTraining,
                      clients: int) -> tuple[ChunkChoice, float]:
    """The chunk-size calibration a run makes at its start, from an empty cache (as on a new machine), and its
    seconds."""
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        choice = choose_clients_per_chunk(model, spec, data, plain_sgd(spec, "classification", training), clients,
                                          cache_file=Path(cache) / "autotune.json")
    return choice, time.perf_counter() - began


def fresh_threads_choice(model: TargetModel, spec: ParamSpec, training: LocalTraining, clients: int,
                         input_shape: tuple[int, ...]) -> tuple[ThreadsChoice | None, float]:
    """The thread count a run at the default settings measures at its start, from an empty cache (None for a network
    that batches its clients: it keeps the default threads), and its seconds. The run: every client trains each
    round, scored every 10 rounds (``train.eval_every``'s default)."""
    if not model.loops_clients_on(torch.device("cpu")) or torch.get_num_threads() == 1:
        return None, 0.0
    began = time.perf_counter()
    rule = plain_sgd(spec, "classification", LocalTraining(min(training.steps, CHOICE_STEPS), training.batch_size,
                                                           training.lr))
    shape = RoundShape(clients * training.steps, 2 * clients * SCORED_ROWS / 10)
    with tempfile.TemporaryDirectory() as cache:
        choice = choose_torch_threads(model, spec, rule, input_shape, CLASSES, shape, Path(cache) / "autotune.json")
    return choice, time.perf_counter() - began


def at_default_settings(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit,
                        training: LocalTraining) -> tuple[Any, dict[str, Any]]:
    """graphfed's side as a run with the default settings trains: the chunk size and the thread count its fresh
    calibrations choose; and the record of both."""
    chunk, calibration_s = fresh_calibration(model, spec, data, training, data.num_clients)
    model.clients_per_chunk = chunk.clients_per_chunk
    threads, threads_s = fresh_threads_choice(model, spec, training, data.num_clients, tuple(data.x.shape[1:]))
    record = {"execution": chunk.record(), "calibration_s": round(calibration_s + threads_s, 3)}
    if threads is None or threads.torch_threads == torch.get_num_threads():
        return (lambda: run_graphfed(model, spec, start, data, training)), {**record, **threads_record(threads)}
    return (lambda: on_one_thread(lambda: run_graphfed(model, spec, start, data, training))), \
        {**record, **threads_record(threads)}


def threads_record(choice: ThreadsChoice | None) -> dict[str, Any]:
    return {} if choice is None else {"threads": choice.record()}


def measure_realistic(model_name: str, options: dict[str, Any], data: ClientSplit, steps: int, batch: int,
                      repeats: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = cifar_model(model_name, options)
    spec = ParamSpec.from_module(model)
    start = spec.flatten_module(model).unsqueeze(0).repeat(data.num_clients, 1)
    training = LocalTraining(steps, batch, 0.05)
    graphfed, choices = at_default_settings(model, spec, start, data, training)
    sides = {"graphfed": graphfed, "loop": lambda: run_module_loop(model, spec, start, data, training)}
    layout = model.images_layout_on(torch.device("cpu"))
    if layout != torch.contiguous_format:  # what the loop gets with graphfed's layout: graphfed's edge beyond it
        sides["loop_in_layout"] = lambda: run_module_loop(model, spec, start, data, training, layout)
    for run in sides.values():  # warm-up
        run()
    times = {name: float("inf") for name in sides}
    for repeat in range(repeats):  # interleaved, in alternating order: both sides see the same load and neither
        # always runs first (the first of a pair measured a few % slower here, whichever it was)
        for name, run in (sides.items() if repeat % 2 == 0 else reversed(sides.items())):
            times[name] = min(times[name], best_time(run, 1))
    return {"model": model_name, "options": options, "parameters": spec.dim, "clients": data.num_clients,
            "median_rows": int(data.counts.median()), "batch": batch, "steps": steps, **choices,
            "graphfed_s": round(times["graphfed"], 3), "loop_s": round(times["loop"], 3),
            "ratio": round(times["loop"] / times["graphfed"], 3),
            **({} if "loop_in_layout" not in times else
               {"images_layout": str(layout).removeprefix("torch."),
                "loop_in_layout_s": round(times["loop_in_layout"], 3),
                "ratio_to_loop_in_layout": round(times["loop_in_layout"] / times["graphfed"], 3)})}


def realistic(repeats: int, data_dir: Path, models: list[str] | None) -> list[dict[str, Any]]:
    cells = []
    for clients, steps in REALISTIC_ROUNDS:
        data = cifar_clients(clients, data_dir)
        for model_name, options in REALISTIC_MODELS:
            if models and model_name not in models:
                continue
            for batch in BATCHES:
                cell = measure_realistic(model_name, options, data, steps, batch, repeats)
                cells.append(cell)
                print(f"{model_name:12s} {clients:4d} clients x {steps} steps, batch {batch:3d}: graphfed "
                      f"{cell['graphfed_s']:.2f} s ({how_it_ran(cell)}, calibration {cell['calibration_s']:.1f} s), "
                      f"loop {cell['loop_s']:.2f} s, ratio {cell['ratio']:.2f}x"
                      + (f" (loop in graphfed's layout {cell['loop_in_layout_s']:.2f} s, "
                         f"{cell['ratio_to_loop_in_layout']:.2f}x)" if "loop_in_layout_s" in cell else ""), flush=True)
    return cells


def how_it_ran(cell: dict[str, Any]) -> str:
    threads = cell.get("threads")
    side = ("" if threads is None else f", {threads['torch_threads']} thread(s)"
            + (f", {threads['clients_side_by_side']} side by side" if threads["torch_threads"] == 1 else ""))
    return f"{cell['execution']['clients_per_chunk']} per chunk{side}"


def best_time(run: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        begin = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - begin)
    return best


def measure(model_name: str, clients: int, batch: int, steps: int, repeats: int, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = build_model(model_name, federation_shape(model_name), {})  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    start = spec.flatten_module(model).unsqueeze(0).repeat(clients, 1)
    data = client_data(model_name, clients, seed)
    training = LocalTraining(steps, batch, 0.05)
    # graphfed runs as a run at the default settings would: the chunk size and threads its start-of-run
    # calibrations measure (not cached)
    graphfed, choices = at_default_settings(model, spec, start, data, training)
    # the loop a second time, as its own side: loop / loop_again is what timing noise alone does to a ratio here
    sides = {"graphfed": graphfed,
             "loop": lambda: run_loop(model, spec, start, data, training),
             "loop_again": lambda: run_loop(model, spec, start, data, training)}
    for run in sides.values():  # warm-up
        run()
    times = {name: float("inf") for name in sides}
    for _ in range(repeats):  # alternating: both sides see the same background load
        for name, run in sides.items():
            times[name] = min(times[name], best_time(run, 1))
    return {"model": model_name, "parameters": spec.dim, "clients": clients, "batch": batch, "steps": steps,
            "clients_per_chunk": choices["execution"]["clients_per_chunk"], **choices,
            "graphfed_s": round(times["graphfed"], 4), "loop_s": round(times["loop"], 4),
            "ratio": round(times["loop"] / times["graphfed"], 3),
            "noise_ratio": round(times["loop"] / times["loop_again"], 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "cpu_grid.json")
    parser.add_argument("--realistic", action="store_true",
                        help="the realistic CIFAR-10 cells against PFLlib's loop instead of the grid")
    parser.add_argument("--data-dir", type=Path, default=DATA)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.realistic:
        cells = realistic(args.repeats, args.data_dir, args.models.split(",") if args.models != ",".join(MODELS)
                          else None)
        result = {"benchmark": "cpu_realistic", "torch": torch.__version__, "threads": args.threads,
                  "machine": machine_info(), "cells": cells,
                  "cells_below_1x": [f"{c['model']} {c['clients']}x{c['steps']} b{c['batch']}: {c['ratio']}x"
                                     for c in cells if c["ratio"] < 1.0], "code": code_provenance()}
        if args.out.exists():  # keep what pfllib_side_by_side.py wrote there
            kept = json.loads(args.out.read_text()).get("pfllib")
            result.update({"pfllib": kept} if kept else {})
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{len(cells)} cells, {len(result['cells_below_1x'])} below 1.0x -> {args.out}")
        return 0
    cells = []
    for model_name in args.models.split(","):
        for clients in CLIENTS:
            for batch in BATCHES:
                cell = measure(model_name, clients, batch, args.steps, args.repeats, args.seed)
                cells.append(cell)
                print(f"{model_name:12s} {clients:4d} clients batch {batch:3d}: graphfed {cell['graphfed_s']:.3f} s "
                      f"({how_it_ran(cell)}), "
                      f"loop {cell['loop_s']:.3f} s, ratio {cell['ratio']:.2f}x (loop/loop {cell['noise_ratio']:.2f})",
                      flush=True)
    below = [cell for cell in cells if cell["ratio"] < 1.0]
    noise = max(abs(cell["noise_ratio"] - 1.0) for cell in cells)
    result = {"benchmark": "cpu_grid", "torch": torch.__version__, "threads": args.threads, "steps": args.steps,
              "rows_per_client": ROWS_PER_CLIENT, "machine": machine_info(), "cells": cells,
              "cells_below_1x": [f"{c['model']} {c['clients']}x{c['batch']}: {c['ratio']}x" for c in below],
              "largest_noise_ratio_deviation": round(noise, 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result["code"] = code_provenance()  # the numbers are tied to the code that made them
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{len(cells)} cells, {len(below)} below 1.0x -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
