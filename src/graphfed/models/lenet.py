"""The LeNet-style CNN that pFedHN trains on CIFAR (its target network): 2 conv + 3 linear layers.

Not pFedGAT's network: pFedGAT's paper uses 3 conv + 3 linear layers, which graphfed does not ship (its pFedGAT
runs use this LeNet or the MLP, as each report states).

conv(C -> channels, 5x5) -> ReLU -> maxpool 2 -> conv(channels -> channels2, 5x5) -> ReLU -> maxpool 2 ->
fc(flat -> hidden) -> ReLU -> fc(hidden -> hidden2) -> ReLU -> fc(hidden2 -> classes), unpadded convolutions.
Defaults 16 / 32 / 120 / 84 give the papers' network: 121,182 parameters on 32x32x3 CIFAR-10 (flat = 32*5*5),
and it runs on 28x28x1 images as well (flat = 32*4*4): the flat size follows from ``input_shape``.
"""

from __future__ import annotations

import torch
from torch import nn

from graphfed.models.base import ClientGroups, TargetModel, batched_linear

KERNEL = 5
POOL = 2


def _side_after_features(side: int) -> int:
    """Height (or width) after two (5x5 valid conv, 2x2 pool) blocks."""
    for _ in range(2):
        side = (side - (KERNEL - 1)) // POOL
    return side


class LeNet(TargetModel):
    clients_per_chunk = 8  # cache-sized chunks of clients (TargetModel.clients_per_chunk)
    conv_kernels = ("grouped", "unfold")  # the grouped convolution first (TargetModel.conv_kernels)

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, channels: int = 16,
                 channels2: int | None = None, hidden: int = 120, hidden2: int = 84) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"LeNet needs images shaped (channels, height, width), got {input_shape}")
        channels2 = 2 * channels if channels2 is None else channels2  # pFedHN doubles the width in conv2
        widths = {"channels": channels, "channels2": channels2, "hidden": hidden, "hidden2": hidden2}
        for name, width in widths.items():
            if width < 1:
                raise ValueError(f"LeNet option {name} must be >= 1, got {width}")
        in_channels, height, width = input_shape
        out_h, out_w = _side_after_features(height), _side_after_features(width)
        if out_h < 1 or out_w < 1:
            raise ValueError(f"LeNet: images of {height}x{width} are too small for two 5x5 convolutions with "
                             f"2x2 pooling (need at least 16x16)")
        self.conv1 = nn.Conv2d(in_channels, channels, KERNEL)
        self.conv2 = nn.Conv2d(channels, channels2, KERNEL)
        self.fc1 = nn.Linear(channels2 * out_h * out_w, hidden)
        self.fc2 = nn.Linear(hidden, hidden2)
        self.fc3 = nn.Linear(hidden2, num_classes)
        self.head_module = "fc3"

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.conv1(x)), POOL)
        h = torch.max_pool2d(torch.relu(self.conv2(h)), POOL)
        h = torch.relu(self.fc1(h.flatten(1)))
        return torch.relu(self.fc2(h))

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        groups = ClientGroups(x, self.conv_kernel_on(x.device))  # every client's convolutions at once
        h = torch.max_pool2d(torch.relu(groups.conv2d(groups.images, params["conv1.weight"], params["conv1.bias"])),
                             POOL)
        h = torch.max_pool2d(torch.relu(groups.conv2d(h, params["conv2.weight"], params["conv2.bias"])), POOL)
        h = torch.relu(batched_linear(groups.per_client(h), params["fc1.weight"], params["fc1.bias"]))
        h = torch.relu(batched_linear(h, params["fc2.weight"], params["fc2.bias"]))
        return h if features_only else batched_linear(h, params["fc3.weight"], params["fc3.bias"])
