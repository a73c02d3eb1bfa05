"""What leaves a run as a deployed model: an exported file that carries everything between a raw row and its answer
(feature scaling, feature and class names, declared target units), loaded in a fresh process from another folder
with the training federation moved away, answers as ``graphfed predict`` does; ``predict`` needs only the run."""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from graphfed.cli import app
from graphfed.config import load_config
from graphfed.data import build_federation
from graphfed.data.datasets.folder import write_federation
from graphfed.errors import DataError, UntrustedInputError
from graphfed.export import client_model, load_exported, read_rows
from graphfed.runs import read_status
from graphfed.sim.engine import run_config

#: feature scales of 1, 100 and 1000 (with offsets): unscaled, the network reads only the third
SCALES, OFFSETS = np.array([1.0, 100.0, 1000.0]), np.array([0.0, 50.0, 5000.0])


def invoke(*args: object) -> object:
    return CliRunner().invoke(app, [str(arg) for arg in args])


def write_sites(root: Path) -> Path:
    """Four sites whose label is a signed sum of three standardised features, stored at scales 1, 100 and 1000 and
    shifted per site."""
    rng = np.random.default_rng(0)
    clients = {}
    for c in range(4):
        splits = {}
        for split, n in (("train", 100), ("val", 30), ("test", 40)):
            z = rng.standard_normal((n, 3))
            y = ((z[:, 0] + z[:, 1] - z[:, 2] + 0.3 * c) > 0).astype(np.int64)
            x = z * SCALES + OFFSETS + np.array([0.0, 20.0 * c, 100.0 * c])
            splits[split] = (x.astype(np.float32), y)
        clients[f"site{c}"] = splits
    return write_federation(root, clients, meta={"features": ["a", "b", "c"], "classes": ["healthy", "sick"]},
                            fmt="csv")


def read_probabilities(path: Path) -> tuple[list[str], np.ndarray]:
    rows = list(csv.DictReader(path.open()))
    return [row["class"] for row in rows], np.array([[float(row["p0"]), float(row["p1"])] for row in rows])


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A standardised run on the sites, started in its own folder with a relative data_dir, and site1's export."""
    root = tmp_path_factory.mktemp("deploy")
    fed = write_sites(root / "fed")
    before = Path.cwd()
    os.chdir(root)
    try:
        config = load_config(None, ["dataset.name=folder", "dataset.data_dir=fed", "dataset.novel_fraction=0",
                                    "dataset.standardize=client", "method.name=fedavg", "train.rounds=20",
                                    "train.clients_per_round=4", "train.eval_every=5", "model.options={hidden: 16}"])
        run_config(config, root / "run", progress=False)
        assert invoke("export", root / "run", "--client", "site1", "--out", root / "site1.pt").exit_code == 0
    finally:
        os.chdir(before)
    return {"root": root, "fed": fed, "run": root / "run", "export": root / "site1.pt"}


def test_an_exported_model_answers_raw_rows_as_predict_does_with_the_training_data_moved_away(
        deployed: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = deployed["root"]
    config = load_config(None, ["dataset.name=folder", f"dataset.data_dir={deployed['fed']}",
                                "dataset.novel_fraction=0", "dataset.standardize=client"])
    scaled = build_federation(config.dataset, config.seed)
    raw = build_federation(config.dataset.model_copy(update={"standardize": "none"}), config.seed)
    raw_rows, scaled_rows = raw.test.client(1)[0][:8], scaled.test.client(1)[0][:8]
    with torch.no_grad():  # the network as the run scored it, on the rows as the run stored them
        expected = client_model(deployed["run"], "site1")(scaled_rows).softmax(-1).numpy()
    moved = tmp_path / "fed_elsewhere"
    shutil.move(deployed["fed"], moved)
    try:
        elsewhere = tmp_path / "another_folder"
        elsewhere.mkdir()
        monkeypatch.chdir(elsewhere)
        # the header in another order, with an id column: read by name
        table = io.StringIO()
        table.write("id,c,a,b\n")
        for k, row in enumerate(raw_rows.tolist()):
            table.write(f"{k},{row[2]!r},{row[0]!r},{row[1]!r}\n")
        (elsewhere / "rows.csv").write_text(table.getvalue())
        done = invoke("predict", deployed["run"], "--client", "site1", "--input", "rows.csv", "--out", "p.csv")
        assert done.exit_code == 0, done.output
        names, predicted = read_probabilities(elsewhere / "p.csv")
        np.testing.assert_allclose(predicted, expected, atol=1e-5)
        assert names == [["healthy", "sick"][k] for k in expected.argmax(1)]
        np.save(elsewhere / "raw.npy", raw_rows.numpy())
        script = ("import sys, numpy as np, torch\nfrom graphfed.export import load_exported\n"
                  "model = load_exported(sys.argv[1])\n"
                  "with torch.no_grad(): p = model(torch.from_numpy(np.load(sys.argv[2])))\n"
                  "print(model.class_names, model.feature_names)\nnp.save(sys.argv[3], p.numpy())\n")
        fresh = subprocess.run([sys.executable, "-c", script, str(deployed["export"]), "raw.npy", "fresh.npy"],
                               capture_output=True, text=True, timeout=120, cwd=elsewhere)
        assert fresh.returncode == 0, fresh.stderr
        assert fresh.stdout.strip() == "['healthy', 'sick'] ['a', 'b', 'c']"
        np.testing.assert_allclose(np.load(elsewhere / "fresh.npy"), predicted, atol=1e-4)
        # and the run's own scaling is what it applies: the rows as stored give other answers
        assert np.abs(load_exported(deployed["export"])(raw_rows).detach().numpy() - expected).max() < 1e-5
        assert np.abs(expected - client_model(deployed["run"], "site1")(raw_rows).softmax(-1).detach().numpy()
                      ).max() > 0.1
    finally:
        shutil.move(moved, deployed["fed"])
    assert read_status(deployed["run"])["started_in"] == str(root)


def test_a_run_saved_before_its_scaling_was_stored_rebuilds_it_from_where_the_run_started(
        deployed: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older run's models/best.pt has no ``inputs``: predict rebuilds the scaling from the federation, its
    relative data_dir resolved against the folder the run was started in (status.json), not the current one."""
    run = tmp_path / "old_run"
    shutil.copytree(deployed["run"], run)
    saved = torch.load(run / "models" / "best.pt", weights_only=True)
    saved["model"] = {key: value for key, value in saved["model"].items() if key not in ("inputs", "outputs")}
    torch.save(saved, run / "models" / "best.pt")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.csv").write_text("a,b,c\n0.5,120,5300\n-1,40,4200\n")
    args = ("--client", "site1", "--input", "rows.csv")
    assert invoke("predict", run, *args, "--out", "old.csv").exit_code == 0
    assert invoke("predict", deployed["run"], *args, "--out", "new.csv").exit_code == 0
    new = np.loadtxt("new.csv", delimiter=",", skiprows=1, usecols=(2, 3))
    np.testing.assert_allclose(np.loadtxt("old.csv", delimiter=",", skiprows=1, usecols=(1, 2)), new, atol=1e-5)


def test_a_deployed_file_is_checked_like_any_untrusted_input(deployed: dict[str, Path], tmp_path: Path) -> None:
    saved = torch.load(deployed["export"], weights_only=True)
    saved["model"]["inputs"]["spread"] = torch.zeros(3, dtype=torch.float64)
    torch.save(saved, tmp_path / "bad.pt")
    with pytest.raises(UntrustedInputError, match="finite means and positive spreads"):
        load_exported(tmp_path / "bad.pt")
    (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match=r"no column\(s\) c; the model reads a, b, c"):
        read_rows(tmp_path / "rows.csv", (3,), ["a", "b", "c"])
