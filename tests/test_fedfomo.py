"""FedFomo: downloaded models are weighted by the validation-loss improvement they give, never by one that hurts."""

from __future__ import annotations

import torch

from conftest import ConfigFactory
from graphfed.methods.fedfomo import FedFomoRule
from graphfed.setup import build_setup
from graphfed.sim.engine import Simulator


def test_a_model_that_raises_the_validation_loss_gets_zero_weight(make_config: ConfigFactory) -> None:
    setting = build_setup(make_config("fedfomo")).client_rule.setting
    rule = FedFomoRule(setting, models=3)
    own = torch.zeros(1, 4)
    bank = torch.tensor([[[2.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 3.0, 0]]])  # distances 2, 1, 3 from own
    losses = torch.tensor([[1.0, 0.5, 1.5, 0.4]])  # own 1.0; model 0 gains 0.5, model 1 loses 0.5, model 2 gains 0.6

    fused, uploads = rule.fuse(own, {"bank": bank, "bank_ids": torch.tensor([[4.0, 7.0, 9.0]])},
                               lambda weights: losses)
    raw = torch.tensor([0.5 / 2, 0.0, 0.6 / 3])
    expected = raw / raw.sum()
    assert torch.allclose(uploads["fomo_weights"], expected.unsqueeze(0))
    assert uploads["fomo_weights"][0, 1] == 0  # the model that raised the loss
    assert torch.allclose(fused, (expected.unsqueeze(1) * bank[0]).sum(0, keepdim=True))
    none_helps, _ = rule.fuse(own, {"bank": bank, "bank_ids": torch.zeros(1, 3)},
                              lambda weights: torch.tensor([[0.1, 0.5, 0.6, 0.7]]))
    assert torch.equal(none_helps, own)  # every model hurts: the client starts from its own


def test_fedfomo_trains_and_learns_affinities_from_the_weights_clients_send(make_config: ConfigFactory) -> None:
    simulator = Simulator(make_config("fedfomo", "dataset.novel_fraction=0", "train.clients_per_round=12",
                                      "method.options={models: 3}"), progress=False)
    result = simulator.run()
    assert result.status == "completed" and result.test_mean > result.trivial_test_mean
    affinity = simulator.setup.method.affinity
    assert affinity.sum() > 0 and torch.all(affinity.diagonal() == 0)  # clients weight others, never themselves
    dim = simulator.setup.spec.dim
    rounds, clients = result.rounds, simulator.clients_per_round
    assert result.bytes_down == rounds * clients * (1 + 3) * dim * 4 + rounds * clients * 3 * 4  # own + 3 + ids
