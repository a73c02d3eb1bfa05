"""Where a run's tensors live (``train.device``), resolved once; the one place graphfed names a device.

Runtime code creates a run tensor with ``device=`` the device of the data or weights it works on, and says
``"cpu"`` (the string) for host bookkeeping: client ids, masks by client, row counts, draws from seeded CPU
generators (the same numbers on every device). :class:`graphfed.client.device_audit.HostDeviceAudit` is how tests
hold code to that rule on a machine without an accelerator, and :class:`HostRandomDraws` keeps random initial
values the same on every device.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
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
    """The model's forward (and so its backward) in ``precision``: bf16 autocast for bf16 (matmuls and convolutions
    in bf16, losses and reductions in fp32; the weights stay fp32), nothing for fp32 and tf32 (see
    :func:`use_tensor_cores`)."""
    if precision != "bf16":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def use_tensor_cores(precision: str) -> None:
    """Whether CUDA's convolutions and matmuls may round their inputs to TF32 (``train.precision: tf32``) or not,
    set for the process like ``torch_threads``. torch lets cuDNN convolutions use TF32 unless told otherwise: on an
    H200 that moved FedBN's first round 4e-3 (relative) away from the CPU's, and full fp32 5e-8. A CPU has no TF32:
    nothing changes there."""
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"


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


#: random factories and in-place draws: on a GPU they would use the device's generator, whose numbers differ from
#: the CPU's for the same seed
RANDOM_FACTORIES: frozenset[Any] = frozenset({
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal, torch.bernoulli, torch.multinomial,
    torch.poisson, torch.rand_like, torch.randn_like, torch.randint_like})
#: in-place draws into their first argument. ``nn.init``'s are listed too: a mode does not see the draws nested in a
#: function it handles (``kaiming_uniform_`` calls ``uniform_`` with the mode off), so they are caught whole; the
#: first GPU run's hypernetworks (``nn.Linear``, ``nn.Embedding``) started from CUDA's numbers for want of them
RANDOM_IN_PLACE: frozenset[Any] = frozenset({
    torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.bernoulli_, torch.Tensor.random_,
    torch.Tensor.exponential_, torch.Tensor.geometric_, torch.Tensor.log_normal_, torch.Tensor.cauchy_,
    nn.init.uniform_, nn.init.normal_, nn.init.trunc_normal_, nn.init.xavier_uniform_, nn.init.xavier_normal_,
    nn.init.kaiming_uniform_, nn.init.kaiming_normal_, nn.init.orthogonal_, nn.init.sparse_})


class HostRandomDraws(TorchFunctionMode):
    """Random draws without a generator happen on the host (from the CPU's seeded generator) and are moved to the
    device: a method's initial weights (``nn.init``, ``torch.randn``) are then the same numbers on every device,
    so a GPU run starts where the CPU run starts."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if kwargs.get("generator") is not None:
            return func(*args, **kwargs)
        # on every device, CPU runs included: the same code path wherever the run is (the copy costs little once)
        if func in RANDOM_IN_PLACE:
            target, rest = (args[0], args[1:]) if args else (kwargs.pop("tensor"), ())  # nn.init passes tensor=
            host = torch.empty(target.shape, dtype=target.dtype, device="cpu")
            func(host, *rest, **kwargs)
            with torch.no_grad():
                target.copy_(host)
            return target
        if func in RANDOM_FACTORIES:
            like = args[0] if args and isinstance(args[0], torch.Tensor) and func.__name__.endswith("_like") else None
            device = kwargs.get("device") or (like.device if like is not None else torch.get_default_device())
            kwargs["device"] = "cpu"
            host_args = tuple(arg.cpu() if isinstance(arg, torch.Tensor) else arg for arg in args)
            return func(*host_args, **kwargs).to(device)
        return func(*args, **kwargs)


__all__ = ["DEVICE_CHOICES", "RANDOM_FACTORIES", "RANDOM_IN_PLACE", "HostRandomDraws", "autocast",
           "deterministic_algorithms", "resolve_device", "use_tensor_cores"]
