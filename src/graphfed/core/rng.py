"""Seeded random streams. Each (seed, round, purpose) gets its own generator, so a resumed run draws
exactly the numbers an uninterrupted one would, without saving generator state between rounds."""

from __future__ import annotations

import numpy as np
import torch

STREAMS = {"sampling": 1, "local_training": 2, "evaluation": 3, "method": 4, "init": 5, "novel": 6, "feedback": 7,
           "graph_rows": 8, "architecture": 9, "attack": 10,
           "tuning": 11, "late_clients": 12, "dropout": 13, "stragglers": 14, "privacy": 15, "clip_quantile": 16,
           "server_gradient": 17, "novel_privacy": 18, "clock_speeds": 19, "clock_phases": 20, "dispatch": 21}


def stream_seed(seed: int, round_index: int, purpose: str, client: int | None = None) -> int:
    """A 63-bit seed for one (run seed, round, purpose[, client]) stream."""
    key = [seed, round_index + 1, STREAMS[purpose]]
    if client is not None:
        key.append(client + 1)
    entropy = np.random.SeedSequence(key)
    return int(entropy.generate_state(1, dtype=np.uint64)[0]) >> 1  # a Python int: numpy 1.x casts no uint64 >> int


def client_seeds(seed: int, round_index: int, purpose: str, client_ids: torch.Tensor) -> list[int]:
    """One stream per client, so a client draws the same numbers whether it trains alone or in a batch."""
    return [stream_seed(seed, round_index, purpose, int(c)) for c in client_ids]


def unit_direction(seed: int, dim: int) -> torch.Tensor:
    """A random unit vector in ``R^dim`` from ``seed``: client and server draw the same one from the seed."""
    direction = torch.randn(dim, generator=torch.Generator().manual_seed(int(seed)), device="cpu")
    return direction / direction.norm().clamp_min(1e-12)


def generator(seed: int, round_index: int, purpose: str) -> torch.Generator:
    return torch.Generator().manual_seed(stream_seed(seed, round_index, purpose))
