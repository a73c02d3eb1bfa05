"""What batching Panacea's server across a pack's runs would buy on the CPU, before anyone builds it.

A pack shares its runs' client calls; each run's server update stays its own (``graphfed.sim.pack``), and Panacea
spends most of a run there (10 steps of a GCN over the client graph, the MLP hypernetwork and the graph loss under
Adam per round). This script times that update as a run does it (``Panacea.update`` of a real FL-60 / TPT-48 run,
K_s = 10 steps) against the same 10 steps for S runs at once, the S runs' server modules stacked
(``torch.func.stack_module_state``) under one Adam, three ways:

- ``explicit``: the losses written with batched kernels (``bmm``, ``index_add`` over the stacked rows), one backward;
- ``vmap``: ``vmap(grad(...))`` over ``functional_call`` of the real modules (PyG's GCNConv included);
- ``dense``: as ``explicit``, but the messages as one product with the dense normalised adjacency and the pair
  logits read from ``z_hat @ z_hat^T`` (other sums, so other roundings: what changing Panacea's numbers would buy).

Each run gets its own sampled clients, deltas and graph-loss pairs (over the first run's graph: seeds draw graphs
with a few percent more or fewer edges, which a batched server would pad). Only time is compared; ``per_run_ms``
is a batched round's time divided by S, ``one_run_ms`` the same code for one run (what the machinery itself costs).

``ceiling_speedup`` is what the pack cell (``benchmarks/pack.py``, read from ``results/pack.json``) would reach if
its server time per run fell from ``alone_ms`` to the faster of ``explicit`` and ``vmap``, everything else as
measured there: ``sequential / (packed - alone + per_run)`` per run-round. ``ceiling_speedup_dense`` is the same
for ``dense``, whose runs alone would change too (their server then costs its ``one_run_ms``).

    .venv/bin/python benchmarks/server_batching.py     # -> benchmarks/results/server_batching.json (~2 minutes)
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphfed.config import load_config
from graphfed.methods.panacea import Panacea
from graphfed.provenance import code_provenance
from graphfed.sim.engine import Simulator
from pack import FL60, TPT48

OUT = Path(__file__).resolve().parent / "results" / "server_batching.json"
PACK_RESULTS = Path(__file__).resolve().parent / "results" / "pack.json"
CELLS = {"fl60": FL60, "tpt48": TPT48}
KINDS = ("explicit", "vmap", "dense")


def panacea_of(base: list[str], seed: int) -> Panacea:
    config = load_config(None, [*base, "method.name=panacea", "torch_threads=1", f"seed={seed}"])
    method = Simulator(config, None, progress=False).setup.method
    assert isinstance(method, Panacea)
    return method


def round_inputs(method: Panacea, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A round's sampled clients, the weights they were sent and a delta of a client step's size."""
    train_ids = method.context.train_client_ids
    client_ids = train_ids[torch.randperm(len(train_ids), generator=generator)[:5]].sort().values
    with torch.no_grad():
        sent = method.personalize(client_ids)
    return client_ids, sent, 0.01 * torch.randn(sent.shape, generator=generator)


def graph_pairs(method: Panacea, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Every edge and as many non-edges, as ``reconstruction_loss`` samples them (a fixed count per run here)."""
    positives = method._positives
    n = method.adjacency.shape[0]
    candidates = torch.randint(0, n, (8 * len(positives), 2), generator=generator)
    keep = (candidates[:, 0] != candidates[:, 1]) & (method.adjacency[candidates[:, 0], candidates[:, 1]] <= 0)
    negatives = candidates[keep][: len(positives)]
    assert len(negatives) == len(positives)
    labels = torch.cat([torch.ones(len(positives)), torch.zeros(len(negatives))])
    return torch.cat([positives, negatives]), labels


def time_alone(methods: list[Panacea], rounds: int, generator: torch.Generator) -> float:
    """Seconds per run-round of ``Panacea.update`` as each run does it."""
    inputs = [[round_inputs(method, generator) for _ in range(rounds)] for method in methods]
    began = time.perf_counter()
    for method, per_round in zip(methods, inputs, strict=True):
        for client_ids, sent, delta in per_round:
            method.update(client_ids, sent, delta, {})
    return (time.perf_counter() - began) / (rounds * len(methods))


def stacked_server(methods: list[Panacea]) -> tuple[dict[str, dict[str, torch.Tensor]], torch.optim.Optimizer]:
    """The S runs' server modules stacked on a leading run axis (leaves), with one Adam over them."""
    modules = {"embeddings": [m.embeddings for m in methods], "encoder": [m.encoder for m in methods],
               "hypernet": [m.hypernet for m in methods], "generator": [m.graph_generator for m in methods]}
    stacked = {name: stack_module_state(copies)[0] for name, copies in modules.items()}
    leaves = [tensor.requires_grad_(True) for group in stacked.values() for tensor in group.values()]
    return stacked, torch.optim.Adam(leaves, lr=methods[0].options.server_lr, foreach=True)


def batched_mlp(layers: nn.Sequential, params: dict[str, torch.Tensor], prefix: str, h: torch.Tensor) -> torch.Tensor:
    """``layers`` (Linear / ReLU) applied to ``h [S, B, in]`` with each run's own weights (``baddbmm``)."""
    for index, layer in enumerate(layers):
        if isinstance(layer, nn.Linear):
            weight, bias = params[f"{prefix}{index}.weight"], params[f"{prefix}{index}.bias"]
            h = torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))
        else:
            h = torch.relu(h)
    return h


def explicit_loss(first: Panacea, stacked: dict[str, dict[str, torch.Tensor]], client_ids: torch.Tensor,
                  target: torch.Tensor, pairs: torch.Tensor, labels: torch.Tensor, dense: bool) -> torch.Tensor:
    """The S runs' server losses written with batched kernels (``bmm``, ``index_add`` along the run axis' rows):
    GCNConv(normalize=False) as PyG computes it (``lin`` without bias, messages weighted by the edge weight, summed
    at the target, plus bias), the hypernetwork's trunk and heads, the generator's transform and BCE. ``dense``:
    the messages as one ``[N, N] @ [N, F]`` product with the normalised adjacency and the pair logits read from
    ``z_hat @ z_hat^T`` (other sums, so other roundings: what changing Panacea's numbers would buy)."""
    (source, target_node), edge_weight = first._edges[0], first._edges[1]
    n = first.adjacency.shape[0]
    adjacency = torch.zeros(n, n).index_put_((target_node, source), edge_weight, accumulate=True)
    encoder, hypernet = stacked["encoder"], stacked["hypernet"]
    h = stacked["embeddings"]["weight"]
    layers = len(first.encoder.layers)
    for index in range(layers):
        h = torch.bmm(h, encoder[f"layers.{index}.lin.weight"].transpose(1, 2))
        if dense:
            h = torch.matmul(adjacency, h) + encoder[f"layers.{index}.bias"].unsqueeze(1)
        else:
            messages = edge_weight.view(1, -1, 1) * h.index_select(1, source)
            h = torch.zeros_like(h).index_add_(1, target_node, messages) + encoder[f"layers.{index}.bias"].unsqueeze(1)
        if index < layers - 1:
            h = torch.relu(h)
    z = h
    chosen = torch.gather(z, 1, client_ids.unsqueeze(-1).expand(-1, -1, z.shape[-1]))
    features = batched_mlp(first.hypernet.trunk, hypernet, "trunk.", chosen)
    theta = torch.cat([torch.baddbmm(hypernet[f"heads.{k}.bias"].unsqueeze(1), features,
                                     hypernet[f"heads.{k}.weight"].transpose(1, 2))
                       for k in range(len(first.hypernet.heads))], dim=-1)
    direction = (theta.detach() - target) / client_ids.shape[1]
    z_hat = batched_mlp(first.graph_generator.transform, stacked["generator"], "transform.", z)
    if dense:
        logits = torch.bmm(z_hat, z_hat.transpose(1, 2)).flatten(1).gather(1, pairs[..., 0] * n + pairs[..., 1])
    else:
        ends = [torch.gather(z_hat, 1, pairs[..., end].unsqueeze(-1).expand(-1, -1, z_hat.shape[-1]))
                for end in (0, 1)]
        logits = (ends[0] * ends[1]).sum(-1)
    graph_loss = F.binary_cross_entropy_with_logits(logits, labels, reduction="none").mean(1).sum()
    return (theta * direction).sum() + first.options.lambda_d * graph_loss


def time_batched(methods: list[Panacea], rounds: int, generator: torch.Generator, kind: str) -> float:
    """Seconds per run-round of the same K_s steps for all runs at once: ``explicit`` (or ``dense``) batched kernels
    and one backward, or ``vmap`` (``vmap(grad(...))`` over ``functional_call`` of the real modules)."""
    first = methods[0]
    stacked, optimizer = stacked_server(methods)
    skeleton = {"encoder": copy.deepcopy(first.encoder).to("meta"),
                "hypernet": copy.deepcopy(first.hypernet).to("meta"),
                "generator": copy.deepcopy(first.graph_generator.transform).to("meta")}
    edges, lambda_d = first._edges, first.options.lambda_d

    def vmapped_loss(params: dict[str, dict[str, torch.Tensor]], client_ids: torch.Tensor, target: torch.Tensor,
                     pairs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        z = functional_call(skeleton["encoder"], params["encoder"], (params["embeddings"]["weight"], edges))
        theta = functional_call(skeleton["hypernet"], params["hypernet"], (z[client_ids],))
        direction = (theta.detach() - target) / len(client_ids)
        z_hat = functional_call(skeleton["generator"], {k.removeprefix("transform."): v for k, v in
                                                        params["generator"].items()}, (z,))
        logits = (z_hat[pairs[:, 0]] * z_hat[pairs[:, 1]]).sum(-1)
        return (theta * direction).sum() + lambda_d * F.binary_cross_entropy_with_logits(logits, labels)

    step_grads = vmap(grad(vmapped_loss))
    rounds_in: list[tuple[torch.Tensor, ...]] = []
    for _ in range(rounds):
        per_run = [round_inputs(method, generator) for method in methods]
        rounds_in.append((torch.stack([ids for ids, _, _ in per_run]),
                          torch.stack([(sent - delta) for _, sent, delta in per_run])))
    steps = first.options.server_steps
    # seeds draw different graphs (FL-60's edges differ by a few percent): every run here uses the first run's edges
    # and pair count, which a batched server would have to pad to anyway
    drawn = [[graph_pairs(first, generator) for _ in methods] for _ in range(steps)]
    pairs = [(torch.stack([p for p, _ in step]), torch.stack([lab for _, lab in step])) for step in drawn]
    began = time.perf_counter()
    for client_ids, target in rounds_in:
        for step in range(steps):
            optimizer.zero_grad(set_to_none=True)
            if kind != "vmap":
                explicit_loss(first, stacked, client_ids, target, *pairs[step], dense=kind == "dense").backward()
            else:
                grads = step_grads(stacked, client_ids, target, *pairs[step])
                for group, grad_group in zip(stacked.values(), grads.values(), strict=True):
                    for name, tensor in group.items():
                        tensor.grad = grad_group[name]
            optimizer.step()
    return (time.perf_counter() - began) / (rounds * len(methods))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="S, the pack's runs")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pack_cells = json.loads(PACK_RESULTS.read_text())["cells"] if PACK_RESULTS.exists() else {}
    result: dict[str, Any] = {"benchmark": "server_batching", "code": code_provenance(), "threads": 1,
                              "runs": args.runs, "cells": {}}
    for cell, base in CELLS.items():
        methods = [panacea_of(base, seed) for seed in range(args.runs)]
        generator = torch.Generator().manual_seed(0)
        time_alone(methods[:1], 2, generator)  # warm-up
        for kind in KINDS:
            time_batched(methods, 1, generator, kind)
        alone = time_alone(methods, args.rounds, generator)
        row: dict[str, Any] = {"alone_ms": round(alone * 1e3, 2)}
        for kind in KINDS:
            batched = time_batched(methods, args.rounds, generator, kind)
            one = time_batched(methods[:1], args.rounds, generator, kind)  # the same code for one run
            row[kind] = {"per_run_ms": round(batched * 1e3, 2), "one_run_ms": round(one * 1e3, 2),
                         "server_speedup": round(alone / batched, 2)}
        measured = pack_cells.get(f"{cell}/panacea")
        if measured:  # the pack cell's per run-round times, its server update replaced by the batched one
            run_rounds = measured["seeds"] * measured["rounds"]
            sequential = measured["sequential_seconds"] / run_rounds
            packed = measured["packed_seconds"] / run_rounds
            row["pack_speedup_measured"] = measured["speedup"]
            same_sums = min(row["explicit"]["per_run_ms"], row["vmap"]["per_run_ms"]) / 1e3
            row["ceiling_speedup"] = round(sequential / (packed - alone + same_sums), 2)
            # dense sums change a run alone too: its server costs one_run_ms there
            dense = row["dense"]
            row["ceiling_speedup_dense"] = round((sequential - alone + dense["one_run_ms"] / 1e3)
                                                 / (packed - alone + dense["per_run_ms"] / 1e3), 2)
        result["cells"][cell] = row
        print(f"{cell}: Panacea's update {row['alone_ms']} ms per run-round alone; batched over {args.runs} runs "
              f"{row['explicit']['per_run_ms']} ms per run explicit ({row['explicit']['one_run_ms']} ms for one run), "
              f"{row['vmap']['per_run_ms']} ms vmap ({row['vmap']['one_run_ms']} ms for one run), "
              f"{row['dense']['per_run_ms']} ms dense ({row['dense']['one_run_ms']} ms for one run); pack ceiling "
              f"{row.get('ceiling_speedup')}x, dense {row.get('ceiling_speedup_dense')}x (measured "
              f"{row.get('pack_speedup_measured')}x)", flush=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
