"""Label flipping (Panacea's conference version, Sec. 5; Fung et al. 2020): a malicious client trains on wrong
labels and uploads what that training gives, as an honest client would."""

from __future__ import annotations

import torch


def flip_map(num_classes: int, mode: str, generator: torch.Generator) -> torch.Tensor:
    """``[C]`` the label each true label becomes: ``reverse`` maps y to C-1-y; ``permutation`` is a fixed seeded
    derangement (no class keeps its label, so every flipped row is wrong)."""
    if num_classes < 2:
        raise ValueError("label flipping needs at least two classes")
    if mode == "reverse":
        return torch.arange(num_classes - 1, -1, -1)
    if mode != "permutation":
        raise ValueError(f"unknown label flip {mode!r}; allowed: reverse, permutation")
    # a random cyclic shift of a random order: a derangement drawn in one step (no rejection loop)
    order = torch.randperm(num_classes, generator=generator)
    shift = int(torch.randint(1, num_classes, (1,), generator=generator))
    mapping = torch.empty(num_classes, dtype=torch.long)
    mapping[order] = order.roll(-shift)
    return mapping


def flip_labels(y: torch.Tensor, rows: torch.Tensor, mapping: torch.Tensor) -> torch.Tensor:
    """A copy of labels ``y`` with ``rows`` (bool ``[R]``) mapped through ``mapping``; the other rows untouched."""
    return torch.where(rows, mapping[y], y)
