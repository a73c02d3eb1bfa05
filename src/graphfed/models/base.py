"""Target models: ordinary ``nn.Module``s that can also run many clients' weights at once."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap


class TargetModel(nn.Module):
    """A client model. ``batched_forward`` evaluates S different weight sets on S input batches.

    The default uses ``torch.func.vmap`` over ``functional_call``, which works for any architecture;
    models whose layers are plain matmuls override it with hand-batched ``baddbmm`` (about 2x faster
    on CPU for tiny MLPs, where per-op overhead dominates).
    """

    #: True when a row's output depends on the other rows of its batch (BatchNorm with batch statistics). Such a
    #: model is evaluated on each client's whole split as one batch, without padding rows, so a client's score does
    #: not depend on the order of its rows or on any block size; False: rows are independent and go in blocks
    batch_statistics: bool = False
    #: at most this many clients train at once (None: as many as ``TRAINING_VALUES_PER_CHUNK`` weights allow).
    #: Convolutional models set 8: a chunk's activations and autograd graph then stay cache-sized, and training 100
    #: clients 8 at a time is 2x (LeNet) to 12x (CNN-BN) faster on the CPU than all at once
    #: (``benchmarks/cpu_grid.py``); results equal all-at-once training up to float rounding
    clients_per_chunk: int | None = None
    #: the submodule that maps features to outputs (classifier or regression head); personalisation methods
    #: that split a model into body and head (FedRep, FedRoD, ...) read it from here, never from parameter order
    head_module: str
    #: how this model can run many clients' convolutions (``train.conv_kernel``; :data:`CONV_KERNELS`), in order of
    #: preference; empty: one way only (no convolutions, or a loop everywhere)
    conv_kernels: tuple[str, ...] = ()
    #: the way this run uses, set by the execution plan (None: :meth:`default_conv_kernel` of the device)
    conv_kernel: str | None = None

    def default_conv_kernel(self, device: torch.device) -> str | None:
        """The kernel used on ``device`` unless the run chose another: the first of :attr:`conv_kernels`."""
        return self.conv_kernels[0] if self.conv_kernels else None

    def conv_kernel_on(self, device: torch.device) -> str | None:
        """The kernel this model's clients' convolutions run with on ``device``."""
        return self.conv_kernel or self.default_conv_kernel(device)

    def loops_clients_on(self, device: torch.device) -> bool:
        """Whether training on ``device`` runs the clients one by one whatever the chunk size (a BatchNorm
        network's loop on a CPU): then the chunk size changes nothing and is not calibrated."""
        return self.conv_kernel_on(device) == "loop"

    def images_layout_on(self, device: torch.device) -> torch.memory_format:
        """The memory layout a client's images ``[B, C, H, W]`` are handed to this model's one-client networks in on
        ``device`` (the engine's module step, and the model's own loop over clients): the convolutions, pooling and
        elementwise layers then run in it. The default keeps the layout the data come in."""
        return torch.contiguous_format

    def pads_scoring_blocks(self, device: torch.device) -> bool:
        """Whether a model with batch statistics scores several clients' whole splits in one call on ``device``,
        each padded to the longest with all-zero rows that its statistics leave out (False: one client a call)."""
        return False

    @property
    def head_names(self) -> tuple[str, ...]:
        """Names of the head's parameter tensors (``fc2.weight``, ``fc2.bias``, ...)."""
        head = self.get_submodule(self.head_module)
        return tuple(f"{self.head_module}.{name}" for name, _ in head.named_parameters())

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, *input_shape]`` -> ``[B, F]``: what the head reads (the representation of FedRep, KNN-Per...)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its features")

    def forward(self, x: torch.Tensor, features_only: bool = False) -> torch.Tensor:
        h = self.features(x)
        return h if features_only else self.get_submodule(self.head_module)(h)

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        """``params[name]``: ``[S, *shape]``; ``x``: ``[S, B, *input_shape]`` -> ``[S, B, out]`` (``[S, B, F]``,
        the head's input, with ``features_only``)."""

        def one_client(client_params: dict[str, torch.Tensor], client_x: torch.Tensor) -> torch.Tensor:
            return functional_call(self, client_params, (client_x,), {"features_only": features_only})

        return vmap(one_client)(params, x)

    def batched_head(self, params: dict[str, torch.Tensor], features: torch.Tensor) -> torch.Tensor:
        """The (linear) head of every client on its features: ``[S, B, F]`` -> ``[S, B, out]``."""
        return batched_linear(features, params[f"{self.head_module}.weight"], params[f"{self.head_module}.bias"])

    def client_loop_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                            features_only: bool = False) -> torch.Tensor:
        """Same contract as :meth:`batched_forward`, one ``functional_call`` per client.

        For convolutional models on CPU this beats ``vmap`` (SmallCNN, 20 clients x 64 images, 2 threads:
        400 ms vs 635 ms forward+backward; evaluation 3.3 s vs 7.3 s), and without autograd each client's
        activations are freed before the next client runs.
        """
        num_clients = x.shape[0]
        for name, value in params.items():
            if value.shape[0] != num_clients:
                raise ValueError(f"params[{name!r}] holds {value.shape[0]} clients but x holds {num_clients}")
        if num_clients == 1:  # views both ways (no copy of the weights' gradients): a chunk of one client, the
            # CPU's usual choice for BatchNorm networks, trains as a plain module does
            one = {name: value.squeeze(0) for name, value in params.items()}
            return functional_call(self, one, (x[0],), {"features_only": features_only}).unsqueeze(0)
        # unbind, not value[s]: its backward stacks the clients' gradients once, where each select would allocate
        # and zero-fill a gradient as large as all clients' weights (per tensor, per client, per step)
        per_client = {name: value.unbind(0) for name, value in params.items()}
        return torch.stack([functional_call(self, {name: tensors[s] for name, tensors in per_client.items()},
                                            (x[s],), {"features_only": features_only}) for s in range(num_clients)])


def in_layout(images: torch.Tensor, layout: torch.memory_format) -> torch.Tensor:
    """Clients' images ``[S, B, C, H, W]`` with each client's ``[B, C, H, W]`` in ``layout`` (the same values)."""
    if layout == torch.contiguous_format:
        return images.contiguous()
    if layout != torch.channels_last:
        raise ValueError(f"images can be laid out contiguous or channels-last, not {layout}")
    return images.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)


#: ways to run many clients' convolutions (``train.conv_kernel``): ``loop`` (one client's network after another),
#: ``vmap`` (``torch.func.vmap`` over the network), ``grouped`` (one grouped convolution, channels-last: see
#: :class:`ClientGroups`) and ``unfold`` (im2col and one batched matrix product per layer: GEMMs, which a GPU runs
#: on its tensor cores at tf32 and bf16). All compute the same numbers up to float rounding; which is fastest
#: depends on the device, the shapes and the precision, so a run on an accelerator measures it
#: (:func:`graphfed.client.autotune.choose_conv_kernel`)
CONV_KERNELS = ("loop", "vmap", "grouped", "unfold")


class ClientGroups:
    """Many clients' convolutional layers as one call per layer.

    Client ``s``'s input channels become channel group ``s`` of one image batch (``[B, S*C, H, W]``,
    channels-last), so each layer is a single ``conv2d(groups=S)`` instead of S small ones. On a 2-core CPU
    this trains LeNet within about 1.05x of one network trained on all clients' images at once (the compute
    floor), where a loop of per-client convolutions is 1.3x off it (``benchmarks/sim_throughput.py``).
    Elementwise layers and pooling act per channel, so they need no change. With ``kernel="unfold"`` each layer is
    im2col and one batched matrix product over clients instead (:meth:`unfold_conv2d`), in the same layout.
    """

    def __init__(self, x: torch.Tensor, kernel: str | None = "grouped") -> None:
        """``x``: ``[S, B, C, H, W]``, every client's batch of images (the same B for all)."""
        if kernel not in ("grouped", "unfold"):
            raise ValueError(f"ClientGroups runs grouped or unfold convolutions, not {kernel!r}")
        self.kernel = kernel
        self.num_clients, self.batch = x.shape[:2]
        self.images = x.transpose(0, 1).reshape(self.batch, -1, *x.shape[3:]).contiguous(
            memory_format=torch.channels_last)

    def conv2d(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, **options: Any) -> torch.Tensor:
        """``h [B, S*C, H, W]``, ``weight [S, O, C, k, k]``, ``bias [S, O]`` -> ``[B, S*O, H', W']``."""
        if self.kernel == "unfold":
            return self.unfold_conv2d(h, weight, bias, **options)
        flat_bias = None if bias is None else bias.reshape(-1)
        return F.conv2d(h, weight.reshape(-1, *weight.shape[2:]), flat_bias, groups=self.num_clients, **options)

    def unfold_conv2d(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int = 1,
                      padding: int = 0, dilation: int = 1) -> torch.Tensor:
        """:meth:`conv2d` as im2col (``F.unfold``) and one ``baddbmm`` over clients: each client's layer is one
        matrix product ``[O, C*k*k] @ [C*k*k, B*H'*W']``."""
        num_clients, out_channels, in_channels, k_h, k_w = weight.shape
        per_image = h.reshape(self.batch * num_clients, in_channels, *h.shape[2:])
        columns = F.unfold(per_image, (k_h, k_w), dilation=dilation, padding=padding, stride=stride)
        positions = columns.shape[-1]  # H' * W'
        # [B, S, C*k*k, L] -> [S, C*k*k, B*L]: each client's columns side by side over its images
        columns = columns.view(self.batch, num_clients, -1, positions).permute(1, 2, 0, 3).reshape(
            num_clients, -1, self.batch * positions)
        flat_weight = weight.reshape(num_clients, out_channels, -1)
        if bias is None:
            out = torch.bmm(flat_weight, columns)
        else:
            out = torch.baddbmm(bias.unsqueeze(-1), flat_weight, columns)
        out_h = (h.shape[2] + 2 * padding - dilation * (k_h - 1) - 1) // stride + 1
        out_w = (h.shape[3] + 2 * padding - dilation * (k_w - 1) - 1) // stride + 1
        # [S, O, B, H', W'] -> [B, S*O, H', W'] (a view: client s's channels stay group s)
        return out.view(num_clients, out_channels, self.batch, out_h, out_w).permute(2, 0, 1, 3, 4).reshape(
            self.batch, num_clients * out_channels, out_h, out_w)

    def per_client(self, h: torch.Tensor) -> torch.Tensor:
        """``[B, S*C, H, W]`` -> ``[S, B, C*H*W]``: each client's activations flattened as its own network would."""
        return h.reshape(self.batch, self.num_clients, -1).transpose(0, 1)


class _BatchedLinear(torch.autograd.Function):
    """``baddbmm(bias, h, weight^T)`` whose weight gradient comes out in the weight's own layout.

    Autograd's rule for ``baddbmm`` computes ``h^T @ grad`` (``[S, F, O]``) and hands it back transposed, so every
    SGD step on a large layer walked a transposed gradient (at LeNet 32/64/512 on the CPU, 3 ms per step for the
    1600 x 512 layer, 45 % of a client step: ``benchmarks/cpu_grid.py``). Here the weight gradient is
    ``grad^T @ h`` (``[S, O, F]``), the same dot products over the batch rows in the order the BLAS picks for this
    layout: the same bits as autograd's rule under MKL's AVX-512 path (Intel Xeons), not under its AVX2 path (AMD
    EPYC), where the two agree to float rounding (``tests/test_training_step.py`` checks both). The input's and the
    bias's gradients are autograd's own kernel calls. The backward is differentiable (create_graph)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        h, weight, _ = inputs
        ctx.save_for_backward(h, weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        h, weight = ctx.saved_tensors
        grad_h = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        grad_weight = torch.bmm(grad.transpose(1, 2), h) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(1) if ctx.needs_input_grad[2] else None
        return grad_h, grad_weight, grad_bias


#: weights (over all clients of a call) from which a linear layer's backward is :class:`_BatchedLinear`'s: below,
#: autograd's own rule costs less than a custom Function's call (about 70 us in Python: ``apply`` binds its arguments
#: through ``inspect.signature``), which made a 16-unit MLP's round 35 % slower. Both give the same numbers up to
#: summation order (the same bits on an AVX-512 Xeon's MKL path).
CONTIGUOUS_GRADIENT_MIN_WEIGHTS = 1 << 17


def batched_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Every client's linear layer: ``h [S, B, F]``, ``weight [S, O, F]``, ``bias [S, O]`` -> ``[S, B, O]``."""
    if weight.numel() < CONTIGUOUS_GRADIENT_MIN_WEIGHTS:
        return torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))
    return _BatchedLinear.apply(h, weight, bias)
