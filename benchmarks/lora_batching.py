"""A LoRA round over one shared base against a per-client loop of PEFT-style modules (CPU).

graphfed trains every client's LoRA factors in one call (:func:`graphfed.client.training.train_clients`): the frozen
base is one set of buffers, each layer one product over all clients' rows plus each client's low-rank term
(``models/char_transformer.py``), a chunk of clients at a time (``--chunks``; 8 is what the model declares). The
reference (``loop``) is what a user of PEFT writes for a federation: the same network as ``nn.Linear`` layers
wrapped in PEFT's ``LoraLayer`` forward (``base_layer(x) + lora_B(lora_A(x)) * scaling``), per client a deep copy of
the module (its base and its LoRA layers: one base per client), ``torch.optim.SGD`` over the client's LoRA
parameters, ``zero_grad / backward / step`` on the client's batches, client after client. ``module_loop`` is the
same loop over graphfed's own module, one client per call, so ``batching_ratio`` (module_loop / graphfed) is what
training clients together gains on its own and ``module_loop``'s gain over ``loop`` what graphfed's network does
less of (the last block computes only the last position, which is all a next-character prediction reads). All sides
run the same steps of the same batch size from the same adapters on the same clients' windows (not the same
batches). Each side runs in its own process, a warm-up round and then the timed round, so its peak memory
(``ru_maxrss``) is its own, and the part of it training added after the set-up (``training_rss_mb``); sides
alternate, ``--repeats`` times, and the best time of each counts. ``graphfed_model_state_mb`` is one base and N
adapters, ``per_client_modules_state_mb`` the N bases and N adapters of client modules kept between rounds.
``ratio`` = loop seconds / graphfed seconds (above 1: graphfed faster).

    .venv/bin/python benchmarks/lora_batching.py     # writes benchmarks/results/lora_batching.json
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = SimpleNamespace(name="text", task="classification", input_shape=(80,), output_dim=80)
ROWS_PER_CLIENT = 64


def setting(args: argparse.Namespace) -> tuple[Any, Any, torch.Tensor, Any, Any]:
    """(model, spec, every client's start adapters, their windows, the local training) of one cell, seeded."""
    from graphfed.client.contract import LocalTraining
    from graphfed.core.params import ParamSpec
    from graphfed.data.federation import ClientSplit
    from graphfed.models import build_model

    torch.manual_seed(0)
    options = {"width": args.width, "layers": args.layers, "heads": 4,
               "adapter": {"kind": "lora", "rank": args.rank, "targets": ["qkv", "out", "up", "down"]}}
    model = build_model("char-transformer", SHAPE, options)  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    start = spec.flatten_module(model).unsqueeze(0).repeat(args.clients, 1)
    generator = torch.Generator().manual_seed(1)
    xs = [torch.randint(0, 80, (ROWS_PER_CLIENT, 80), generator=generator).float() for _ in range(args.clients)]
    ys = [torch.randint(0, 80, (ROWS_PER_CLIENT,), generator=generator) for _ in range(args.clients)]
    data = ClientSplit.from_lists(xs, ys, "classification")
    return model, spec, start, data, LocalTraining(args.steps, args.batch, 0.05)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_graphfed(args: argparse.Namespace) -> tuple[float, float]:
    from graphfed.client.contract import plain_sgd
    from graphfed.client.training import train_clients

    model, spec, start, data, training = setting(args)
    model.clients_per_chunk = args.chunk  # as train.clients_per_chunk pins it in a run (None: all at once)
    rule = plain_sgd(spec, "classification", training)
    set_up, began = peak_rss_mb(), time.perf_counter()
    train_clients(model, spec, start, data, rule, list(range(args.clients)))
    return time.perf_counter() - began, set_up


class PeftLinear(nn.Module):
    """PEFT's ``LoraLayer`` forward: ``base_layer(x) + lora_B(lora_A(x)) * scaling``, the base frozen."""

    def __init__(self, base: nn.Linear, rank: int, scaling: float) -> None:
        super().__init__()
        self.base_layer, self.scaling = base.requires_grad_(False), scaling
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


class PeftBlock(nn.Module):
    def __init__(self, width: int, heads: int, rank: int, scaling: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out, self.up, self.down = (
            PeftLinear(nn.Linear(n_in, n_out), rank, scaling)
            for n_in, n_out in ((width, 3 * width), (width, width), (width, 4 * width), (4 * width, width)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, steps, width = h.shape
        query, key, value = self.qkv(self.ln1(h)).view(batch, steps, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        mixed = nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
        h = h + self.out(mixed.transpose(1, 2).reshape(batch, steps, width))
        return h + self.down(nn.functional.gelu(self.up(self.ln2(h)), approximate="tanh"))


class PeftCharTransformer(nn.Module):
    """The same network as graphfed's ``char-transformer`` written as a PEFT user's module: ``nn.Linear`` layers
    wrapped in :class:`PeftLinear`, one client per module."""

    def __init__(self, model: Any, rank: int) -> None:
        super().__init__()
        width, vocab = model.width, model.vocab
        self.embed, self.position = nn.Embedding(vocab, width), nn.Parameter(torch.zeros(model.context, width))
        self.blocks = nn.ModuleList(PeftBlock(width, model.heads, rank, model.lora_scale)
                                    for _ in model.blocks)
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)
        peft_names = {name.replace(".base_layer", ""): name for name in self.state_dict() if "lora_" not in name}
        self.load_state_dict({peft_names[name]: value for name, value in model.state_dict().items()
                              if "lora_" not in name}, strict=False)
        self.requires_grad_(False)
        for name, parameter in self.named_parameters():
            parameter.requires_grad_("lora_" in name)

    def load_adapters(self, adapters: dict[str, torch.Tensor]) -> None:
        """graphfed's ``lora_A [r, in]`` / ``lora_B [out, r]`` are PEFT's ``lora_A.weight`` / ``lora_B.weight``."""
        for name, value in adapters.items():
            self.get_parameter(f"{name}.weight").data.copy_(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.long()) + self.position[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h[:, -1]))


def run_loop(args: argparse.Namespace) -> tuple[float, float]:
    model, spec, start, data, training = setting(args)
    if args.side == "loop":
        template = PeftCharTransformer(model, args.rank)
        template.load_adapters(dict(spec.unflatten(start[0])))
        x, _ = data.client(0)
        if not torch.allclose(template(x[:4]), model(x[:4]), atol=1e-5):  # the reference computes the same network
            raise SystemExit("the PEFT-style module does not compute graphfed's char-transformer")
    else:
        template = model
    set_up, began = peak_rss_mb(), time.perf_counter()
    for client in range(args.clients):
        local = copy.deepcopy(template)  # the client's module: its LoRA layers and its own copy of the base
        if args.side == "loop":
            local.load_adapters(dict(spec.unflatten(start[client])))
        else:
            local.load_state_dict(dict(spec.unflatten(start[client])), strict=False)
        local.train()
        optimizer = torch.optim.SGD([p for p in local.parameters() if p.requires_grad], lr=training.lr)
        x, y = data.client(client)
        generator = torch.Generator().manual_seed(client)
        for _ in range(training.steps):
            rows = torch.randint(len(y), (training.batch_size,), generator=generator)
            optimizer.zero_grad()
            nn.functional.cross_entropy(local(x[rows]), y[rows]).backward()
            optimizer.step()
    return time.perf_counter() - began, set_up


def side(args: argparse.Namespace) -> None:
    """One side of one cell in this process: its seconds and peak memory, as JSON on standard output."""
    torch.set_num_threads(args.threads)
    train = run_graphfed if args.side == "graphfed" else run_loop
    # the first round warms up (a fresh process's first pass cost the loop 1.8 s against 1.0 s after); a round of
    # a run is the second kind, so the second is timed
    _, set_up = train(args)
    seconds, _ = train(args)
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_rss_mb(), "training_rss_mb": peak_rss_mb() - set_up}))


def measure(clients: int, chunk: int | None, args: argparse.Namespace) -> dict[str, Any]:
    common = ["--clients", str(clients), "--width", str(args.width), "--layers", str(args.layers), "--rank",
              str(args.rank), "--steps", str(args.steps), "--batch", str(args.batch), "--threads", str(args.threads),
              *(["--chunk", str(chunk)] if chunk else [])]
    runs: dict[str, list[dict[str, float]]] = {"graphfed": [], "loop": [], "module_loop": []}
    for _ in range(args.repeats):
        for name in runs:
            done = subprocess.run([sys.executable, __file__, "--side", name, *common], capture_output=True,
                                  text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = {name: min(run["seconds"] for run in values) for name, values in runs.items()}
    memory = {name: max(run["peak_rss_mb"] for run in values) for name, values in runs.items()}
    training = {name: max(run["training_rss_mb"] for run in values) for name, values in runs.items()}
    from graphfed.core.params import ParamSpec

    model, *_ = setting(argparse.Namespace(**{**vars(args), "clients": 1}))
    base_mb = sum(buffer.numel() * 4 for buffer in model.buffers()) / 2**20
    adapter_mb = ParamSpec.from_module(model).dim * 4 / 2**20
    cell = {"clients": clients, "clients_per_chunk": chunk or clients, "graphfed_s": best["graphfed"],
            "loop_s": best["loop"],
            "ratio": best["loop"] / best["graphfed"], "module_loop_s": best["module_loop"],
            "batching_ratio": best["module_loop"] / best["graphfed"], "graphfed_peak_rss_mb": memory["graphfed"],
            "loop_peak_rss_mb": memory["loop"], "graphfed_training_rss_mb": training["graphfed"],
            "loop_training_rss_mb": training["loop"], "base_mb": round(base_mb, 3),
            "adapter_mb_per_client": round(adapter_mb, 4),
            # what each side holds of the model: graphfed one base and N adapters; a federation of PEFT modules
            # kept per client (the loop's module, alive between rounds) N bases and N adapters
            "graphfed_model_state_mb": round(base_mb + clients * adapter_mb, 3),
            "per_client_modules_state_mb": round(clients * (base_mb + adapter_mb), 3),
            "runs": runs}
    print(f"{clients:4d} clients, {chunk or clients:3d} at once: graphfed {best['graphfed']:.2f} s, loop "
          f"{best['loop']:.2f} s, ratio "
          f"{cell['ratio']:.2f}x (batching alone {cell['batching_ratio']:.2f}x); "
          f"peak RSS {memory['graphfed']:.0f} / {memory['loop']:.0f} MiB, of which training "
          f"{training['graphfed']:.0f} / {training['loop']:.0f}; model state {cell['graphfed_model_state_mb']:.1f} "
          f"MiB against {cell['per_client_modules_state_mb']:.1f} MiB for {clients} client modules", flush=True)
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("graphfed", "loop", "module_loop"), help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--chunks", type=int, nargs="+", default=[8, 0], help="clients graphfed trains at once, as "
                        "train.clients_per_chunk pins it (8: what the model declares; 0: all at once)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "lora_batching.json")
    args = parser.parse_args(argv)
    if args.side is not None:
        args.clients = args.clients[0]
        side(args)
        return 0
    from graphfed.provenance import code_provenance

    cells = [measure(clients, chunk or None, args) for clients in args.clients for chunk in args.chunks]
    record = {"benchmark": "lora_batching", "model": f"char-transformer width {args.width}, {args.layers} layers, "
              f"4 heads, context 80, LoRA rank {args.rank} on qkv/out/up/down", "steps": args.steps,
              "batch": args.batch, "threads": args.threads, "repeats": args.repeats, "cells": cells,
              "code": code_provenance(), "torch": torch.__version__}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
