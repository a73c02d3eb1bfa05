"""The personalised-aggregation kernel: per-layer mixing of clients' parameters.

Given one row-stochastic matrix per layer, ``mixing[r] [S, N]``, and every client's flat parameters
``weights [N, dim]``, the personalised model of requested client s is, layer by layer,
``theta'_s[layer r] = sum_j mixing[r, s, j] * weights_j[layer r]``. One matmul per layer (layers are
contiguous slices of the flat row), differentiable in ``mixing`` so attention parameters can learn from
the hypergradient.
"""

from __future__ import annotations

import torch

from graphfed.core.params import ParamSpec


def layer_bounds(spec: ParamSpec) -> list[tuple[int, int]]:
    """``(start, stop)`` of each layer's contiguous block in the flat parameter row."""
    return [(slices[0].start, slices[-1].stop) for _, slices in spec.layer_slices()]


def mix_layers(mixing: torch.Tensor, weights: torch.Tensor, spec: ParamSpec) -> torch.Tensor:
    """``mixing [L, S, N]`` x ``weights [N, dim]`` -> ``[S, dim]`` (layer r uses ``mixing[r]``)."""
    bounds = layer_bounds(spec)
    if mixing.shape[0] != len(bounds) or mixing.shape[2] != weights.shape[0]:
        raise ValueError(f"mixing must be [{len(bounds)} layers, S, {weights.shape[0]} clients], "
                         f"got {tuple(mixing.shape)}")
    return torch.cat([mixing[r] @ weights[:, lo:hi] for r, (lo, hi) in enumerate(bounds)], dim=1)


def weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Mean of rows ``values [S, ...]`` weighted by ``weights [S]`` (e.g. sample counts)."""
    w = weights.to(values.dtype).clamp_min(0)
    w = w / w.sum().clamp_min(1e-12)
    return torch.tensordot(w, values, dims=1)
