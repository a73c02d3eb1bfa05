"""Small CNNs for image clients: graphfed's two conv blocks + two linear layers, and pfl-research's benchmark CNN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graphfed.models.base import ClientGroups, TargetModel, batched_linear


class SmallCNN(TargetModel):
    clients_per_chunk = 8  # cache-sized chunks of clients (TargetModel.clients_per_chunk)
    conv_kernels = ("grouped", "unfold")  # the grouped convolution first (TargetModel.conv_kernels)

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

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        groups = ClientGroups(x, self.conv_kernel_on(x.device))  # every client's convolutions at once
        h = groups.conv2d(groups.images, params["conv1.weight"], params["conv1.bias"], padding=1)
        h = torch.max_pool2d(torch.relu(h), 2)
        h = torch.max_pool2d(torch.relu(groups.conv2d(h, params["conv2.weight"], params["conv2.bias"], padding=1)), 2)
        h = torch.relu(batched_linear(groups.per_client(h), params["fc1.weight"], params["fc1.bias"]))
        return h if features_only else batched_linear(h, params["fc2.weight"], params["fc2.bias"])


class PflCNN(TargetModel):
    """The 2-layer CNN of pfl-research's CIFAR-10 benchmark (Apple's pfl-research, ``simple_cnn``)::

        conv 3x3 (32) -> ReLU -> conv 3x3 (64) -> ReLU -> max-pool 2 -> linear (128) -> ReLU -> linear (classes)

    1.6M parameters on 32x32x3 images, Glorot-uniform weights as in its reference. The reference's two dropout
    layers (0.25, 0.5) are left out: graphfed's local training is deterministic given the seed, and dropout
    would need a per-client mask stream; the benchmark compares speed, not accuracy.
    """

    clients_per_chunk = 8  # cache-sized chunks of clients (TargetModel.clients_per_chunk)
    conv_kernels = ("loop", "grouped", "unfold")  # the loop on a CPU, the grouped convolution elsewhere (below)

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        if len(input_shape) != 3 or input_shape[1] < 6 or input_shape[2] < 6:
            raise ValueError(f"pfl-cnn needs images shaped (channels, height >= 6, width >= 6), got {input_shape}")
        in_channels, height, width = input_shape
        self.conv1 = nn.Conv2d(in_channels, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(64 * ((height - 4) // 2) * ((width - 4) // 2), 128)
        self.fc2 = nn.Linear(128, num_classes)
        self.head_module = "fc2"
        for layer in (self.conv1, self.conv2, self.fc1, self.fc2):
            nn.init.xavier_uniform_(layer.weight)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.conv2(torch.relu(self.conv1(x)))), 2)
        return torch.relu(self.fc1(h.flatten(1)))

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        # On a CPU, convolutions client by client (linear layers batched): at 50 clients x batch 10 this trains in
        # about 1.3x the combined-batch floor, where one grouped convolution over clients (best for LeNet) takes
        # 1.6x: oneDNN's grouped kernels lose on 32 -> 64 channels per group. On a GPU the per-client loop is
        # launch-bound (pfl-research's setting on an H200: 2.9x a plain per-client loop, 8,700 kernel launches a
        # round) and the grouped convolution fills the device (9.9x, 4,100 launches; benchmarks/gpu.py).
        kernel = self.conv_kernel_on(x.device)
        convolved = (self.client_loop_convolutions(params, x) if kernel == "loop" else
                     self.grouped_convolutions(params, x, kernel))
        h = torch.relu(batched_linear(convolved, params["fc1.weight"], params["fc1.bias"]))
        return h if features_only else batched_linear(h, params["fc2.weight"], params["fc2.bias"])

    def default_conv_kernel(self, device: torch.device) -> str:
        return "loop" if device.type == "cpu" else "grouped"

    def loops_clients_on(self, device: torch.device) -> bool:
        return False  # its loop is over convolutions only: the linear layers batch, so chunks still pay

    @staticmethod
    def client_loop_convolutions(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``x [S, B, C, H, W]`` -> ``[S, B, F]``, the flattened convolutional features, one client at a time.
        (Channels-last here was 7 % faster on a CPU but its gradients of conv1 disagreed with a float64 reference
        on one client in three: not used.)"""
        flat = []
        for s in range(x.shape[0]):
            h = torch.relu(F.conv2d(x[s], params["conv1.weight"][s], params["conv1.bias"][s]))
            h = torch.max_pool2d(torch.relu(F.conv2d(h, params["conv2.weight"][s], params["conv2.bias"][s])), 2)
            flat.append(h.flatten(1))
        return torch.stack(flat)

    @staticmethod
    def grouped_convolutions(params: dict[str, torch.Tensor], x: torch.Tensor, kernel: str = "grouped",
                             ) -> torch.Tensor:
        """As :meth:`client_loop_convolutions`, every client's convolutions at once (:class:`ClientGroups`)."""
        groups = ClientGroups(x, kernel)
        h = torch.relu(groups.conv2d(groups.images, params["conv1.weight"], params["conv1.bias"]))
        h = torch.max_pool2d(torch.relu(groups.conv2d(h, params["conv2.weight"], params["conv2.bias"])), 2)
        return groups.per_client(h)
