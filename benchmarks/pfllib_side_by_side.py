"""graphfed's FedAvg round against PFLlib's own, side by side on one machine, on graphfed's CIFAR-10 Dir(0.1) splits.

PFLlib is not part of graphfed: name a checkout of it (``--pfllib PATH``, the folder holding ``system/``). Nothing
of it enters this repository; this script imports its classes from there, unmodified: its ``FedAvg`` server and
``clientAVG`` clients with its CIFAR-10 CNN (``FedAvgCNN``: conv5x5 3->32, pool, conv5x5 32->64, pool, fc 1600->512,
fc 512->10, which is graphfed's ``lenet`` at 32 / 64 / 512 / 10). PFLlib's server imports ``h5py`` to save results,
which no round here does: where it is not installed, an empty module stands in for it.

**Equal work.** PFLlib trains ``local_epochs`` passes over each client's file in full batches (``drop_last``); graphfed
trains ``steps`` batches per client. So each client's training file holds exactly ``steps x batch`` of its own rows
(graphfed's split, seed 0: a random subset, or drawn again when a client has fewer), PFLlib trains one epoch over it,
and graphfed trains ``steps`` steps of ``batch`` on the same rows: both sides make the same SGD steps on batches of
the same size and the same images, every client every round.

**One round.** PFLlib: ``select_clients``, ``send_models``, each selected client's ``train()``, ``receive_models``,
``aggregate_parameters`` (its ``train()`` loop without evaluation or printing). Each ``client.train()`` reads the
client's ``.npz`` file again and builds a ``DataLoader`` (PFLlib's ``load_train_data``): that time is measured apart
(``pfllib_reads_s``, a timing wrapper around ``read_client_data`` where the client module calls it) and
``pfllib_train_s`` is the round without it, the reference graphfed is held to (``ratio`` = pfllib_train_s /
graphfed_s). graphfed: one call of ``train_clients`` for every client, as a run at the default settings makes it
(its start-of-run calibration picks the chunk size; ``benchmarks/cpu_grid.py``'s ``at_default_settings``), and the
FedAvg mean; and, as a user's run spends it, a whole round of the simulator (``graphfed_round_s``: FedAvg, every
client, no evaluation; sending, training, the server's mean and the round's set-up; its clients draw their rows from
all their training rows), held to PFLlib's training in ``round_ratio`` and to PFLlib's whole round in
``ratio_as_a_user_sees_it``. ``cpu_grid``'s per-client loop runs on the same rows too (``loop_s``), so
``loop_calibration`` = loop_s / pfllib_train_s says how far that loop, the reference of ``cpu_grid.py --realistic``,
is from PFLlib's.

**The floor** (``floor_s``): one network on all of a step's images at once (clients x batch rows), ``steps`` SGD
steps, what batching the clients could at best become if they were one client. ``floor_ratio`` = floor_s /
graphfed_s: below 1, graphfed is slower than that; above 1 the "floor" is slower than graphfed (on a CPU one large
batch can lose its caches), so it bounds nothing there.

All sides run interleaved, alternating their order, after a warm-up; the median of ``--repeats`` counts. Written to
``--out`` under ``pfllib`` (other keys of the file are kept).

    git clone <PFLlib> /tmp/PFLlib   # any checkout of PFLlib
    .venv/bin/python benchmarks/pfllib_side_by_side.py --pfllib /tmp/PFLlib
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphfed.client.contract import LocalTraining
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.provenance import code_provenance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_grid import (
    DATA,
    REALISTIC_MODELS,
    at_default_settings,
    cifar_clients,
    cifar_model,
    run_module_loop,
)
from sim_throughput import machine_info

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_realistic.json"
#: (clients, local steps, batch) of the comparison: the issue's cells
CELLS = ((20, 50, 10), (20, 50, 32), (100, 10, 10), (100, 10, 32))
LR = 0.05
DATASET = "graphfed-cifar10"


def equal_work_split(data: ClientSplit, steps: int, batch: int, seed: int = 0) -> ClientSplit:
    """Each client's ``steps x batch`` training rows, its own (a random subset; drawn again when it has fewer)."""
    generator = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    want = steps * batch
    for client in range(data.num_clients):
        x, y = data.client(client)
        count = len(x)
        rows = (torch.randperm(count, generator=generator)[:want] if count >= want
                else torch.randint(count, (want,), generator=generator))
        xs.append(x[rows])
        ys.append(y[rows])
    return ClientSplit.from_lists(xs, ys, "classification")


def export_pfllib(data: ClientSplit, folder: Path) -> None:
    """The split in PFLlib's format: ``dataset/<name>/{train,test}/<client>.npz``, each holding ``data`` = a dict of
    ``x`` (float32 NCHW) and ``y`` (int64), the object PFLlib's ``read_data`` loads. The test files hold the first
    10 training rows (no round here evaluates)."""
    for split in ("train", "test"):
        (folder / "dataset" / DATASET / split).mkdir(parents=True, exist_ok=True)
    for client in range(data.num_clients):
        x, y = data.client(client)
        for split, rows in (("train", slice(None)), ("test", slice(0, 10))):
            with (folder / "dataset" / DATASET / split / f"{client}.npz").open("wb") as f:
                np.savez_compressed(f, data={"x": x[rows].numpy().astype(np.float32),
                                             "y": y[rows].numpy().astype(np.int64)})


@contextlib.contextmanager
def pfllib_imported(checkout: Path, workdir: Path) -> Iterator[types.SimpleNamespace]:
    """PFLlib's modules, imported from ``checkout/system`` with ``workdir/system`` as the working directory (PFLlib
    reads ``../dataset/<name>``); ``reads``: the seconds its clients spent in ``read_client_data`` so far."""
    system = checkout / "system"
    if not (system / "flcore" / "servers" / "serveravg.py").is_file():
        raise SystemExit(f"--pfllib {checkout}: no system/flcore/servers/serveravg.py there (a PFLlib checkout?)")
    try:
        importlib.import_module("h5py")
    except ImportError:  # only its save_results uses it
        sys.modules["h5py"] = types.ModuleType("h5py")
    sys.path.insert(0, str(system))
    (workdir / "system").mkdir(exist_ok=True)
    before = Path.cwd()
    os.chdir(workdir / "system")
    try:
        serveravg = importlib.import_module("flcore.servers.serveravg")
        clientbase = importlib.import_module("flcore.clients.clientbase")
        models = importlib.import_module("flcore.trainmodel.models")
        timing = types.SimpleNamespace(reads=0.0, serveravg=serveravg, models=models)
        original = clientbase.read_client_data

        def timed_read(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timing.reads += time.perf_counter() - began

        clientbase.read_client_data = timed_read  # the name clientbase's load_train_data calls
        yield timing
    finally:
        os.chdir(before)
        sys.path.remove(str(system))


def pfllib_args(model: torch.nn.Module, clients: int, batch: int) -> types.SimpleNamespace:
    """What PFLlib's ``main.py`` hands its server (FedAvg, every client every round, one local epoch)."""
    return types.SimpleNamespace(
        model=model, algorithm="FedAvg", dataset=DATASET, device="cpu", save_folder_name="items", num_classes=10,
        batch_size=batch, local_learning_rate=LR, local_epochs=1, few_shot=0, learning_rate_decay=False,
        learning_rate_decay_gamma=0.99, global_rounds=1, num_clients=clients, join_ratio=1.0, random_join_ratio=False,
        time_select=False, goal="bench", time_threthold=10000, top_cnt=100, auto_break=False, eval_gap=1,
        client_drop_rate=0.0, train_slow_rate=0.0, send_slow_rate=0.0, dlg_eval=False, dlg_gap=100,
        batch_num_per_client=2, num_new_clients=0, fine_tuning_epoch_new=0)


def pfllib_round(server: Any) -> None:
    """PFLlib's FedAvg.train() for one round, without its evaluation and printing."""
    server.selected_clients = server.select_clients()
    server.send_models()
    for client in server.selected_clients:
        client.train()
    server.receive_models()
    server.aggregate_parameters()


def floor_step(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, steps: int) -> Callable[[], None]:
    """One network on all of a step's images, ``steps`` SGD steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    def run() -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
    return run


def profile(run: Callable[[], Any], top: int = 12) -> dict[str, Any]:
    """Where one call's CPU time goes (``torch.profiler``): the ``top`` operators by self time, with their share."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    events = prof.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    ranked = sorted(events, key=lambda event: event.self_cpu_time_total, reverse=True)[:top]
    return {"self_cpu_s": round(total / 1e6, 3),
            "top": [{"op": event.key, "calls": event.count, "self_s": round(event.self_cpu_time_total / 1e6, 3),
                     "share": round(event.self_cpu_time_total / total, 3)} for event in ranked]}


def engine_round(clients: int, steps: int, batch: int, data_dir: Path) -> Callable[[], Any]:
    """A whole FedAvg round of graphfed's simulator on CIFAR-10 Dir(0.1) (every client; no evaluation): what a run
    spends per round, set-up, sending and the server's mean included. Its clients draw their ``steps x batch`` rows
    from all their training rows: the same arithmetic as the other sides, on rows of their own."""
    from graphfed.config import load_config
    from graphfed.sim.engine import Simulator

    name, options = REALISTIC_MODELS[0]
    config = load_config(None, [
        "dataset.name=cifar10", f"dataset.data_dir={data_dir}", f"dataset.num_clients={clients}",
        "dataset.partition=dirichlet", "dataset.dirichlet_beta=0.1", "dataset.novel_fraction=0",
        f"model.name={name}", f"model.options={json.dumps(options)}", "method.name=fedavg",
        f"train.local_steps={steps}", f"train.batch_size={batch}", f"train.lr={LR}",
        f"train.clients_per_round={clients}", "train.rounds=1000", "train.eval_every=1000"])
    simulator = Simulator(config, None, progress=False)
    rounds = iter(range(config.train.rounds))
    return lambda: simulator.run_round(next(rounds))


def measure(checkout: Path, data: ClientSplit, steps: int, batch: int, repeats: int, data_dir: Path,
            profiled: bool = False) -> dict[str, Any]:
    clients = data.num_clients
    rows = equal_work_split(data, steps, batch)
    torch.manual_seed(0)
    name, options = REALISTIC_MODELS[0]
    model = cifar_model(name, options)
    spec = ParamSpec.from_module(model)
    start = spec.flatten_module(model).unsqueeze(0).repeat(clients, 1)
    training = LocalTraining(steps, batch, LR)
    graphfed_train, choices = at_default_settings(model, spec, start, rows, training)
    counts = rows.counts.to(torch.float32)

    def graphfed() -> None:
        trained = graphfed_train()
        (counts / counts.sum()) @ trained  # the FedAvg mean

    with tempfile.TemporaryDirectory(prefix="graphfed-pfllib-") as work, \
            pfllib_imported(checkout, Path(work)) as pfllib:
        export_pfllib(rows, Path(work))
        torch.manual_seed(0)
        server = pfllib.serveravg.FedAvg(pfllib_args(pfllib.models.FedAvgCNN(3, 10, 1600), clients, batch), 0)
        step_images = torch.cat([rows.client(c)[0][:batch] for c in range(clients)])
        step_labels = torch.cat([rows.client(c)[1][:batch] for c in range(clients)])
        floor = floor_step(cifar_model(name, options), step_images, step_labels, steps)
        reads: list[float] = []

        def pfllib_side() -> None:
            before = pfllib.reads
            pfllib_round(server)
            reads.append(pfllib.reads - before)

        sides: dict[str, Callable[[], Any]] = {
            "graphfed": graphfed, "graphfed_round": engine_round(clients, steps, batch, data_dir),
            "pfllib": pfllib_side,
            "loop": lambda: run_module_loop(model, spec, start, rows, training), "floor": floor}
        for run in sides.values():  # warm-up
            run()
        reads.clear()
        times: dict[str, list[float]] = {side: [] for side in sides}
        for repeat in range(repeats):  # interleaved, alternating order: the same background load for every side
            for side, run in (sides.items() if repeat % 2 == 0 else reversed(sides.items())):
                began = time.perf_counter()
                run()
                times[side].append(time.perf_counter() - began)
        timed_reads = list(reads)  # (a profiled PFLlib round below reads again)
        profiles = ({side: profile(sides[side]) for side in ("graphfed", "graphfed_round", "pfllib")} if profiled
                    else None)
    median = {side: statistics.median(values) for side, values in times.items()}
    train_alone = statistics.median([total - read for total, read in zip(times["pfllib"], timed_reads, strict=True)])
    return {"model": f"{name} (PFLlib's FedAvgCNN)", "clients": clients, "steps": steps, "batch": batch,
            "rows_per_client": steps * batch, **choices,
            "graphfed_s": round(median["graphfed"], 3), "graphfed_round_s": round(median["graphfed_round"], 3),
            "pfllib_round_s": round(median["pfllib"], 3),
            "pfllib_reads_s": round(statistics.median(timed_reads), 3), "pfllib_train_s": round(train_alone, 3),
            "loop_s": round(median["loop"], 3), "floor_s": round(median["floor"], 3),
            "reference": "PFLlib's round without its file re-reads (pfllib_train_s)",
            "ratio": round(train_alone / median["graphfed"], 3),
            "ratio_as_a_user_sees_it": round(median["pfllib"] / median["graphfed_round"], 3),
            "round_ratio": round(train_alone / median["graphfed_round"], 3),
            "loop_calibration": round(median["loop"] / train_alone, 3),
            "floor_ratio": round(median["floor"] / median["graphfed"], 3),
            "repeats": {side: [round(t, 3) for t in values] for side, values in times.items()},
            **({"profiles": profiles} if profiles else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pfllib", type=Path, required=True, help="a PFLlib checkout (the folder holding system/)")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cells", default=",".join(f"{c}x{s}b{b}" for c, s, b in CELLS),
                        help="clients x steps b batch, comma-separated")
    parser.add_argument("--data-dir", type=Path, default=DATA)
    parser.add_argument("--profile", action="store_true", help="also profile one call of each side (torch.profiler)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    wanted = []
    for cell in args.cells.split(","):
        clients, rest = cell.split("x")
        steps, batch = rest.split("b")
        wanted.append((int(clients), int(steps), int(batch)))
    code = code_provenance()
    cells, splits = [], {}
    for clients, steps, batch in wanted:
        if clients not in splits:
            splits[clients] = cifar_clients(clients, args.data_dir)
        cell = measure(args.pfllib.resolve(), splits[clients], steps, batch, args.repeats, args.data_dir,
                       args.profile)
        cells.append(cell)
        print(f"{clients:4d} clients x {steps} steps, batch {batch:3d}: graphfed {cell['graphfed_s']:.2f} s (a whole "
              f"round {cell['graphfed_round_s']:.2f} s: {cell['round_ratio']:.2f}x), PFLlib "
              f"{cell['pfllib_round_s']:.2f} s ({cell['pfllib_reads_s']:.2f} s re-reading, training "
              f"{cell['pfllib_train_s']:.2f} s) -> {cell['ratio']:.2f}x, as a user sees it "
              f"{cell['ratio_as_a_user_sees_it']:.2f}x; cpu_grid's loop {cell['loop_s']:.2f} s "
              f"({cell['loop_calibration']:.2f} of PFLlib's training); floor {cell['floor_s']:.2f} s "
              f"(floor_ratio {cell['floor_ratio']:.2f})", flush=True)
    document = json.loads(args.out.read_text()) if args.out.exists() else {}
    document["pfllib"] = {"threads": args.threads, "repeats": args.repeats, "machine": machine_info(),
                          "torch": torch.__version__, "cells": cells, "code": code}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"{len(cells)} cells -> {args.out} (pfllib)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
