"""Malicious clients (graphfed.attacks) and defences (graphfed.attacks.defenses) in the simulator.

Every attack must change exactly the malicious clients' data or uploads: honest rows are compared bit for bit with
a clean run. Robust aggregators are checked against naive per-coordinate loops and against Flower's own
implementations, and against a scaled update that breaks plain FedAvg.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphfed.attacks import build_attack
from graphfed.attacks.backdoor import blend
from graphfed.attacks.defenses import clip_updates, coordinate_median, krum_select, robust_aggregate, trimmed_mean
from graphfed.attacks.label_flip import flip_map
from graphfed.config import AttackConfig, ConfigError, dump_config, load_config
from graphfed.setup import build_setup
from graphfed.sim.engine import run_config

DIGITS = ["dataset.name=digits", "dataset.num_clients=10", "dataset.partition=iid", "model.name=mlp",
          "model.options={hidden: 32}", "train.local_steps=10", "train.batch_size=32", "train.clients_per_round=10",
          "train.eval_every=10", "train.lr=0.1"]
FLN = ["dataset.name=fln", "dataset.num_clients=12", "model.options={hidden: 8}", "train.local_steps=5",
       "train.batch_size=16", "train.clients_per_round=12", "train.eval_every=5"]


def setup_of(*overrides: str):
    return build_setup(load_config(None, list(overrides)))


def one_round(setup, start: torch.Tensor | None = None):
    """Every training client's first-round update from the same start weights."""
    ids = setup.federation.train_client_ids
    sent = setup.method.personalize(ids).detach() if start is None else start
    return ids, setup.client_executor(setup.config.seed).train(ids, sent, 0, "local_training")


# ---- who is malicious ---------------------------------------------------------------------------------------------

def test_malicious_clients_are_a_seeded_share_of_the_training_clients_and_recorded() -> None:
    config = load_config(None, [*FLN, "dataset.novel_fraction=0.25", "method.name=fedavg", "train.rounds=5",
                                "attack.kind=sign_flip", "attack.fraction=0.3"])
    setup = build_setup(config)
    attack = setup.clients.attack
    train_ids = setup.federation.train_client_ids
    assert int(attack.malicious.sum()) == round(0.3 * len(train_ids)) == 3
    assert not attack.malicious[setup.federation.novel_client_ids].any()  # novel clients never train
    again = build_setup(config).clients.attack
    assert torch.equal(attack.malicious, again.malicious)
    summary = run_config(config, progress=False)
    names = [setup.federation.client_names[int(i)] for i in attack.malicious_client_ids]
    assert summary.attack["kind"] == "sign_flip" and summary.attack["malicious_clients"] == names
    assert summary.honest_test_mean is not None and summary.malicious_test_mean is not None


def test_named_malicious_clients_and_their_errors() -> None:
    setup = setup_of(*FLN, "method.name=fedavg", "attack.kind=sign_flip", "attack.clients=['2', '7']")
    assert setup.clients.attack.malicious_client_ids.tolist() == [2, 7]
    with pytest.raises(ConfigError, match=r"attack.clients: .*'nobody'.* are not clients"):
        setup_of(*FLN, "method.name=fedavg", "attack.kind=sign_flip", "attack.clients=[nobody]")
    novel = setup_of(*FLN, "dataset.novel_fraction=0.25").federation.novel_client_ids[0]
    with pytest.raises(ConfigError, match=r"novel clients, which never train"):
        setup_of(*FLN, "dataset.novel_fraction=0.25", "attack.kind=sign_flip", f"attack.clients=['{int(novel)}']")
    with pytest.raises(ConfigError, match=r"leave none of the 12 training clients honest"):
        setup_of(*FLN, "attack.kind=sign_flip", "attack.count=12")
    with pytest.raises(ConfigError, match=r"attack.fraction: Input should be less than or equal to 0.5"):
        load_config(None, ["attack.fraction=0.6"])
    with pytest.raises(ConfigError, match=r"attack.clients and attack.count both"):
        load_config(None, ["attack.count=1", "attack.clients=['1']"])
    with pytest.raises(ConfigError, match=r"attack.kind: Input should be"):
        load_config(None, ["attack.kind=ddos"])


def test_data_attacks_on_regression_and_a_target_outside_the_classes_are_refused() -> None:
    from graphfed.data.federation import ClientSplit, Federation

    split = ClientSplit.from_lists([torch.zeros(3, 2)] * 2, [torch.zeros(3, 1)] * 2, "regression")
    regression = Federation("toy", "regression", split, split, split, (2,), 1, metric="mse")
    with pytest.raises(ConfigError, match=r"label_flip rewrites labels; toy is a regression task"):
        build_attack(AttackConfig(kind="label_flip", count=1), regression, 0)
    digits = setup_of(*DIGITS).federation
    with pytest.raises(ConfigError, match=r"attack.target: 10 is not a class of digits"):
        build_attack(AttackConfig(kind="backdoor", count=1, target=10), digits, 0)


def test_a_config_without_an_attack_reads_as_before_and_one_with_an_attack_round_trips() -> None:
    plain = load_config(None, [])
    assert "attack" not in dump_config(plain) and "defense" not in dump_config(plain)
    attacked = load_config(None, ["attack.kind=backdoor", "attack.count=1", "defense.simple_tuning=true"])
    text = dump_config(attacked)
    import yaml

    assert load_config(None, []).model_validate(yaml.safe_load(text)) == attacked


# ---- data attacks -------------------------------------------------------------------------------------------------

def test_label_flip_rewrites_exactly_the_malicious_clients_training_labels() -> None:
    clean = setup_of(*DIGITS).clients.federation
    setup = setup_of(*DIGITS, "attack.kind=label_flip", "attack.fraction=0.3")
    attacked, malicious = setup.clients.federation, setup.clients.attack.malicious
    owner, rows = clean.train.row_owners()
    bad = malicious[owner]
    assert int(malicious.sum()) == 3
    assert torch.equal(attacked.train.x, clean.train.x)
    assert torch.equal(attacked.train.y[rows[~bad]], clean.train.y[rows[~bad]])  # honest rows bit-identical
    assert torch.equal(attacked.train.y[rows[bad]], 9 - clean.train.y[rows[bad]])  # y -> C - 1 - y
    for split in ("val", "test"):  # every score is measured on true data
        assert torch.equal(getattr(attacked, split).y, getattr(clean, split).y)


def test_a_permutation_flip_is_a_fixed_derangement() -> None:
    for seed in range(20):
        mapping = flip_map(10, "permutation", torch.Generator().manual_seed(seed))
        assert sorted(mapping.tolist()) == list(range(10))
        assert not (mapping == torch.arange(10)).any()
    setup = setup_of(*DIGITS, "attack.kind=label_flip", "attack.flip=permutation", "attack.count=2")
    assert torch.equal(setup.clients.federation.train.y, setup_of(*DIGITS, "attack.kind=label_flip",
                                                                  "attack.flip=permutation",
                                                                  "attack.count=2").clients.federation.train.y)


def test_the_backdoor_blends_the_trigger_into_half_of_an_attackers_rows_and_relabels_them() -> None:
    clean = setup_of(*DIGITS).clients.federation
    setup = setup_of(*DIGITS, "attack.kind=backdoor", "attack.count=1")
    attacked, attacker = setup.clients.federation, int(setup.clients.attack.malicious_client_ids[0])
    owner, rows = clean.train.row_owners()
    mine = rows[owner == attacker]
    others = rows[owner != attacker]
    assert torch.equal(attacked.train.x[others], clean.train.x[others])
    assert torch.equal(attacked.train.y[others], clean.train.y[others])
    changed = (attacked.train.x[mine] != clean.train.x[mine]).any(1)
    assert int(changed.sum()) == round(0.5 * len(mine))
    assert (attacked.train.y[mine][changed] == 1).all()
    assert torch.equal(attacked.train.y[mine][~changed], clean.train.y[mine][~changed])
    # x' = 0.8 x + 0.2 trigger: the trigger is the same for every poisoned row
    triggers = (attacked.train.x[mine][changed] - 0.8 * clean.train.x[mine][changed]) / 0.2
    assert torch.allclose(triggers, triggers[:1].expand_as(triggers), atol=1e-4)
    # the ASR split: every client's non-target test rows, triggered, labelled with the target
    backdoor, test = attacked.backdoor_test, clean.test
    assert backdoor is not None and (backdoor.y == 1).all()
    assert torch.equal(backdoor.counts, torch.stack([(test.client(i)[1] != 1).sum() for i in range(10)]))
    x0, _ = test.client(0)
    assert torch.allclose(backdoor.client(0)[0], blend(x0[test.client(0)[1] != 1], triggers[0], 0.2), atol=1e-4)


@pytest.mark.parametrize("kind", ["label_flip", "backdoor"])
def test_data_attacks_leave_honest_updates_bit_identical_and_change_the_malicious_ones(kind: str) -> None:
    clean_setup = setup_of(*DIGITS, "method.name=fedavg")
    setup = setup_of(*DIGITS, "method.name=fedavg", f"attack.kind={kind}", "attack.count=3")
    ids, clean = one_round(clean_setup)
    _, attacked = one_round(setup, clean_setup.method.personalize(ids).detach())
    bad = setup.clients.attack.malicious[ids]
    assert torch.equal(attacked.delta[~bad], clean.delta[~bad])
    assert (attacked.delta[bad] != clean.delta[bad]).any(1).all()


# ---- update attacks -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "forged"), [("model_poisoning", lambda d: -0.5 * d), ("sign_flip", lambda d: -d),
                                              ("scaling", lambda d: 10 * d)])
def test_update_attacks_forge_exactly_the_malicious_uploads(kind: str, forged) -> None:
    clean_setup = setup_of(*FLN, "method.name=fedavg")
    setup = setup_of(*FLN, "method.name=fedavg", f"attack.kind={kind}", "attack.fraction=0.25")
    ids, clean = one_round(clean_setup)
    _, attacked = one_round(setup)
    bad = setup.clients.attack.malicious[ids]
    assert int(bad.sum()) == 3
    assert torch.equal(attacked.delta[~bad], clean.delta[~bad])
    assert torch.equal(attacked.delta[bad], forged(clean.delta[bad]))
    for name, value in clean.metrics.items():  # an attacker reports its honest losses and counts
        assert torch.equal(attacked.metrics[name], value)


def test_gaussian_noise_uploads_seeded_noise_of_the_given_scale() -> None:
    setup = setup_of(*FLN, "method.name=fedavg", "attack.kind=gaussian_noise", "attack.count=4",
                     "attack.noise_std=0.5", "model.options={hidden: 64}")
    ids, attacked = one_round(setup)
    bad = setup.clients.attack.malicious[ids]
    noise = attacked.delta[bad]
    assert abs(float(noise.std()) - 0.5) < 0.02 and abs(float(noise.mean())) < 0.02
    assert not torch.equal(noise[0], noise[1])  # each client draws its own
    _, again = one_round(setup_of(*FLN, "method.name=fedavg", "attack.kind=gaussian_noise", "attack.count=4",
                                  "attack.noise_std=0.5", "model.options={hidden: 64}"))
    assert torch.equal(again.delta, attacked.delta)


def test_attacks_do_not_touch_novel_client_adaptation() -> None:
    setup = setup_of(*FLN, "dataset.novel_fraction=0.25", "method.name=pfedhn", "attack.kind=scaling",
                     "attack.count=3")
    executor = setup.client_executor(0)
    ids = setup.federation.train_client_ids[setup.clients.attack.malicious[setup.federation.train_client_ids]]
    sent = setup.method.personalize(ids).detach()
    adapted = executor.train(ids, sent, 0, "novel").delta
    clean = setup_of(*FLN, "dataset.novel_fraction=0.25", "method.name=pfedhn").client_executor(0)
    assert torch.equal(adapted, clean.train(ids, sent, 0, "novel").delta)


# ---- attack success rate ------------------------------------------------------------------------------------------

def test_asr_is_the_share_of_triggered_rows_classified_as_the_target() -> None:
    setup = setup_of(*DIGITS, "method.name=fedavg", "attack.kind=backdoor", "attack.count=0")
    executor, spec = setup.client_executor(0), setup.spec
    ids = torch.arange(10)
    weights = setup.method.eval_weights(ids).clone()
    bias = next(t for t in spec.tensors if t.name == setup.model.head_names[-1])
    never, always = weights.clone(), weights.clone()
    never[:, bias.offset + 1] = -1e4  # the target's logit can never win
    always[:, bias.offset + 1] = 1e4  # the target always wins
    assert float(executor.evaluate(ids, never, 0)["backdoor_test"].metric.max()) == 0.0
    assert float(executor.evaluate(ids, always, 0)["backdoor_test"].metric.min()) == 1.0


def test_asr_is_low_for_a_clean_model_and_high_for_a_model_trained_on_triggered_rows() -> None:
    """A clean FedAvg model (no attacker) rarely maps triggered digits to the target; the attacker's Local model,
    trained on its own rows with half of them triggered, maps nearly all of them there and still classifies its
    clean test rows."""
    clean = run_config(load_config(None, [*DIGITS, "method.name=fedavg", "train.rounds=30", "attack.kind=backdoor",
                                          "attack.count=0"]), progress=False)
    assert clean.test_mean > 0.85 and clean.asr_mean < 0.05
    attacked = run_config(load_config(None, [*DIGITS, "method.name=local", "train.rounds=30", "attack.kind=backdoor",
                                             "attack.count=1", "train.local_steps=20"]), progress=False)
    assert attacked.asr_malicious > 0.8
    assert attacked.asr_honest < 0.05  # Local: nothing of the attacker reaches the others
    assert attacked.malicious_test_mean > 0.5


# ---- robust aggregation -------------------------------------------------------------------------------------------

def naive(updates: np.ndarray, reduce) -> np.ndarray:
    """``reduce`` applied to each coordinate's column, one coordinate at a time."""
    return np.array([reduce(updates[:, j]) for j in range(updates.shape[1])])


@pytest.mark.parametrize("n", [5, 6])
def test_median_and_trimmed_mean_match_naive_loops_and_flower(n: int) -> None:
    from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

    updates = torch.randn(n, 7, generator=torch.Generator().manual_seed(n))
    as_numpy = updates.double().numpy()
    median = coordinate_median(updates)
    assert np.allclose(median, naive(as_numpy, np.median), atol=1e-6)
    assert np.allclose(median, aggregate_median([([u], 1) for u in as_numpy])[0], atol=1e-6)
    for beta in (0.0, 0.2, 0.4):
        cut = int(beta * n)
        expected = naive(as_numpy, lambda column, cut=cut: np.sort(column)[cut:n - cut].mean())
        assert np.allclose(trimmed_mean(updates, beta), expected, atol=1e-6)
        assert np.allclose(trimmed_mean(updates, beta), aggregate_trimmed_avg([([u], 1) for u in as_numpy], beta)[0],
                           atol=1e-6)


def test_krum_and_multikrum_match_a_naive_loop_and_flower() -> None:
    from flwr.server.strategy.aggregate import aggregate_krum

    updates = torch.randn(7, 5, generator=torch.Generator().manual_seed(3))
    counts = torch.tensor([10.0, 20, 30, 40, 50, 60, 70])
    for f in (0, 1, 2):
        closest = max(1, 7 - f - 2)
        scores = [sorted(float((updates[i] - updates[j]).pow(2).sum()) for j in range(7) if j != i)[:closest]
                  for i in range(7)]
        best = int(np.argmin([sum(s) for s in scores]))
        assert krum_select(updates, f, 1).tolist() == [best]
        results = [([u.double().numpy()], int(c)) for u, c in zip(updates, counts, strict=True)]
        assert np.allclose(robust_aggregate(updates, counts, "krum", num_malicious_nodes=f),
                           aggregate_krum(results, f, 0)[0], atol=1e-6)
        assert np.allclose(robust_aggregate(updates, counts, "multikrum", num_malicious_nodes=f, num_nodes_to_select=3),
                           aggregate_krum(results, f, 3)[0], atol=1e-6)


def test_clipping_bounds_every_update_and_keeps_small_ones() -> None:
    updates = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    assert torch.allclose(clip_updates(updates, 1.0), torch.tensor([[0.6, 0.8], [0.3, 0.4]]))


def test_robust_aggregators_resist_a_scaled_update_that_breaks_fedavg() -> None:
    honest = torch.ones(5, 4) + 0.01 * torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    attacked = torch.cat([honest, -100 * torch.ones(1, 4)])
    counts = torch.full((6,), 10.0)
    assert float((robust_aggregate(attacked, counts) - 1).abs().max()) > 10  # FedAvg is dragged away
    for name, options in [("fedmedian", {}), ("fedtrimmedavg", {"beta": 0.2}), ("krum", {"num_malicious_nodes": 1}),
                          ("multikrum", {"num_malicious_nodes": 1, "num_nodes_to_select": 3})]:
        assert float((robust_aggregate(attacked, counts, name, **options) - 1).abs().max()) < 0.05, name
    clipped = robust_aggregate(attacked, counts, clipping_norm=2.0)
    assert float(clipped.norm()) <= 2.0 + 1e-5


def test_fedavg_with_a_median_survives_scaled_updates_that_break_plain_fedavg() -> None:
    base = [*FLN, "method.name=fedavg", "train.rounds=20", "attack.kind=model_poisoning", "attack.fraction=0.25",
            "attack.poison_lambda=20"]
    plain = run_config(load_config(None, base), progress=False)
    median = run_config(load_config(None, [*base, "method.options={aggregation: fedmedian}"]), progress=False)
    clean = run_config(load_config(None, [*base[:-3]]), progress=False)
    assert median.honest_test_mean > plain.honest_test_mean + 0.1
    assert median.honest_test_mean > clean.test_mean - 0.1


def test_ditto_and_other_fedavg_family_methods_take_the_aggregation_option() -> None:
    setup = setup_of(*FLN, "method.name=ditto", "method.options={aggregation: fedtrimmedavg, beta: 0.25}")
    assert setup.method.options.aggregation == "fedtrimmedavg"
    with pytest.raises(ConfigError, match=r"method.options.aggregation"):
        load_config(None, ["method.name=fedavg", "method.options={aggregation: bulyan}"])
    with pytest.raises(ConfigError, match=r"method.options.aggregation: Extra inputs"):
        load_config(None, ["method.name=panacea", "method.options={aggregation: fedmedian}"])


# ---- Simple-Tuning -------------------------------------------------------------------------------------------------

def test_simple_tuning_retrains_only_the_head_of_trained_clients_from_its_initialisation() -> None:
    base = [*DIGITS, "dataset.novel_fraction=0.2", "method.name=fedavg", "train.clients_per_round=4"]
    tuned_setup = setup_of(*base, "defense.simple_tuning=true", "defense.tuning_steps=5")
    plain_setup = setup_of(*base)
    ids = torch.arange(10)
    trained_ids = tuned_setup.federation.train_client_ids[:4]
    results = []
    for setup in (plain_setup, tuned_setup):
        executor = setup.client_executor(0)
        executor.train(trained_ids, setup.method.personalize(trained_ids).detach(), 0, "local_training")
        results.append(executor.evaluation_weights(ids, setup.method.eval_weights(ids), 0))
    plain, tuned = results
    spec = tuned_setup.spec
    head = torch.cat([torch.arange(t.offset, t.offset + t.numel) for t in spec.tensors
                      if t.name in tuned_setup.model.head_names])
    body = torch.ones(spec.dim, dtype=torch.bool)
    body[head] = False
    assert torch.equal(tuned[:, body], plain[:, body])  # the body is untouched
    untouched = torch.ones(10, dtype=torch.bool)
    untouched[trained_ids] = False
    assert torch.equal(tuned[untouched], plain[untouched])  # clients that never trained evaluate what they receive
    assert (tuned[trained_ids][:, head] != plain[trained_ids][:, head]).any(1).all()
    # retrained from the initial head, not from the trained one: zero steps would give the initial head back
    zero_steps = setup_of(*base, "defense.simple_tuning=true", "defense.tuning_steps=1",
                          "defense.tuning_lr=0.000000000001")
    executor = zero_steps.client_executor(0)
    executor.train(trained_ids, zero_steps.method.personalize(trained_ids).detach(), 0, "local_training")
    barely = executor.evaluation_weights(ids, zero_steps.method.eval_weights(ids), 0)
    assert torch.allclose(barely[trained_ids][:, head], zero_steps.clients.init_weights[head].expand(4, -1),
                          atol=1e-6)


def test_simple_tuning_is_refused_for_mixed_architectures() -> None:
    with pytest.raises(ConfigError, match=r"defense.simple_tuning: clients of different architectures"):
        load_config(None, ["model.name=resnet-like", "model.architectures=[arch0, arch1]", "method.name=local",
                           "defense.simple_tuning=true", "dataset.name=digits"])


def test_the_robustness_report_is_regenerated_from_its_run_directories() -> None:
    """``benchmarks/results/robustness/report.md`` is exactly what ``benchmarks/robustness.py`` writes from the
    committed ``runs/*/*/seed*/summary.json`` (no hand-edited number)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import robustness

    assert (robustness.RESULTS / "report.md").read_text() == robustness.render()


def test_the_robustness_sweep_verdict_follows_the_test() -> None:
    """Made-up standings: a method that beats the subject at one ratio sinks the claim; beating half of the others
    everywhere with no loss holds; short of half with trailing, undecided methods gives the seeds they would need;
    short of half with no method trailing it says more seeds cannot help."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import robustness
    from graphfed.report.verdicts import Comparison

    def standing(*outcomes: tuple[str, float, int | None]) -> robustness.Standing:
        comparisons = [Comparison(f"m{i}", outcome, 0.5, 90.0 + lead, 90.0, 10, 10, needed)
                       for i, (outcome, lead, needed) in enumerate(outcomes)]
        return robustness.Standing(comparisons, [10] * (len(outcomes) + 1))

    wins = standing(("beats", 5, None), ("beats", 5, None), ("undecided", 1, 40), ("undecided", -1, 60))
    assert wins.short_of_half == 0
    assert robustness.sweep_verdict([(10, wins), (20, wins)]) == "holds"
    lost = standing(("beats", 5, None), ("beats", 5, None), ("loses", -5, None), ("undecided", 1, 40))
    assert robustness.sweep_verdict([(10, wins), (20, lost)]) == "does not hold here"
    short = standing(("beats", 5, None), ("undecided", 1, 40), ("undecided", 2, 25), ("undecided", -1, 60))
    assert short.short_of_half == 1 and short.seeds_to_half() == 25  # the cheapest lead it has
    assert robustness.sweep_verdict([(10, wins), (20, short)]) == (
        "partly (loses to none, beats fewer than half at some ratio); ~25 seeds per method would decide the rest")
    trailing_none = standing(("undecided", -1, 30), ("undecided", -2, 20), ("undecided", -1, 30), ("beats", 5, None))
    assert trailing_none.seeds_to_half() is None
    assert robustness.sweep_verdict([(30, trailing_none)]).endswith(
        "at 30 % too few methods trail it for more seeds to reach half")
    nothing = standing(("undecided", 1, 30), ("undecided", 1, 20), ("undecided", -1, 30), ("undecided", 1, 50))
    assert robustness.sweep_verdict([(40, nothing)]) == (
        "inconclusive; ~30 seeds per method would decide the rest")


def test_an_attacked_run_with_simple_tuning_resumes_bit_identically(tmp_path, monkeypatch) -> None:
    """The malicious set, the forged noise and Simple-Tuning are drawn from (seed, round, client) streams: a run
    interrupted after a checkpoint and resumed gives the uninterrupted run's summary."""
    from conftest import without_wall_time
    from graphfed.sim.checkpoint import load_checkpoint
    from test_engine import interrupt_at

    config = load_config(None, [*FLN, "method.name=ditto", "train.rounds=8", "train.eval_every=2",
                                "train.checkpoint_every=4", "train.clients_per_round=5", "attack.kind=gaussian_noise",
                                "attack.fraction=0.25", "defense.simple_tuning=true", "defense.tuning_steps=3"])
    clean = run_config(config, tmp_path / "clean", progress=False)
    interrupt_at(monkeypatch, 6)
    with pytest.raises(KeyboardInterrupt):
        run_config(config, tmp_path / "resumed", progress=False)
    assert load_checkpoint(tmp_path / "resumed")["completed_rounds"] == 4
    monkeypatch.undo()
    resumed = run_config(config, tmp_path / "resumed", resume=True, progress=False)
    assert without_wall_time(resumed) == without_wall_time(clean)
    assert clean.attack["malicious_clients"] and clean.defense["simple_tuning"] is True
