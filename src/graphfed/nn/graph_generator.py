"""Panacea's graph generator: reconstruct the client graph from client embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class InnerProductGraphGenerator(nn.Module):
    """``P(A_uv = 1) = sigmoid(<f(z_u), f(z_v)>)`` with ``f`` a small MLP."""

    def __init__(self, dim: int, hidden: int = 100) -> None:
        super().__init__()
        self.transform = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden))

    def reconstruction_loss(self, z: torch.Tensor, adjacency: torch.Tensor, positives: torch.Tensor,
                            generator: torch.Generator, max_pairs: int | None = None) -> torch.Tensor:
        """BCE on the edges ``positives [P, 2]`` (each once; at most ``max_pairs`` of them, sampled) and as many
        uniformly sampled non-edges (negatives, checked against ``adjacency``). Work grows with the edges sampled,
        not with N^2."""
        num_nodes = adjacency.shape[0]
        if len(positives) == 0:
            return z.sum() * 0.0
        if max_pairs is not None and len(positives) > max_pairs:
            positives = positives[torch.randperm(len(positives), generator=generator, device="cpu")[:max_pairs]
                                  .to(positives.device)]
        candidates = torch.randint(0, num_nodes, (4 * len(positives), 2), generator=generator,
                                   device="cpu").to(adjacency.device)
        keep = (candidates[:, 0] != candidates[:, 1]) & (adjacency[candidates[:, 0], candidates[:, 1]] <= 0)
        negatives = candidates[keep][: len(positives)]
        pairs = torch.cat([positives, negatives])
        labels = torch.cat([torch.ones(len(positives), device=z.device), torch.zeros(len(negatives), device=z.device)])
        z_hat = self.transform(z)
        logits = (z_hat[pairs[:, 0]] * z_hat[pairs[:, 1]]).sum(-1)
        return F.binary_cross_entropy_with_logits(logits, labels)
