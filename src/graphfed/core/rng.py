"""Seeded random streams. Each (seed, round, purpose) gets its own generator, so a resumed run draws
exactly the numbers an uninterrupted one would, without saving generator state between rounds."""

from __future__ import annotations

import numpy as np
import torch

STREAMS = {"sampling": 1, "local_training": 2, "evaluation": 3, "method": 4, "init": 5, "novel": 6}


def stream_seed(seed: int, round_index: int, purpose: str) -> int:
    entropy = np.random.SeedSequence([seed, round_index + 1, STREAMS[purpose]])
    return int(entropy.generate_state(1, dtype=np.uint64)[0] >> 1)


def generator(seed: int, round_index: int, purpose: str) -> torch.Generator:
    return torch.Generator().manual_seed(stream_seed(seed, round_index, purpose))
