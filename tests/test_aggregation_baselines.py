"""Personalised-aggregation baselines: SFL, FedAMP, H-FedAMP, CFL, pFedGraph, pFedLA."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from conftest import ConfigFactory
from graphfed.client.contract import ClientRule
from graphfed.core.hypergrad import hypergradient_step
from graphfed.methods.aggregation import PersonalizedAggregation
from graphfed.methods.cfl import CFL
from graphfed.methods.fedamp import FedAMP, HFedAMP
from graphfed.methods.pfedgraph import PFedGraph, project_to_simplex
from graphfed.methods.pfedla import PFedLA
from graphfed.methods.sfl import SFL
from graphfed.sim.engine import Simulator

FULL = "train.clients_per_round=12"
SMALL_PFEDLA = "method.options={embedding_dim: 8, hidden: 16}"
BASELINES = ["sfl", "fedamp", "h-fedamp", "cfl", "pfedgraph", "pfedla"]
N = 12


def _simulator(make_config: ConfigFactory, name: str, rounds: int, *overrides: str) -> Simulator:
    extra = [SMALL_PFEDLA] if name == "pfedla" else []
    simulator = Simulator(make_config(name, FULL, *extra, *overrides), progress=False)
    for round_index in range(rounds):
        simulator.run_round(round_index)
    return simulator


def rule_of(make_config: ConfigFactory, name: str, *overrides: str) -> ClientRule:
    """The client rule a run of ``name`` trains its clients with."""
    return Simulator(make_config(name, *overrides), progress=False).setup.client_rule


def _method(make_config: ConfigFactory, name: str, rounds: int, *overrides: str) -> PersonalizedAggregation:
    return _simulator(make_config, name, rounds, *overrides).setup.method  # type: ignore[return-value]


def _hand_models(method: PersonalizedAggregation, seed: int = 0) -> torch.Tensor:
    """Give every client a random trained model; return them ``[N, dim]``."""
    g = torch.Generator().manual_seed(seed)
    method.client_weights = torch.randn(N, method.context.spec.dim, generator=g)
    method.has_trained = torch.ones(N, dtype=torch.bool)
    return method.client_weights


# ---- every baseline ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BASELINES)
def test_mixing_is_row_stochastic_per_layer(name: str, make_config: ConfigFactory) -> None:
    """Also under partial participation (4 of 12 clients a round), where some clients never trained."""
    method = _method(make_config, name, 3, "train.clients_per_round=4")
    ids = torch.tensor([0, 3, 7, 11])
    mixing = method.mixing(ids).detach()
    assert mixing.shape == (method.num_layers, len(ids), N)
    assert torch.all(mixing >= 0)
    torch.testing.assert_close(mixing.sum(-1), torch.ones(method.num_layers, len(ids)))
    graph = method.collaboration_graph()
    assert graph.shape == (method.num_layers, N, N)


@pytest.mark.parametrize("name", BASELINES)
def test_learns_on_a_tiny_run_and_state_round_trips(name: str, make_config: ConfigFactory) -> None:
    """Mean validation accuracy rises over a few rounds; a fresh method loaded from state_dict() sends
    exactly the same weights."""
    simulator = _simulator(make_config, name, 0)
    before = simulator.evaluate(0)["val_mean"]
    for round_index in range(6):
        simulator.run_round(round_index)
    after = simulator.evaluate(5)["val_mean"]
    assert after > before + 0.1, (before, after)
    state = copy.deepcopy(simulator.setup.method.state_dict())
    restored = _simulator(make_config, name, 0).setup.method
    restored.load_state_dict(state)
    ids = torch.arange(N)
    assert torch.equal(restored.personalize(ids).detach(), simulator.setup.method.personalize(ids).detach())


# ---- SFL -----------------------------------------------------------------------------------------------


def test_sfl_equals_the_closed_form_on_a_hand_made_graph(make_config: ConfigFactory) -> None:
    """P = alpha * A_hat^L W + (1 - alpha) W with A_hat = row-normalised (A + I), on a path plus a hub
    (uneven degrees, so a symmetric normalisation would differ)."""
    base = _method(make_config, "sfl", 0)
    graph = torch.zeros(N, N)
    for i in range(N - 1):
        graph[i, i + 1] = graph[i + 1, i] = 1.0
    graph[0, 2:6] = graph[2:6, 0] = 1.0
    method = SFL(dataclasses.replace(base.context, client_graph=graph), SFL.Options(alpha=0.3, hops=2))
    weights = _hand_models(method)
    with_loops = graph + torch.eye(N)
    a_hat = with_loops / with_loops.sum(1, keepdim=True)
    expected = 0.3 * a_hat @ a_hat @ weights + 0.7 * weights
    torch.testing.assert_close(method.personalize(torch.arange(N)), expected, atol=1e-5, rtol=1e-5)


def test_sfl_ignores_untrained_clients_and_infers_a_graph_when_none_is_given(make_config: ConfigFactory) -> None:
    base = _method(make_config, "sfl", 0)
    method = SFL(dataclasses.replace(base.context, client_graph=None), SFL.Options(knn=1))
    assert method.notes and "kNN" in method.notes[0]
    torch.testing.assert_close(method.mixing(torch.arange(N))[0], torch.eye(N))  # nobody trained: P = I
    weights = _hand_models(method)
    weights[5] = weights[2] + 1e-3  # client 5's nearest neighbour is client 2
    method.has_trained[9] = False
    rows = method.mixing(torch.arange(N))[0]
    assert rows[2, 5] > 0 and rows[5, 2] > 0
    assert torch.all(rows[torch.arange(N) != 9, 9] == 0)  # nobody mixes in an untrained model


# ---- FedAMP / H-FedAMP ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fedamp", "h-fedamp"])
def test_fedamp_prefers_an_identical_model_to_an_opposite_one(name: str, make_config: ConfigFactory) -> None:
    small_sigma = "method.options={sigma: 10.0, alpha_k: 0.5}" if name == "fedamp" else "method.options={}"
    method = _method(make_config, name, 1, small_sigma)
    method.client_weights[1] = method.client_weights[0]
    method.client_weights[2] = -method.client_weights[0]
    row = method.mixing(torch.tensor([0]))[0, 0]
    assert row[1] > 2 * row[2]


def test_fedamp_weights_follow_the_attention_derivative(make_config: ConfigFactory) -> None:
    """xi_ij = alpha_k / sigma * exp(-||w_i - w_j||^2 / sigma), xi_ii = 1 - sum; prox_mu = lambda / alpha_k."""
    method: FedAMP = _method(make_config, "fedamp", 0, "method.options={alpha_k: 2.0, sigma: 50.0, lam: 0.5}")
    weights = _hand_models(method)
    row = method.mixing(torch.tensor([4]))[0, 0]
    expected = 2.0 / 50.0 * torch.exp(-(weights - weights[4]).square().sum(1) / 50.0)
    expected[4] = 0.0
    expected[4] = 1.0 - expected.sum()
    torch.testing.assert_close(row, expected)
    assert rule_of(make_config, "fedamp", "method.options={alpha_k: 2.0, sigma: 50.0, lam: 0.5}").prox_mu == 0.25


def test_h_fedamp_keeps_its_fixed_self_weight(make_config: ConfigFactory) -> None:
    method: HFedAMP = _method(make_config, "h-fedamp", 2, "method.options={self_weight: 0.2}")
    mixing = method.mixing(torch.arange(N))
    torch.testing.assert_close(mixing.diagonal(dim1=1, dim2=2), torch.full((method.num_layers, N), 0.2))
    assert rule_of(make_config, "h-fedamp").prox_mu == 1.0  # lambda / alpha_k with the defaults 1 / 1


# ---- CFL -----------------------------------------------------------------------------------------------


def _cfl_round(method: CFL, delta: torch.Tensor) -> None:
    ids = torch.arange(N)
    method.update(ids, method.personalize(ids).detach(), delta, {"num_examples": torch.ones(N)})


def _two_group_deltas(dim: int, sign_second: float, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    direction = torch.nn.functional.normalize(torch.randn(dim, generator=g), dim=0) * scale
    delta = direction.repeat(N, 1) + 0.05 * torch.randn(N, dim, generator=g)
    delta[6:] *= sign_second
    return delta


def test_cfl_splits_two_opposite_groups(make_config: ConfigFactory) -> None:
    """Mean update ~0 (< eps1) while each update is large (> eps2): the cluster splits along the groups,
    and each client then averages only over its own group."""
    method: CFL = _method(make_config, "cfl", 1, "method.options={start_round: 0}")
    _cfl_round(method, _two_group_deltas(method.context.spec.dim, -1.0))
    groups = method.cluster_of
    assert len(groups.unique()) == 2
    assert len(groups[:6].unique()) == 1 and len(groups[6:].unique()) == 1 and groups[0] != groups[6]
    rows = method.mixing(torch.arange(N))[0]
    expected = torch.zeros(N, N)
    expected[:6, :6] = expected[6:, 6:] = 1 / 6
    torch.testing.assert_close(rows, expected)


def test_cfl_assigns_members_that_did_not_report_by_their_latest_update(make_config: ConfigFactory) -> None:
    """Partial participation: 4 + 3 clients report opposite updates; each silent member joins the part its
    latest update points like, and a member that never trained joins the larger part."""
    method: CFL = _method(make_config, "cfl", 1, "method.options={start_round: 0}")
    delta = _two_group_deltas(method.context.spec.dim, -1.0)
    method.latest_delta = delta.clone()  # silent clients 4, 5 (group one) and 10, 11 (group two)
    method.has_trained[9] = False
    method.latest_delta[9] = 0.0
    reported = torch.tensor([0, 1, 2, 3, 6, 7, 8])  # ||mean|| = 2/7 < eps1
    method.update(reported, method.personalize(reported).detach(), delta[reported], {})
    groups = method.cluster_of
    assert len(groups.unique()) == 2
    assert torch.all(groups[:6] == groups[0]) and torch.all(groups[[6, 7, 8, 10, 11]] == groups[6])
    assert groups[0] != groups[6] and groups[9] == groups[0]


def test_cfl_does_not_split_when_updates_agree(make_config: ConfigFactory) -> None:
    method: CFL = _method(make_config, "cfl", 1, "method.options={start_round: 0}")
    _cfl_round(method, _two_group_deltas(method.context.spec.dim, 1.0))  # mean norm ~2 > eps1
    _cfl_round(method, _two_group_deltas(method.context.spec.dim, 1.0, scale=0.1))  # max norm < eps2
    assert torch.all(method.cluster_of == 0)
    torch.testing.assert_close(method.mixing(torch.arange(N))[0], torch.full((N, N), 1 / N))


def test_cfl_waits_for_the_start_round(make_config: ConfigFactory) -> None:
    method: CFL = _method(make_config, "cfl", 1)  # default start_round 20
    _cfl_round(method, _two_group_deltas(method.context.spec.dim, -1.0))
    assert torch.all(method.cluster_of == 0)


# ---- pFedGraph -------------------------------------------------------------------------------------


def test_pfedgraph_weights_lie_on_the_simplex_and_favour_similar_clients(make_config: ConfigFactory) -> None:
    method: PFedGraph = _method(make_config, "pfedgraph", 2)
    init = method.context.init_weights
    update = method.client_weights[0] - init
    method.client_weights[1] = init + 0.5 * update  # same direction
    method.client_weights[2] = init - update  # opposite direction
    rows = method.mixing(torch.arange(N))[0]
    assert torch.all(rows >= 0)
    torch.testing.assert_close(rows.sum(1), torch.ones(N))
    assert rows[0, 1] > rows[0, 2]
    assert rows[0, 2] == 0.0


def test_pfedgraph_projection_solves_the_official_qp(make_config: ConfigFactory) -> None:
    """Row i minimises alpha x^T x + (d - 2 alpha p)^T x on the simplex, d = -s (the official QP): the
    exact projection agrees with scipy's SLSQP."""
    method: PFedGraph = _method(make_config, "pfedgraph", 2)
    method.num_examples = torch.arange(1.0, N + 1)
    alpha = method.options.alpha
    p = (method.num_examples / method.num_examples.sum()).double().numpy()
    for client in (0, 5):
        d = -method.similarity(torch.tensor([client]))[0].double().numpy()
        result = minimize(lambda x, q=d - 2 * alpha * p: alpha * x @ x + q @ x, np.full(N, 1 / N),
                          jac=lambda x, q=d - 2 * alpha * p: 2 * alpha * x + q, method="SLSQP",
                          bounds=[(0, None)] * N, constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}],
                          options={"ftol": 1e-12, "maxiter": 500})
        ours = method.mixing(torch.tensor([client]))[0, 0].double().numpy()
        np.testing.assert_allclose(ours, result.x, atol=1e-5)


def test_simplex_projection_respects_the_allowed_entries() -> None:
    values = torch.tensor([[0.2, 3.0, -1.0, 0.5], [0.1, 0.1, 0.1, 0.1]])
    allowed = torch.tensor([[True, False, True, True], [True, True, True, True]])
    projected = project_to_simplex(values, allowed)
    torch.testing.assert_close(projected, torch.tensor([[0.35, 0.0, 0.0, 0.65], [0.25, 0.25, 0.25, 0.25]],
                                                       dtype=torch.float64))


# ---- pFedLA --------------------------------------------------------------------------------------------


def test_pfedla_hypernetworks_move_and_the_released_sign_moves_them_back(make_config: ConfigFactory) -> None:
    """One update changes the round's clients' hypernetworks (and only theirs); the released sign applies
    exactly the opposite step."""
    method: PFedLA = _method(make_config, "pfedla", 2, "method.options={embedding_dim: 8, hidden: 16}")
    ids = torch.tensor([1, 4, 6])
    sent = method.personalize(ids).detach()
    delta = sent - method.client_weights[ids]  # pulls each client towards its own old model
    metrics = {"num_examples": torch.ones(3)}
    state = copy.deepcopy(method.state_dict())
    before = [p.detach().clone() for p in method.hypernets.parameters()]

    def step(sign: str) -> list[torch.Tensor]:
        method.load_state_dict(copy.deepcopy(state))
        method.options = method.options.model_copy(update={"hypergrad_sign": sign})
        method.update(ids, sent, delta, metrics)
        return [p.detach() - b for p, b in zip(method.hypernets.parameters(), before, strict=True)]

    descent, released = step("descent"), step("released")
    assert any(change.abs().max() > 0 for change in descent)
    others = torch.ones(N, dtype=torch.bool)
    others[ids] = False
    for d, r in zip(descent, released, strict=True):
        torch.testing.assert_close(d, -r)
        assert torch.all(d[others] == 0)


def test_pfedla_descent_raises_the_self_weight_when_the_client_wants_its_own_model(
        make_config: ConfigFactory) -> None:
    """Toy check of the sign: each client's delta says 'move towards your own model' (the gradient of
    0.5 ||theta - own||^2), so descending the hypergradient raises every client's self weight."""
    method: PFedLA = _method(make_config, "pfedla", 0, "method.options={embedding_dim: 8, hidden: 16, server_lr: 0.05}")
    ids = torch.arange(N)
    own = _hand_models(method)
    before = method.mixing(ids).detach().diagonal(dim1=1, dim2=2).mean()
    for _ in range(5):
        sent = method.personalize(ids).detach()
        hypergradient_step(method.optimizer, method.personalize(ids), sent - own)
    after = method.mixing(ids).detach().diagonal(dim1=1, dim2=2).mean()
    assert after > 3 * before, (before, after)
