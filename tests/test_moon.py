"""MOON's model-contrastive term: the formula by hand on a toy batch, and what it does to training."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import ConfigFactory, without_wall_time
from graphfed.methods.moon import contrastive_term
from graphfed.sim.engine import Simulator


def test_the_contrastive_term_equals_a_hand_computation() -> None:
    z = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # one client, two rows, 2-d representations
    z_global = torch.tensor([[[1.0, 1.0], [0.0, 1.0]]])
    z_previous = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    tau = 0.5

    def cos(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True)) / (math.hypot(*a) * math.hypot(*b))

    by_hand = []
    for row in range(2):
        p = cos(z[0, row].tolist(), z_global[0, row].tolist()) / tau
        n = cos(z[0, row].tolist(), z_previous[0, row].tolist()) / tau
        by_hand.append(-math.log(math.exp(p) / (math.exp(p) + math.exp(n))))
    # row 0: cos 1/sqrt(2) to the global, 0 to the previous; row 1: 1 to the global, 0 to the previous
    assert contrastive_term(z, z_global, z_previous, tau).item() == pytest.approx(sum(by_hand) / 2, rel=1e-6)


def test_mu_zero_is_fedavg_exactly_and_a_positive_mu_changes_training(
        make_config: ConfigFactory) -> None:
    fedavg = Simulator(make_config("fedavg"), progress=False).run()
    plain = Simulator(make_config("moon", "method.options={mu: 0.0}"), progress=False).run()
    drop = ("method", "method_options", "code")
    assert ({k: v for k, v in without_wall_time(plain).items() if k not in drop}
            == {k: v for k, v in without_wall_time(fedavg).items() if k not in drop})
    contrastive = Simulator(make_config("moon", "method.options={mu: 5.0}"), progress=False).run()
    assert contrastive.status == "completed" and contrastive.test_mean != fedavg.test_mean


def test_the_temperature_reaches_training(make_config: ConfigFactory) -> None:
    """The contrastive softmax's temperature is the one configured: two temperatures, two trainings."""
    sharp = Simulator(make_config("moon", "method.options={mu: 5.0, temperature: 0.1}"), progress=False).run()
    soft = Simulator(make_config("moon", "method.options={mu: 5.0, temperature: 2.0}"), progress=False).run()
    assert (sharp.test_mean, sharp.val_mean) != (soft.test_mean, soft.val_mean)
