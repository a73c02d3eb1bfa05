"""MLP hypernetwork with one linear head per target tensor (pFedHN style)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from graphfed.core.params import ParamSpec


class MLPHypernet(nn.Module):
    """``z [S, in_dim]`` -> flat target weights ``[S, spec.dim]``.

    A trunk of ``num_layers`` linear layers (ReLU between) feeds one head per named target tensor;
    the heads' outputs are concatenated in the ParamSpec's order, so the result is a flat weight row.
    """

    def __init__(self, in_dim: int, spec: ParamSpec, hidden: int = 100, num_layers: int = 3) -> None:
        super().__init__()
        self.trunk = mlp_trunk(in_dim, hidden, num_layers)
        self.heads = nn.ModuleList(nn.Linear(hidden, t.numel) for t in spec.tensors)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        features = self.trunk(z)
        return torch.cat([head(features) for head in self.heads], dim=-1)


def mlp_trunk(in_dim: int, hidden: int, num_layers: int) -> nn.Sequential:
    """``num_layers`` linear layers of width ``hidden``, ReLU between."""
    widths = [in_dim] + [hidden] * num_layers
    trunk: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        trunk.append(nn.Linear(a, b))
        if i < num_layers - 1:
            trunk.append(nn.ReLU())
    return nn.Sequential(*trunk)


class ArchitectureHypernet(nn.Module):
    """pFedHN for clients of different architectures (FLHA-GHN's baseline, paper Sec. 5.1): one shared trunk and
    one set of output heads per architecture, each emitting that architecture's weights. ``forward(z, arch)`` ->
    ``[S, max_dim]`` rows zero-padded past each client's architecture (the ``own`` wire).

    Each head's bias starts at its architecture's initial weights (``init_weights``), so the hypernetwork first
    generates networks that train like freshly initialised ones. With PyTorch's default head initialisation the
    BatchNorm gains of a deep ResNet-like network come out near 0 and silence it (chance accuracy after 20 rounds
    in a first FLHA run)."""

    def __init__(self, in_dim: int, specs: Sequence[ParamSpec], init_weights: Sequence[torch.Tensor],
                 hidden: int = 100, num_layers: int = 3) -> None:
        super().__init__()
        self.trunk = mlp_trunk(in_dim, hidden, num_layers)
        self.heads = nn.ModuleList(nn.ModuleList(nn.Linear(hidden, t.numel) for t in spec.tensors) for spec in specs)
        with torch.no_grad():
            for heads, spec, init in zip(self.heads, specs, init_weights, strict=True):
                for head, tensor in zip(heads, spec.tensors, strict=True):  # type: ignore[call-overload]
                    head.bias.copy_(init[tensor.slice])
        self.max_dim = max(spec.dim for spec in specs)

    def forward(self, z: torch.Tensor, arch: torch.Tensor) -> torch.Tensor:
        features = self.trunk(z)
        parts, order = [], []
        for index in arch.unique().tolist():
            rows = torch.nonzero(arch == index).flatten()
            generated = torch.cat([head(features[rows]) for head in self.heads[index]], dim=-1)  # type: ignore[union-attr]
            parts.append(F.pad(generated, (0, self.max_dim - generated.shape[1])))
            order.append(rows)
        return torch.cat(parts)[torch.argsort(torch.cat(order))]
