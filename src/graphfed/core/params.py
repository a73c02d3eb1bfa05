"""Layer-aware views of a model's parameters as one flat vector.

Every method in graphfed exchanges personalised models as rows of a ``[clients, dim]`` tensor. A
``ParamSpec`` knows where each named tensor lives inside that row and which tensors form a layer
(the parameters of one module), so hypernetworks can emit one head per tensor and aggregation methods
can mix clients layer by layer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TensorSpec:
    name: str  # e.g. "layers.0.weight"
    shape: tuple[int, ...]
    offset: int  # start inside the flat vector
    layer: str  # owning module, e.g. "layers.0"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def slice(self) -> slice:
        return slice(self.offset, self.offset + self.numel)


class ParamSpec:
    """Named tensors <-> one flat vector, with per-layer groups."""

    def __init__(self, named_shapes: list[tuple[str, tuple[int, ...]]]) -> None:
        self.tensors: list[TensorSpec] = []
        offset = 0
        for name, shape in named_shapes:
            layer = name.rsplit(".", 1)[0] if "." in name else name
            spec = TensorSpec(name, tuple(shape), offset, layer)
            self.tensors.append(spec)
            offset += spec.numel
        self.dim = offset
        self.layers: OrderedDict[str, list[TensorSpec]] = OrderedDict()
        for spec in self.tensors:
            self.layers.setdefault(spec.layer, []).append(spec)

    @classmethod
    def from_module(cls, module: nn.Module) -> ParamSpec:
        return cls([(name, tuple(p.shape)) for name, p in module.named_parameters()])

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def flatten_module(self, module: nn.Module) -> torch.Tensor:
        """The module's current parameters as one detached flat vector ``[dim]``."""
        params = dict(module.named_parameters())
        return torch.cat([params[t.name].detach().reshape(-1) for t in self.tensors])

    def flatten(self, tensors: dict[str, torch.Tensor], batch_dims: int = 0,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """Inverse of :meth:`unflatten`: ``{name: [*batch, *shape]}`` -> ``[*batch, dim]`` (written into ``out``
        when given)."""
        parts = []
        for t in self.tensors:
            value = tensors[t.name]
            parts.append(value.reshape(*value.shape[:batch_dims], t.numel))
        return torch.cat(parts, dim=-1) if out is None else torch.cat(parts, dim=-1, out=out)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """``[*batch, dim]`` -> ``{name: [*batch, *shape]}`` as views (differentiable)."""
        if flat.shape[-1] != self.dim:
            raise ValueError(f"expected a flat parameter vector of size {self.dim}, got {flat.shape[-1]}")
        batch = flat.shape[:-1]
        return {t.name: flat[..., t.slice].reshape(*batch, *t.shape) for t in self.tensors}

    def layer_slices(self) -> list[tuple[str, list[slice]]]:
        """Per layer, the slices of the flat vector it owns (tensors of a layer are contiguous)."""
        return [(layer, [t.slice for t in specs]) for layer, specs in self.layers.items()]

    def index_of(self, names: tuple[str, ...] | list[str]) -> torch.Tensor:
        """Flat coordinates of the tensors ``names`` (e.g. a model's head), in spec order."""
        return torch.cat([torch.arange(t.offset, t.offset + t.numel, device="cpu") for t in self.tensors
                          if t.name in names])

    def layer_index(self) -> torch.Tensor:
        """``[dim]`` long tensor: which layer (0..L-1) each flat coordinate belongs to."""
        index = torch.empty(self.dim, dtype=torch.long, device="cpu")
        for layer_id, specs in enumerate(self.layers.values()):
            for t in specs:
                index[t.slice] = layer_id
        return index
