"""Client-level differential privacy (``privacy:``): the epsilon a run reports is the accounting library's own, a
target epsilon is met, every upload that leaves a client (or enters the server's sum) is clipped, the noise has the
stated size, a mechanism without noise or clipping is the plain run, and what cannot be privatised is refused."""

from __future__ import annotations

import math
from pathlib import Path

import dp_accounting
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from flwr.app import Message, RecordDict
from typer.testing import CliRunner

from conftest import ConfigFactory, tiny_overrides, without_wall_time
from graphfed import cli
from graphfed.client.privacy import (
    PrivacyPlan,
    ServerGradientPrivacy,
    clip_rows,
    epsilon,
    noised_mean,
    privatize_uploads,
)
from graphfed.config import PrivacyConfig
from graphfed.flower.app import run_on_grid
from graphfed.flower.server import FLOWER_FIELDS
from graphfed.sim.engine import Simulator, run_config
from test_flower import flower_config, grid_for


def private(make_config: ConfigFactory, mechanism: str, *overrides: str, method: str = "fedavg"):  # type: ignore[no-untyped-def]
    return make_config(method, f"privacy.mechanism={mechanism}", *overrides)


def library_epsilon(noise: float, rounds: int, rate: float | None, delta: float, kind: str = "pld") -> float:
    gaussian = dp_accounting.GaussianDpEvent(noise)
    step = gaussian if rate is None else dp_accounting.PoissonSampledDpEvent(rate, gaussian)
    accountant = (pld_privacy_accountant.PLDAccountant() if kind == "pld" else rdp_privacy_accountant.RdpAccountant())
    accountant.compose(dp_accounting.SelfComposedDpEvent(step, rounds))
    return float(accountant.get_epsilon(delta))


# ---- accounting --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["pld", "rdp"])
def test_a_central_runs_epsilon_is_the_librarys_for_its_sampling_noise_and_rounds(make_config: ConfigFactory,
                                                                                 kind: str) -> None:
    config = private(make_config, "central", "privacy.noise_multiplier=1.1", f"privacy.accountant={kind}",
                     "train.rounds=12", "train.eval_every=6")
    result = Simulator(config, progress=False).run()
    record = result.privacy or {}
    train_clients = result.training_clients or 0
    rate = config.train.clients_per_round / train_clients
    assert record["delta"] == pytest.approx(0.1 / train_clients)  # the stated default, below 1 / clients
    assert record["sampling"] == f"poisson, q = {rate:.6g} per client and round"
    assert record["epsilon"] == library_epsilon(1.1, 12, rate, record["delta"], kind)


def test_a_local_runs_epsilon_per_client_composes_the_rounds_that_client_uploaded_in(
        make_config: ConfigFactory) -> None:
    config = private(make_config, "local", "privacy.noise_multiplier=2.0", "privacy.delta=1e-5", "train.rounds=10")
    result = Simulator(config, progress=False).run()
    per_client = (result.privacy or {})["per_client_epsilon"]
    sampled = [Simulator(config, progress=False).sample_clients(r).tolist() for r in range(10)]
    names = list(result.per_client or {})
    for name, value in per_client.items():
        rounds = sum(names.index(name) in ids for ids in sampled)
        assert value == (library_epsilon(2.0, rounds, None, 1e-5) if rounds else 0.0), name
    assert result.privacy["epsilon_max"] == max(per_client.values())


@pytest.mark.parametrize(("noise", "rounds", "rate", "delta"), [(0.8, 50, 0.05, 1e-5), (1.5, 200, 0.2, 1e-6),
                                                                 (3.0, 10, None, 1e-5), (1.0, 100, 0.01, 1e-3)])
def test_pld_is_never_looser_than_rdp(noise: float, rounds: int, rate: float | None, delta: float) -> None:
    assert epsilon("pld", noise, rounds, rate, delta) <= epsilon("rdp", noise, rounds, rate, delta)


@pytest.mark.parametrize(("mechanism", "target"), [("central", 2.0), ("local", 4.0)])
def test_a_target_epsilon_is_met_within_one_percent(make_config: ConfigFactory, mechanism: str,
                                                    target: float) -> None:
    config = private(make_config, mechanism, f"privacy.target_epsilon={target}", "train.rounds=10",
                     "train.eval_every=10")
    simulator = Simulator(config, progress=False)
    plan = simulator.privacy
    planned = plan.epsilon_of_rounds(config.train.rounds)  # local: a client in every round, the worst case
    assert planned <= target * (1 + 1e-9)
    assert planned == pytest.approx(target, rel=0.01)


# ---- the mechanisms ------------------------------------------------------------------------------------------------
def plan(mechanism: str, clip: float, noise: float) -> PrivacyPlan:
    return PrivacyPlan(mechanism, clip, noise, 1e-5, "pld", 10, 0.5 if mechanism == "central" else None)


def test_clipping_bounds_every_row_and_leaves_small_rows_alone() -> None:
    delta = torch.randn(50, 300, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 50)[:, None]
    clipped = clip_rows(delta, 1.0)
    norms = torch.linalg.vector_norm(clipped, dim=1)
    assert (norms <= 1.0 + 1e-6).all()
    small = torch.linalg.vector_norm(delta, dim=1) <= 1.0
    assert torch.equal(clipped[small], delta[small]) and small.any() and (~small).any()
    assert torch.equal(clip_rows(delta, math.inf), delta)


def test_the_noise_has_the_stated_standard_deviation() -> None:
    """Many draws: local noise per value is N(0, (noise_multiplier * clip)^2); central noise on the sum, divided by
    the expected cohort."""
    zeros = torch.zeros(4, 50_000)
    local = privatize_uploads(zeros, plan("local", 2.0, 1.5), 0, 3, torch.arange(4))
    assert local.std().item() == pytest.approx(3.0, rel=0.01) and abs(local.mean().item()) < 0.02
    assert not torch.equal(local[0], local[1])  # one stream per client
    central = noised_mean(zeros, plan("central", 2.0, 1.5), 5.0, 0, 3)
    assert central.std().item() == pytest.approx(3.0 / 5.0, rel=0.01)


def test_every_update_a_local_client_uploads_is_clipped(make_config: ConfigFactory) -> None:
    from graphfed.methods.fedavg import FedAvg

    norms: list[float] = []
    update = FedAvg.update

    def recording(self: FedAvg, client_ids, sent, delta, metrics) -> None:  # type: ignore[no-untyped-def]
        norms.extend(torch.linalg.vector_norm(delta, dim=1).tolist())
        update(self, client_ids, sent, delta, metrics)

    config = private(make_config, "local", "privacy.noise_multiplier=0", "privacy.clip_norm=0.05")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FedAvg, "update", recording)
        Simulator(config, progress=False).run()
    assert len(norms) == config.train.rounds * config.train.clients_per_round
    assert max(norms) <= 0.05 * (1 + 1e-5) and max(norms) > 0.049  # raw updates are larger: all were clipped


def test_a_central_server_hands_the_method_only_the_noised_mean(make_config: ConfigFactory) -> None:
    from graphfed.methods.fedavg import FedAvg

    seen: list[torch.Tensor] = []
    update = FedAvg.update

    def recording(self: FedAvg, client_ids, sent, delta, metrics) -> None:  # type: ignore[no-untyped-def]
        seen.append(delta.clone())
        assert torch.equal(metrics["num_examples"], torch.ones_like(metrics["num_examples"]))
        update(self, client_ids, sent, delta, metrics)

    config = private(make_config, "central", "privacy.noise_multiplier=0.7", "privacy.clip_norm=0.5")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FedAvg, "update", recording)
        Simulator(config, progress=False).run()
    assert seen and all(torch.equal(rows, rows[:1].expand_as(rows)) for rows in seen)


# ---- central DP for hypernetworks: DP-SGD on the server's parameters ------------------------------------------------
def _linear_server(rows: int, width: int, seed: int = 0) -> tuple[torch.nn.Linear, torch.Tensor]:
    torch.manual_seed(seed)
    return torch.nn.Linear(width, 6, bias=False), torch.randn(rows, width)


def test_the_server_gradient_is_the_sum_of_each_clients_clipped_contribution() -> None:
    """Noise 0: the gradient the optimiser steps on is sum_i clip(S * J_i^T d_i) / expected clients, with each
    client's contribution (the vector-Jacobian product of its own row) clipped alone."""
    layer, embeddings = _linear_server(rows=3, width=4)
    direction = torch.randn(3, 6) * torch.tensor([[0.01], [10.0], [3.0]])  # one client far inside the clip
    clip, expected = 1.0, 5.0
    privacy = ServerGradientPrivacy(PrivacyPlan("central", clip, 0.0, 1e-5, "pld", 10, 0.5), expected, seed=0)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.0)
    privacy.step(optimizer, layer(embeddings), direction)
    contributions = [3 * torch.outer(direction[i], embeddings[i]) for i in range(3)]  # d <d_i, W e_i> / dW
    clipped = [c * min(1.0, clip / float(c.norm())) for c in contributions]
    torch.testing.assert_close(layer.weight.grad, sum(clipped) / expected)
    assert float(clipped[0].norm()) < clip and all(float(c.norm()) == pytest.approx(clip) for c in clipped[1:])


def test_the_server_gradient_noise_has_the_stated_std_split_over_the_rounds_steps() -> None:
    """With nothing to learn, the gradient is the noise / expected clients: std z * clip * sqrt(k) / expected, k the
    server steps of a round (k Gaussian steps of multiplier z sqrt(k) on one sample compose to multiplier z)."""
    layer, embeddings = _linear_server(rows=2, width=4000)
    plan = PrivacyPlan("central", 2.0, 1.5, 1e-5, "pld", 10, 0.5)
    privacy = ServerGradientPrivacy(plan, expected_clients=4.0, seed=3, steps_per_round=4)
    privacy.begin_round(0)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.0)
    privacy.step(optimizer, layer(embeddings), torch.zeros(2, 6))
    first = layer.weight.grad.clone()
    assert first.std().item() == pytest.approx(1.5 * 2.0 * 2.0 / 4.0, rel=0.02)
    privacy.step(optimizer, layer(embeddings), torch.zeros(2, 6))
    assert not torch.equal(layer.weight.grad, first)  # each step of the round draws its own noise


@pytest.mark.parametrize("method", ["pfedhn", "panacea"])
def test_central_dp_trains_hypernetworks_by_private_server_gradients(method: str, make_config: ConfigFactory) -> None:
    """pFedHN and Panacea (on FL-N, whose graph is given) run under central DP: their server steps go through
    ServerGradientPrivacy (each client's contribution within the clip), the accounting is one sampled Gaussian per
    round whatever the server steps, and with noise 0, no clip and every client each round the run learns what the
    plain run learns (the same numbers up to the float order of a per-client sum)."""
    seen: list[float] = []
    step = ServerGradientPrivacy.step

    def recording(self, optimizer, sent, direction, extra_loss=None) -> None:  # type: ignore[no-untyped-def]
        seen.append(self.plan.clip_norm)
        step(self, optimizer, sent, direction, extra_loss)

    config = private(make_config, "central", "privacy.noise_multiplier=1.1", "privacy.clip_norm=0.5", method=method)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ServerGradientPrivacy, "step", recording)
        result = run_config(config, progress=False)
    assert seen and result.privacy is not None
    rate = config.train.clients_per_round / (result.training_clients or 0)
    assert result.privacy["epsilon"] == library_epsilon(1.1, config.train.rounds, rate, result.privacy["delta"])
    everyone = ["privacy.noise_multiplier=0", "privacy.clip_norm=.inf", "train.clients_per_round=100",
                "dataset.novel_fraction=0"]
    plain = run_config(make_config(method, *everyone[2:]), progress=False)
    degenerate = run_config(private(make_config, "central", *everyone, method=method), progress=False)
    assert degenerate.test_mean == pytest.approx(plain.test_mean, abs=1e-4)


def test_noise_zero_and_no_clipping_is_the_plain_run(make_config: ConfigFactory) -> None:
    """``local`` with noise 0 and clip .inf changes nothing: the same numbers as the run without privacy."""
    plain = run_config(make_config("ditto"), progress=False)
    degenerate = run_config(private(make_config, "local", "privacy.noise_multiplier=0", "privacy.clip_norm=.inf",
                                    method="ditto"), progress=False)
    assert {k: v for k, v in without_wall_time(degenerate).items() if k != "privacy"} == without_wall_time(plain)
    assert degenerate.privacy["epsilon_max"] == math.inf


def test_privacy_needs_exactly_one_noise_source() -> None:
    with pytest.raises(ValueError, match=r"give exactly one of privacy\.noise_multiplier and privacy\.target_epsilon"):
        PrivacyConfig(mechanism="local")
    with pytest.raises(ValueError, match="give exactly one"):
        PrivacyConfig(mechanism="central", noise_multiplier=1.0, target_epsilon=2.0)


# ---- refusals ------------------------------------------------------------------------------------------------------
REFUSED = {
    "pfedgat local": ("pfedgat", ["privacy.mechanism=local"],
                      "privacy.mechanism=local: pfedgat uploads feedback beside its update"),
    "fedpac local": ("fedpac", ["privacy.mechanism=local"], "privacy.mechanism=local: fedpac uploads "),
    "fedaghn central": ("fedaghn", ["privacy.mechanism=central"],
                        "privacy.mechanism=central: fedaghn: its server computes each client's model from the "
                        "individual uploads"),
    "panacea central, inferred graph": ("panacea", ["privacy.mechanism=central", "dataset.name=digits"],
                                        "privacy.mechanism=central: panacea: without a client graph it infers one "
                                        "from the clients' raw updates"),
    "pfedhn central, adaptive clip": ("pfedhn", ["privacy.mechanism=central", "privacy.adaptive_quantile=0.5"],
                                      "privacy.mechanism=central: pfedhn: adaptive clipping follows the norms of "
                                      "updates"),
    "median central": ("fedavg", ["privacy.mechanism=central", "method.options.aggregation=fedmedian"],
                       "privacy.mechanism=central: fedavg: aggregation fedmedian needs the individual updates"),
    "no noise given": ("fedavg", ["privacy.mechanism=local"], "give exactly one of privacy.noise_multiplier"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_cannot_be_privatised_exits_2_with_one_line(case: str, tmp_path: Path) -> None:
    method, overrides, message = REFUSED[case]
    noise = [] if case == "no noise given" else ["privacy.noise_multiplier=1.0"]
    args = [a for o in [*tiny_overrides(method), *overrides, *noise] for a in ("--set", o)]
    result = CliRunner().invoke(cli.app, ["run", "demo", *args, "--out", str(tmp_path / "out"), "--no-progress"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "out").exists()


# ---- on Flower -----------------------------------------------------------------------------------------------------
def test_a_supernode_sends_only_clipped_updates_under_local_dp() -> None:
    config = flower_config("fedavg", "privacy.mechanism=local", "privacy.noise_multiplier=0",
                           "privacy.clip_norm=0.01")
    grid = grid_for(config)
    sent_norms: list[float] = []

    def reading(content: RecordDict, message: Message) -> RecordDict:
        if message.metadata.message_type == "train":
            sent_norms.append(float(torch.linalg.vector_norm(torch.from_numpy(
                content["delta"].to_numpy_ndarrays()[0]))))
        return content

    for node in grid.contexts:
        grid.tamper[node] = reading
    assert run_on_grid(grid, config, None).status == "completed"
    assert sent_norms and max(sent_norms) <= 0.01 * (1 + 1e-5)


def test_flower_nodes_add_the_simulators_noise_under_local_dp() -> None:
    """The noise is drawn on the node, from the (run, round, client) stream: the deployment's numbers are the
    simulator's."""
    config = flower_config("fedavg", "privacy.mechanism=local", "privacy.noise_multiplier=0.3",
                           "privacy.clip_norm=0.5")
    on_flower = run_on_grid(grid_for(config), config, None)
    simulated = run_config(config, progress=False)
    drop = (*FLOWER_FIELDS, "models_note")
    assert ({k: v for k, v in without_wall_time(on_flower).items() if k not in drop}
            == {k: v for k, v in without_wall_time(simulated).items() if k not in drop})


def test_a_flower_server_takes_the_simulators_private_server_steps_for_pfedhn() -> None:
    """Central DP of a hypernetwork happens in the ServerApp's server step: the deployment's numbers, epsilon
    included, are the simulator's."""
    config = flower_config("pfedhn", "privacy.mechanism=central", "privacy.noise_multiplier=0.8",
                           "privacy.clip_norm=0.5")
    on_flower = run_on_grid(grid_for(config), config, None)
    simulated = run_config(config, progress=False)
    drop = (*FLOWER_FIELDS, "models_note")
    assert on_flower.privacy is not None and on_flower.privacy["epsilon"] > 0
    assert ({k: v for k, v in without_wall_time(on_flower).items() if k not in drop}
            == {k: v for k, v in without_wall_time(simulated).items() if k not in drop})


# ---- secure aggregation (SecAgg+ on real SuperNodes: tests/test_flower_processes.py) ------------------------------
SECAGG_REFUSED = {
    "panacea": (["method.name=panacea"], "flower.secure_aggregation: panacea: its server learns from each client's "
                "own update (a hypernetwork), not from their mean"),
    "median": (["method.options.aggregation=fedmedian"], "flower.secure_aggregation: fedavg: aggregation fedmedian "
               "needs the individual updates"),
    "sampled": (["train.clients_per_round=2"], "flower.secure_aggregation: fedavg: needs every client in every round"),
    "pfedgat": (["method.name=pfedgat"], "flower.secure_aggregation: pfedgat: its server computes"),
}


@pytest.mark.parametrize("case", sorted(SECAGG_REFUSED))
def test_secure_aggregation_is_refused_where_the_server_needs_more_than_the_mean(case: str, tmp_path: Path) -> None:
    overrides, message = SECAGG_REFUSED[case]
    base = ["dataset.name=fln", "dataset.num_clients=4", "dataset.novel_fraction=0", "train.clients_per_round=4",
            "flower.secure_aggregation=true", "method.name=fedavg", *overrides]
    args = [a for o in base for a in ("--set", o)]
    result = CliRunner().invoke(cli.app, ["flower-app", "demo", *args, "--out", str(tmp_path / "app")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "app").exists()


def test_the_plain_serverapp_refuses_a_secure_aggregation_config() -> None:
    """A secure-aggregation config handed to graphfed's own ServerApp (which reads every reply) stops at once."""
    from flwr.app import Context

    from graphfed.config import dump_config
    from graphfed.errors import ConfigError
    from graphfed.flower import protocol
    from graphfed.flower.app import main as plain_main

    config = flower_config("fedavg", "flower.secure_aggregation=true")
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={protocol.RUN_CONFIG_KEY: dump_config(config)})
    with pytest.raises(ConfigError, match=r"run the SecAgg\+ app"):
        plain_main(grid_for(config), context)


# ---- adaptive clipping ---------------------------------------------------------------------------------------------
def test_adaptive_clipping_spends_part_of_the_noise_on_the_count_and_accounts_the_total(
        make_config: ConfigFactory) -> None:
    """Andrew et al.'s Theorem 1: the sum's noise z_sum and the count's std s compose to z = (z_sum^-2 +
    (2 s)^-2)^(-1/2), the multiplier the accountant is given; epsilon is the library's for z."""
    config = private(make_config, "central", "privacy.target_epsilon=4.0", "privacy.adaptive_quantile=0.5",
                     "train.rounds=8", "train.eval_every=8")
    result = Simulator(config, progress=False).run()
    record = result.privacy or {}
    total, own, count = record["noise_multiplier"], record["sum_noise_multiplier"], record["quantile_noise"]
    # expected clients / 20 = 0.2 would spend most of the budget on 4 clients: the default keeps it to a tenth
    assert count == pytest.approx(max(config.train.clients_per_round / 20, 10 ** 0.5 * total / 2))
    assert (2 * count) ** -2 == pytest.approx(total ** -2 / 10)
    assert (own ** -2 + (2 * count) ** -2) ** -0.5 == pytest.approx(total, rel=1e-12) and own > total
    rate = config.train.clients_per_round / (result.training_clients or 0)
    assert record["epsilon"] == library_epsilon(total, 8, rate, record["delta"])
    assert record["final_clip_norm"] != record["clip_norm"]


def test_the_adaptive_clip_settles_at_the_target_quantile_of_the_update_norms(make_config: ConfigFactory) -> None:
    """Without noise, every client every round: over the last rounds about half the updates fall within the clip
    (target quantile 0.5), from a first clip 100 times too large."""
    from graphfed.sim import engine

    shares: list[float] = []
    real = engine.next_clip

    def recording(delta, clip_norm, plan, expected, seed, round_index):  # type: ignore[no-untyped-def]
        shares.append(float((torch.linalg.vector_norm(delta, dim=1) <= clip_norm).double().mean()))
        return real(delta, clip_norm, plan, expected, seed, round_index)

    config = private(make_config, "central", "privacy.noise_multiplier=0", "privacy.clip_norm=100",
                     "privacy.adaptive_quantile=0.5", "privacy.clip_learning_rate=0.5", "train.rounds=80",
                     "train.eval_every=80", "train.clients_per_round=100", "dataset.novel_fraction=0")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "next_clip", recording)
        result = Simulator(config, progress=False).run()
    assert shares[0] == 1.0  # the first clip bounds nobody
    assert 0.3 <= sum(shares[-20:]) / 20 <= 0.7
    assert (result.privacy or {})["final_clip_norm"] < 10


@pytest.mark.parametrize(("overrides", "message"), [
    (["privacy.mechanism=local", "privacy.noise_multiplier=1", "privacy.adaptive_quantile=0.5"],
     "privacy.adaptive_quantile: adaptive clipping needs mechanism central"),
    (["privacy.mechanism=central", "privacy.noise_multiplier=1", "privacy.adaptive_quantile=0.5",
      "privacy.quantile_noise=0.4"], "privacy.quantile_noise: 0.4 leaves no budget for the sum"),
])
def test_adaptive_clipping_errors_are_one_line(overrides: list[str], message: str, tmp_path: Path) -> None:
    args = [a for o in [*tiny_overrides("fedavg"), *overrides] for a in ("--set", o)]
    result = CliRunner().invoke(cli.app, ["run", "demo", *args, "--out", str(tmp_path / "out"), "--no-progress"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
