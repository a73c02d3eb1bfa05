"""Client-steps per second: graphfed's vectorised local training vs a plain per-client PyTorch loop.

Both sides train the FL-60 target network (``MLP(2, 2, hidden=16, num_layers=3)``) of every client for
``--steps`` SGD steps at batch 64 on the FL-60 train split, from the same start weights and with the same
mini-batch indices:

* vectorised: one call of :func:`graphfed.client.training.train_clients` for all clients at once;
* loop: for each client its own ``nn.Module`` and ``torch.optim.SGD``, ``zero_grad / backward / step``.

The same comparison is made for one client-rule method, Ditto (lambda = 1): each client trains the global
model and its personal model (pulled towards the received weights) on the same mini-batches; the loop side
keeps two modules and two optimizers per client.

The loop gets its mini-batch indices precomputed outside the timed region (the same per-client draws
``train_clients`` makes, via ``draw_batch_indices``), which favours the loop: the vectorised side's time
includes its draw. Each side runs
once as warm-up, then ``--repeats`` times, alternating with the other side so both see the same
background load; the best time counts. The trained weights of both sides are
compared (max absolute difference, tolerance 1e-5).

    .venv/bin/python benchmarks/sim_throughput.py            # writes benchmarks/results/sim_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphfed.client.contract import ClientSetting, LocalTraining, plain_sgd
from graphfed.client.training import draw_batch_indices, train_clients
from graphfed.config import DatasetConfig
from graphfed.core.params import ParamSpec
from graphfed.data import build_federation
from graphfed.data.federation import ClientSplit, PaddedRows
from graphfed.methods.ditto import DittoRule
from graphfed.models.mlp import MLP
from graphfed.provenance import code_provenance

RESULTS = Path(__file__).resolve().parent / "results"
BATCH_SIZE = 64
LR = 0.05  # the client learning rate of configs/demo_fl60.yaml
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Workload:
    """Everything both sides share: data, start weights, training settings, seed of the index draws."""

    data: ClientSplit
    spec: ParamSpec
    model: MLP
    start: torch.Tensor  # [clients, dim]
    training: LocalTraining
    draw_seed: int

    @property
    def client_steps(self) -> int:
        return self.data.num_clients * self.training.steps


def make_model() -> MLP:
    return MLP(2, 2, hidden=16, num_layers=3)


def build_workload(clients: int, steps: int, seed: int) -> Workload:
    fed = build_federation(DatasetConfig(name="fl60"), seed)
    if clients > fed.num_clients:
        raise SystemExit(f"--clients: FL-60 has {fed.num_clients} clients, got {clients}")
    data = fed.train.select(torch.arange(clients))
    torch.manual_seed(seed)
    model = make_model()
    spec = ParamSpec.from_module(model)
    # Every client starts from its own initialisation, as personalised methods send distinct rows.
    start = torch.stack([spec.flatten_module(make_model()) for _ in range(clients)])
    return Workload(data, spec, model, start, LocalTraining(steps, BATCH_SIZE, LR), draw_seed=seed + 1)


def batch_seeds(work: Workload) -> list[int]:
    return [work.draw_seed * 1000 + client for client in range(work.data.num_clients)]


def draw_indices(work: Workload) -> torch.Tensor:
    """``[steps, clients, batch]``: the row indices ``train_clients`` draws (its public draw function)."""
    index = draw_batch_indices(work.data.counts, work.training.steps, work.training.batch_size, batch_seeds(work))
    return index.transpose(0, 1)


def run_vectorised(work: Workload) -> torch.Tensor:
    trained, _, _ = train_clients(work.model, work.spec, work.start, work.data,
                                  plain_sgd(work.spec, "classification", work.training), batch_seeds(work))
    return trained


DITTO_LAMBDA = 1.0


def ditto_rule(work: Workload) -> DittoRule:
    setting = ClientSetting(work.spec, work.model.head_names, "classification", 2, work.training)
    return DittoRule(setting, DITTO_LAMBDA, None)


def run_ditto_vectorised(work: Workload) -> torch.Tensor:
    """Both of Ditto's models, every client at once; returns [global | personal] weights per client."""
    rule = ditto_rule(work)
    trained, _, state = train_clients(work.model, work.spec, work.start, work.data, rule, batch_seeds(work),
                                      rule.init_state(work.start))
    return torch.cat([trained, state["personal"]], dim=1)


def run_ditto_loop(work: Workload, modules: list[tuple[nn.Module, torch.optim.Optimizer]],
                   indices: torch.Tensor) -> torch.Tensor:
    """Ditto by hand: per client a global and a personal module, each with its own optimizer."""
    personal_modules = make_client_modules(work)
    for client, ((module, optimizer), (personal, personal_optimizer)) in enumerate(
            zip(modules, personal_modules, strict=True)):
        x, y = work.data.client(client)
        anchor = work.start[client]
        for step in range(work.training.steps):
            batch = indices[step, client]
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(module(x[batch]), y[batch]).backward()
            optimizer.step()
            personal_optimizer.zero_grad(set_to_none=True)
            pull = (nn.utils.parameters_to_vector(personal.parameters()) - anchor).pow(2).sum()
            (nn.functional.cross_entropy(personal(x[batch]), y[batch]) + 0.5 * DITTO_LAMBDA * pull).backward()
            personal_optimizer.step()
    return torch.stack([torch.cat([nn.utils.parameters_to_vector(m.parameters()).detach(),
                                   nn.utils.parameters_to_vector(p.parameters()).detach()])
                        for (m, _), (p, _) in zip(modules, personal_modules, strict=True)])


def make_client_modules(work: Workload) -> list[tuple[nn.Module, torch.optim.Optimizer]]:
    modules = []
    for row in work.start:
        module = make_model()
        nn.utils.vector_to_parameters(row.clone(), module.parameters())
        modules.append((module, torch.optim.SGD(module.parameters(), lr=work.training.lr)))
    return modules


def sgd_through_batches(module: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                        batches: torch.Tensor) -> None:
    """Plain PyTorch training of one client: ``zero_grad / backward / step`` on each row-index batch in turn."""
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(module(x[batch]), y[batch]).backward()
        optimizer.step()


def run_loop(work: Workload, modules: list[tuple[nn.Module, torch.optim.Optimizer]],
             indices: torch.Tensor) -> torch.Tensor:
    """The plain baseline: each client trains its own module with its own optimizer."""
    for client, (module, optimizer) in enumerate(modules):
        sgd_through_batches(module, optimizer, *work.data.client(client), indices[:, client])
    return torch.stack([nn.utils.parameters_to_vector(module.parameters()).detach() for module, _ in modules])


def run_hand_batched(work: Workload, indices: torch.Tensor, padded: PaddedRows) -> torch.Tensor:
    """A hand-written reference: the 3-layer MLP as explicit baddbmm calls on per-layer weight tensors.

    It is what one would write for this one model by hand; graphfed's engine is generic (any model's
    ``batched_forward``, flat parameter rows, per-client seeds), so this bounds what the engine could gain.
    """
    weights = [value.clone() for value in work.spec.unflatten(work.start).values()]
    x, y = padded.x, padded.y  # clients on a padded axis, prepared untimed
    for step in range(work.training.steps):
        batch = indices[step]
        h = torch.gather(x, 1, batch.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        targets = torch.gather(y, 1, batch)
        leaves = [w.requires_grad_(True) for w in weights]
        for layer in range(3):
            h = torch.baddbmm(leaves[2 * layer + 1].unsqueeze(1), h, leaves[2 * layer].transpose(1, 2))
            if layer < 2:
                h = torch.relu(h)
        loss = nn.functional.cross_entropy(h.reshape(-1, h.shape[-1]), targets.reshape(-1), reduction="none")
        gradients = torch.autograd.grad(loss.view(targets.shape).mean(1).sum(), leaves)
        with torch.no_grad():
            weights = [w - work.training.lr * g for w, g in zip(leaves, gradients, strict=True)]
    return torch.cat([w.flatten(1) for w in weights], dim=1)


@dataclass
class Timed:
    """One side of the comparison: ``prepare`` runs untimed before each timed ``run(prepare())``."""

    run: Callable[[Any], torch.Tensor]
    prepare: Callable[[], Any]
    best: float = float("inf")
    result: torch.Tensor | None = None

    def once(self) -> float:
        argument = self.prepare()
        begin = time.perf_counter()
        self.result = self.run(argument)
        return time.perf_counter() - begin


def time_interleaved(sides: list[Timed], repeats: int) -> None:
    """One untimed warm-up per side, then ``repeats`` rounds alternating the sides; each keeps its best.

    Alternating makes both sides see the same background load on a shared machine.
    """
    for side in sides:
        side.once()
    for _ in range(repeats):
        for side in sides:
            side.best = min(side.best, side.once())


def machine_info() -> dict[str, Any]:
    return {"platform": platform.platform(), "machine": platform.machine(), "processor": platform.processor(),
            "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "load_average_1_5_15min": list(os.getloadavg())}


def measure(clients: int, steps: int, repeats: int, seed: int) -> dict[str, Any]:
    load_before = list(os.getloadavg())
    work = build_workload(clients, steps, seed)
    indices = draw_indices(work)
    vectorised = Timed(lambda _: run_vectorised(work), lambda: None)
    loop = Timed(lambda modules: run_loop(work, modules, indices), lambda: make_client_modules(work))
    padded = work.data.padded()
    hand = Timed(lambda _: run_hand_batched(work, indices, padded), lambda: None)
    ditto = Timed(lambda _: run_ditto_vectorised(work), lambda: None)
    ditto_loop = Timed(lambda modules: run_ditto_loop(work, modules, indices), lambda: make_client_modules(work))
    time_interleaved([vectorised, loop, hand, ditto, ditto_loop], repeats)
    assert vectorised.result is not None and loop.result is not None and hand.result is not None
    assert ditto.result is not None and ditto_loop.result is not None
    vec_seconds, loop_seconds = vectorised.best, loop.best
    max_diff = max(float((vectorised.result - loop.result).abs().max()),
                   float((hand.result - loop.result).abs().max()),
                   float((ditto.result - ditto_loop.result).abs().max()))
    vec_rate, loop_rate = work.client_steps / vec_seconds, work.client_steps / loop_seconds
    hand_rate = work.client_steps / hand.best
    return {
        "clients": clients, "steps": steps, "batch_size": BATCH_SIZE, "lr": LR, "repeats": repeats, "seed": seed,
        "num_params": work.spec.dim, "client_steps": work.client_steps,
        "vectorised": {"best_seconds": vec_seconds, "client_steps_per_second": vec_rate},
        "loop": {"best_seconds": loop_seconds, "client_steps_per_second": loop_rate},
        "hand_batched_bmm": {"best_seconds": hand.best, "client_steps_per_second": hand_rate},
        "ratio": vec_rate / loop_rate,
        "hand_batched_ratio": hand_rate / loop_rate,
        "vectorised_over_hand_batched": vec_rate / hand_rate,
        "ditto": {"vectorised_best_seconds": ditto.best, "loop_best_seconds": ditto_loop.best,
                  "ratio": ditto_loop.best / ditto.best},
        "load_average_before": load_before,
        "weights_match": {"max_abs_diff": max_diff, "tolerance": TOLERANCE, "ok": max_diff <= TOLERANCE},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=60, help="clients trained together (FL-60: at most 60)")
    parser.add_argument("--steps", type=int, default=50, help="local SGD steps per client")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats after one warm-up; best counts")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="data, initialisation and index-draw seed")
    parser.add_argument("--out", type=Path, default=RESULTS / "sim_throughput.json", help="JSON result file")
    args = parser.parse_args(argv)
    for name in ("clients", "steps", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    result = measure(args.clients, args.steps, args.repeats, args.seed)
    result.update(torch=torch.__version__, threads=torch.get_num_threads(), machine=machine_info())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result["code"] = code_provenance()  # the numbers are tied to the code that made them
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    match = result["weights_match"]
    print(f"sim_throughput: vectorised {result['vectorised']['client_steps_per_second']:,.0f} client-steps/s, "
          f"loop {result['loop']['client_steps_per_second']:,.0f} client-steps/s, ratio {result['ratio']:.1f}x "
          f"(hand-batched bmm reference {result['hand_batched_ratio']:.1f}x; Ditto vectorised vs its loop "
          f"{result['ditto']['ratio']:.1f}x) "
          f"({args.clients} clients x {args.steps} steps, {result['threads']} threads); weights "
          f"{'match' if match['ok'] else 'DIFFER'} (max |diff| {match['max_abs_diff']:.1e}); -> {args.out}")
    return 0 if match["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
