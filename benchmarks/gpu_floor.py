"""The ``floor`` part of ``benchmarks/gpu.py``: how near graphfed's client step runs to what the device can do.

For FedAGHN's CIFAR-10 step (CNN-BN, 20 clients x batch 32 of 3x32x32 images; random images, since a step's cost
does not depend on the pixels) at each precision (fp32, tf32, bf16):

- **graphfed**: ``train_clients`` for every client at once, its convolution kernel and chunk size as a run's
  calibration chooses them (``train.conv_kernel: auto``), under ``train.precision``; and each of the model's
  batched kernels pinned (``graphfed[vmap]``, ``graphfed[grouped]``, ``graphfed[unfold]``: ``vmap``, one grouped
  convolution, im2col + batched matrix products), all clients in one chunk;
- **floor**: one plain CNN-BN module (``torch.optim.SGD``, ``backward``) on all clients' images of a step as one
  batch, in NCHW and in channels-last: the least a step of that many images costs on this device, whatever the
  batching of clients;
- **peak**: a large matrix product (TFLOP/s) and a large copy (GB/s) at that precision: what the device delivers
  on work that suits it.

FLOPs are counted by ``torch.utils.flop_counter`` on one forward and backward of one network on one batch (the
matrix and convolution work; the elementwise tail is not counted), so every TFLOP/s in the JSON is the same count
over a measured time. GB/s counts the bytes a step must touch at least: every client's weights read, its gradient
written and read, and the weights written (4 x parameters x 4 bytes), plus the step's images: a lower bound.
``graphfed_over_floor`` is the issue's yardstick (target: within 1.3x at 20 clients).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphfed.client.autotune import choose_clients_per_chunk, choose_conv_kernel, synchronised_seconds
from graphfed.client.contract import ClientRule, LocalTraining, plain_sgd
from graphfed.client.placement import autocast, use_tensor_cores
from graphfed.client.thread_choice import synthetic_clients
from graphfed.client.training import train_clients
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.models import build_model
from graphfed.models.base import TargetModel

PRECISIONS = ("fp32", "tf32", "bf16")
IMAGE = (3, 32, 32)
CLASSES = 10


def cnn_bn(device: torch.device, quick: bool) -> TargetModel:
    torch.manual_seed(0)
    shape = SimpleNamespace(name="cifar10", task="classification", input_shape=IMAGE, output_dim=CLASSES)
    options = {"channels": 4, "hidden": 16} if quick else {}
    return build_model("cnn-bn", shape, options).to(device)  # type: ignore[arg-type]


def flop_per_image(model: TargetModel, device: torch.device, batch: int) -> float:
    """Forward and backward FLOPs of one plain network on one batch, per image."""
    module = copy.deepcopy(model)  # the network as a plain module of its own, the same weights
    x = torch.randn(batch, *IMAGE, device=device)
    y = torch.randint(0, CLASSES, (batch,), device=device)
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(module(x), y).backward()
    return counter.get_total_flops() / batch


def floor_step(model: TargetModel, images: torch.Tensor, labels: torch.Tensor, precision: str,
               channels_last: bool) -> Callable[[], None]:
    """One SGD step of one network on every client's images of a step at once."""
    module = copy.deepcopy(model)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    module = module.to(memory_format=memory_format)
    x = images.contiguous(memory_format=memory_format)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(precision, images.device):
            loss = nn.functional.cross_entropy(module(x), labels)
        loss.backward()
        optimizer.step()
    return step


def peak(device: torch.device, precision: str, quick: bool, repeats: int) -> dict[str, float]:
    """A large matrix product's TFLOP/s and a large copy's GB/s at ``precision``."""
    size = 512 if quick else 8192
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    source = torch.empty(1 << (20 if quick else 28), device=device)
    target = torch.empty_like(source)
    torch.mm(a, b)
    target.copy_(source)
    matmul = min(synchronised_seconds(lambda: torch.mm(a, b), device) for _ in range(repeats))
    copy = min(synchronised_seconds(lambda: target.copy_(source), device) for _ in range(repeats))
    return {"matmul_tflops": 2 * size ** 3 / matmul / 1e12, "copy_gbps": 2 * source.nbytes / copy / 1e9}


def floor(device: torch.device, quick: bool, repeats: int, record: Callable[[dict[str, Any]], None]) -> None:
    clients, batch, steps = (4, 8, 2) if quick else (20, 32, 10)
    model = cnn_bn(device, quick)
    spec = ParamSpec.from_module(model)
    data = synthetic_clients(IMAGE, clients, 4 * batch, CLASSES).to(device)
    start = spec.flatten_module(model).detach().unsqueeze(0).repeat(clients, 1)
    images = torch.randn(clients * batch, *IMAGE, device=device)
    labels = torch.randint(0, CLASSES, (clients * batch,), device=device)
    flops = flop_per_image(model, device, batch)
    bytes_per_step = 4 * 4 * spec.dim * clients + images.nbytes
    for precision in PRECISIONS:
        use_tensor_cores(precision)
        training = LocalTraining(steps, batch, 0.01, precision=precision)
        rule = plain_sgd(spec, "classification", training)
        model.conv_kernel = None
        kernel = choose_conv_kernel(model, spec, data, rule, clients)
        model.conv_kernel = kernel.conv_kernel
        model.clients_per_chunk = choose_clients_per_chunk(model, spec, data, rule, clients).clients_per_chunk
        chosen = (kernel.conv_kernel, model.clients_per_chunk)
        sides: dict[str, Callable[[], Any]] = {"graphfed": pinned_step(model, spec, start, data, rule, *chosen)}
        for batched in (name for name in model.conv_kernels if name != "loop"):
            sides[f"graphfed[{batched}]"] = pinned_step(model, spec, start, data, rule, batched, clients)
        sides["floor"] = floor_step(model, images, labels, precision, channels_last=False)
        sides["floor_channels_last"] = floor_step(model, images, labels, precision, channels_last=True)
        for run in sides.values():
            run()  # warm-up: cuDNN's algorithm search, the allocator
        seconds = {name: min(synchronised_seconds(run, device) for _ in range(repeats)) for name, run in sides.items()}
        step_seconds = {name: value / (1 if name.startswith("floor") else steps) for name, value in seconds.items()}
        best_floor = min(step_seconds["floor"], step_seconds["floor_channels_last"])
        images_per_step = clients * batch
        row = {"precision": precision, "clients": clients, "batch": batch, "clients_per_chunk": chosen[1],
               "conv_kernel": kernel.record(), "flop_per_image": flops, "step_seconds": step_seconds,
               "tflops": {name: flops * images_per_step / s / 1e12 for name, s in step_seconds.items()},
               "graphfed_gbps_lower_bound": bytes_per_step / step_seconds["graphfed"] / 1e9,
               "graphfed_over_floor": step_seconds["graphfed"] / best_floor,
               "kernel_over_floor": {name.removeprefix("graphfed[").rstrip("]"): s / best_floor
                                     for name, s in step_seconds.items() if name.startswith("graphfed[")},
               "peak": peak(device, precision, quick, repeats), "quick": quick}
        record(row)
        kernels = ", ".join(f"{name} {ratio:.2f}" for name, ratio in row["kernel_over_floor"].items())
        print(f"floor {precision}: graphfed ({chosen[0]}, chunks of {chosen[1]}) {1e3 * step_seconds['graphfed']:.2f} "
              f"ms a step ({row['tflops']['graphfed']:.3g} TFLOP/s), floor {1e3 * best_floor:.2f} ms, "
              f"graphfed/floor {row['graphfed_over_floor']:.2f} (each kernel: {kernels}), "
              f"peak {row['peak']['matmul_tflops']:.3g} TFLOP/s", flush=True)
    use_tensor_cores("fp32")
    model.conv_kernel = None


def pinned_step(model: TargetModel, spec: ParamSpec, start: torch.Tensor, data: ClientSplit, rule: ClientRule,
                kernel: str | None, clients_per_chunk: int | None) -> Callable[[], Any]:
    """The rule's local steps for every client, the model's kernel and chunk size set to these while it runs."""
    def run() -> Any:
        saved = model.conv_kernel, model.clients_per_chunk
        model.conv_kernel, model.clients_per_chunk = kernel, clients_per_chunk
        try:
            return train_clients(model, spec, start, data, rule, list(range(data.num_clients)))
        finally:
            model.conv_kernel, model.clients_per_chunk = saved
    return run
