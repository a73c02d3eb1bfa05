"""MLP hypernetwork with one linear head per target tensor (pFedHN style)."""

from __future__ import annotations

import itertools

import torch
from torch import nn

from graphfed.core.params import ParamSpec


class MLPHypernet(nn.Module):
    """``z [S, in_dim]`` -> flat target weights ``[S, spec.dim]``.

    A trunk of ``num_layers`` linear layers (ReLU between) feeds one head per named target tensor;
    the heads' outputs are concatenated in the ParamSpec's order, so the result is a flat weight row.
    """

    def __init__(self, in_dim: int, spec: ParamSpec, hidden: int = 100, num_layers: int = 3) -> None:
        super().__init__()
        widths = [in_dim] + [hidden] * num_layers
        trunk: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(widths)):
            trunk.append(nn.Linear(a, b))
            if i < num_layers - 1:
                trunk.append(nn.ReLU())
        self.trunk = nn.Sequential(*trunk)
        self.heads = nn.ModuleList(nn.Linear(hidden, t.numel) for t in spec.tensors)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        features = self.trunk(z)
        return torch.cat([head(features) for head in self.heads], dim=-1)
