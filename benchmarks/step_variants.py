"""Where the last few percent of a one-client CNN step go: the same ResNet-like training step (width 8, CIFAR-10
rows of one client, batch 32, 30 steps, plain SGD) written five ways, interleaved, best of 15.

* ``loop``: PFLlib's loop (the module called, ``backward``, ``torch.optim.SGD``);
* ``module_backward``: the module called, ``backward``, the update in place (no optimizer object);
* ``module_backward_inputs``: the same with ``torch.autograd.backward(inputs=parameters)``;
* ``module_autograd_grad``: the module called, ``torch.autograd.grad`` on its parameters, the update in place;
* ``functional_autograd_grad``: graphfed's path: ``functional_call`` with the weights as plain leaves,
  ``torch.autograd.grad``, the update in place.

Every variant is the same step (up to float rounding); the JSON says what each way of writing it costs here, and
how far apart equivalent ways of writing one step land on this machine.

    .venv/bin/python benchmarks/step_variants.py      # -> benchmarks/results/step_variants.json (~2 min)
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_grid import DATA, cifar_clients, cifar_model
from graphfed.provenance import code_provenance

OUT = Path(__file__).resolve().parent / "results" / "step_variants.json"
BATCH, STEPS, LR, REPEATS = 32, 30, 0.05, 15


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    x, y = cifar_clients(20, DATA).client(0)
    model = cifar_model("resnet-like", {"width": 8})
    draws = torch.Generator().manual_seed(0)
    batches = [(x[rows], y[rows]) for rows in (torch.randint(len(x), (BATCH,), generator=draws)
                                                for _ in range(STEPS))]

    def loop() -> None:
        local = copy.deepcopy(model)
        optimizer = torch.optim.SGD(local.parameters(), lr=LR)
        for batch_x, batch_y in batches:
            optimizer.zero_grad()
            F.cross_entropy(local(batch_x), batch_y).backward()
            optimizer.step()

    def module(gradients: Callable[[torch.Tensor, list[torch.Tensor]], list[torch.Tensor]]) -> Callable[[], None]:
        def run() -> None:
            local = copy.deepcopy(model)
            parameters = list(local.parameters())
            for batch_x, batch_y in batches:
                grads = gradients(F.cross_entropy(local(batch_x), batch_y), parameters)
                with torch.no_grad():
                    for parameter, grad in zip(parameters, grads, strict=True):
                        parameter.sub_(grad.mul_(LR))
        return run

    def backward(loss: torch.Tensor, parameters: list[torch.Tensor], **inputs: object) -> list[torch.Tensor]:
        loss.backward(**inputs)  # type: ignore[arg-type]
        grads = [parameter.grad for parameter in parameters]
        for parameter in parameters:
            parameter.grad = None
        return grads  # type: ignore[return-value]

    def functional() -> None:
        weights = {name: value.detach().clone().requires_grad_() for name, value in model.named_parameters()}
        for batch_x, batch_y in batches:
            loss = F.cross_entropy(functional_call(model, weights, (batch_x,)), batch_y)
            grads = torch.autograd.grad(loss, list(weights.values()))
            with torch.no_grad():
                for value, grad in zip(weights.values(), grads, strict=True):
                    value.sub_(grad.mul_(LR))

    variants: dict[str, Callable[[], None]] = {
        "loop": loop,
        "module_backward": module(backward),
        "module_backward_inputs": module(lambda loss, ps: backward(loss, ps, inputs=ps)),
        "module_autograd_grad": module(lambda loss, ps: list(torch.autograd.grad(loss, ps))),
        "functional_autograd_grad": functional,
    }
    for run in variants.values():
        run()
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(REPEATS):  # interleaved: every variant sees the same background load
        for name, run in variants.items():
            begin = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - begin)
    document = {"model": "resnet-like width 8", "batch": BATCH, "steps": STEPS, "repeats": REPEATS, "threads": 2,
                "seconds": {name: round(seconds, 4) for name, seconds in best.items()},
                "speed_vs_loop": {name: round(best["loop"] / seconds, 3) for name, seconds in best.items()},
                "code": code_provenance()}
    OUT.write_text(json.dumps(document, indent=1) + "\n")
    for name, seconds in best.items():
        print(f"{name:26s} {seconds:.3f} s  {best['loop'] / seconds:.3f}x the loop")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
