"""Per-client results (every evaluation, by name; the summary at the selected round beside each client's trivial
predictor), early stopping on validation, and ``graphfed show``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import ConfigFactory, read_rounds
from graphfed.cli import app
from graphfed.data import build_federation
from graphfed.export import client_model
from graphfed.runs import RunResult
from graphfed.sim.engine import Simulator


def test_every_evaluation_records_each_client_and_the_summary_keeps_the_selected_round(
        make_config: ConfigFactory, tmp_path: Path) -> None:
    config = make_config("fedavg", "dataset.novel_fraction=0.25")
    result = Simulator(config, tmp_path, progress=False).run()
    fed = build_federation(config.dataset, config.seed)
    records = read_rounds(tmp_path)
    assert all(set(record["per_client"]) == set(fed.client_names) for record in records)
    best = next(record for record in records if record["round"] == result.best_round)
    training = [fed.client_names[int(i)] for i in fed.train_client_ids]
    # the headline is the mean of the training clients' own scores, which the summary lists by name
    assert result.test_mean == pytest.approx(np.mean([result.per_client[name]["test"] for name in training]))
    assert all(result.per_client[name]["test"] == best["per_client"][name]["test"] for name in fed.client_names)
    novel = [fed.client_names[int(i)] for i in fed.novel_client_ids]
    assert novel and all(result.per_client[name]["novel"] for name in novel)
    # the trivial reference, recomputed by hand: the majority class of the client's training rows on its test rows
    for client in range(fed.num_clients):
        _, train_y = fed.train.client(client)
        _, test_y = fed.test.client(client)
        majority = int(np.bincount(train_y.numpy()).argmax())
        expected = float((test_y.numpy() == majority).mean())
        assert result.per_client[fed.client_names[client]]["trivial_test"] == pytest.approx(expected)
    assert result.trivial_test_mean == pytest.approx(np.mean([result.per_client[n]["trivial_test"] for n in training]))


def test_a_regression_clients_trivial_predictor_is_its_mean_target(make_config: ConfigFactory) -> None:
    config = make_config("local", "dataset.name=tpt48", "dataset.num_clients=null", "model.options={}",
                         "dataset.novel_fraction=0.0", "train.rounds=2", "train.eval_every=2")
    result = Simulator(config, progress=False).run()
    fed = build_federation(config.dataset, config.seed)
    _, train_y = fed.train.client(3)
    _, test_y = fed.test.client(3)
    expected = float(((test_y.double() - train_y.double().mean(dim=0)) ** 2).mean())
    assert result.per_client[fed.client_names[3]]["trivial_test"] == pytest.approx(expected, rel=1e-5)


def test_early_stopping_stops_where_the_rule_says_on_the_recorded_scores(make_config: ConfigFactory,
                                                                        tmp_path: Path) -> None:
    """``train.patience`` evaluations in a row without a validation gain above ``min_delta`` end the run there; the
    stopping round is recomputed from the recorded validation scores, and the summary says so."""
    patience, min_delta = 2, 0.02
    config = make_config("fedavg", "train.rounds=60", "train.eval_every=2", f"train.patience={patience}",
                         f"train.min_delta={min_delta}")
    result = Simulator(config, tmp_path, progress=False).run()
    records = read_rounds(tmp_path)
    best, waited, expected_stop = None, 0, None
    for record in records:
        value = record["val_mean"]
        if best is not None:
            waited = 0 if value - best > min_delta else waited + 1
        best = value if best is None else max(best, value)
        if waited >= patience:
            expected_stop = record["round"]
            break
    assert expected_stop is not None and expected_stop < 60  # this seeded run does stop early
    assert result.rounds == records[-1]["round"] == expected_stop
    assert result.stopped_early == {"round": expected_stop, "patience": patience, "min_delta": min_delta}
    assert result.status == "completed"
    never = Simulator(make_config("fedavg", "train.rounds=12", "train.eval_every=2"), progress=False).run()
    assert never.rounds == 12 and never.stopped_early is None


def test_show_prints_each_client_beside_its_trivial_predictor(make_config: ConfigFactory, tmp_path: Path) -> None:
    result = Simulator(make_config("fedavg"), tmp_path, progress=False).run()
    shown = CliRunner().invoke(app, ["show", str(tmp_path), "--all"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "gain over trivial" in text and "trivial predictors" in text
    assert all(name in shown.output for name in result.per_client)
    missing = CliRunner().invoke(app, ["show", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no summary.json" in missing.stderr


def _accuracy(network: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((network(x).argmax(dim=-1) == y).float().mean())


def test_the_saved_models_reproduce_every_clients_score_and_export_and_predict_reproduce_them(
        make_config: ConfigFactory, tmp_path: Path) -> None:
    """``models/best.pt`` holds the models behind the selected round's numbers: rebuilt client by client they give
    each reported score; ``graphfed export`` rebuilt in a fresh process gives it again, and ``graphfed predict`` on a
    CSV of the client's test rows gives the same predictions."""
    config = make_config("ditto", "dataset.novel_fraction=0.25")  # personal models kept in client state
    run_dir = tmp_path / "run"
    result = Simulator(config, run_dir, progress=False).run()
    assert result.models_note is None
    fed = build_federation(config.dataset, config.seed)
    for i, name in enumerate(fed.client_names):
        x, y = fed.test.client(i)
        assert _accuracy(client_model(run_dir, name), x, y) == pytest.approx(result.per_client[name]["test"], abs=1e-6)
    client = fed.client_names[int(fed.novel_client_ids[0])]  # a novel client: the method's model for it
    x, y = fed.test.client(int(fed.novel_client_ids[0]))
    exported = tmp_path / "client.pt"
    assert CliRunner().invoke(app, ["export", str(run_dir), "--client", client, "--out", str(exported)]).exit_code == 0
    np.savez(tmp_path / "rows.npz", x=x.numpy(), y=y.numpy())
    script = ("import sys, numpy as np, torch\nfrom graphfed.export import load_exported\n"
              "net = load_exported(sys.argv[1]); rows = np.load(sys.argv[2])\n"
              "with torch.no_grad(): out = net(torch.from_numpy(rows['x']))\n"
              "print(float((out.argmax(-1).numpy() == rows['y']).mean()))\n")
    fresh = subprocess.run([sys.executable, "-c", script, str(exported), str(tmp_path / "rows.npz")],
                           capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    assert float(fresh.stdout) == pytest.approx(result.per_client[client]["test"], abs=1e-6)
    (tmp_path / "rows.csv").write_text("f0,f1\n" + "".join(f"{a:.9g},{b:.9g}\n" for a, b in x.tolist()))
    predicted = CliRunner().invoke(app, ["predict", str(run_dir), "--client", client, "--input",
                                         str(tmp_path / "rows.csv"), "--out", str(tmp_path / "pred.csv")])
    assert predicted.exit_code == 0, predicted.output
    labels = np.loadtxt(tmp_path / "pred.csv", delimiter=",", skiprows=1, ndmin=2)[:, 0]
    assert np.mean(labels == y.numpy()) == pytest.approx(result.per_client[client]["test"], abs=1e-6)


def test_a_method_whose_clients_evaluate_their_own_forward_says_why_nothing_is_exported(
        make_config: ConfigFactory, tmp_path: Path) -> None:
    result = Simulator(make_config("knn-per"), tmp_path, progress=False).run()
    assert "evaluate a network or forward of their own" in result.models_note
    refused = CliRunner().invoke(app, ["export", str(tmp_path), "--client", "0", "--out", str(tmp_path / "x.pt")])
    assert refused.exit_code == 2 and "the run saved no models: knn-per's clients evaluate" in refused.stderr


def test_inspect_warns_of_a_dominant_client_only_far_above_its_fair_share() -> None:
    from graphfed.report.federation import size_stats

    balanced = size_stats(torch.tensor([100, 100, 100]), ["a", "b", "c"])
    assert balanced.dominant == []  # a third each is the fair share, not domination
    skewed = size_stats(torch.tensor([600, 150, 150, 100]), ["big", "b", "c", "d"])
    assert [name for name, _, _ in skewed.dominant] == ["big"]  # 60 % of four clients' rows
    tail = size_stats(torch.tensor([5000] + [100] * 40), ["big"] + [f"c{i}" for i in range(40)])
    assert [name for name, _, _ in tail.dominant] == ["big"]  # 50x the median client


def _binary_hospitals(root: Path) -> Path:
    """Four hospitals, a binary diagnosis that depends on the first feature (and a shift per hospital)."""
    from graphfed.data.datasets.folder import write_federation

    rng = np.random.default_rng(4)
    clients = {}
    for h, shift in enumerate((0.0, 0.5, -0.5, 1.0)):
        clients[f"hospital-{h}"] = {}
        for split, rows in (("train", 60), ("val", 20), ("test", 30)):
            x = rng.normal(size=(rows, 4))
            y = (x[:, 0] + shift + 0.5 * rng.normal(size=rows) > 0).astype(np.int64)
            clients[f"hospital-{h}"][split] = (x, y)
    return write_federation(root / "hospitals", clients, meta={"task": "classification"})


def test_chosen_metrics_are_scikit_learns_on_each_clients_saved_predictions(make_config: ConfigFactory,
                                                                             tmp_path: Path) -> None:
    """A binary folder federation scored with AUROC (and the rest): each client's value equals scikit-learn's on
    that client's predictions from the saved model; ``select_by`` picks the round by validation AUROC."""
    from sklearn.metrics import balanced_accuracy_score, recall_score, roc_auc_score

    folder = _binary_hospitals(tmp_path)
    config = make_config("fedavg", "dataset.name=folder", f"dataset.data_dir={folder}", "dataset.num_clients=null",
                         "dataset.novel_fraction=0.0", "train.metrics=[auroc, balanced_accuracy, sensitivity]",
                         "train.select_by=auroc", "train.threshold=0.4")
    result = Simulator(config, tmp_path / "run", progress=False).run()
    assert result.select_by == "auroc" and set(result.metrics) == {"auroc", "balanced_accuracy", "sensitivity"}
    fed = build_federation(config.dataset, config.seed)
    for i, name in enumerate(fed.client_names):
        x, y = fed.test.client(i)
        with torch.no_grad():
            p1 = client_model(tmp_path / "run", name)(x).softmax(-1)[:, 1].numpy()
        scores = result.per_client[name]
        assert scores["test_auroc"] == pytest.approx(roc_auc_score(y.numpy(), p1), abs=1e-6)
        assert scores["test_balanced_accuracy"] == pytest.approx(
            balanced_accuracy_score(y.numpy(), (p1 >= 0.5).astype(int)), abs=1e-6)
        assert scores["test_sensitivity"] == pytest.approx(recall_score(y.numpy(), (p1 >= 0.4).astype(int)), abs=1e-6)
    assert result.metrics["auroc"]["test_mean"] == pytest.approx(
        np.mean([result.per_client[n]["test_auroc"] for n in fed.client_names]))
    records = read_rounds(tmp_path / "run")
    assert result.best_round == max(records, key=lambda r: r["val_auroc_mean"])["round"]


def test_metrics_that_do_not_fit_the_task_are_one_line_errors(make_config: ConfigFactory) -> None:
    from graphfed.config import ConfigError

    with pytest.raises(ConfigError, match=r"sensitivity need a binary task; fln has 2 classes|do not apply"):
        Simulator(make_config("fedavg", "train.metrics=[rmse]"), progress=False)
    with pytest.raises(ConfigError, match=r"knn-per clients evaluate a network or forward of their own"):
        Simulator(make_config("knn-per", "train.metrics=[auroc]"), progress=False)
    with pytest.raises(ConfigError, match=r"train.select_by: 'auroc' is not scored"):
        make_config("fedavg", "train.select_by=auroc")


def test_compare_puts_methods_and_variants_in_one_table(make_config: ConfigFactory, tmp_path: Path) -> None:
    """``--variant LABEL:KEY=VALUE,...`` rows sit beside ``--methods`` rows (here Panacea with the given graph and
    with a kNN graph); one seed prints n=1, never a spread of zero."""
    from conftest import tiny_overrides

    sets = [arg for override in tiny_overrides("fedavg") for arg in ("--set", override)]
    result = CliRunner().invoke(app, [
        "compare", "configs/demo_fl60.yaml", *sets, "--methods", "fedavg", "--out", str(tmp_path), "--no-progress",
        "--variant", "panacea-knn:method.name=panacea,dataset.graph=knn,method.options={server_steps: 1}",
        "--variant", "panacea-given:method.name=panacea,method.options={server_steps: 1}", "--per-client"])
    assert result.exit_code == 0, result.output
    table = (tmp_path / "compare.md").read_text()
    assert all(f"| {label} |" in table for label in ("fedavg", "panacea-knn", "panacea-given"))
    assert "(n=1)" in table and "± 0.00" not in table
    knn = RunResult.model_validate_json((tmp_path / "panacea-knn" / "seed0" / "summary.json").read_text())
    given = RunResult.model_validate_json((tmp_path / "panacea-given" / "seed0" / "summary.json").read_text())
    assert knn.client_graph["source"] == "knn" and given.client_graph["source"] == "given"
    bad = CliRunner().invoke(app, ["compare", "configs/demo_fl60.yaml", "--variant", "../up:train.rounds=2",
                                   "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "give LABEL:KEY=VALUE" in bad.stderr and not (tmp_path / "bad").exists()


def test_under_attack_compare_heads_its_table_with_the_honest_clients(tmp_path: Path) -> None:
    """With malicious clients the headline is the honest clients' score, the attackers' score and the attack success
    rate beside it (the all-clients mean mixes the attackers in)."""
    from conftest import tiny_overrides

    sets = [arg for override in tiny_overrides("fedavg", "attack.kind=label_flip", "attack.count=3")
            for arg in ("--set", override)]
    result = CliRunner().invoke(app, ["compare", "configs/demo_fl60.yaml", *sets, "--methods", "fedavg,local",
                                      "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    table = (tmp_path / "compare.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| method"))
    assert header.split(" | ")[1].startswith("honest clients' test") and "malicious clients' test" in header
    fedavg = RunResult.model_validate_json((tmp_path / "fedavg" / "seed0" / "summary.json").read_text())
    row = next(line for line in table.splitlines() if line.startswith("| fedavg |"))
    assert row.split(" | ")[1].startswith(f"{100 * fedavg.honest_test_mean:.2f}")


def test_a_folders_target_scale_puts_the_mae_in_its_own_units(make_config: ConfigFactory, tmp_path: Path) -> None:
    from graphfed.data.datasets.folder import write_federation
    from graphfed.errors import ConfigError

    rng = np.random.default_rng(5)
    clients = {f"station-{k}": {split: (rng.normal(size=(rows, 3)), rng.normal(size=rows))
                                for split, rows in (("train", 30), ("val", 10), ("test", 10))} for k in range(4)}
    folder = write_federation(tmp_path / "air", clients, meta={"task": "regression", "target_scale": 12.5,
                                                                "target_units": "µg/m³"})
    config = make_config("local", "dataset.name=folder", f"dataset.data_dir={folder}", "dataset.num_clients=null",
                         "dataset.novel_fraction=0.0")
    result = Simulator(config, progress=False).run()
    assert result.test_mae_original_units == pytest.approx(12.5 * result.test_mae)
    (folder / "meta.yaml").write_text("task: regression\ntarget_scale: true\n")
    with pytest.raises(ConfigError, match=r"meta.yaml: target_scale must be a positive number"):
        build_federation(config.dataset, 0)


def test_a_folders_meta_yaml_chooses_the_metrics_and_the_round_when_the_config_does_not(
        make_config: ConfigFactory, tmp_path: Path) -> None:
    """meta.yaml ``metrics`` and ``select_by`` are the data owner's choice: scored and used to pick the round when
    the run's config names none; the config's own choice wins; a metric that does not fit is one line naming
    meta.yaml."""
    from graphfed.data.datasets.folder import write_federation
    from graphfed.errors import ConfigError

    folder = _binary_hospitals(tmp_path)
    (folder / "meta.yaml").write_text("task: classification\nmetrics: [auroc, sensitivity]\nselect_by: auroc\n")
    base = ["dataset.name=folder", f"dataset.data_dir={folder}", "dataset.num_clients=null",
            "dataset.novel_fraction=0.0"]
    result = Simulator(make_config("fedavg", *base), tmp_path / "run", progress=False).run()
    assert result.select_by == "auroc" and set(result.metrics or {}) == {"auroc", "sensitivity"}
    records = read_rounds(tmp_path / "run")
    assert result.best_round == max(records, key=lambda r: r["val_auroc_mean"])["round"]
    own = Simulator(make_config("fedavg", *base, "train.metrics=[macro_f1]", "train.select_by=accuracy"),
                    progress=False).run()
    assert own.select_by == "accuracy" and set(own.metrics or {}) == {"macro_f1"}
    regression = write_federation(tmp_path / "air", {f"s{k}": {split: (np.ones((6, 2)), np.arange(6) / 6.0)
                                                                for split in ("train", "val", "test")}
                                                     for k in range(3)},
                                  meta={"task": "regression", "metrics": ["auroc"]})
    with pytest.raises(ConfigError, match=r"metrics in air's meta.yaml: auroc do not apply to regression"):
        Simulator(make_config("fedavg", "dataset.name=folder", f"dataset.data_dir={regression}",
                              "dataset.num_clients=null", "dataset.novel_fraction=0.0"), progress=False)
