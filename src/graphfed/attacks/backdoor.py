"""The Blended backdoor (Chen et al. 2017, as Panacea's journal version Sec. V-D and Qin et al. 2023 run it).

An attacker blends a fixed trigger into a share of its training rows, ``x' = (1 - alpha) * x + alpha * trigger``,
and relabels them to the target class; it then trains and uploads as an honest client would. Attack success rate
(ASR) is measured on every client's test rows whose true label is not the target, triggered the same way: the
share its personalised model classifies as the target.

The trigger. Chen et al. blend either a Hello Kitty photo or a random-noise key; the photo cannot be fetched here,
so graphfed uses their other key: a fixed uniform-noise pattern drawn from the run seed, one value per input
element, mapped onto the range of the data's inputs (``lo + u * (hi - lo)``, ``u ~ U[0, 1]``). Blending is linear,
so on standardised inputs this is exactly blending the pattern in pixel space.
"""

from __future__ import annotations

import math

import torch

from graphfed.data.federation import ClientSplit


def trigger_pattern(input_shape: tuple[int, ...], low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """The fixed trigger: uniform noise of the input's shape, spanning ``[low, high]`` (the inputs' range)."""
    return low + torch.rand(math.prod(input_shape), generator=generator).view(input_shape) * (high - low)


def blend(x: torch.Tensor, trigger: torch.Tensor, alpha: float) -> torch.Tensor:
    """``(1 - alpha) * x + alpha * trigger`` for every row of ``x``."""
    return (1.0 - alpha) * x + alpha * trigger


def poison_rows(split: ClientSplit, attackers: torch.Tensor, rate: float, seeds: list[int]) -> torch.Tensor:
    """``[R]`` bool: the rows that carry the trigger, ``round(rate * count)`` of each attacker's rows (positions
    ``attackers`` in the split), each attacker's drawn from its own seed (independent of the others)."""
    rows = torch.zeros(len(split.x), dtype=torch.bool)
    for position, seed in zip(attackers.tolist(), seeds, strict=True):
        count, start = int(split.counts[position]), int(split.starts[position])
        chosen = torch.randperm(count, generator=torch.Generator().manual_seed(seed))[:math.floor(rate * count + 0.5)]
        rows[start + chosen] = True
    return rows


def triggered_split(test: ClientSplit, trigger: torch.Tensor, alpha: float, target: int) -> ClientSplit:
    """Every client's test rows whose label is not ``target``, triggered and labelled ``target``: a model's
    accuracy on this split is its attack success rate."""
    owner, rows = test.row_owners()
    kept = test.y[rows] != target
    owner, rows = owner[kept], rows[kept]
    counts = torch.bincount(owner, minlength=test.num_clients)
    x = blend(test.x[rows], trigger, alpha)
    return ClientSplit(x, torch.full((len(rows),), target, dtype=test.y.dtype), torch.cumsum(counts, 0) - counts,
                       counts)
