"""Update poisoning: a malicious client trains honestly and uploads a forged update (``delta = sent - trained``,
so ``-delta`` is the client's step, the "gradient" g of Fang et al. 2020 up to the learning rate).

- ``model_poisoning`` (Panacea journal Sec. V-D, after Fang et al.'s local model poisoning): g' = -lambda * g;
- ``sign_flip``: g' = -g, the Byzantine literature's sign-flipping client;
- ``scaling``: g' = scale * g, an update boosted to dominate the average (Bagdasaryan et al. 2020);
- ``gaussian_noise``: g' ~ N(0, sigma^2 I), a client that sends noise; each (round, client) draws its own
  seeded noise, so the simulator and a Flower node send the same vector.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def forge_updates(kind: str, delta: torch.Tensor, seeds: Sequence[int], poison_lambda: float = 0.5,
                  scale: float = 10.0, noise_std: float = 0.1) -> torch.Tensor:
    """The updates ``[M, dim]`` that malicious clients upload in place of their honest ``delta [M, dim]``;
    ``seeds``: one noise stream per client."""
    if kind == "model_poisoning":
        return -poison_lambda * delta
    if kind == "sign_flip":
        return -delta
    if kind == "scaling":
        return scale * delta
    if kind == "gaussian_noise":
        noise = [torch.randn(delta.shape[1], generator=torch.Generator().manual_seed(int(seed)), device="cpu")
                 .to(delta.device) for seed in seeds]
        return noise_std * torch.stack(noise) if noise else torch.zeros_like(delta)
    raise ValueError(f"not an update attack: {kind!r}")
