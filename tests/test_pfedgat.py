"""pFedGAT: row-stochastic attention, learning from validation feedback, and the scalar-only estimate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import ConfigFactory
from graphfed.client.contract import LocalTraining
from graphfed.client.evaluation import evaluate_clients
from graphfed.client.training import validation_feedback
from graphfed.core.hypergrad import hypergradient_step
from graphfed.core.rng import unit_direction
from graphfed.methods.pfedgat import PFedGAT
from graphfed.sim.engine import Simulator

SMALL = "method.options={heads: 4, head_dim: 8, server_lr: 0.01}"


def _after_rounds(make_config: ConfigFactory, rounds: int, *overrides: str) -> Simulator:
    simulator = Simulator(make_config("pfedgat", SMALL, "train.clients_per_round=12", *overrides), progress=False)
    for round_index in range(rounds):
        simulator.run_round(round_index)
    return simulator


def test_attention_is_row_stochastic(make_config: ConfigFactory) -> None:
    method: PFedGAT = _after_rounds(make_config, 2).setup.method  # type: ignore[assignment]
    attention = method.attention(torch.arange(12)).detach()
    assert attention.shape == (12, 12)
    assert torch.all(attention >= 0)
    torch.testing.assert_close(attention.sum(1), torch.ones(12))
    assert not torch.allclose(attention, torch.full_like(attention, 1 / 12))  # it attends, not averages


def test_attention_rows_in_chunks_equal_the_complete_graph(make_config: ConfigFactory,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows computed a few clients at a time (bounded memory at 10,000 clients) are the rows of the attention
    over the complete graph, for any subset of clients asked for."""
    from graphfed.methods import pfedgat

    method: PFedGAT = _after_rounds(make_config, 2).setup.method  # type: ignore[assignment]
    whole = method.attention(torch.arange(12)).detach()
    monkeypatch.setattr(pfedgat, "ATTENTION_EDGES_PER_CHUNK", 12 * 5)  # 5 rows per chunk
    some = torch.tensor([11, 0, 3, 7, 8, 2, 5])
    torch.testing.assert_close(method.attention(some).detach(), whole[some], atol=1e-6, rtol=1e-5)


def test_gat_steps_on_validation_feedback_lower_the_validation_loss(make_config: ConfigFactory) -> None:
    """Holding the client models fixed, a few GAT steps driven by the clients' validation gradients lower
    the mean validation loss of the aggregated models theta'_i."""
    simulator = _after_rounds(make_config, 3)
    method: PFedGAT = simulator.setup.method  # type: ignore[assignment]
    setup = simulator.setup
    ids = torch.arange(12)
    validation = setup.federation.val.select(ids)
    probe = LocalTraining(1, 1, 0.1, feedback="val_gradient")

    def mean_val_loss() -> float:
        weights = method.personalize(ids).detach()
        return float(evaluate_clients(setup.model, setup.spec, weights, validation, setup.federation.task).loss.mean())

    before = mean_val_loss()
    for _ in range(15):
        sent = method.personalize(ids).detach()
        gradient = validation_feedback(setup.model, setup.spec, sent, validation, setup.federation.task, probe,
                                       [0] * len(ids))
        hypergradient_step(method.optimizer, method.personalize(ids), gradient / len(ids))
    assert mean_val_loss() < before


def test_loss_only_estimate_points_along_the_true_gradient(make_config: ConfigFactory) -> None:
    """The two-point estimate from scalar losses, averaged over many seeded directions, aligns with the
    exact validation gradient (cosine > 0.7): the scalar protocol carries the right signal, noisily."""
    simulator = _after_rounds(make_config, 1, "method.options={heads: 2, head_dim: 4, feedback: loss_only}")
    method: PFedGAT = simulator.setup.method  # type: ignore[assignment]
    setup = simulator.setup
    client = torch.tensor([0])
    validation = setup.federation.val.select(client)
    sent = method.personalize(client).detach()
    exact = validation_feedback(setup.model, setup.spec, sent, validation, setup.federation.task,
                                LocalTraining(1, 1, 0.1, feedback="val_gradient"), [0])[0]
    pair = LocalTraining(1, 1, 0.1, feedback="val_loss_pair", feedback_mu=1e-3)
    seeds = list(range(3000))
    losses = validation_feedback(setup.model, setup.spec, sent.expand(len(seeds), -1),
                                 validation.select(torch.zeros(len(seeds), dtype=torch.long)),
                                 setup.federation.task, pair, seeds)
    estimate = method._validation_gradient({"feedback": losses, "feedback_seed": torch.tensor(seeds)}).mean(0)
    assert torch.nn.functional.cosine_similarity(estimate, exact, dim=0) > 0.7
    assert unit_direction(5, 10).norm().item() == pytest.approx(1.0)


def test_bytes_up_count_the_feedback(make_config: ConfigFactory) -> None:
    """Honest protocol: each update carries a model-sized gradient too; loss_only adds just two numbers."""
    gradient = _after_rounds(make_config, 1)
    loss_only = _after_rounds(make_config, 1, "method.options={heads: 2, head_dim: 4, feedback: loss_only}")
    dim = gradient.setup.spec.dim
    assert gradient.tracker.bytes_up == 12 * 2 * dim * 4
    assert loss_only.tracker.bytes_up == 12 * (dim + 2) * 4


def _grouped_toy(make_config: ConfigFactory, *options: str) -> tuple[PFedGAT, torch.Tensor, torch.Tensor]:
    """Twelve client models in two groups around opposite centres (plus a shared offset, as real models share
    most of their weights); client i's validation loss is 1/2 ||theta'_i - its group's centre||^2."""
    method: PFedGAT = _after_rounds(make_config, 1, *options).setup.method  # type: ignore[assignment]
    generator = torch.Generator().manual_seed(0)
    dim = method.client_weights.shape[1]
    shared = torch.randn(dim, generator=generator)
    centre = 0.3 * torch.randn(dim, generator=generator)
    groups = torch.arange(12) % 2
    centres = torch.where(groups.unsqueeze(1) == 0, centre, -centre) + shared
    method.client_weights = centres + 0.1 * torch.randn(12, dim, generator=generator)
    return method, groups, centres


def _train_on_toy(method: PFedGAT, centres: torch.Tensor, steps: int) -> tuple[float, float]:
    ids = torch.arange(12)

    def loss() -> float:
        with torch.no_grad():
            return float(0.5 * (method.personalize(ids) - centres).pow(2).sum(1).mean())

    before = loss()
    for _ in range(steps):
        sent = method.personalize(ids)
        hypergradient_step(method.optimizer, sent, (sent - centres).detach() / len(ids))
    return before, loss()


def test_default_attention_learns_to_weigh_same_group_clients(make_config: ConfigFactory) -> None:
    """GATv2 on centred models (the default) learns pairwise weights: same-group clients end up with most of
    each row's weight, and the validation loss drops."""
    method, groups, centres = _grouped_toy(make_config, "method.options={heads: 4, head_dim: 8}")
    before, after = _train_on_toy(method, centres, 40)
    attention = method.attention(torch.arange(12)).detach()
    same = groups.unsqueeze(0) == groups.unsqueeze(1)
    assert attention[same].view(12, 6).sum(1).min() > 0.8  # every client: > 80 % on its own group
    assert after < 0.5 * before


def test_paper_gat_layer_gives_every_client_the_same_weights(make_config: ConfigFactory) -> None:
    """The paper's layer (GAT on LayerNorm(theta_i)) has static attention: a_dst.W h_i is constant along row i
    and cancels in the softmax, so every row of R ranks the clients alike and on the same toy no client can
    prefer its own group."""
    method, groups, centres = _grouped_toy(
        make_config, "method.options={heads: 4, head_dim: 8, attention: gat, node_features: model}")
    _train_on_toy(method, centres, 40)
    attention = method.attention(torch.arange(12)).detach()
    same = groups.unsqueeze(0) == groups.unsqueeze(1)
    own_group = attention[same].view(12, 6).sum(1)
    assert own_group.max() < 0.55
    assert (attention - attention[:1]).abs().max() < 1e-4


def test_uniform_ablation_averages_the_trained_clients_and_asks_no_feedback(make_config: ConfigFactory) -> None:
    """``attention: uniform`` is pFedGAT without the GAT: each client receives the plain mean of the latest models
    of the clients that trained, and uploads only its update (no feedback, so no bytes for it)."""
    simulator = _after_rounds(make_config, 2, "method.options={attention: uniform}", "train.clients_per_round=6")
    method: PFedGAT = simulator.setup.method  # type: ignore[assignment]
    assert simulator.setup.training.feedback == "none" and not hasattr(method, "gat")
    trained = method.has_trained  # the clients sampled in the two rounds
    sent = method.personalize(torch.arange(12)).detach()
    expected = method.client_weights[trained].mean(dim=0)
    torch.testing.assert_close(sent, expected.expand(12, -1), atol=1e-6, rtol=1e-5)
    one_round = _after_rounds(make_config, 1, "method.options={attention: uniform}")
    assert one_round.tracker.bytes_up == 12 * one_round.setup.spec.dim * 4


def test_direct_ablation_learns_the_weight_matrix_itself_from_the_same_feedback(make_config: ConfigFactory) -> None:
    """``attention: direct`` is the paper's Table 4 "without GAT": R = softmax(free logits), uniform at the start, and
    the same validation feedback moves it (here: a client's rows stop being uniform and still sum to 1), with no
    GAT built."""
    start = _after_rounds(make_config, 0, "method.options={attention: direct}")
    method: PFedGAT = start.setup.method  # type: ignore[assignment]
    assert not hasattr(method, "gat") and start.setup.training.feedback == "val_gradient"
    torch.testing.assert_close(method.attention(torch.arange(12)), torch.full((12, 12), 1 / 12))
    trained = _after_rounds(make_config, 3, "method.options={attention: direct, server_lr: 1.0}")
    rows = trained.setup.method.attention(torch.arange(12)).detach()  # type: ignore[attr-defined]
    torch.testing.assert_close(rows.sum(1), torch.ones(12))
    assert (rows - 1 / 12).abs().max() > 1e-4  # learned away from uniform


def test_late_clients_are_never_sampled_before_they_join(make_config: ConfigFactory, tmp_path: Path) -> None:
    """pFedGAT Sec. 5.3: 3 of 12 clients join at round 7 of 10. Before that no round samples them; afterwards
    they train, and the summary names them and scores them at the last round."""
    config = make_config("pfedgat", SMALL, "train.late_clients=3", "train.join_round=7")
    simulator = Simulator(config, tmp_path, progress=False)
    late = simulator.late_ids
    assert len(late) == 3
    early_rounds = torch.cat([simulator.sample_clients(r) for r in range(6)])
    assert not torch.isin(early_rounds, late).any() and len(early_rounds) == 6 * 4
    later_rounds = torch.cat([simulator.sample_clients(r) for r in range(6, 60)])
    assert torch.isin(late, later_rounds).all()
    summary = simulator.run()
    names = simulator.setup.federation.client_names
    assert summary.late_clients == [names[int(i)] for i in late] and summary.join_round == 7
    assert 0.0 <= summary.late_test_final <= 1.0


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.late_clients=2", "train.join_round=1"], "late clients must join after round 1"),
    (["train.late_clients=2", "train.join_round=11"], "by the last round"),
    (["train.late_clients=12", "train.join_round=5"], "at least one must train from round 1"),
])
def test_late_clients_misconfigured_is_a_clear_error(make_config: ConfigFactory, overrides: list[str],
                                                      message: str) -> None:
    from graphfed.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        Simulator(make_config("fedavg", *overrides), progress=False)
