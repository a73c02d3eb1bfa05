"""What a practitioner concludes from their own tabular federation: raw features of very different scales are
flagged and fixed by ``dataset.standardize``, a run below its trivial predictors says so, and regression numbers are
read in the units the federation declares."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from graphfed.cli import app
from graphfed.config import load_config
from graphfed.data.datasets.folder import write_federation
from graphfed.report.tables import in_declared_units, plain
from graphfed.runs import read_result
from graphfed.sim.engine import run_config

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
#: every command's settings: four clients, every client every round
SMALL = ["--set", "dataset.novel_fraction=0", "--set", "train.rounds=20", "--set", "train.clients_per_round=4",
         "--set", "train.eval_every=5", "--set", "model.options={hidden: 16}", "--no-progress"]


def invoke(*args: object) -> object:
    return CliRunner().invoke(app, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def hospitals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four hospitals whose label is a small marker (about 0.002) beside raw cholesterol (about 300) and age
    (about 55); half the hospitals have mostly positive patients, half mostly negative, so a model that cannot
    read the marker predicts one class for all and half the clients fall below their majority-class predictor
    (the federation ``benchmarks/standardize.py`` measures the scalings on)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("standardize", BENCHMARKS / "standardize.py")
    assert spec is not None and spec.loader is not None
    standardize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standardize)
    return standardize.hospitals_marker(tmp_path_factory.mktemp("hospitals") / "fed")


def test_inspect_flags_features_of_very_different_scales(hospitals: Path) -> None:
    result = invoke("inspect", hospitals)
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "the features' scales differ by" in text and "cholesterol: std" in text and "marker: std" in text
    assert "dataset.standardize: pooled, or client under DP" in text
    standardized = invoke("inspect", "--config", "demo", "--set", "dataset.name=folder", "--set",
                          f"dataset.data_dir={hospitals}", "--set", "dataset.standardize=client")
    assert standardized.exit_code == 0 and "scales differ" not in standardized.output


def test_a_run_below_its_trivial_predictors_says_so_and_standardising_fixes_it(hospitals: Path,
                                                                               tmp_path: Path) -> None:
    raw = invoke("run", "demo", "--set", "dataset.name=folder", "--set", f"dataset.data_dir={hospitals}", *SMALL,
                 "--set", "method.name=fedavg", "--out", tmp_path / "raw")
    assert raw.exit_code == 0, raw.output
    text = " ".join(raw.output.split())
    assert "(below trivial)" in text and "trained client(s) scoring below their trivial predictor" in text
    summary = read_result(tmp_path / "raw")
    assert summary.test_mean is not None and summary.trivial_test_mean is not None
    assert summary.test_mean < summary.trivial_test_mean
    fixed = invoke("run", "demo", "--set", "dataset.name=folder", "--set", f"dataset.data_dir={hospitals}", *SMALL,
                   "--set", "method.name=fedavg", "--set", "dataset.standardize=client", "--out", tmp_path / "scaled")
    assert fixed.exit_code == 0 and "(below trivial)" not in fixed.output and "scoring below" not in fixed.output
    scaled = read_result(tmp_path / "scaled")
    assert scaled.test_mean is not None and scaled.test_mean > 0.9 > summary.trivial_test_mean
    # the comparison says it too: a column, a marker and a closing line
    compared = invoke("compare", "demo", "--methods", "fedavg", "--seeds", 1, "--set", "dataset.name=folder",
                      "--set", f"dataset.data_dir={hospitals}", *SMALL, "--out", tmp_path / "cmp")
    assert compared.exit_code == 0, compared.output
    assert "(below trivial)" in compared.output and "its trained clients score below their trivial predictors" in \
        " ".join(compared.output.split())


def test_each_client_is_scaled_by_its_own_training_rows_and_predict_scales_the_same(hospitals: Path,
                                                                                    tmp_path: Path) -> None:
    """``client``: every client's training features at mean 0 and std 1 (its val/test rows by the same numbers);
    ``predict`` on new rows applies that client's own statistics before its model."""
    import torch

    from graphfed.data import build_federation
    from graphfed.export import client_model

    config = load_config(None, ["dataset.name=folder", f"dataset.data_dir={hospitals}", "dataset.novel_fraction=0",
                                "dataset.standardize=client", "train.rounds=2", "train.eval_every=1"])
    fed = build_federation(config.dataset, config.seed)
    for i in range(fed.num_clients):
        x = fed.train.client(i)[0].double()
        torch.testing.assert_close(x.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-5, rtol=0)
        torch.testing.assert_close(x.std(0, unbiased=False), torch.ones(3, dtype=torch.float64), atol=1e-4, rtol=0)
    raw = build_federation(config.dataset.model_copy(update={"standardize": "none"}), config.seed)
    run_config(config, tmp_path / "run", progress=False)
    new_rows = raw.test.client(1)[0][:5]
    (tmp_path / "rows.csv").write_text("cholesterol,age,marker\n" + "".join(
        ",".join(repr(float(v)) for v in row) + "\n" for row in new_rows.tolist()))
    done = invoke("predict", tmp_path / "run", "--client", "hospital1", "--input", tmp_path / "rows.csv",
                  "--out", tmp_path / "p.csv")
    assert done.exit_code == 0, done.output
    got = [row for row in csv.DictReader((tmp_path / "p.csv").open())]
    with torch.no_grad():
        expected = client_model(tmp_path / "run", "hospital1")(fed.test.client(1)[0][:5]).softmax(-1)
    assert [int(row["prediction"]) for row in got] == expected.argmax(1).tolist()
    assert [float(row["p1"]) for row in got] == pytest.approx(expected[:, 1].tolist(), rel=1e-4)


def test_pooled_standardisation_reads_the_training_clients_rows_only(hospitals: Path) -> None:
    """``pooled``: one mean and spread for everyone, from the training clients' training rows; a novel client's rows
    never enter them (it is held out of training), though it is scaled by them too."""
    import torch

    from graphfed.data import build_federation

    config = load_config(None, ["dataset.name=folder", f"dataset.data_dir={hospitals}",
                                "dataset.novel_clients=[hospital3]", "dataset.standardize=pooled"])
    fed = build_federation(config.dataset, config.seed)
    raw = build_federation(config.dataset.model_copy(update={"standardize": "none"}), config.seed)
    assert fed.input_scaling is not None and fed.client_names[3] == "hospital3" and bool(fed.novel_mask[3])
    training = torch.cat([raw.train.client(i)[0] for i in range(3)]).double()
    everyone = torch.cat([raw.train.client(i)[0] for i in range(4)]).double()
    assert (training.mean(0) - everyone.mean(0)).abs().max() > 1e-3  # the novel client's rows would show
    for i in range(4):
        torch.testing.assert_close(fed.input_scaling.mean[i], training.mean(0), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(fed.input_scaling.spread[i], training.std(0, unbiased=False), rtol=1e-9,
                                   atol=1e-9)
    scaled = fed.test.client(3)[0].double()
    torch.testing.assert_close(scaled, ((raw.test.client(3)[0].double() - training.mean(0))
                                        / training.std(0, unbiased=False)), rtol=1e-5, atol=1e-5)


def test_pooled_standardisation_is_refused_under_privacy(hospitals: Path) -> None:
    result = invoke("run", "demo", "--set", "dataset.name=folder", "--set", f"dataset.data_dir={hospitals}",
                    "--set", "dataset.standardize=pooled", "--set", "privacy.mechanism=local", "--set",
                    "privacy.noise_multiplier=1.0", "--out", "unused")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "dataset.standardize=pooled" in result.output and "dataset.standardize=client" in result.output


@pytest.fixture(scope="module")
def stations(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three air-quality stations whose targets are stored divided by 100 (meta.yaml: target_scale 100, in ug/m3)."""
    rng = np.random.default_rng(1)
    clients = {}
    for c in range(3):
        splits = {}
        for split, n in (("train", 80), ("val", 20), ("test", 30)):
            x = rng.standard_normal((n, 2)).astype(np.float32)
            splits[split] = (x, (0.2 + 0.05 * x[:, 0] + 0.02 * c).astype(np.float32))
        clients[f"station{c}"] = splits
    return write_federation(tmp_path_factory.mktemp("stations") / "fed", clients, meta={
        "task": "regression", "target_scale": 100, "target_units": "ug/m3"}, fmt="csv")


def test_regression_outputs_are_in_the_declared_units(stations: Path, tmp_path: Path) -> None:
    base = ["--set", "dataset.name=folder", "--set", f"dataset.data_dir={stations}", "--set",
            "dataset.novel_fraction=0", "--set", "train.rounds=4", "--set", "train.eval_every=2", "--no-progress"]
    assert invoke("run", "demo", *base, "--set", "method.name=fedavg", "--out", tmp_path / "run").exit_code == 0
    stored = read_result(tmp_path / "run")
    assert (stored.target_scale, stored.target_units) == (100.0, "ug/m3")
    shown = in_declared_units(stored)
    assert shown.test_mean == pytest.approx(stored.test_mean * 100 ** 2)  # an MSE scales by the square
    assert all(shown.per_client[name]["test"] == pytest.approx(stored.per_client[name]["test"] * 1e4)
               for name in stored.per_client)
    show = " ".join(invoke("show", tmp_path / "run").output.split())
    assert f"test mse {plain(shown.test_mean)} (ug/m3)²" in show
    compared = invoke("compare", "demo", *base, "--methods", "fedavg", "--seeds", 2, "--set", "train.metrics=[mae]",
                      "--per-client", "--out", tmp_path / "cmp")
    assert compared.exit_code == 0 and "(ug/m3)²" in compared.output
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert "in (ug/m3)², the units the federation declares" in markdown
    # the chosen MAE and every per-client number in the declared units too, under headers that say so
    assert "test mae (ug/m3)" in markdown and "| client | test MSE ↓ (ug/m3)² |" in markdown
    seeds = [read_result(tmp_path / "cmp" / "fedavg" / f"seed{seed}") for seed in (0, 1)]
    by_client = {row["client"]: row for row in csv.DictReader((tmp_path / "cmp" / "per_client.csv").open())}
    stored = sum(run.per_client["station0"]["test"] for run in seeds) / 2
    assert float(by_client["station0"]["test_mean"]) == pytest.approx(stored * 1e4, rel=1e-9)
    stored_mae = sum(run.per_client["station0"]["test_mae"] for run in seeds) / 2
    assert float(by_client["station0"]["mae_mean"]) == pytest.approx(stored_mae * 100, rel=1e-9)
    (tmp_path / "rows.csv").write_text("x0,x1\n1.0,0.0\n")
    assert invoke("predict", tmp_path / "run", "--client", "station0", "--input", tmp_path / "rows.csv",
                  "--out", tmp_path / "p.csv").exit_code == 0
    header, value = (tmp_path / "p.csv").read_text().splitlines()
    assert header == "y0 (ug/m3)" and 10 < float(value) < 40  # about 25 ug/m3, not 0.25 as stored
    inspected = " ".join(invoke("inspect", stations).output.split())
    assert "target mean ± std (ug/m3)" in inspected


def test_errors_print_in_plain_decimals() -> None:
    assert [plain(v) for v in (0.2447, 20.81, 1234.5, 0.0004, 123456.0, 0.0)] == [
        "0.2447", "20.81", "1234", "4.000e-04", "123,456", "0"]


def test_a_csv_federation_has_the_platforms_line_ends(hospitals: Path) -> None:
    """``write_federation(fmt="csv")`` ends its lines as this platform's CSV readers expect (no stray CR on Linux)."""
    import os

    data = (hospitals / "clients" / "hospital0" / "train.csv").read_bytes()
    assert data.count(os.linesep.encode()) == 121 and (os.linesep == "\r\n" or b"\r" not in data)
