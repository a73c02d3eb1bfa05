"""Where a run's tensors live (``train.device``), resolved once; the one place graphfed names a device.

Runtime code creates every tensor with an explicit ``device=``: the device of the data or weights it works on, or
``"cpu"`` for host bookkeeping (client ids, row counts, seeded CPU generators, whose draws are the same on every
device). :class:`DevicelessFactoryAudit` is how tests hold code to that rule on a machine without an accelerator.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, ClassVar

import torch
from torch.overrides import TorchFunctionMode

from graphfed.errors import ConfigError

#: ``train.device`` values: ``auto`` picks CUDA, then Apple's MPS, then the CPU
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N, mps"


def resolve_device(name: str) -> torch.device:
    """The device ``train.device`` names; ConfigError (one line, saying what this machine has) when it is absent."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device: {name!r} is not a device; allowed: {DEVICE_CHOICES}") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device: {name} asked for, but this torch ({torch.__version__}) finds no CUDA "
                              f"device ({_cuda_build()}); install a CUDA build of torch or set train.device=cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"train.device: {name} asked for, but this machine has {count} CUDA device(s) "
                              f"(cuda:0..cuda:{count - 1})")
        return device
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"train.device: mps asked for, but this torch ({torch.__version__}) finds no MPS "
                              f"device; set train.device=cpu")
        return device
    raise ConfigError(f"train.device: {name!r} is not supported; allowed: {DEVICE_CHOICES}")


def autocast(precision: str, device: torch.device) -> AbstractContextManager[Any]:
    """The model's forward (and so its backward) in ``precision``: nothing for fp32, bf16 autocast otherwise
    (matmuls and convolutions in bf16, losses and reductions in fp32; the weights stay fp32)."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@contextmanager
def deterministic_algorithms(enabled: bool) -> Iterator[None]:
    """``torch.use_deterministic_algorithms`` while a run runs (``train.deterministic``), restored after. On CUDA it
    also needs cuBLAS's fixed workspace (set here unless the user set it; it takes effect before cuBLAS starts)."""
    if not enabled:
        yield
        return
    previous = torch.are_deterministic_algorithms_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def _cuda_build() -> str:
    built = torch.version.cuda
    return f"built with CUDA {built}, no GPU visible" if built else "a CPU-only build"


class DevicelessFactoryAudit(TorchFunctionMode):
    """Within it, a tensor factory called without ``device=`` makes its tensor on the ``meta`` device, where no
    real tensor lives: the first operation that meets a real tensor fails and names the mix. On a machine with
    only a CPU this is how a test finds code that would create a tensor on the CPU beside a GPU run's tensors.
    ``*_like`` factories and tensors made from others follow their inputs and are not touched."""

    FACTORIES: ClassVar[frozenset[Any]] = frozenset({
        torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.rand, torch.randn, torch.randint,
        torch.randperm, torch.tensor, torch.eye, torch.linspace, torch.as_tensor})

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in self.FACTORIES and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


__all__ = ["DEVICE_CHOICES", "DevicelessFactoryAudit", "autocast", "deterministic_algorithms", "resolve_device"]
