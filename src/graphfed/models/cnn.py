"""A small CNN for image clients (two conv blocks + two linear layers)."""

from __future__ import annotations

import torch
from torch import nn

from graphfed.models.base import TargetModel


class SmallCNN(TargetModel):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, channels: int = 16,
                 hidden: int = 64) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"SmallCNN needs images shaped (channels, height, width), got {input_shape}")
        in_channels, height, width = input_shape
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        flat = 2 * channels * (height // 4) * (width // 4)
        self.fc1 = nn.Linear(flat, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        self.head_module = "fc2"

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = torch.max_pool2d(torch.relu(self.conv2(h)), 2)
        return torch.relu(self.fc1(h.flatten(1)))

    clients_in_loop = True

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        return self.client_loop_forward(params, x, features_only)  # faster than vmap for convolutions on CPU
