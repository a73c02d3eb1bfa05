"""The personalised-aggregation kernel, FedAGHN's collaboration weights, and saved collaboration graphs."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import ConfigFactory
from graphfed.cli import app
from graphfed.core.mixing import layer_bounds, mix_layers
from graphfed.core.params import ParamSpec
from graphfed.methods.fedaghn import FedAGHN
from graphfed.models.mlp import MLP
from graphfed.sim.engine import Simulator, run_config


def test_mix_layers_equals_a_naive_per_client_per_layer_loop() -> None:
    """Kernel output == sum_j W^r[i, j] * theta_j[layer r], computed client by client, tensor by tensor."""
    spec = ParamSpec.from_module(MLP(3, 2, hidden=4))
    g = torch.Generator().manual_seed(0)
    num_clients, requested = 5, torch.tensor([4, 1, 2])
    weights = torch.randn(num_clients, spec.dim, generator=g)
    mixing = torch.softmax(torch.randn(len(spec.layers), len(requested), num_clients, generator=g), dim=-1)
    fast = mix_layers(mixing, weights, spec)
    naive = torch.zeros(len(requested), spec.dim)
    for s in range(len(requested)):
        for r, specs in enumerate(spec.layers.values()):
            for tensor in specs:
                for j in range(num_clients):
                    naive[s, tensor.slice] += mixing[r, s, j] * weights[j, tensor.slice]
    torch.testing.assert_close(fast, naive, atol=1e-6, rtol=1e-6)


def test_mix_layers_rejects_a_wrong_layer_count() -> None:
    spec = ParamSpec.from_module(MLP(3, 2, hidden=4))
    with pytest.raises(ValueError, match="3 layers"):
        mix_layers(torch.ones(2, 1, 4) / 4, torch.zeros(4, spec.dim), spec)


def _fedaghn_after_rounds(make_config: ConfigFactory, rounds: int, *overrides: str) -> Simulator:
    simulator = Simulator(make_config("fedaghn", "train.clients_per_round=12", *overrides), progress=False)
    for round_index in range(rounds):
        simulator.run_round(round_index)
    return simulator


def test_fedaghn_round_zero_is_uniform(make_config: ConfigFactory) -> None:
    method = Simulator(make_config("fedaghn"), progress=False).setup.method
    mixing = method.mixing(torch.arange(12))
    torch.testing.assert_close(mixing, torch.full_like(mixing, 1 / 12))


def test_fedaghn_weights_sum_to_one_with_self_weight_p_over_one_plus_p(make_config: ConfigFactory) -> None:
    """Every client's per-layer weights sum to 1; its self weight is p/(1+p) (p >= 0: p = 0, no self weight)."""
    simulator = _fedaghn_after_rounds(make_config, 2)
    method: FedAGHN = simulator.setup.method  # type: ignore[assignment]
    with torch.no_grad():
        method.self_strength[3, 0] = 0.0  # no self weight
        method.self_strength[5, 1] = 0.25
    ids = torch.arange(12)
    mixing = method.mixing(ids).detach()
    torch.testing.assert_close(mixing.sum(-1), torch.ones(method.num_layers, 12))
    assert mixing[0, 3, 3] == 0.0
    assert mixing[1, 5, 5].item() == pytest.approx(0.25 / 1.25)
    p = method.self_strength.detach().clamp_min(0)
    torch.testing.assert_close(mixing.diagonal(dim1=1, dim2=2), (p / (1 + p)).T)


def test_fedaghn_prefers_clients_with_similar_updates(make_config: ConfigFactory) -> None:
    """With q > 0 the client whose previous update points the same way gets more weight than an opposite one."""
    simulator = _fedaghn_after_rounds(make_config, 1, "method.options={init_q: 5.0}")
    method: FedAGHN = simulator.setup.method  # type: ignore[assignment]
    method.latest_delta[1] = method.latest_delta[0]
    method.latest_delta[2] = -method.latest_delta[0]
    weights = method.mixing(torch.tensor([0])).detach()[:, 0]
    assert torch.all(weights[:, 1] > weights[:, 2])


def test_fedaghn_projects_p_after_the_step_so_a_p_at_zero_can_come_back(make_config: ConfigFactory) -> None:
    """p is kept >= 0 by projection after each step, not by a clamp in the forward pass: a clamp gives every p
    that crossed 0 a zero gradient for ever. Here every p starts at 0; a step whose hypergradient lowers it leaves
    it at exactly 0 (projected), and a delta that asks for more self weight then raises it again."""
    simulator = _fedaghn_after_rounds(make_config, 2, "method.options={server_lr: 0.5}")
    method: FedAGHN = simulator.setup.method  # type: ignore[assignment]
    ids = torch.arange(12)
    with torch.no_grad():
        method.self_strength.zero_()
    metrics = {"num_examples": torch.ones(12)}
    sent = method.personalize(ids).detach()
    away_from_own_model = method.client_weights - sent  # asks for less self weight
    method.update(ids, sent, away_from_own_model, metrics)
    assert float(method.self_strength.min()) == 0.0  # projected, never negative
    sent = method.personalize(ids).detach()
    method.update(ids, sent, sent - method.client_weights, metrics)  # asks for more self weight
    assert float(method.self_strength.max()) > 0.0  # the gradient at p = 0 was not zero


def test_fedaghn_ablation_options(make_config: ConfigFactory) -> None:
    """FedAGHN's ablation (Appendix D.1): p absent = no self weight; q absent = q fixed at 1; frozen p and q never
    move; layerwise false = one p and q per client for all layers."""
    absent = _fedaghn_after_rounds(make_config, 2, "method.options={p: absent, q: absent}").setup.method
    mixing = absent.mixing(torch.arange(12)).detach()
    assert float(mixing.diagonal(dim1=1, dim2=2).abs().max()) == 0.0
    assert torch.equal(absent.temperature.detach(), torch.ones_like(absent.temperature))
    assert not absent.learns
    frozen = _fedaghn_after_rounds(make_config, 3, "method.options={p: frozen, q: frozen, init_p: 0.2}").setup.method
    assert torch.equal(frozen.self_strength.detach(), torch.full_like(frozen.self_strength, 0.2))
    only_q = _fedaghn_after_rounds(make_config, 3, "method.options={p: frozen}").setup.method
    assert torch.equal(only_q.self_strength.detach(), torch.full_like(only_q.self_strength, 0.03))
    assert not torch.equal(only_q.temperature.detach(), torch.full_like(only_q.temperature, 0.5))
    shared = _fedaghn_after_rounds(make_config, 3, "method.options={layerwise: false}").setup.method
    assert shared.self_strength.shape == (12, 1)
    diagonal = shared.mixing(torch.arange(12)).detach().diagonal(dim1=1, dim2=2)  # [L, 12]: same p in every layer
    torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))


def test_fedaghn_client_step_scale_moves_each_clients_p_s_times_as_far(make_config: ConfigFactory) -> None:
    """p_i is client i's alone: ``step_scale: client`` gives it client i's full hypergradient step, ``mean`` (the
    default) the same step divided by the S clients of the round."""
    steps = {}
    for scale in ("mean", "client"):
        options = f"method.options={{step_scale: {scale}, init_p: 0.5, server_lr: 5.0}}"
        simulator = _fedaghn_after_rounds(make_config, 1, options)
        before = simulator.setup.method.self_strength.detach().clone()
        simulator.run_round(1)
        steps[scale] = simulator.setup.method.self_strength.detach() - before
    assert float(steps["mean"].abs().min()) > 1e-5  # well above float32 resolution at p = 0.5 (6e-8)
    torch.testing.assert_close(steps["client"], 12 * steps["mean"], rtol=1e-3, atol=1e-6)  # S = 12 per round


@pytest.mark.parametrize("sign", ["descent", "released"])
def test_fedaghn_hypergradient_sign_moves_p_as_documented(make_config: ConfigFactory, sign: str) -> None:
    """Toy check: when the client's delta says 'move towards your own old model' (delta = sent - own
    model, i.e. the loss gradient points away from it), the descent sign raises the self weight p and
    the released sign lowers it."""
    simulator = _fedaghn_after_rounds(make_config, 2, f"method.options={{hypergrad_sign: {sign}, server_lr: 0.5}}")
    method: FedAGHN = simulator.setup.method  # type: ignore[assignment]
    ids = torch.arange(12)
    sent = method.personalize(ids).detach()
    toward_own_model = sent - method.client_weights  # SGD on 0.5||theta - own||^2 gives this delta
    before = method.self_strength.detach().clone()
    metrics = {"num_examples": torch.ones(12)}
    method.update(ids, sent, toward_own_model, metrics)
    moved = (method.self_strength.detach() - before).mean()
    assert (moved > 0) if sign == "descent" else (moved < 0)


def test_collaboration_graphs_are_saved_and_plotted(make_config: ConfigFactory, tmp_path: Path) -> None:
    """A FedAGHN run saves [layers, N, N] row-stochastic graphs at every evaluation; plot-graphs draws them."""
    run_config(make_config("fedaghn", "train.rounds=10", "train.eval_every=5"), tmp_path, progress=False)
    saved = sorted((tmp_path / "graphs").glob("round_*.npz"))
    assert [p.name for p in saved] == ["round_0005.npz", "round_0010.npz"]
    with np.load(saved[-1]) as data:
        matrices, layers = data["matrices"], list(data["layers"])
    assert matrices.shape == (3, 12, 12) and len(layers) == 3
    np.testing.assert_allclose(matrices.sum(-1), 1.0, atol=1e-5)
    result = CliRunner().invoke(app, ["plot-graphs", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in ("graphs_layers.png", "graphs_over_rounds.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 1000


def test_large_federations_save_the_graph_rows_of_a_fixed_client_sample(make_config: ConfigFactory, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Above GRAPH_ROWS clients only a fixed, seeded sample of clients' rows is saved (a 10,000-client [L, N, N]
    graph would be gigabytes per evaluation): [L, R, N] rows of a row-stochastic graph, with the sample's ids;
    the same rows at every evaluation, and the graph among the sample loads back square for the plots."""
    from graphfed.runs import load_graphs
    from graphfed.sim import engine

    monkeypatch.setattr(engine, "GRAPH_ROWS", 5)
    run_config(make_config("fedaghn", "train.rounds=10", "train.eval_every=5"), tmp_path, progress=False)
    saved = sorted((tmp_path / "graphs").glob("round_*.npz"))
    clients = []
    for path in saved:
        with np.load(path, allow_pickle=False) as data:
            assert data["matrices"].shape == (3, 5, 12)
            np.testing.assert_allclose(data["matrices"].sum(-1), 1.0, atol=1e-5)
            clients.append(data["clients"].tolist())
    assert clients[0] == clients[1] == sorted(set(clients[0])) and len(clients[0]) == 5
    assert [matrices.shape for _, _, matrices in load_graphs(tmp_path)] == [(3, 5, 5), (3, 5, 5)]


def test_plot_graphs_explains_a_run_without_graphs(make_config: ConfigFactory, tmp_path: Path) -> None:
    run_config(make_config("fedavg", "train.rounds=5"), tmp_path, progress=False)
    result = CliRunner().invoke(app, ["plot-graphs", str(tmp_path)])
    assert result.exit_code == 2  # the folder given is not what the command needs: input, one line
    assert "no collaboration graphs saved" in result.output


def test_layer_bounds_are_contiguous_and_cover_the_row() -> None:
    spec = ParamSpec.from_module(MLP(3, 2, hidden=4))
    bounds = layer_bounds(spec)
    assert bounds[0][0] == 0 and bounds[-1][1] == spec.dim
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
