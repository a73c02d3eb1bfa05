"""Finding, on a machine with only a CPU, the code that would mix host and device tensors on a GPU.

On a GPU run graphfed keeps two kinds of tensor: the run's (data, weights, server state) on ``train.device``, and
the host's (client ids, masks by client, row counts, seeded CPU draws). An operation that meets both fails on a
GPU (``torch.where(host_mask, cuda_a, cuda_b)``, ``host_ids[cuda_mask]``) but runs on a CPU, where both kinds are
CPU tensors. :class:`HostDeviceAudit` tells them apart on the CPU: inside it every host tensor is a
:class:`HostTensor`, and an operation that mixes one (with at least one dimension) with a run tensor raises
:class:`DeviceMixError` naming the operation and the shapes, as the GPU would have.

Which tensors are the host's follows PyTorch's own rules, seen from the call site:

- a factory without ``device=`` (PyTorch's default is the CPU), with ``device="cpu"``, ``torch.from_numpy`` and
  ``.cpu()`` / ``.to("cpu")`` make host tensors; a factory or ``.to()`` given any ``torch.device`` (the run's,
  resolved from ``train.device``, or a run tensor's ``.device``) makes run tensors. Host bookkeeping therefore says
  ``"cpu"``, the string; ``torch.device("cpu")`` names the run's device when the run is on the CPU;
- results of operations on host tensors alone are host tensors; a run tensor indexed by host indices is a run
  tensor (CUDA allows that), a host tensor indexed by run indices is an error (CUDA does not);
- 0-dimensional host tensors may meet run tensors (CUDA treats them as scalars), and ``tensor.numpy()`` of a run
  tensor is an error (CUDA needs ``.cpu()`` first).

A run built and stepped inside the audit (``tests/test_devices.py`` does this for every registered method and
model) therefore fails on the CPU where it would fail on a GPU. It also refuses a random draw made on the run's
device without a generator: the CPU and the GPU draw different numbers from the same seed, so such a draw breaks
CPU/GPU parity (:func:`graphfed.client.placement.host_random_draws` moves them to the host).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from graphfed.client.placement import RANDOM_FACTORIES, RANDOM_IN_PLACE

#: what a host tensor's ``.device`` says inside the audit: a CPU device unequal to the run's ``torch.device("cpu")``,
#: so ``if tensor.device != device: tensor = tensor.to(device)`` moves host tensors onto the run's device as on a GPU
HOST_DEVICE = torch.device("cpu", 0)

FACTORIES: frozenset[Callable[..., Any]] = frozenset({
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.rand, torch.randn, torch.randint,
    torch.randperm, torch.tensor, torch.eye, torch.linspace, torch.logspace, torch.as_tensor, torch.empty_strided,
    torch.scalar_tensor})
MOVES: frozenset[Callable[..., Any]] = frozenset({torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda})
#: copies between devices, allowed across them as on a GPU
TRANSFERS: frozenset[Callable[..., Any]] = frozenset({torch.Tensor.copy_, torch._has_compatible_shallow_copy_type})
#: a run tensor may be indexed by host indices (CUDA copies them over); the reverse is an error
INDEXING: frozenset[Callable[..., Any]] = frozenset({torch.Tensor.__getitem__, torch.Tensor.__setitem__,
                                                     torch.Tensor.index_put_, torch.Tensor.index_put})


class DeviceMixError(RuntimeError):
    """An operation met host and run tensors: on a GPU it would fail."""


class HostTensor(torch.Tensor):
    """A host (CPU bookkeeping) tensor, inside :class:`HostDeviceAudit`."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return HOST_DEVICE

    def __deepcopy__(self, memo: dict[int, Any]) -> HostTensor:
        return copy.deepcopy(self.as_subclass(torch.Tensor), memo).as_subclass(HostTensor)

    def __reduce_ex__(self, protocol: Any) -> Any:  # torch.save of a checkpoint: saved as the plain tensor it is
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)


def _names_host(device: Any) -> bool:
    return (isinstance(device, str) and device in ("cpu", "cpu:0")) or device == HOST_DEVICE


def _as_host(value: Any) -> Any:
    return tree_map(lambda t: t.as_subclass(HostTensor) if type(t) is torch.Tensor else t, value)


def _as_run(value: Any) -> Any:
    return tree_map(lambda t: t.as_subclass(torch.Tensor) if isinstance(t, HostTensor) else t, value)


def _shapes(tensors: list[torch.Tensor]) -> str:
    return ", ".join(str(tuple(t.shape)) for t in tensors)


class HostDeviceAudit(TorchFunctionMode):
    """Host tensors become :class:`HostTensor`; an operation mixing them with run tensors raises DeviceMixError."""

    def __enter__(self) -> HostDeviceAudit:
        self._from_numpy = torch.from_numpy
        from_numpy = self._from_numpy

        def host_from_numpy(array: np.ndarray) -> torch.Tensor:  # not a torch function: the audit sees it here
            return from_numpy(array).as_subclass(HostTensor)

        torch.from_numpy = host_from_numpy
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.from_numpy = self._from_numpy
        super().__exit__(*exc)

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", str(func))
        if func in FACTORIES:
            device = kwargs.get("device")
            if device is not None and not _names_host(device) and func in RANDOM_FACTORIES \
                    and kwargs.get("generator") is None:
                raise DeviceMixError(f"{name}: a random draw on the run's device without a generator (the CPU and "
                                     f"a GPU draw different numbers; draw on the host and move the result)")
            on_host = device is None or _names_host(device)
            if on_host:
                kwargs["device"] = "cpu"
            with torch._C.DisableTorchFunctionSubclass():
                made = func(*args, **kwargs)
            return _as_host(made) if on_host else made
        tensors = [value for value in tree_flatten((args, kwargs))[0] if isinstance(value, torch.Tensor)]
        hosts = [tensor for tensor in tensors if isinstance(tensor, HostTensor)]
        runs = [tensor for tensor in tensors if not isinstance(tensor, HostTensor)]
        if func in TRANSFERS:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if name == "__set__" and len(args) == 2 and isinstance(args[0], torch.Tensor):  # tensor.data = value
            with torch._C.DisableTorchFunctionSubclass():
                func(*args, **kwargs)
            args[0].__class__ = HostTensor if isinstance(args[1], HostTensor) else torch.Tensor
            return None
        if func in MOVES:
            return self._move(func, args, kwargs)
        target = args[0] if args else kwargs.get("tensor")  # nn.init passes tensor=
        if func in RANDOM_IN_PLACE and kwargs.get("generator") is None and isinstance(target, torch.Tensor) \
                and not isinstance(target, HostTensor):
            raise DeviceMixError(f"{name}: a random draw on the run's device without a generator (the CPU and a GPU "
                                 f"draw different numbers; draw on the host and copy the result over)")
        if not hosts:
            if func is torch.Tensor.numpy:
                raise DeviceMixError("numpy() of a run tensor: on a GPU it needs .cpu() first")
            return func(*args, **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            if func in INDEXING:
                return self._index(func, name, args, kwargs, runs)
            if runs and any(tensor.ndim > 0 for tensor in hosts):
                raise DeviceMixError(f"{name}: mixes host (CPU) tensor(s) {_shapes([t for t in hosts if t.ndim])} "
                                     f"with run-device tensor(s) {_shapes(runs)}; on a GPU this fails")
            result = func(*args, **kwargs)
        return result if runs else _as_host(result)

    @staticmethod
    def _move(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        target: Any = kwargs.get("device")
        for value in args[1:]:
            if isinstance(value, (str, torch.device)):
                target = value
            elif isinstance(value, torch.Tensor):  # .to(other): other's kind
                target = HOST_DEVICE if isinstance(value, HostTensor) else torch.device("cpu")
        with torch._C.DisableTorchFunctionSubclass():
            moved = func(*args, **kwargs)
        if func is torch.Tensor.cpu or (target is not None and _names_host(target)):
            return _as_host(moved)
        if target is None:  # a dtype change: the kind stays
            return _as_host(moved) if isinstance(args[0], HostTensor) else moved
        return _as_run(moved)

    @staticmethod
    def _index(func: Callable[..., Any], name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
               runs: list[torch.Tensor]) -> Any:
        base = args[0]
        if isinstance(base, HostTensor):
            if runs:
                raise DeviceMixError(f"{name}: a host (CPU) tensor {tuple(base.shape)} indexed by, or assigned, "
                                     f"run-device tensor(s) {_shapes(runs)}; on a GPU this fails")
            return _as_host(func(*args, **kwargs))
        value = args[2] if len(args) > 2 else None
        if isinstance(value, HostTensor) and value.ndim > 0:
            raise DeviceMixError(f"{name}: a host (CPU) tensor {tuple(value.shape)} assigned into a run-device "
                                 f"tensor; on a GPU this fails")
        return func(*args, **kwargs)


__all__ = ["HOST_DEVICE", "DeviceMixError", "HostDeviceAudit", "HostTensor"]
