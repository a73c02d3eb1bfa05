"""APFL's learned mixing weight: alpha grows on a client whose data differ from everyone else's."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from conftest import ConfigFactory, registered_dataset
from graphfed.data import federation_from_clients
from graphfed.sim.engine import Simulator

CLIENTS = 8


def shared_rule_and_one_outlier(cfg, streams):  # type: ignore[no-untyped-def]
    """8 clients label x by the same rule (x0 + x1 > 0); client 0 by its reverse: the global model fits it worst."""
    rng = streams.generate
    xs = [rng.normal(size=(150, 2)).astype(np.float32) for _ in range(CLIENTS)]
    ys = [((x.sum(1) > 0) != (i == 0)).astype(np.int64) for i, x in enumerate(xs)]
    return federation_from_clients("outlier", xs, ys, cfg, streams, task="classification", output_dim=2)


@pytest.fixture(autouse=True, scope="module")
def _registered() -> Iterator[None]:
    with registered_dataset("one-outlier", shared_rule_and_one_outlier, "classification"):
        yield


def test_alpha_moves_towards_the_personal_model_on_a_client_unlike_the_others(make_config: ConfigFactory) -> None:
    """After training, the outlier's alpha has grown past its start and past every other client's (theirs fall:
    the global model serves them)."""
    config = make_config("apfl", "dataset.name=one-outlier", "dataset.num_clients=null", "dataset.novel_fraction=0",
                         "method.options={alpha: 0.5, alpha_lr: 0.02}", "train.rounds=20",
                         f"train.clients_per_round={CLIENTS}", "train.eval_every=20")
    simulator = Simulator(config, progress=False)
    result = simulator.run()
    assert result.status == "completed"
    alphas = simulator.executor.store.get(torch.arange(CLIENTS))["alpha"].squeeze(1)
    assert alphas[0] > 0.5 and alphas[0] > alphas[1:].max() and alphas[1:].median() < 0.5, alphas.tolist()


def test_apfl_evaluates_the_mixture_of_its_personal_and_the_received_model(make_config: ConfigFactory) -> None:
    simulator = Simulator(make_config("apfl", "dataset.novel_fraction=0", "train.clients_per_round=12"),
                          progress=False)
    simulator.run()
    ids = torch.arange(12)
    received = simulator.setup.method.eval_weights(ids)
    state = simulator.executor.store.get(ids)
    expected = state["alpha"] * state["personal"] + (1 - state["alpha"]) * received
    assert torch.allclose(simulator.executor.evaluation_weights(ids, received, 0), expected)
