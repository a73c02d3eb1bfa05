"""SCAFFOLD and FedDyn on heterogeneous quadratic clients: their fixed point is the global optimum, where
FedAvg's drifts away (many local steps pull each client towards its own optimum).

Each client holds a linear-regression problem with its own true weights; the global optimum of the sum of the
clients' squared errors is the pooled least-squares solution, computed here in closed form. A linear model (one
layer) trains with every client in every round; the distance of the final global weights to the optimum is
measured for each method.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from conftest import registered_dataset
from graphfed.config import load_config
from graphfed.data import federation_from_clients
from graphfed.setup import build_setup
from graphfed.sim.engine import Simulator

CLIENTS = 6


def quadratic_clients(cfg, streams):  # type: ignore[no-untyped-def]
    """Client i: y = w_i . x + b_i, w_i and b_i far apart between clients (no noise), 200 rows."""
    rng = np.random.default_rng(11)  # the same problems under every seed: only training draws differ
    xs, ys = [], []
    for i in range(CLIENTS):
        w, b = rng.normal(scale=2.0, size=3), 3.0 * (i - CLIENTS / 2)
        x = rng.normal(size=(200, 3)).astype(np.float32) * (1 + i / 2)  # different curvatures too
        xs.append(x)
        ys.append((x @ w + b).astype(np.float32)[:, None])
    return federation_from_clients("quadratic", xs, ys, cfg, streams, task="regression", output_dim=1)


@pytest.fixture(autouse=True, scope="module")
def _registered() -> Iterator[None]:
    with registered_dataset("quadratic-clients", quadratic_clients, "regression"):
        yield


def global_optimum(simulator: Simulator) -> torch.Tensor:
    """Least squares over every client's training rows pooled (equal weight per row): the minimiser of the sum of
    the clients' losses, as [weight (3), bias]."""
    train = simulator.setup.federation.train
    x = torch.cat([train.client(i)[0] for i in range(CLIENTS)]).double()
    y = torch.cat([train.client(i)[1] for i in range(CLIENTS)]).double().reshape(-1)
    design = torch.cat([x, torch.ones(len(x), 1, dtype=torch.float64)], dim=1)
    return torch.linalg.lstsq(design, y.unsqueeze(1)).solution.squeeze(1)


def distance_to_optimum(method: str, *options: str) -> float:
    config = load_config(None, ["dataset.name=quadratic-clients", "dataset.novel_fraction=0", "dataset.split=[0.8, "
                                "0.1, 0.1]", "model.name=mlp", "model.options={num_layers: 1}", f"method.name={method}",
                                *options, "train.rounds=150", f"train.clients_per_round={CLIENTS}",
                                "train.local_steps=20", "train.batch_size=512", "train.lr=0.01", "train.eval_every=150",
                                "train.autotune=false", "seed=0"])
    simulator = Simulator(config, progress=False)
    simulator.run()
    weights = simulator.setup.method.global_weights.double()  # [w (3), b] in the one linear layer's order
    return float(torch.linalg.vector_norm(weights - global_optimum(simulator)))


def test_scaffold_and_feddyn_reach_the_global_optimum_where_fedavg_drifts() -> None:
    fedavg = distance_to_optimum("fedavg")
    scaffold = distance_to_optimum("scaffold")
    scaffold_option_one = distance_to_optimum("scaffold", "method.options={control_update: I}")
    feddyn = distance_to_optimum("feddyn", "method.options={alpha: 1.0}")
    assert fedavg > 0.3  # client drift: FedAvg's fixed point is not the global optimum
    assert scaffold < 0.2 * fedavg and scaffold_option_one < 0.2 * fedavg and feddyn < 0.2 * fedavg, (
        fedavg, scaffold, scaffold_option_one, feddyn)


def test_scaffolds_controls_travel_and_are_counted() -> None:
    config = load_config(None, ["dataset.name=quadratic-clients", "dataset.novel_fraction=0", "method.name=scaffold",
                                "model.name=mlp", "model.options={num_layers: 1}", "train.rounds=3",
                                f"train.clients_per_round={CLIENTS}", "train.eval_every=3"])
    result = Simulator(config, progress=False).run()
    dim = build_setup(config).spec.dim
    # each way: the model and its control variate (down: the server's c; up: the client's Delta c)
    assert result.bytes_down == result.bytes_up == 3 * CLIENTS * 2 * dim * 4


@pytest.mark.parametrize("option", ["II", "I"])
def test_scaffold_option_ii_is_the_papers_control_update(option: str) -> None:
    """c_i+ from the rule equals the paper's formula on one client after one round."""
    config = load_config(None, ["dataset.name=quadratic-clients", "dataset.novel_fraction=0", "method.name=scaffold",
                                f"method.options={{control_update: {option}}}", "model.name=mlp",
                                "model.options={num_layers: 1}", "train.rounds=1", "train.local_steps=5",
                                "train.lr=0.01", f"train.clients_per_round={CLIENTS}", "train.eval_every=1"])
    simulator = Simulator(config, progress=False)
    sent = simulator.setup.method.global_weights.clone()
    simulator.run()
    store = simulator.executor.store
    controls = store.get(torch.arange(CLIENTS))["control"]
    trained_delta = None
    if option == "II":  # c_i+ = c_i - c + (x - y)/(K lr) with c_i = c = 0 in round 1: the mean step direction
        # the server moved by the mean delta: x1 = x0 - mean(delta) (server_lr 1); so mean(c_i+) = mean(delta)/(K lr)
        trained_delta = sent - simulator.setup.method.global_weights
        assert torch.allclose(controls.mean(0), trained_delta / (5 * 0.01), atol=1e-4)
    else:  # c_i+ = g_i(x): a gradient at the sent model, nonzero and different per client
        assert controls.abs().sum() > 0 and not torch.allclose(controls[0], controls[1])
