"""A small causal character transformer (nanoGPT's shape), with LoRA adapters that a federation trains alone.

The network reads a window of character classes ``x [B, T]`` (floats holding integers, as every graphfed split
stores its rows) and predicts the next character from the last position: token and position embeddings, ``layers``
pre-LayerNorm decoder blocks (LayerNorm -> causal self-attention by ``F.scaled_dot_product_attention`` -> residual,
LayerNorm -> MLP of 4x the width with GELU, GPT-2's tanh form -> residual), a final LayerNorm and a linear head over
the classes.

**Adapters** (``adapter: {kind: lora, rank: r, alpha: a, targets: [...]}``, Hu et al. 2021, as PEFT writes them):
the base network's every weight becomes a frozen buffer shared by all clients, and each targeted linear layer
(``qkv``, ``out``: attention; ``up``, ``down``: MLP; ``head``) gains ``lora_A [r, in]`` (initialised like a linear
layer's weight) and ``lora_B [out, r]`` (zeros, so an adapter starts as the base), its output ``W x + b +
(a / r) B A x``. Only the adapters are parameters: they are what trains, travels and is personalised; the base comes
from ``model.base`` (a pretrained file) or the model's seeded initialisation.

**One base for all clients.** :meth:`CharTransformer.batched_forward` runs every client's rows through the base in one
product per layer (``[S*B*T, in] @ W^T``: the base is never copied per client) and adds each client's low-rank
correction by two batched products (``[S, B*T, in] @ A^T @ B^T``), with the backward written out
(:class:`LoraLinear`). A next-character prediction reads only the last position, so the last block computes the
keys and values of every position but the query, attention and MLP of the last one only. Without adapters every
weight is a client's own and each layer is one batched product over clients (``baddbmm``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphfed.config import ConfigError
from graphfed.models.base import TargetModel

#: the linear layers an adapter may target, by the last part of their names
LORA_TARGETS = ("qkv", "out", "up", "down", "head")


class Block(nn.Module):
    """A pre-LayerNorm decoder block's parameters (the computation is :class:`CharTransformer`'s)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)


def lora_options(adapter: dict[str, Any] | None) -> tuple[int, float, tuple[str, ...]] | None:
    """``(rank, scale, targets)`` of ``model.options.adapter`` (None: no adapter); ConfigError for anything else."""
    if adapter is None:
        return None
    if not isinstance(adapter, dict) or adapter.get("kind", "lora") != "lora":
        raise ConfigError(f"model.options.adapter: give {{kind: lora, rank: R, alpha: A, targets: [...]}}; got "
                          f"{adapter!r}")
    unknown = sorted(set(adapter) - {"kind", "rank", "alpha", "targets"})
    if unknown:
        raise ConfigError(f"model.options.adapter: unknown key(s) {', '.join(unknown)}; keys: kind, rank, alpha, "
                          f"targets")
    rank = adapter.get("rank", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"model.options.adapter.rank: a whole number >= 1, got {rank!r}")
    alpha = adapter.get("alpha", 2 * rank)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
        raise ConfigError(f"model.options.adapter.alpha: a number > 0, got {alpha!r}")
    targets = adapter.get("targets", ["qkv", "out", "up", "down"])
    if not isinstance(targets, list) or not targets or any(t not in LORA_TARGETS for t in targets):
        raise ConfigError(f"model.options.adapter.targets: a list of {', '.join(LORA_TARGETS)}; got {targets!r}")
    return rank, float(alpha) / rank, tuple(targets)


class LoraLinear(torch.autograd.Function):
    """``h [S, N, in]`` -> ``W h + b + scale B_s A_s h`` for each client ``s``: the frozen base ``W [out, in]`` one
    product over every client's rows, the low-rank term two batched products.

    Written out because autograd's own graph of the same expression copied and zero-filled the ``[S, N, out]``
    output and its gradient several times a layer (a third of a LoRA step at 20 clients); here backward is the four
    products it needs: ``dh = g W + scale (g B) A``, ``dA = scale (g B)^T h``, ``dB = scale g^T (A h)``. The base
    takes no gradient (it is a buffer); backward is written in differentiable operations, so second-order methods
    still differentiate through it.
    """

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, lora_a: torch.Tensor,
                lora_b: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(h, weight, lora_a, lora_b)
        ctx.scale = scale
        low = torch.bmm(h, lora_a.transpose(1, 2))
        return F.linear(h, weight, bias).baddbmm_(low, lora_b.transpose(1, 2), alpha=scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, weight, lora_a, lora_b = ctx.saved_tensors
        grad_low = torch.bmm(grad, lora_b).mul_(ctx.scale)  # [S, N, r]
        grad_h = torch.matmul(grad, weight).baddbmm_(grad_low, lora_a) if ctx.needs_input_grad[0] else None
        grad_a = torch.bmm(grad_low.transpose(1, 2), h) if ctx.needs_input_grad[3] else None
        grad_b = None
        if ctx.needs_input_grad[4]:  # A h again (N x r, cheap) rather than saved: so it stays differentiable
            grad_b = torch.bmm(grad.transpose(1, 2), torch.bmm(h, lora_a.transpose(1, 2))).mul_(ctx.scale)
        return grad_h, None, None, grad_a, grad_b, None


class CharTransformer(TargetModel):
    """``x [B, T]`` character classes -> ``[B, vocab]`` logits of the next character; see the module docstring."""

    #: clients trained at once (TargetModel.clients_per_chunk): 8 was fastest at 20 and 100 clients on 2 cores
    #: (width 64, 2 blocks, batch 16: 0.47 s against 0.50 all at once and 0.65 one by one at 20 clients; at 100,
    #: 2.3 s against 3.4 all at once, whose activations outgrow the caches); a run's autotune measures it again
    clients_per_chunk = 8

    def __init__(self, vocab: int, context: int, width: int = 128, layers: int = 4, heads: int = 4,
                 adapter: dict[str, Any] | None = None) -> None:
        super().__init__()
        if width % heads:
            raise ConfigError(f"model.options.width: {width} is not a multiple of heads ({heads})")
        self.vocab, self.context, self.width, self.heads = vocab, context, width, heads
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.head_module = "head"
        self.lora = lora_options(adapter)
        if self.lora is not None:
            self._freeze_base_and_add_adapters(*self.lora)

    def _freeze_base_and_add_adapters(self, rank: int, scale: float, targets: tuple[str, ...]) -> None:
        """Every base weight becomes a buffer (frozen, shared); each targeted linear layer gains its LoRA factors."""
        for name, parameter in list(self.named_parameters()):
            owner, _, leaf = name.rpartition(".")
            module = self.get_submodule(owner) if owner else self
            delattr(module, leaf)
            module.register_buffer(leaf, parameter.detach().clone())
        self.lora_scale = scale
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and name.rpartition(".")[2] in targets:
                lora_a = torch.empty(rank, module.in_features)
                nn.init.kaiming_uniform_(lora_a, a=math.sqrt(5))  # as nn.Linear initialises its weight (PEFT's A)
                module.register_parameter("lora_A", nn.Parameter(lora_a))
                module.register_parameter("lora_B", nn.Parameter(torch.zeros(module.out_features, rank)))

    @property
    def base_names(self) -> tuple[str, ...]:
        """The frozen base's tensors (buffers) under adapters; empty without."""
        return tuple(name for name, _ in self.named_buffers()) if self.lora is not None else ()

    @property
    def head_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.named_parameters() if name.startswith(f"{self.head_module}."))

    # ---- the computation, for S clients at once -----------------------------------------------------------------
    def _tensor(self, params: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        """A client-batched tensor of ``params`` (``[S, ...]``), else the shared base tensor of the module."""
        if name in params:
            return params[name]
        return self.get_buffer(name) if self.lora is not None else self.get_parameter(name)

    def _linear(self, params: dict[str, torch.Tensor], name: str, h: torch.Tensor,
                outputs: slice = slice(None)) -> torch.Tensor:
        """``h [S, N, in]`` -> ``[S, N, out]``: the base (or each client's) layer, plus each client's LoRA term;
        ``outputs`` picks a part of the layer's outputs (the queries or the keys and values of ``qkv``)."""
        weight, bias = self._tensor(params, f"{name}.weight"), self._tensor(params, f"{name}.bias")
        if weight.dim() == 3:  # each client's own weight: one batched product
            return torch.baddbmm(bias[:, outputs].unsqueeze(1), h, weight[:, outputs].transpose(1, 2))
        if f"{name}.lora_A" in params:
            if weight.requires_grad or bias.requires_grad:  # LoraLinear gives the base no gradient
                raise ValueError(f"{name}: a LoRA layer's base weight must be frozen")
            return LoraLinear.apply(h, weight[outputs], bias[outputs], params[f"{name}.lora_A"],
                                    params[f"{name}.lora_B"][:, outputs], self.lora_scale)
        return F.linear(h, weight[outputs], bias[outputs])  # the shared base: one product over every client's rows

    def _layer_norm(self, params: dict[str, torch.Tensor], name: str, h: torch.Tensor) -> torch.Tensor:
        weight, bias = self._tensor(params, f"{name}.weight"), self._tensor(params, f"{name}.bias")
        if weight.dim() == 1:
            return F.layer_norm(h, (self.width,), weight, bias)
        return F.layer_norm(h, (self.width,)) * weight.unsqueeze(1) + bias.unsqueeze(1)

    def _embeddings(self, params: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [S, B, T]`` -> ``[S, B*T, width]``: token plus position embeddings."""
        clients, batch, steps = tokens.shape
        table, position = self._tensor(params, "embed.weight"), self._tensor(params, "position")
        if table.dim() == 3:
            h = table[torch.arange(clients, device=tokens.device).view(-1, 1, 1), tokens]
        else:
            h = F.embedding(tokens, table)
        h = h + (position[:, None, :steps] if position.dim() == 3 else position[:steps])
        return h.reshape(clients, batch * steps, self.width)

    def _attention(self, params: dict[str, torch.Tensor], name: str, h: torch.Tensor, batch: int,
                   last_only: bool = False) -> torch.Tensor:
        """``h [S, B*T, width]`` -> causal self-attention's output ``[S, B*T, width]``, or with ``last_only`` the
        last position's ``[S, B, width]`` (its query over every key: no mask needed)."""
        clients, rows, _ = h.shape
        steps, per_head = rows // batch, self.width // self.heads
        if last_only:
            keys_values = self._linear(params, f"{name}.qkv", h, slice(self.width, None))
            key, value = keys_values.view(clients * batch, steps, 2, self.heads, per_head).permute(2, 0, 3, 1, 4)
            last = h.view(clients, batch, steps, self.width)[:, :, -1]
            query = self._linear(params, f"{name}.qkv", last, slice(self.width)).view(clients * batch, 1, self.heads,
                                                                                      per_head).transpose(1, 2)
            mixed = F.scaled_dot_product_attention(query, key, value)
            return self._linear(params, f"{name}.out", mixed.reshape(clients, batch, self.width))
        qkv = self._linear(params, f"{name}.qkv", h).view(clients * batch, steps, 3, self.heads, per_head)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [S*B, heads, T, per_head]
        mixed = F.scaled_dot_product_attention(query, key, value, is_causal=True)
        return self._linear(params, f"{name}.out", mixed.transpose(1, 2).reshape(clients, rows, self.width))

    def _features(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``x [S, B, T]`` -> ``[S, B, width]``: the last position's representation, after the final LayerNorm."""
        return self._layer_norm(params, "ln_f", self._hidden(params, x, last_only=True))

    def _hidden(self, params: dict[str, torch.Tensor], x: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """``x [S, B, T]`` -> ``[S, B*T, width]``: every position's representation before the final LayerNorm; with
        ``last_only`` the last position's ``[S, B, width]``, which is all a next-character prediction reads: the
        last block then computes only the keys and values of the other positions (a third less arithmetic at
        two blocks)."""
        clients, batch, steps = x.shape
        h = self._embeddings(params, x.long())
        for i in range(len(self.blocks)):
            name, last_block = f"blocks.{i}", last_only and i == len(self.blocks) - 1
            mixed = self._attention(params, name, self._layer_norm(params, f"{name}.ln1", h), batch, last_block)
            h = (h.view(clients, batch, steps, self.width)[:, :, -1] if last_block else h) + mixed
            up = F.gelu(self._linear(params, f"{name}.up", self._layer_norm(params, f"{name}.ln2", h)),
                        approximate="tanh")  # GPT-2's
            h = h + self._linear(params, f"{name}.down", up)
        return h

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        features = self._features(params, x)
        return features if features_only else self.batched_head(params, features)

    def batched_head(self, params: dict[str, torch.Tensor], features: torch.Tensor) -> torch.Tensor:
        return self._linear(params, "head", features)

    def sequence_logits(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T]`` -> ``[B, T, vocab]``: at every position the logits of the character after it (causal: a
        position sees only those before it), which is how pretraining learns from every character of a window."""
        params = {name: value.unsqueeze(0) for name, value in self.named_parameters()}
        h = self._layer_norm(params, "ln_f", self._hidden(params, x.unsqueeze(0)))
        return self.batched_head(params, h).view(*x.shape, self.vocab)

    def forward(self, x: torch.Tensor, features_only: bool = False) -> torch.Tensor:
        params = {name: value.unsqueeze(0) for name, value in self.named_parameters()}
        return self.batched_forward(params, x.unsqueeze(0), features_only).squeeze(0)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x, features_only=True)
