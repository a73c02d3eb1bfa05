"""Client-level differential privacy (``privacy:``): the epsilon a run reports is the accounting library's own over
every release it made, a target epsilon is met, every upload that leaves a client (or enters the server's sum) is
clipped, the noise has the stated size and cannot be regenerated from anything the run writes or sends, a mechanism
without noise or clipping is the plain run, and what cannot be privatised is refused."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
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
    SecureNoise,
    SeededNoise,
    ServerGradientPrivacy,
    clip_rows,
    epsilon,
    noised_mean,
    privatize_uploads,
)
from graphfed.config import PrivacyConfig, dump_config
from graphfed.flower.app import run_on_grid
from graphfed.runs import RoundLog
from graphfed.sim import checkpoint
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


@pytest.mark.parametrize("source", [SecureNoise(), SeededNoise(0)], ids=["secure", "seeded"])
def test_the_noise_has_the_stated_standard_deviation(source: SecureNoise | SeededNoise) -> None:
    """Many draws: local noise per value is N(0, (noise_multiplier * clip)^2); central noise on the sum, divided by
    the expected cohort; the same from either source."""
    zeros = torch.zeros(4, 50_000)
    local = privatize_uploads(zeros, plan("local", 2.0, 1.5), source, 3, torch.arange(4))
    assert local.std().item() == pytest.approx(3.0, rel=0.01) and abs(local.mean().item()) < 0.02
    assert not torch.equal(local[0], local[1])  # each client its own noise
    central = noised_mean(zeros, plan("central", 2.0, 1.5), 5.0, source, 3)
    assert central.std().item() == pytest.approx(3.0 / 5.0, rel=0.01)
    empty = noised_mean(torch.zeros(0, 50_000), plan("central", 2.0, 1.5), 5.0, source, 4)  # an empty cohort
    assert empty.std().item() == pytest.approx(3.0 / 5.0, rel=0.01)


def test_the_secure_source_draws_anew_each_time_and_its_coins_are_uniform() -> None:
    source = SecureNoise()
    first, second = (source.gaussian((20_000,), 1.0, "cpu", 0, "privacy") for _ in range(2))
    assert not torch.equal(first, second)  # same (round, purpose): a seeded stream would repeat
    assert float(torch.corrcoef(torch.stack([first, second]))[0, 1]) == pytest.approx(0.0, abs=0.03)
    coins = source.uniform(40_000, 0, "sampling")
    assert coins.min() > 0 and coins.max() < 1 and float(coins.mean()) == pytest.approx(0.5, abs=0.01)
    assert float((coins < 0.1).double().mean()) == pytest.approx(0.1, abs=0.006)
    seeded = SeededNoise(7)
    assert torch.equal(seeded.gaussian((10,), 1.0, "cpu", 2, "privacy", 3), seeded.gaussian((10,), 1.0, "cpu", 2,
                                                                                           "privacy", 3))


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


def _central_releases(config, out_dir: Path | None = None) -> tuple[list[torch.Tensor], object]:  # type: ignore[no-untyped-def]
    """Every mean update FedAvg's server learned from in a run of ``config`` (its ``central_update`` argument), and
    the run's result; ``update``, which reads individual updates, must never be called."""
    from graphfed.methods.fedavg import FedAvg

    seen: list[torch.Tensor] = []
    central_update = FedAvg.central_update

    def recording(self: FedAvg, mean_delta: torch.Tensor, expected: float) -> None:
        seen.append(mean_delta.clone())
        central_update(self, mean_delta, expected)

    def individual(*args: object) -> None:
        raise AssertionError("an individual update reached the method under central DP")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FedAvg, "central_update", recording)
        patch.setattr(FedAvg, "update", individual)
        result = Simulator(config, out_dir, progress=False).run()
    return seen, result


def test_a_central_server_hands_the_method_only_the_noised_mean(make_config: ConfigFactory, tmp_path: Path) -> None:
    """One release a round reaches the method; the outputs carry neither the cohort's size nor its losses, and
    the bytes counted are the expected cohort's."""
    config = private(make_config, "central", "privacy.noise_multiplier=0.7", "privacy.clip_norm=0.5")
    seen, result = _central_releases(config, tmp_path / "run")
    assert len(seen) == config.train.rounds and all(release.ndim == 1 for release in seen)
    records = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert records and all(r["clients"] is None and r["train_loss"] is None for r in records)
    assert result.bytes_up == config.train.rounds * config.train.clients_per_round * result.num_params * 4


def test_two_central_runs_of_one_config_release_different_noise_unless_reproducible_is_asked(
        make_config: ConfigFactory) -> None:
    config = private(make_config, "central", "privacy.noise_multiplier=1.0", "train.rounds=3", "train.eval_every=3")
    first, second = _central_releases(config)[0], _central_releases(config)[0]
    assert not any(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    reproducible = config.model_copy(update={"privacy": config.privacy.model_copy(
        update={"reproducible_noise": True})})
    again, result = _central_releases(reproducible)
    assert all(torch.equal(a, b) for a, b in zip(again, _central_releases(reproducible)[0], strict=True))
    record = result.privacy or {}
    assert record["reproducible_noise"] is True and "protects nobody" in record["noise"]
    assert any("noise is reproducible from the seed" in line for line in record["outside_the_guarantee"])


# ---- the noise is a secret: regenerating it from what the run writes or sends fails --------------------------
def _uploads_and_clipped(config) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    """Local DP: per round, the clipped updates before noise, the noised uploads the server receives, and the ids."""
    from graphfed.client import executor as executor_module

    clipped_rows: list[torch.Tensor] = []
    uploads: list[torch.Tensor] = []
    ids: list[torch.Tensor] = []
    real = executor_module.privatize_uploads

    def recording(delta, plan, noise, round_index, client_ids, purpose="privacy"):  # type: ignore[no-untyped-def]
        out = real(delta, plan, noise, round_index, client_ids, purpose)
        clipped_rows.append(clip_rows(delta, plan.clip_norm))
        uploads.append(out.clone())
        ids.append(client_ids.clone())
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(executor_module, "privatize_uploads", recording)
        Simulator(config, progress=False).run()
    return clipped_rows, uploads, ids


@pytest.mark.parametrize("reproducible", [False, True], ids=["secure", "reproducible"])
def test_regenerating_local_noise_from_the_seed_recovers_no_update(make_config: ConfigFactory,
                                                                    reproducible: bool) -> None:
    """The attack the issue ran: subtract the noise regenerated from (seed, round, client), which config.yaml and
    summary.json record. Secure noise leaves an error of the noise's own size (sqrt 2 times it: two independent
    draws); the reproducible mode, the attack's control, gives the clipped update back."""
    config = private(make_config, "local", "privacy.noise_multiplier=0.8", "privacy.clip_norm=0.5",
                     f"privacy.reproducible_noise={str(reproducible).lower()}", "train.rounds=3",
                     "train.eval_every=3")
    clipped, uploads, ids = _uploads_and_clipped(config)
    attacker = SeededNoise(config.seed)  # everything the attacker needs is in the run's outputs
    for round_index, (clean, upload, clients) in enumerate(zip(clipped, uploads, ids, strict=True)):
        regenerated = attacker.gaussian_rows(len(clients), upload.shape[1], 0.8 * 0.5, "cpu", round_index, "privacy",
                                             clients)
        error = float(torch.linalg.vector_norm(upload - regenerated - clean))
        noise = float(torch.linalg.vector_norm(upload - clean))
        if reproducible:
            assert error < 1e-4 * noise
        else:
            assert error == pytest.approx(2 ** 0.5 * noise, rel=0.15)


def test_a_reader_of_the_outputs_predicts_neither_the_central_sample_nor_its_noise(make_config: ConfigFactory) -> None:
    """Under central DP the attacker regenerates the sampling coins and the sum's noise from the seed: the cohort
    it predicts is not the one drawn (compared over many rounds), and the sum it recovers is off by the noise."""
    config = private(make_config, "central", "privacy.noise_multiplier=1.0", "train.rounds=2", "train.eval_every=2")
    simulator = Simulator(config, progress=False)
    attacker = SeededNoise(config.seed)
    train_ids = simulator.setup.federation.train_client_ids
    rate = simulator.privacy.sampling_rate or 0.0
    drawn = [set(simulator.sample_clients(r).tolist()) for r in range(200)]
    predicted = [set(train_ids[attacker.uniform(len(train_ids), r, "sampling") < rate].tolist()) for r in range(200)]
    assert sum(a == b for a, b in zip(drawn, predicted, strict=True)) < 40  # equal only by chance (mostly empty)
    zeros = torch.zeros(0, 5000)
    released = noised_mean(zeros, simulator.privacy, 4.0, simulator.noise, 0)
    regenerated = attacker.gaussian((5000,), simulator.privacy.sum_noise_multiplier * simulator.privacy.clip_norm,
                                    "cpu", 0, "privacy") / 4.0
    assert float(torch.linalg.vector_norm(released - regenerated)) == pytest.approx(
        2 ** 0.5 * float(torch.linalg.vector_norm(released)), rel=0.1)


# ---- every release accounted ---------------------------------------------------------------------------------
def test_an_empty_poisson_cohort_releases_the_noise_and_counts_as_a_round(make_config: ConfigFactory,
                                                                          tmp_path: Path) -> None:
    """Rounds whose secret sample is empty (forced here in rounds 2 and 5) still release the noise to the method
    and are accounted; the run completes."""
    config = private(make_config, "central", "privacy.noise_multiplier=1.0", "train.rounds=6", "train.eval_every=3")
    real = Simulator.sample_clients

    def sometimes_empty(self: Simulator, round_index: int) -> torch.Tensor:
        return real(self, round_index)[:0] if round_index in (1, 4) else real(self, round_index)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Simulator, "sample_clients", sometimes_empty)
        seen, result = _central_releases(config, tmp_path / "run")
    assert result.status == "completed" and len(seen) == 6
    assert float(torch.linalg.vector_norm(seen[1])) > 0  # the noise alone
    record = result.privacy or {}
    assert record["rounds_released"] == 6
    rate = config.train.clients_per_round / (result.training_clients or 0)
    assert record["epsilon"] == library_epsilon(1.0, 6, rate, record["delta"])


@pytest.mark.parametrize("method", ["pfedhn", "feddyn"])
def test_an_empty_cohort_steps_every_central_server_on_the_noise(method: str, make_config: ConfigFactory) -> None:
    """Both forms of central DP survive a round with no client: the DP-SGD server (pFedHN) steps on the noise, the
    released-mean server (FedDyn, which needs a count) uses the expected cohort."""
    config = private(make_config, "central", "privacy.noise_multiplier=1.0", "train.rounds=3", "train.eval_every=3",
                     method=method)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Simulator, "sample_clients", lambda self, round_index: torch.zeros(0, dtype=torch.long))
        simulator = Simulator(config, progress=False)
        clients = torch.arange(simulator.setup.federation.num_clients)
        before = simulator.setup.method.eval_weights(clients).clone()
        result = simulator.run()
    assert result.status == "completed" and (result.privacy or {})["rounds_released"] == 3
    assert not torch.equal(before, simulator.setup.method.eval_weights(clients))  # the noise moved the server


def test_a_run_stopped_between_evaluations_accounts_every_round_it_released(make_config: ConfigFactory,
                                                                           tmp_path: Path) -> None:
    """Evaluations every 5 rounds; a NaN update stops the run in round 8 (before its release): epsilon covers the 7
    rounds that reached the model, not the 5 evaluated."""
    from graphfed.client.executor import ClientRuntime

    config = private(make_config, "central", "privacy.noise_multiplier=1.0", "train.rounds=12")
    real = ClientRuntime.train

    def breaking(self, client_ids, start, round_index, purpose, steps=None, broadcast=None):  # type: ignore[no-untyped-def]
        result = real(self, client_ids, start, round_index, purpose, steps, broadcast)
        if round_index == 7 and purpose == "local_training":
            result.delta[0, 0] = float("nan")
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ClientRuntime, "train", breaking)
        patch.setattr(Simulator, "sample_clients", lambda self, r: self.setup.federation.train_client_ids[:3])
        result = Simulator(config, tmp_path / "run", progress=False).run()
    assert result.status.startswith("stopped") and result.rounds == 5
    record = result.privacy or {}
    assert record["rounds_released"] == 7
    assert record["epsilon"] == library_epsilon(1.0, 7, 4 / (result.training_clients or 0), record["delta"])


@pytest.mark.parametrize("mechanism", ["central", "local"])
def test_an_interrupted_and_resumed_run_never_releases_a_round_twice(make_config: ConfigFactory, tmp_path: Path,
                                                                    mechanism: str) -> None:
    """A private run checkpoints every round; interrupted in round 10's evaluation (after its release, before its
    checkpoint) and resumed: round 10 is not run again (its release counts, its effect is lost with the process),
    so 12 rounds released 12 times, the ledger says so, and its evaluations restart after the checkpoint."""
    config = private(make_config, mechanism, "privacy.noise_multiplier=1.0", "train.rounds=12",
                     "train.checkpoint_every=5")
    out = tmp_path / "run"
    real = Simulator.evaluation_steps

    def interrupting(self: Simulator, round_index: int):  # type: ignore[no-untyped-def]
        if round_index == 9:
            raise KeyboardInterrupt
        return (yield from real(self, round_index))

    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(Simulator, "evaluation_steps", interrupting)
        Simulator(config, out, progress=False).run()
    assert json.loads((out / "privacy.json").read_text())["rounds"] == 10
    assert checkpoint.load_checkpoint(out)["completed_rounds"] == 9  # every round, not every 5
    trained = []
    with pytest.MonkeyPatch.context() as patch:
        round_steps = Simulator.round_steps

        def counting(self: Simulator, round_index: int):  # type: ignore[no-untyped-def]
            trained.append(round_index + 1)
            return (yield from round_steps(self, round_index))

        patch.setattr(Simulator, "round_steps", counting)
        result = Simulator(config, out, progress=False).run(resume=True)
    assert result.status == "completed" and trained == [11, 12]
    ledger = json.loads((out / "privacy.json").read_text())
    record = result.privacy or {}
    if mechanism == "central":
        assert record["rounds_released"] == ledger["central_releases"] == 12
        assert record["epsilon"] == library_epsilon(1.0, 12, 4 / (result.training_clients or 0), record["delta"])
    else:  # each client's uploads: the rounds it was sampled in, once each
        sampled = Counter(i for r in range(12) for i in Simulator(config, progress=False).sample_clients(r).tolist())
        assert {int(i): n for i, n in ledger["uploads"].items()} == dict(sampled)
    assert [record["round"] for record in RoundLog(out).read()] == [5, 12]


def test_a_private_run_reports_its_last_round_unless_validation_selection_is_asked(make_config: ConfigFactory) -> None:
    """Choosing the best round reads the clients' validation scores outside the mechanism: a private run reports
    its last evaluation by default; with model_selection=validation it may choose, and says that is outside."""
    config = private(make_config, "local", "privacy.noise_multiplier=3.0", "train.rounds=10", "train.eval_every=1")
    result = run_config(config, progress=False)
    assert result.best_round == 10
    assert not any("validation scores" in line for line in (result.privacy or {})["outside_the_guarantee"])
    chosen = run_config(private(make_config, "local", "privacy.noise_multiplier=3.0", "train.rounds=10",
                                "train.eval_every=1", "privacy.model_selection=validation"), progress=False)
    assert any("validation scores" in line for line in (chosen.privacy or {})["outside_the_guarantee"])


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
    privacy = ServerGradientPrivacy(PrivacyPlan("central", clip, 0.0, 1e-5, "pld", 10, 0.5), expected, SecureNoise())
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
    privacy = ServerGradientPrivacy(plan, expected_clients=4.0, noise=SecureNoise(), steps_per_round=4)
    privacy.begin_round(0)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.0)
    privacy.step(optimizer, layer(embeddings), torch.zeros(2, 6))
    first = layer.weight.grad.clone()
    assert first.std().item() == pytest.approx(1.5 * 2.0 * 2.0 / 4.0, rel=0.02)
    privacy.step(optimizer, layer(embeddings), torch.zeros(2, 6))
    assert not torch.equal(layer.weight.grad, first)  # each step of the round draws its own noise
    privacy.step(optimizer, layer(embeddings)[:0], torch.zeros(0, 6))  # an empty cohort: the noise alone
    assert layer.weight.grad.std().item() == pytest.approx(1.5 * 2.0 * 2.0 / 4.0, rel=0.02)


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
    everyone = ["privacy.noise_multiplier=0", "privacy.clip_norm=.inf", "privacy.model_selection=validation",
                "train.clients_per_round=100", "dataset.novel_fraction=0"]
    plain = run_config(make_config(method, *everyone[3:]), progress=False)
    degenerate = run_config(private(make_config, "central", *everyone, method=method), progress=False)
    assert degenerate.test_mean == pytest.approx(plain.test_mean, abs=1e-4)


def test_noise_zero_and_no_clipping_is_the_plain_run(make_config: ConfigFactory) -> None:
    """``local`` with noise 0 and clip .inf changes nothing: the same numbers as the run without privacy."""
    plain = run_config(make_config("ditto"), progress=False)
    degenerate = run_config(private(make_config, "local", "privacy.noise_multiplier=0", "privacy.clip_norm=.inf",
                                    "privacy.model_selection=validation", method="ditto"), progress=False)
    # every number the same; the code differs in name only (a private run records the private behaviour id)
    assert ({k: v for k, v in without_wall_time(degenerate).items() if k not in ("privacy", "code")}
            == {k: v for k, v in without_wall_time(plain).items() if k != "code"})
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
    "panacea central, knn graph": ("panacea", ["privacy.mechanism=central", "dataset.graph=knn"],
                                   "privacy.mechanism=central: panacea reads the client graph, and dataset.graph=knn "
                                   "builds it from each client's data"),
    "sfl local, knn graph": ("sfl", ["privacy.mechanism=local", "dataset.graph=knn"],
                             "privacy.mechanism=local: sfl reads the client graph, and dataset.graph=knn"),
    "central dropout": ("fedavg", ["privacy.mechanism=central", "train.dropout=0.2"],
                        "train.dropout change who takes part"),
    "early stop, last round": ("fedavg", ["privacy.mechanism=local", "train.patience=2"],
                               "train.patience: early stopping reads the clients' validation scores"),
    "central replace-one": ("fedavg", ["privacy.mechanism=central", "privacy.neighbours=replace_one"],
                            "privacy.neighbours: replace_one does not apply to mechanism central"),
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


def test_flower_nodes_draw_noise_nobody_can_regenerate_under_local_dp() -> None:
    """Each node draws its local noise from its own secure generator: the uploads the server receives are the
    clipped update plus noise of the stated size, and the noise the run's seed (sent in every message) would give
    is not it. With zero noise the same nodes send exactly the simulator's clipped updates."""
    common = ["privacy.mechanism=local", "privacy.clip_norm=0.05", "train.rounds=1", "model.options={hidden: 64}"]
    noisy = flower_config("fedavg", *common, "privacy.noise_multiplier=2.0")
    exact = flower_config("fedavg", *common, "privacy.noise_multiplier=0")
    received: dict[str, dict[int, torch.Tensor]] = {"noisy": {}, "exact": {}}
    for key, config in (("noisy", noisy), ("exact", exact)):
        grid = grid_for(config)

        def reading(content: RecordDict, message: Message, key: str = key) -> RecordDict:
            if message.metadata.message_type == "train":
                received[key][len(received[key])] = torch.from_numpy(content["delta"].to_numpy_ndarrays()[0].copy())
            return content

        for node in grid.contexts:
            grid.tamper[node] = reading
        assert run_on_grid(grid, config, None).status == "completed"
    assert len(received["noisy"]) == len(received["exact"]) > 0
    clean = torch.stack(list(received["exact"].values()))
    noisy_rows = torch.stack(list(received["noisy"].values()))
    # rows arrive in node order in both runs: the clean update is the exact run's (same seed, same batches)
    noise = noisy_rows - clean
    assert float(noise.std()) == pytest.approx(2.0 * 0.05, rel=0.05)
    regenerated = SeededNoise(noisy.seed).gaussian((noise.shape[1],), 0.1, "cpu", 0, "privacy", 0)
    assert all(float(torch.linalg.vector_norm(row - regenerated)) > float(torch.linalg.vector_norm(row))
               for row in noise)


def test_flower_refuses_reproducible_noise(tmp_path: Path) -> None:
    config = flower_config("fedavg", "privacy.mechanism=local", "privacy.noise_multiplier=1.0",
                           "privacy.reproducible_noise=true")
    from graphfed.errors import ConfigError

    with pytest.raises(ConfigError, match=r"privacy\.reproducible_noise: a deployment.s noise must be secret"):
        run_on_grid(grid_for(config), config, None)
    args = [a for o in ["dataset.name=fln", "privacy.mechanism=local", "privacy.noise_multiplier=1",
                        "privacy.reproducible_noise=true"] for a in ("--set", o)]
    result = CliRunner().invoke(cli.app, ["flower-app", "demo", *args, "--out", str(tmp_path / "app")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "a deployment's noise must be secret" in lines[0]
    assert not (tmp_path / "app").exists()


def test_a_flower_server_takes_private_server_steps_for_pfedhn() -> None:
    """Central DP of a hypernetwork happens in the ServerApp's server step (each client's contribution clipped, the
    noise the server's own), and its epsilon is the library's for the rounds it released."""
    config = flower_config("pfedhn", "privacy.mechanism=central", "privacy.noise_multiplier=0.8",
                           "privacy.clip_norm=0.5")
    steps: list[int] = []
    step = ServerGradientPrivacy.step

    def recording(self, optimizer, sent, direction, extra_loss=None) -> None:  # type: ignore[no-untyped-def]
        steps.append(len(sent))
        step(self, optimizer, sent, direction, extra_loss)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ServerGradientPrivacy, "step", recording)
        on_flower = run_on_grid(grid_for(config), config, None)
    record = on_flower.privacy or {}
    assert on_flower.status == "completed" and len(steps) == config.train.rounds
    rate = config.train.clients_per_round / (on_flower.training_clients or 0)
    assert record["epsilon"] == library_epsilon(0.8, config.train.rounds, min(1.0, rate), record["delta"])


# ---- secure aggregation (SecAgg+ on real SuperNodes: tests/test_flower_processes.py) ------------------------------
SECAGG_REFUSED = {
    "panacea": (["method.name=panacea"], "flower.secure_aggregation: panacea: its server learns from each client's "
                "own update (a hypernetwork), not from their mean"),
    "median": (["method.options.aggregation=fedmedian"], "flower.secure_aggregation: fedavg: aggregation fedmedian "
               "needs the individual updates"),
    "sampled": (["train.clients_per_round=2"], "flower.secure_aggregation: fedavg: needs every client in every round"),
    "pfedgat": (["method.name=pfedgat"], "flower.secure_aggregation: pfedgat: its server computes"),
    "fedbuff": (["train.server_mode=fedbuff"], "flower.secure_aggregation: fedavg: SecAgg+ masks one cohort's updates "
                "together in each round"),
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
    from graphfed.sim import stages

    shares: list[float] = []
    real = stages.next_clip

    def recording(delta, clip_norm, plan, expected, seed, round_index):  # type: ignore[no-untyped-def]
        shares.append(float((torch.linalg.vector_norm(delta, dim=1) <= clip_norm).double().mean()))
        return real(delta, clip_norm, plan, expected, seed, round_index)

    config = private(make_config, "central", "privacy.noise_multiplier=0", "privacy.clip_norm=100",
                     "privacy.adaptive_quantile=0.5", "privacy.clip_learning_rate=0.5", "train.rounds=80",
                     "train.eval_every=80", "train.clients_per_round=100", "dataset.novel_fraction=0")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stages, "next_clip", recording)
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


# ---- the audit: an epsilon lower bound that a broken mechanism exceeds ------------------------------------------
def test_clopper_pearson_bounds_and_the_epsilon_they_prove() -> None:
    from graphfed.client.audit import clopper_pearson_upper, epsilon_lower_bound

    assert clopper_pearson_upper(0, 1000, 0.975) == pytest.approx(1 - 0.025 ** (1 / 1000), rel=1e-9)
    assert clopper_pearson_upper(1000, 1000, 0.975) == 1.0
    assert clopper_pearson_upper(10, 1000, 0.975) > 0.01  # above the observed rate
    fpr, fnr = 1 - 0.025 ** (1 / 5000), 1 - 0.025 ** (1 / 4000)
    assert epsilon_lower_bound(0, 5000, 0, 4000, 1e-3) == pytest.approx(math.log((1 - 1e-3 - fnr) / fpr))
    assert epsilon_lower_bound(2500, 5000, 2000, 4000, 1e-3) == 0.0  # a coin flip proves nothing


@pytest.mark.parametrize("mechanism", ["local", "central"])
def test_the_audit_fails_a_broken_mechanism_and_passes_graphfeds(mechanism: str) -> None:
    """8,000 canaries against a claim of epsilon 2 over 20 rounds: no noise, and reproducible noise against an
    attacker who reads the seed, prove an epsilon well above the claim; the secure mechanism stays below it."""
    from graphfed.client.audit import audit
    from graphfed.client.privacy import plan_privacy

    def plan(**options: object):  # type: ignore[no-untyped-def]
        return plan_privacy(PrivacyConfig(mechanism=mechanism, delta=1e-3, clip_norm=1.0, **options), 60, 24, 20)

    broken = [audit(plan(noise_multiplier=0.0), 20, 8000),
              audit(plan(target_epsilon=2.0, reproducible_noise=True), 1 if mechanism == "local" else 20, 8000,
                    seed_attacker=True)]
    sound = audit(plan(target_epsilon=2.0), 20, 8000)
    assert all(result.epsilon_lower_bound > 6.0 for result in broken), [r.epsilon_lower_bound for r in broken]
    assert sound.claimed_epsilon == pytest.approx(2.0, rel=0.01)
    assert 0.3 < sound.epsilon_lower_bound < sound.claimed_epsilon  # a real attack, and the claim holds


def test_replace_one_neighbours_double_the_sensitivity_and_the_summary_names_them(make_config: ConfigFactory) -> None:
    """Replace-one compares any two uploads of a client (sensitivity 2 clip): the same noise spends the epsilon of
    half the multiplier, and a target calibrates twice the noise of zero-out's."""
    from graphfed.client.privacy import plan_privacy

    zero_out = plan_privacy(PrivacyConfig(mechanism="local", target_epsilon=2.0, delta=1e-3), 60, 24, 100)
    replace = plan_privacy(PrivacyConfig(mechanism="local", target_epsilon=2.0, delta=1e-3,
                                         neighbours="replace_one"), 60, 24, 100)
    assert replace.noise_multiplier == pytest.approx(2 * zero_out.noise_multiplier)
    same_noise = plan_privacy(PrivacyConfig(mechanism="local", noise_multiplier=zero_out.noise_multiplier,
                                            delta=1e-3, neighbours="replace_one"), 60, 24, 100)
    assert same_noise.epsilon_of_rounds(100) == library_epsilon(zero_out.noise_multiplier / 2, 100, None, 1e-3)
    assert same_noise.epsilon_of_rounds(100) > 2 * 2.0
    result = run_config(private(make_config, "local", "privacy.noise_multiplier=2.0",
                                "privacy.neighbours=replace_one"), progress=False)
    record = result.privacy or {}
    assert record["neighbours"] == "replace_one" and "sensitivity 2 x clip_norm" in record["neighbours_meaning"]
    assert record["delta_source"].startswith(f"0.1 / {result.training_clients} training clients")


def test_novel_clients_adapt_with_clipped_noised_uploads_under_local_dp(make_config: ConfigFactory) -> None:
    """A novel client's adaptation uploads leave it clipped (and noised), and count towards its own epsilon."""
    from graphfed.methods.base import EmbeddingHypernetwork

    norms: list[float] = []
    adapt = EmbeddingHypernetwork.adapt_novel

    def recording(self, client_ids, sent, delta) -> None:  # type: ignore[no-untyped-def]
        norms.extend(torch.linalg.vector_norm(delta, dim=1).tolist())
        adapt(self, client_ids, sent, delta)

    config = private(make_config, "local", "privacy.noise_multiplier=0", "privacy.clip_norm=0.01",
                     "dataset.novel_fraction=0.25", method="pfedhn")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EmbeddingHypernetwork, "adapt_novel", recording)
        result = run_config(config, progress=False)
    assert norms and max(norms) <= 0.01 * (1 + 1e-5)
    novel = result.novel_clients or []
    epsilons = (result.privacy or {})["per_client_epsilon"]
    assert novel and all(epsilons[name] == math.inf for name in novel)  # no noise: every upload spends all


def test_the_privacy_audit_command_passes_a_sound_config_and_fails_reproducible_noise() -> None:
    base = [*tiny_overrides("fedavg"), "privacy.mechanism=local", "privacy.target_epsilon=2.0", "train.rounds=1"]
    args = [a for o in base for a in ("--set", o)]
    sound = CliRunner().invoke(cli.app, ["privacy-audit", "demo", *args, "--canaries", "4000"])
    assert sound.exit_code == 0, sound.output
    assert "claimed epsilon 2" in sound.stdout and "the claim holds against this attack" in sound.stdout
    broken = CliRunner().invoke(cli.app, ["privacy-audit", "demo", *args, "--set", "privacy.reproducible_noise=true",
                                          "--seed-attacker", "--canaries", "4000"])
    assert broken.exit_code == 3, broken.output
    assert "does not give its claimed epsilon: its noise is reproducible from the seed" in broken.stderr


# ---- every client within the target, every release on disk -----------------------------------------------------
def test_under_a_local_target_no_client_spends_more_novel_clients_included(make_config: ConfigFactory,
                                                                            tmp_path: Path) -> None:
    """Local DP, target 4, 4 training rounds, novel clients adapting for 20 rounds (20 noised uploads each): the
    noise is calibrated for the 20, every client's epsilon (from its uploads in privacy.json, by dp-accounting
    itself) is at most 4, the novel ones close to it, and the summary says what the noise was sized for."""
    config = private(make_config, "local", "privacy.target_epsilon=4", "train.rounds=4", "train.eval_every=4",
                     "train.novel_adapt_rounds=20", "dataset.novel_fraction=0.25", method="pfedhn")
    simulator = Simulator(config, tmp_path / "run", progress=False)
    result = simulator.run()
    record = result.privacy or {}
    fed = simulator.setup.federation
    uploads = {int(i): n for i, n in json.loads((tmp_path / "run" / "privacy.json").read_text())["uploads"].items()}
    novel = fed.novel_client_ids.tolist()
    assert novel and all(uploads[i] == 20 for i in novel)
    assert max(uploads[i] for i in fed.train_client_ids.tolist()) <= 4
    spent = {fed.client_names[i]: library_epsilon(record["noise_multiplier"], count, None, record["delta"])
             for i, count in uploads.items()}
    assert max(spent.values()) <= 4 * (1 + 1e-9) and max(spent.values()) == pytest.approx(4, rel=0.01)
    assert all(record["per_client_epsilon"][name] == pytest.approx(value, rel=1e-9) for name, value in spent.items())
    assert record["releases_per_client"] == 20
    assert record["calibrated_for"] == ("20 noised uploads per client, the most any client makes (a training client's "
                                        "at most 4 (train.rounds), a novel client's adaptation 20 "
                                        "(train.novel_adapt_rounds))")


def test_an_interrupt_during_novel_adaptation_resumes_after_its_last_release_within_the_target(
        make_config: ConfigFactory, tmp_path: Path) -> None:
    """Local DP at target 4, novel clients adapting for 5 steps: interrupted in the third step (its uploads made,
    its effect not yet applied) and resumed, the adaptation continues after step 3 from the checkpoint of step 2
    and never repeats an upload: every novel client made 5 uploads, each client's epsilon by dp-accounting from
    privacy.json is within 4, and the summary records the target with no client above it."""
    from graphfed.methods.base import EmbeddingHypernetwork

    config = private(make_config, "local", "privacy.target_epsilon=4", "train.rounds=2", "train.eval_every=2",
                     "train.novel_adapt_rounds=5", "dataset.novel_fraction=0.25", method="pfedhn")
    out = tmp_path / "run"
    adapt, calls = EmbeddingHypernetwork.adapt_novel, []

    def interrupting(self, client_ids, sent, delta) -> None:  # type: ignore[no-untyped-def]
        calls.append(len(client_ids))
        if len(calls) == 3:
            raise KeyboardInterrupt
        adapt(self, client_ids, sent, delta)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(EmbeddingHypernetwork, "adapt_novel", interrupting)
        Simulator(config, out, progress=False).run()
    assert checkpoint.load_checkpoint(out)["novel_adaptation"]["steps"] == 2
    simulator = Simulator(config, out, progress=False)
    novel = simulator.setup.federation.novel_client_ids.tolist()
    assert novel and all(json.loads((out / "privacy.json").read_text())["uploads"][str(i)] == 3 for i in novel)
    adapted = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EmbeddingHypernetwork, "adapt_novel",
                      lambda self, *args: (adapted.append(1), adapt(self, *args))[1])
        result = simulator.run(resume=True)
    record = result.privacy or {}
    uploads = {int(i): n for i, n in json.loads((out / "privacy.json").read_text())["uploads"].items()}
    assert result.completed and len(adapted) == 2 and all(uploads[i] == 5 for i in novel)
    assert result.novel_adapted_mean is not None
    spent = [library_epsilon(record["noise_multiplier"], count, None, record["delta"]) for count in uploads.values()]
    assert max(spent) <= 4 * (1 + 1e-9)
    assert record["target_epsilon"] == 4 and record["above_target"] == {}
    assert not any("budget exceeded" in flag for flag in result.flags)


def test_a_run_above_its_target_says_so_and_exits_6(make_config: ConfigFactory, tmp_path: Path) -> None:
    """A ledger that counts more releases than the noise was sized for (an older graphfed's resume released rounds
    twice): the resumed run completes, its summary names the excess (privacy.above_target, a flag), the command ends
    with one closing line and exit 6, and graphfed status says the same."""
    config = private(make_config, "central", "privacy.target_epsilon=2", "train.rounds=6", "train.eval_every=3")
    out = tmp_path / "run"
    real = Simulator.round_steps

    def interrupting(self: Simulator, round_index: int):  # type: ignore[no-untyped-def]
        if round_index == 4:
            raise KeyboardInterrupt
        return (yield from real(self, round_index))

    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(Simulator, "round_steps", interrupting)
        Simulator(config, out, progress=False).run()
    ledger = json.loads((out / "privacy.json").read_text())
    (out / "privacy.json").write_text(json.dumps({**ledger, "central_releases": ledger["central_releases"] + 8}))
    (tmp_path / "config.yaml").write_text(dump_config(config))
    resumed = CliRunner().invoke(cli.app, ["run", str(tmp_path / "config.yaml"), "--out", str(out), "--resume",
                                           "--no-progress"])
    assert resumed.exit_code == 6, resumed.output
    assert "privacy budget exceeded" in resumed.output.strip().splitlines()[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["privacy"]["rounds_released"] == 14
    assert list(summary["privacy"]["above_target"]) == ["every client"]
    assert summary["privacy"]["above_target"]["every client"] > 2
    assert any(flag.startswith("privacy budget exceeded") for flag in summary["flags"])
    status = CliRunner().invoke(cli.app, ["status", str(out)])
    assert status.exit_code == 6 and "above its privacy target" in status.output


def test_a_central_release_clips_every_update_of_the_cohort(make_config: ConfigFactory) -> None:
    """Updates far above the clip and no noise: each round's release is the sum of the cohort's updates, each
    scaled to the clip by hand, over the expected cohort. An update released unclipped would move it by its excess."""
    from graphfed.client.executor import ClientRuntime
    from graphfed.methods.fedavg import FedAvg

    config = private(make_config, "central", "privacy.noise_multiplier=0.0", "privacy.clip_norm=0.01",
                     "privacy.reproducible_noise=true", "train.rounds=3", "train.eval_every=3")  # a seeded sample
    uploads: list[torch.Tensor] = []
    releases: list[tuple[torch.Tensor, float]] = []
    train, update = ClientRuntime.train, FedAvg.central_update

    def recording_train(self, client_ids, start, round_index, purpose, steps=None, broadcast=None):  # type: ignore[no-untyped-def]
        result = train(self, client_ids, start, round_index, purpose, steps, broadcast)
        uploads.append(result.delta.clone())
        return result

    def recording_update(self, mean_delta: torch.Tensor, expected_clients: float) -> None:  # type: ignore[no-untyped-def]
        releases.append((mean_delta.clone(), expected_clients))
        update(self, mean_delta, expected_clients)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ClientRuntime, "train", recording_train)
        patch.setattr(FedAvg, "central_update", recording_update)
        Simulator(config, progress=False).run()
    assert len(uploads) == len(releases) == 3 and sum(len(u) for u in uploads) >= 3
    for delta, (released, expected) in zip(uploads, releases, strict=True):
        norms = torch.linalg.vector_norm(delta.double(), dim=1, keepdim=True)
        assert bool((norms > 0.01).all())  # every update is above the clip: each must be scaled
        by_hand = (delta.double() * (0.01 / norms)).sum(0) / expected
        torch.testing.assert_close(released.double(), by_hand, rtol=1e-5, atol=1e-9)


def test_a_private_comparison_checks_every_row_first_runs_local_without_a_mechanism_and_goes_on_past_a_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any run, a row that cannot run under the privacy setting is refused (one line, nothing run); Local
    runs without a mechanism (it releases nothing) and says so; a seed that stops leaves the other rows to run and
    the table to say so, with exit 3 at the end; the table states epsilon and delta."""
    from graphfed.client.executor import ClientRuntime

    base = [*tiny_overrides("fedavg"), "privacy.mechanism=central", "privacy.noise_multiplier=1.0",
            "privacy.reproducible_noise=true", "train.rounds=4", "train.eval_every=2"]
    args = [a for o in base for a in ("--set", o)]
    refused = CliRunner().invoke(cli.app, ["compare", "demo", *args, "--methods", "fedavg,fedaghn", "--out",
                                           str(tmp_path / "refused"), "--no-progress"])
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert "fedaghn: privacy.mechanism=central: fedaghn" in refused.output
    assert not (tmp_path / "refused").exists()  # refused before the first run
    real = ClientRuntime.train

    def seed_1_breaks(self, client_ids, start, round_index, purpose, steps=None, broadcast=None):  # type: ignore[no-untyped-def]
        result = real(self, client_ids, start, round_index, purpose, steps, broadcast)
        if self.seed == 1 and round_index == 2 and len(client_ids):
            result.delta[0, 0] = float("nan")
        return result

    monkeypatch.setattr(ClientRuntime, "train", seed_1_breaks)
    done = CliRunner().invoke(cli.app, ["compare", "demo", *args, "--methods", "fedavg,local", "--seeds", "2",
                                        "--pack", "1", "--out", str(tmp_path / "cmp"), "--no-progress"])
    text = " ".join(done.output.split())
    assert done.exit_code == 3, done.output
    assert "fedavg (1 of 2 seeds stopped)" in text and "2 run(s) stopped (fedavg seed 1, local seed 1)" in text
    assert "round 3: non-finite (NaN/Inf) update from a client of the round's secret cohort" in text
    assert "local releases nothing" in text and "ε 0 (releases nothing)" in text
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert "(central)" in markdown and "privacy (every private row): central DP at δ =" in markdown
    assert "outside the guarantee: checkpoint.pt" in markdown


def test_a_non_finite_stop_under_central_dp_names_the_round_and_the_levers_never_the_client(
        make_config: ConfigFactory, tmp_path: Path) -> None:
    from graphfed.client.executor import ClientRuntime

    config = private(make_config, "central", "privacy.noise_multiplier=1.0", "privacy.reproducible_noise=true",
                     "train.rounds=4", "train.eval_every=2")
    real = ClientRuntime.train

    def breaking(self, client_ids, start, round_index, purpose, steps=None, broadcast=None):  # type: ignore[no-untyped-def]
        result = real(self, client_ids, start, round_index, purpose, steps, broadcast)
        if round_index == 1 and len(client_ids):
            result.delta[0, 0] = float("nan")
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ClientRuntime, "train", breaking)
        simulator = Simulator(config, tmp_path / "run", progress=False)
        result = simulator.run()
    names = simulator.setup.federation.client_names
    status = json.loads((tmp_path / "run" / "status.json").read_text())["reason"]
    for told in (result.status, status, (tmp_path / "run" / "summary.json").read_text()):
        assert "round 2: non-finite (NaN/Inf) update from a client of the round's secret cohort" in told
        assert "more clients per round" in told and "adaptive clipping" in told
        assert not any(f"client(s) {name}" in told or f"from client {name}" in told for name in names)


# ---- the pre-flight: public quantities in what is shared, the measurement where nobody reads it ------------------
def test_the_noise_check_measures_updates_against_the_smaller_of_their_median_and_the_clip() -> None:
    """Clipped updates are at most the clip, so the signal the noise is weighed against is min(median norm, clip):
    updates far below the clip make a noise that clipped-size updates would outweigh too large."""
    from graphfed.client.privacy import noise_warning

    plan = PrivacyPlan("central", clip_norm=1.0, noise_multiplier=1.0, delta=1e-5, accountant="pld", rounds=50,
                       sampling_rate=0.5)
    args = (plan, 100, 20, 50, 10.0)  # dim, cohort, rounds, weights far larger than the noise's drift
    assert noise_warning(*args) is None  # updates at the clip outweigh the noise
    small = noise_warning(*args, typical_norm=0.01)
    assert small is not None and "more than updates of norm 0.01" in small
    assert noise_warning(*args, typical_norm=100.0) is None  # larger than the clip: the clip bounds them


def test_the_noise_levers_leave_out_more_clients_per_round_when_every_client_takes_part() -> None:
    from graphfed.client.privacy import noise_levers, noise_warning

    assert noise_levers(all_take_part=False).startswith("more clients per round")
    assert "more clients per round" not in noise_levers(all_take_part=True)
    plan = PrivacyPlan("local", clip_norm=1.0, noise_multiplier=50.0, delta=1e-5, accountant="pld", rounds=10,
                       sampling_rate=None)
    warned = noise_warning(plan, 1000, 4, 10, 0.01, all_take_part=True)
    assert warned is not None and warned.startswith("the noise may be too large for the model to learn")
    assert "more clients per round" not in warned and "if the model does not beat its trivial predictor" in warned


def test_no_shareable_file_of_a_central_run_holds_a_statistic_of_the_raw_updates(
        make_config: ConfigFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The audit's repro: spy the first cohort's median update norm the trusted server measures; neither the log
    nor any file the docs call shareable holds it in any printed form, private_diagnostics.json does (for the
    researcher), and the summary lists that file outside the guarantee."""
    from graphfed.sim.stages import NoiseCheck

    config = private(make_config, "central", "privacy.noise_multiplier=0.06", "privacy.clip_norm=5.0",
                     "train.rounds=4", "train.eval_every=2")
    measure, spied = NoiseCheck.measure, []

    def spying(self: NoiseCheck, delta: torch.Tensor):  # type: ignore[no-untyped-def]
        measured = measure(self, delta)
        if measured is not None:
            spied.append(float(measured["median_update_norm"]))
        return measured

    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as patch, caplog.at_level("INFO", logger="graphfed"):
        patch.setattr(NoiseCheck, "measure", spying)
        result = Simulator(config, out, progress=False).run()
    (median,) = spied
    # as any output would print it (3 significant digits and more), as a whole number: not inside a longer one
    forms = [re.compile(rf"(?<![\d.]){re.escape(text)}(?!\d)")
             for text in {f"{median:{spec}}" for spec in (".3g", ".4g", ".6g", "g")} | {repr(median)}]
    shareable = ["config.yaml", "summary.json", "rounds.jsonl", "metrics.csv", "privacy.json", "status.json"]
    texts = {name: (out / name).read_text() for name in shareable if (out / name).exists()} | {"log": caplog.text}
    assert set(texts) >= {"summary.json", "rounds.jsonl", "privacy.json", "log"}
    for name, text in texts.items():
        assert not any(form.search(text) for form in forms), f"{name} holds the median update norm {median}"
    diagnostics = json.loads((out / "private_diagnostics.json").read_text())["noise_check"]
    assert diagnostics["median_update_norm"] == median and diagnostics["round"] >= 1
    # the noise outweighs what updates of the median norm add up to, though not what clip-sized ones would
    assert median < 5.0 and diagnostics["warning"] is not None and f"norm {median:.3g} (" in diagnostics["warning"]
    assert any(item.startswith("private_diagnostics.json") for item in result.privacy["outside_the_guarantee"])
    assert result.privacy["noise_check"]["warning"] is None or "median" not in result.privacy["noise_check"]["warning"]


@pytest.mark.parametrize(("seed", "learned"), [(0, True), (2, False)])
def test_the_pre_flight_warning_is_logged_once_and_flagged_only_where_the_model_did_not_learn(
        make_config: ConfigFactory, caplog: pytest.LogCaptureFixture, seed: int, learned: bool) -> None:
    """Strong local noise drawn from the seed: the pre-flight's one line, once in the log; the run's flags point to it
    only when its trained clients then do not beat their trivial predictors (seed 2's), never beside a model that
    learned (seed 0's beats them)."""
    noisy = private(make_config, "local", "privacy.noise_multiplier=50", "privacy.reproducible_noise=true",
                    "train.rounds=4", "train.eval_every=2", f"seed={seed}")
    with caplog.at_level("INFO", logger="graphfed"):
        result = Simulator(noisy, progress=False).run()
    assert caplog.text.count("the noise may be too large for the model to learn") == 1
    assert result.test_mean is not None and result.trivial_test_mean is not None
    assert (result.test_mean > result.trivial_test_mean) is learned
    pointer = [flag for flag in result.flags if "as the privacy pre-flight warned" in flag]
    assert len(pointer) == (0 if learned else 1)
    assert result.privacy["noise_check"]["warning"].startswith("the noise may be too large")
