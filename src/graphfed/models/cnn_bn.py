"""The 4-layer CNN with BatchNorm of FedAGHN / pFedLA: two conv-BN-ReLU-pool blocks, then two linear layers.

FedAGHN only says "the 4-layer CNN architecture with Batch Normalization (BN) layers similar to previous
work Ma et al. (2022)" (pFedLA), and pFedLA does not publish its exact layers either. This module follows
the 4-layer CNN of the PFLlib code base that FedAGHN's baselines (FedALA, FedCP) come from, with a BN
layer after each convolution::

    conv 5x5 (channels=32) -> BN -> ReLU -> max-pool 2
    conv 5x5 (2*channels=64) -> BN -> ReLU -> max-pool 2
    linear (hidden=512) -> ReLU -> linear (num_classes)

28x28 inputs give a 64 x 4 x 4 = 1024-wide flattened feature (32x32 inputs: 1600), ~582k parameters.

BatchNorm and the batched simulator
-----------------------------------
graphfed trains and evaluates many clients at once through ``batched_forward(params, x)``, which carries
per-client parameters only; buffers are not part of a client's weights. The BN
layers are therefore built with ``track_running_stats=False``: they normalise with the statistics of the
current batch both in training and in evaluation, and there are no running mean/variance buffers at all.
Consequences:

* BN running statistics are never shared or aggregated between clients - they do not exist. The BN affine
  weight and bias are ordinary parameters and are aggregated like every other layer.
* Evaluation normalises with the statistics of the client's whole split: the simulator evaluates each client's
  split as one batch (``batch_statistics``), so a client's score does not depend on the order of its rows or on
  any block size (rows are stored class-sorted; blocks of a class-sorted split would each see a few classes and
  shift the statistics). Tiny splits (a few rows) give noisy statistics.
* Padding rows never enter the statistics: evaluation batches hold no padding at all, and training batches are
  drawn from a client's real rows. As a second guard, rows whose input is identically zero are left out of the
  statistics (real MNIST / Fashion-MNIST images are never all zero, checked on the 70k images of each; a real
  all-zero input still gets an output, it just does not contribute to the statistics). A batch with no valid
  row yields the BN bias instead of NaN.

How clients are batched
-----------------------
``vmap`` over this model works (``vmap_forward``, the :class:`~graphfed.models.base.TargetModel` default;
equal to a per-client loop to float32 rounding, see ``tests/test_image_data.py``), but on CPU it is slower
than simply looping over clients (in isolation, the second convolution alone ran about 2.5x slower under
``vmap`` than in a loop). Measured CPU time, 1 thread, 28x28 inputs, default
sizes: S=5 clients x B=64 rows forward+backward: loop 334 ms, vmap 368 ms; S=20 x 64: loop 1634 ms, vmap
2246 ms; S=5 x 700 forward only (evaluation-sized): loop 2022 ms, vmap 3577 ms. A hand-batched version
(grouped ``conv2d`` + per-client BN statistics + ``baddbmm``) was no faster than ``vmap`` (352 / 2175 /
3303 ms). On a CPU ``batched_forward`` is therefore a loop over the client axis (``conv_kernel: loop``); as a
bonus, under ``torch.no_grad`` only one client's activations are alive at a time, which bounds evaluation memory
(a 7k-row client needs about 0.5 GiB for its first conv activation).

On a CPU the loop hands each client's images to its network channels-last (``images_layout_on``; the engine's
module step does the same): oneDNN's convolutions and its pooling run faster in that layout (one thread, 32x32
inputs, a batch of 32: 26.6 ms a step in the images' own layout, 22.2 ms channels-last; a batch of 10: 8.5 and
6.9 ms). The module called as a user calls it keeps the layout it is given.

On an accelerator the loop is launch-bound, and a run measures (``graphfed.client.autotune.choose_conv_kernel``)
``vmap`` against the hand-batched network (:meth:`CNNBN.grouped_forward`): every client's convolutions as one grouped
convolution or as im2col + one batched matrix product (the tensor cores' GEMMs), channels-last, with each client's
BatchNorm statistics over its own channels. The hand-batched network also scores several clients per call, each
split padded with all-zero rows, which the statistics leave out (``pads_scoring_blocks``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch._C._functorch import is_batchedtensor

from graphfed.models.base import ClientGroups, TargetModel, batched_linear, in_layout

__all__ = ["CNNBN", "PaddingAwareBatchNorm2d"]


class PaddingAwareBatchNorm2d(nn.BatchNorm2d):
    """``BatchNorm2d`` with batch statistics only (no running buffers) over the rows flagged valid.

    With every row valid it computes exactly what ``nn.BatchNorm2d(track_running_stats=False)`` does
    (biased variance, ``eps`` inside the square root), in training and in eval mode alike.
    """

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__(num_features, eps=eps, affine=True, track_running_stats=False)

    def forward(self, h: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """``h``: ``[B, C, H, W]``; ``valid``: ``[B]`` bool, rows that enter the statistics (default all)."""
        return padding_aware_batch_norm(h, self.weight, self.bias, valid, self.eps)


def padding_aware_batch_norm(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                             valid: torch.Tensor | None, eps: float) -> torch.Tensor:
    """:class:`PaddingAwareBatchNorm2d` as a function of its weights (a client's own, in the client loop).
    ``valid``: ``[B]``, or ``[B, C]`` where the channels' valid rows differ (many clients' channels side by side)."""
    if valid is not None and every_row_counts(valid):
        valid = None  # no mask to multiply by: x * 1 is x, so the same bits with two passes fewer each way
    if valid is None:
        n = torch.tensor(float(h.shape[0]), dtype=h.dtype, device=h.device) * (h.shape[2] * h.shape[3])
        return normalised(h, None, n.clamp_min(1.0), weight, bias, eps)
    weight_rows = valid.to(h.dtype)
    n = (weight_rows.sum(0) * (h.shape[2] * h.shape[3])).clamp_min(1.0).view(1, -1, 1, 1)
    return normalised(h, weight_rows.view(h.shape[0], -1, 1, 1), n, weight, bias, eps)


def normalised(h: torch.Tensor, mask: torch.Tensor | None, n: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               eps: float) -> torch.Tensor:
    """BatchNorm of ``h`` by the statistics of the rows ``mask`` keeps (None: all), ``n`` values per channel."""
    mean = (h if mask is None else h * mask).sum(dim=(0, 2, 3), keepdim=True) / n
    centred = h - mean
    squares = centred.square()
    var = (squares if mask is None else squares * mask).sum(dim=(0, 2, 3), keepdim=True) / n
    scale = torch.rsqrt(var + eps) * weight.view(1, -1, 1, 1)
    return centred * scale + bias.view(1, -1, 1, 1)


def every_row_counts(valid: torch.Tensor) -> bool:
    """Whether every row enters the statistics, where asking costs nothing: on a CPU (an accelerator would wait
    for the answer) and outside ``vmap`` (whose tensors have no single answer)."""
    return valid.device.type == "cpu" and not is_batchedtensor(valid) and bool(valid.all())


class CNNBN(TargetModel):
    """conv-BN-ReLU-pool x2, linear-ReLU, linear; see the module docstring for the BN semantics."""

    clients_per_chunk = 8  # cache-sized chunks of clients (TargetModel.clients_per_chunk)
    conv_kernels = ("loop", "vmap", "grouped", "unfold")  # see the module docstring

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, channels: int = 32, hidden: int = 512,
                 kernel_size: int = 5) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"CNNBN needs images shaped (channels, height, width), got {input_shape}")
        in_channels, height, width = input_shape
        k = kernel_size
        out_h, out_w = ((height - k + 1) // 2 - k + 1) // 2, ((width - k + 1) // 2 - k + 1) // 2
        if out_h < 1 or out_w < 1:
            raise ValueError(f"CNNBN: images {height}x{width} are too small for two {k}x{k} convolutions "
                             f"with 2x2 pooling")
        self.input_shape = (in_channels, height, width)
        self.conv1 = nn.Conv2d(in_channels, channels, k)
        self.bn1 = PaddingAwareBatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, 2 * channels, k)
        self.bn2 = PaddingAwareBatchNorm2d(2 * channels)
        self.fc1 = nn.Linear(2 * channels * out_h * out_w, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        self.head_module = "fc2"

    batch_statistics = True

    def default_conv_kernel(self, device: torch.device) -> str:
        return "loop" if device.type == "cpu" else "vmap"  # see the module docstring

    def images_layout_on(self, device: torch.device) -> torch.memory_format:
        return torch.channels_last if device.type == "cpu" else torch.contiguous_format  # see the module docstring

    def pads_scoring_blocks(self, device: torch.device) -> bool:
        return self.conv_kernel_on(device) in ("grouped", "unfold")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[B, C, H, W]`` -> ``[B, hidden]`` (the head's input). All-zero rows are left out of BN
        statistics."""
        valid = x.flatten(1).ne(0).any(dim=1)
        h = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x), valid)), 2)
        h = torch.max_pool2d(torch.relu(self.bn2(self.conv2(h), valid)), 2)
        return torch.relu(self.fc1(h.flatten(1)))

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        """``params[name]``: ``[S, *shape]``; ``x``: ``[S, B, C, H, W]`` -> ``[S, B, num_classes]``.

        By :meth:`conv_kernel_on`: ``loop`` (a CPU's default) is a loop over clients (see the module docstring for
        why not ``vmap`` there), and so is ``vmap`` without autograd (each client's activations are freed before the
        next client runs, which bounds evaluation memory); ``vmap`` trains with ``vmap`` (an accelerator's default:
        the loop is launch-bound there, FedAGHN's CIFAR-10 round on an H200 took 22.8 s looped, 2.4 s with
        ``vmap``; benchmarks/gpu.py); ``grouped`` and ``unfold`` run :meth:`grouped_forward`.
        """
        kernel = self.conv_kernel_on(x.device)
        if kernel in ("grouped", "unfold"):
            return self.grouped_forward(params, x, features_only, kernel)
        if kernel == "vmap" and torch.is_grad_enabled():
            return self.vmap_forward(params, x, features_only)
        x = in_layout(x, self.images_layout_on(x.device))
        if x.shape[0] == 1:  # one client (the CPU's chunk): its weights straight into the layers' functions, views
            # both ways, no module to re-parametrise: the same kernels as the module, in less time than calling it
            return self.client_forward({name: value.squeeze(0) for name, value in params.items()}, x[0],
                                       features_only).unsqueeze(0)
        return self.client_loop_forward(params, x, features_only)

    def client_forward(self, weights: dict[str, torch.Tensor], x: torch.Tensor,
                       features_only: bool = False) -> torch.Tensor:
        """:meth:`forward` with ``weights`` (one client's, by parameter name) in place of the module's own."""
        valid = x.flatten(1).ne(0).any(dim=1)
        h = F.conv2d(x, weights["conv1.weight"], weights["conv1.bias"])
        h = torch.max_pool2d(torch.relu(padding_aware_batch_norm(h, weights["bn1.weight"], weights["bn1.bias"],
                                                                 valid, self.bn1.eps)), 2)
        h = F.conv2d(h, weights["conv2.weight"], weights["conv2.bias"])
        h = torch.max_pool2d(torch.relu(padding_aware_batch_norm(h, weights["bn2.weight"], weights["bn2.bias"],
                                                                 valid, self.bn2.eps)), 2)
        h = torch.relu(F.linear(h.flatten(1), weights["fc1.weight"], weights["fc1.bias"]))
        return h if features_only else F.linear(h, weights["fc2.weight"], weights["fc2.bias"])

    def grouped_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor, features_only: bool = False,
                        kernel: str = "grouped") -> torch.Tensor:
        """:meth:`batched_forward` with every client's layers at once (:class:`ClientGroups`): its convolutions by
        ``kernel``, each client's BatchNorm over its own channels and its own valid rows (an all-zero row of one
        client, e.g. padding, leaves its statistics and no other client's)."""
        groups = ClientGroups(x, kernel)
        valid = x.flatten(2).ne(0).any(dim=2).transpose(0, 1)  # [B, S]: rows that enter each client's statistics

        def block(h: torch.Tensor, layer: str, norm: str, eps: float) -> torch.Tensor:
            h = groups.conv2d(h, params[f"{layer}.weight"], params[f"{layer}.bias"])
            rows = valid.repeat_interleave(h.shape[1] // groups.num_clients, dim=1)  # [B, S*C], client-major
            h = padding_aware_batch_norm(h, params[f"{norm}.weight"].reshape(-1), params[f"{norm}.bias"].reshape(-1),
                                         rows, eps)
            return torch.max_pool2d(torch.relu(h), 2)

        h = block(block(groups.images, "conv1", "bn1", self.bn1.eps), "conv2", "bn2", self.bn2.eps)
        h = torch.relu(batched_linear(groups.per_client(h), params["fc1.weight"], params["fc1.bias"]))
        return h if features_only else batched_linear(h, params["fc2.weight"], params["fc2.bias"])

    def vmap_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                     features_only: bool = False) -> torch.Tensor:
        """The generic ``vmap``-over-``functional_call`` path of :class:`TargetModel`: same outputs as
        :meth:`batched_forward` (to float32 rounding), kept as a reference and for benchmarks."""
        return TargetModel.batched_forward(self, params, x, features_only)
