"""Multi-layer perceptron (Panacea's target network for FL-N and TPT-48: 3 layers, hidden 16)."""

from __future__ import annotations

import itertools

import torch
from torch import nn

from graphfed.models.base import TargetModel


class MLP(TargetModel):
    def __init__(self, in_features: int, out_features: int, hidden: int = 16, num_layers: int = 3) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError("MLP needs at least one layer")
        widths = [in_features] + [hidden] * (num_layers - 1) + [out_features]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.head_module = f"layers.{len(widths) - 2}"

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(1)
        for layer in self.layers[:-1]:
            h = torch.relu(layer(h))
        return h

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        h = x.flatten(2)
        for i in range(len(self.layers) - 1):
            weight, bias = params[f"layers.{i}.weight"], params[f"layers.{i}.bias"]
            # h: [S, B, in] @ weight^T: [S, in, out] + bias: [S, 1, out]
            h = torch.relu(torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2)))
        return h if features_only else self.batched_head(params, h)
