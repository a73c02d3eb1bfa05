"""Convolutional clients: graphfed's local training vs a sequential per-client loop and the compute floor.

Two workloads, each trained three or four ways from the same per-client start weights on the same
mini-batch indices (drawn beforehand with ``draw_batch_indices``, untimed):

* ``lenet-cifar10``: pFedHN's LeNet (121k parameters) on CIFAR-10 (JPEG) Dir(0.1), 20 clients, batch 32,
  5 local steps;
* ``pfl-cifar10``: pfl-research's published CIFAR-10 benchmark setting: 50 clients of 50 images each
  (sampled from 1,000), batch 10, one local epoch (5 steps), its 2-layer CNN (``pfl-cnn``, 1.6M parameters).

Sides:

* **graphfed**: one call of :func:`graphfed.client.training.train_clients` for all clients (grouped convolutions);
* **loop**: per client an ``nn.Module`` and ``torch.optim.SGD``, ``zero_grad / backward / step``, client after
  client (what pfl-research and Flower do);
* **floor**: ONE network trained on all clients' images of a step at once (a combined batch of S x B images):
  the same convolution work with no per-client anything, the practical lower bound on time;
* **client_loop_kernel** (LeNet only): graphfed with its previous kernel, a Python loop of ``functional_call``
  over clients.

Each side runs once as warm-up and then ``--repeats`` times, alternating; the best time counts. graphfed and
the loop must end at the same weights (max |difference| <= 1e-4).

    .venv/bin/python benchmarks/cnn_throughput.py     # writes benchmarks/results/cnn_throughput.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphfed.client.contract import LocalTraining, plain_sgd
from graphfed.client.training import draw_batch_indices, train_clients
from graphfed.config import DatasetConfig
from graphfed.core.params import ParamSpec
from graphfed.data import build_federation
from graphfed.data.federation import ClientSplit
from graphfed.models import build_model
from graphfed.models.base import TargetModel
from graphfed.provenance import code_provenance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_throughput import Timed, machine_info, sgd_through_batches, time_interleaved

RESULTS = Path(__file__).resolve().parent / "results"
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Workload:
    name: str
    data: ClientSplit
    make_model: Any  # () -> TargetModel, the same initialisation every call
    start: torch.Tensor
    training: LocalTraining
    seeds: list[int]

    @property
    def indices(self) -> torch.Tensor:
        """``[steps, clients, batch]`` client-local row indices, as ``train_clients`` draws them."""
        return draw_batch_indices(self.data.counts, self.training.steps, self.training.batch_size,
                                  self.seeds).transpose(0, 1)


def lenet_workload(seed: int) -> Workload:
    fed = build_federation(DatasetConfig(name="cifar10", num_clients=20, dirichlet_beta=0.1), seed)
    return _workload("lenet-cifar10", fed, "lenet", torch.arange(20), LocalTraining(5, 32, 0.01), seed)


def pfl_workload(seed: int) -> Workload:
    fed = build_federation(DatasetConfig(name="cifar10", num_clients=1000, partition="iid",
                                         split=(0.84, 0.03, 0.13)), seed)
    cohort = torch.randperm(1000, generator=torch.Generator().manual_seed(seed))[:50]
    return _workload("pfl-cifar10", fed, "pfl-cnn", cohort, LocalTraining(5, 10, 0.01), seed)


def _workload(name: str, fed: Any, model_name: str, clients: torch.Tensor, training: LocalTraining,
              seed: int) -> Workload:
    def make_model() -> TargetModel:
        torch.manual_seed(seed)
        return build_model(model_name, fed)

    model = make_model()
    spec = ParamSpec.from_module(model)
    start = spec.flatten_module(model).unsqueeze(0).repeat(len(clients), 1)
    seeds = [seed * 100_000 + int(client) for client in clients]
    return Workload(name, fed.train.select(clients), make_model, start, training, seeds)


def run_graphfed(work: Workload, model: TargetModel) -> torch.Tensor:
    spec = ParamSpec.from_module(model)
    return train_clients(model, spec, work.start, work.data, plain_sgd(spec, "classification", work.training),
                         work.seeds).trained


def run_loop(work: Workload, indices: torch.Tensor) -> torch.Tensor:
    """Client after client: load the weights into a module, SGD through its batches, keep the result."""
    module = work.make_model()
    spec = ParamSpec.from_module(module)
    trained = []
    for client in range(work.data.num_clients):
        nn.utils.vector_to_parameters(work.start[client].clone(), module.parameters())
        optimizer = torch.optim.SGD(module.parameters(), lr=work.training.lr)
        sgd_through_batches(module, optimizer, *work.data.client(client), indices[:, client])
        trained.append(spec.flatten_module(module).detach().clone())
    return torch.stack(trained)


def run_floor(work: Workload, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """One network on every client's images of a step at once: S x B images per SGD step."""
    module = work.make_model()
    optimizer = torch.optim.SGD(module.parameters(), lr=work.training.lr)
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
    return ParamSpec.from_module(module).flatten_module(module).unsqueeze(0)


def measure(work: Workload, repeats: int) -> dict[str, Any]:
    indices = work.indices
    combined = [work.data.gather(indices[step]) for step in range(work.training.steps)]
    combined = [(x.flatten(0, 1), y.flatten(0, 1)) for x, y in combined]
    model = work.make_model()
    sides = {"graphfed": Timed(lambda _: run_graphfed(work, model), lambda: None),
             "loop": Timed(lambda _: run_loop(work, indices), lambda: None),
             "floor": Timed(lambda _: run_floor(work, combined), lambda: None)}
    if work.name.startswith("lenet"):
        looped = work.make_model()
        looped.batched_forward = looped.client_loop_forward  # type: ignore[method-assign]
        sides["client_loop_kernel"] = Timed(lambda _: run_graphfed(work, looped), lambda: None)
    time_interleaved(list(sides.values()), repeats)
    # The same two sides again, each run back to back: interleaving with the loop side costs the grouped
    # kernel measurably (caches, allocator), so both orders are reported.
    consecutive = {}
    for name in ("graphfed", "floor"):
        again = Timed(sides[name].run, lambda: None)
        time_interleaved([again], repeats)
        consecutive[name] = again.best
    graphfed, loop = sides["graphfed"].result, sides["loop"].result
    assert graphfed is not None and loop is not None
    max_diff = float((graphfed - loop).abs().max())
    best = {name: side.best for name, side in sides.items()}
    return {"clients": work.data.num_clients, "steps": work.training.steps, "batch_size": work.training.batch_size,
            "rows_per_client_mean": work.data.num_rows / work.data.num_clients,
            "num_params": work.start.shape[1], "best_seconds": best,
            "graphfed_over_loop": best["loop"] / best["graphfed"],  # >= 1: graphfed is faster
            "graphfed_over_floor": best["graphfed"] / best["floor"],  # <= 1.2: within 20 % of the floor
            "floor_over_loop": best["loop"] / best["floor"],  # the most any batching could gain here
            "consecutive_best_seconds": consecutive,
            "graphfed_over_floor_consecutive": consecutive["graphfed"] / consecutive["floor"],
            **({"client_loop_kernel_over_floor": best["client_loop_kernel"] / best["floor"]}
               if "client_loop_kernel" in best else {}),
            "weights_match": {"max_abs_diff": max_diff, "tolerance": TOLERANCE, "ok": max_diff <= TOLERANCE}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats after one warm-up; best counts")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", default="lenet-cifar10,pfl-cifar10")
    parser.add_argument("--out", type=Path, default=RESULTS / "cnn_throughput.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    builders = {"lenet-cifar10": lenet_workload, "pfl-cifar10": pfl_workload}
    results: dict[str, Any] = {"threads": torch.get_num_threads(), "torch": torch.__version__,
                               "machine": machine_info(), "workloads": {}}
    ok = True
    for name in args.workloads.split(","):
        result = measure(builders[name](args.seed), args.repeats)
        results["workloads"][name] = result
        ok = ok and result["weights_match"]["ok"]
        best = result["best_seconds"]
        print(f"{name}: graphfed {best['graphfed']:.2f} s, loop {best['loop']:.2f} s "
              f"({result['graphfed_over_loop']:.2f}x), floor {best['floor']:.2f} s "
              f"(graphfed/floor {result['graphfed_over_floor']:.2f}, floor/loop {result['floor_over_loop']:.2f}x)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results["code"] = code_provenance()  # the numbers are tied to the code that made them
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
