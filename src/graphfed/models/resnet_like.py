"""FLHA-GHN's architecture family, sized for a 2-core CPU: a ResNet-18-style network and three variants.

The paper (Litany et al., FLHA-GHN, Sec. 5 and its Figure 5) federates four architectures built from the same
layer types: Arch 0 is ResNet-18, Arch 1 has 10 layers and no skip connections, Arch 2 has 12 layers with skip
connections only in the first 8, Arch 3 has 12 (different) layers with skip connections only in the last 8; a
small 4-layer CNN serves its stress test. Here (layers = convolutions and the final linear layer; the 1x1
projection convolutions of downsampling skips are not counted, as in ResNet's naming):

========  ======================================================================================  ======
arch0     stem, 4 stages x 2 residual blocks (widths w, 2w, 4w, 8w; stride 2 from stage 2 on)     18
arch1     stem, 4 stages x 1 plain pair of convolutions, no skip                                   10
arch2     stem, 2 residual blocks (w, 2w), then 3 plain pairs (2w, 4w, 8w)                         12
arch3     stem, 1 plain pair (w), then 4 residual blocks (2w, 4w, 8w, 8w)                          12
small     3 plain convolutions (w, 2w, 4w; stride 2 from the second) + linear                      4
plainN    N = 4, 7, 10, 13: N - 1 plain convolutions of width 4w (the first with stride 2, all      N
          others 3x3 4w -> 4w) + linear: the GNN ablation's chains of one repeated layer type (Table 2)
========  ======================================================================================  ======

Every convolution is 3x3 and followed by BatchNorm and ReLU; each network ends in global average pooling and one
linear layer (the head). Widths are reduced for the CPU: ``width`` w = 8 by default (the paper's ResNet-18 uses
64, 128, 256, 512). BatchNorm uses the statistics of the batch it is given and keeps no running statistics (as
``cnn-bn``): weights generated for a client architecture then come with no buffers to estimate, and clients never
exchange statistics of their data. Training batches are drawn from a client's real rows; evaluation normalises
with the statistics of the client's whole split, one batch without padding (``batch_statistics``), so a score
does not depend on row order or block size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from graphfed.models.base import TargetModel

ARCHITECTURES = ("arch0", "arch1", "arch2", "arch3", "small", "plain4", "plain7", "plain10", "plain13")


@dataclass(frozen=True)
class Stage:
    """``blocks`` units of ``channels`` output channels, the first with ``stride``; residual or plain."""

    channels: int
    stride: int
    blocks: int
    residual: bool


def stages(arch: str, width: int) -> tuple[int, list[Stage]]:
    """``(stem channels, stages)`` of architecture ``arch`` at base width ``width``."""
    w = width
    if arch == "arch0":
        return w, [Stage(w, 1, 2, True), Stage(2 * w, 2, 2, True), Stage(4 * w, 2, 2, True), Stage(8 * w, 2, 2, True)]
    if arch == "arch1":
        return w, [Stage(w, 1, 1, False), Stage(2 * w, 2, 1, False), Stage(4 * w, 2, 1, False),
                   Stage(8 * w, 2, 1, False)]
    if arch == "arch2":
        return w, [Stage(w, 1, 1, True), Stage(2 * w, 2, 1, True), Stage(2 * w, 1, 1, False),
                   Stage(4 * w, 2, 1, False), Stage(8 * w, 2, 1, False)]
    if arch == "arch3":
        return w, [Stage(w, 1, 1, False), Stage(2 * w, 2, 1, True), Stage(4 * w, 2, 1, True),
                   Stage(8 * w, 2, 1, True), Stage(8 * w, 1, 1, True)]
    raise ValueError(f"unknown architecture {arch!r}; allowed: {', '.join(ARCHITECTURES)}")


def conv_bn(in_channels: int, out_channels: int, stride: int, kernel: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel, stride, padding=kernel // 2, bias=False),
                         nn.BatchNorm2d(out_channels, track_running_stats=False))


class ResidualBlock(nn.Module):
    """conv-BN-ReLU-conv-BN, plus the input (through a 1x1 conv-BN when the shape changes), then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv_bn(in_channels, out_channels, stride)
        self.conv2 = conv_bn(out_channels, out_channels, 1)
        self.shortcut = (conv_bn(in_channels, out_channels, stride, kernel=1)
                         if stride != 1 or in_channels != out_channels else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + self.shortcut(x))


class PlainPair(nn.Module):
    """conv-BN-ReLU-conv-BN-ReLU: a residual block without its skip connection."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv_bn(in_channels, out_channels, stride)
        self.conv2 = conv_bn(out_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv2(torch.relu(self.conv1(x))))


class ResNetLike(TargetModel):
    """One member of the family (see the module docstring); ``forward`` takes ``[B, C, H, W]`` images."""

    clients_per_chunk = 8  # cache-sized chunks of clients (TargetModel.clients_per_chunk)

    batch_statistics = True  # BN normalises with the batch: evaluated on each client's whole split at once

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, arch: str = "arch0", width: int = 8) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"{arch} needs images shaped (channels, height, width), got {input_shape}")
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        if arch not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {arch!r}; allowed: {', '.join(ARCHITECTURES)}")
        self.arch = arch
        in_channels = input_shape[0]
        if arch.startswith("plain"):
            convs = int(arch.removeprefix("plain")) - 1
            chain: list[nn.Module] = [conv_bn(in_channels, 4 * width, 2), nn.ReLU()]
            for _ in range(convs - 1):
                chain += [conv_bn(4 * width, 4 * width, 1), nn.ReLU()]
            self.body = nn.Sequential(*chain)
            features = 4 * width
        elif arch == "small":
            self.body = nn.Sequential(conv_bn(in_channels, width, 1), nn.ReLU(), conv_bn(width, 2 * width, 2),
                                      nn.ReLU(), conv_bn(2 * width, 4 * width, 2), nn.ReLU())
            features = 4 * width
        else:
            stem, plan = stages(arch, width)
            layers: list[nn.Module] = [conv_bn(in_channels, stem, 1), nn.ReLU()]
            channels = stem
            for stage in plan:
                for block in range(stage.blocks):
                    unit = ResidualBlock if stage.residual else PlainPair
                    layers.append(unit(channels, stage.channels, stage.stride if block == 0 else 1))
                    channels = stage.channels
            self.body = nn.Sequential(*layers)
            features = channels
        self.fc = nn.Linear(features, num_classes)
        self.head_module = "fc"

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).mean(dim=(2, 3))  # global average pooling

    def loops_clients_on(self, device: torch.device) -> bool:
        return True  # batched_forward is a client loop on every device

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        # One network per client: faster than vmap for CNNs on CPU, and a client's outputs do not depend on how
        # many clients run beside it (vmap's batched convolutions round differently), so a Flower node that
        # trains alone computes the simulator's numbers bit for bit.
        return self.client_loop_forward(params, x, features_only)
