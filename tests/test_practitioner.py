"""What a practitioner's federation needs: one novel-client protocol for every method, mixing only trained models,
novel clients chosen by name, the client graph as a choice, tables that name their metric."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from conftest import read_rounds
from graphfed.config import ConfigError, load_config
from graphfed.data import build_federation
from graphfed.data.datasets.folder import write_example_federation
from graphfed.methods import METHODS
from graphfed.methods.aggregation import PersonalizedAggregation
from graphfed.runs import read_result
from graphfed.setup import build_setup
from graphfed.sim.engine import run_config

FLN = ["dataset.name=fln", "dataset.num_clients=12", "model.options={hidden: 8}", "train.local_steps=5",
       "train.batch_size=16", "train.clients_per_round=4", "train.eval_every=2", "train.rounds=6",
       "train.novel_adapt_rounds=0"]
AGGREGATION_FAMILY = sorted(name for name, cls in METHODS.items() if issubclass(cls, PersonalizedAggregation))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_example_federation(tmp_path / "fed", num_clients=8)


# ---- one novel-client protocol ------------------------------------------------------------------------------------

def test_fedavg_ft_scores_novel_clients_as_fedavg_does(tmp_path: Path) -> None:
    """No fine-tuning for a client that never trained: FedAvg-FT's novel clients evaluate the global model they
    receive, exactly FedAvg's, at every evaluated round (its own clients fine-tune, so its test scores differ)."""
    base = [*FLN, "dataset.novel_fraction=0.25"]
    run_config(load_config(None, [*base, "method.name=fedavg"]), tmp_path / "fedavg", progress=False)
    run_config(load_config(None, [*base, "method.name=fedavg-ft"]), tmp_path / "ft", progress=False)
    plain, tuned = read_rounds(tmp_path / "fedavg"), read_rounds(tmp_path / "ft")
    assert [r["novel_mean"] for r in plain] == [r["novel_mean"] for r in tuned]
    assert [r["test_mean"] for r in plain] != [r["test_mean"] for r in tuned]


def test_local_reports_no_novel_score_and_says_why() -> None:
    summary = run_config(load_config(None, [*FLN, "dataset.novel_fraction=0.25", "method.name=local"]),
                         progress=False)
    assert summary.novel_mean is None and summary.num_novel_clients == 3
    assert "never trained has no model" in summary.novel_none_reason
    fedavg = run_config(load_config(None, [*FLN, "dataset.novel_fraction=0.25", "method.name=fedavg"]),
                        progress=False)
    assert fedavg.novel_mean is not None and fedavg.novel_none_reason is None


@pytest.mark.parametrize("method", AGGREGATION_FAMILY)
def test_aggregation_methods_give_never_trained_clients_no_weight(method: str) -> None:
    """After a round in which 4 of 12 clients trained (3 more are novel), every mixing row, for trained, untrained
    and novel clients alike, gives weight 0 to the clients that never trained, and each row still sums to 1."""
    setup = build_setup(load_config(None, [*FLN, "dataset.novel_fraction=0.25", f"method.name={method}"]))
    executor = setup.client_executor(0)
    ids = setup.federation.train_client_ids[:4]
    sent = setup.method.personalize(ids).detach()
    result = executor.train(ids, sent, 0, "local_training")
    setup.method.update(result.client_ids, sent, result.delta, result.metrics)
    graph = setup.method.collaboration_graph()
    untrained = torch.ones(12, dtype=torch.bool)
    untrained[ids] = False
    assert torch.equal(graph[..., untrained], torch.zeros_like(graph[..., untrained]))
    assert torch.allclose(graph.sum(-1), torch.ones(graph.shape[:-1]), atol=1e-5)
    # what a novel client receives is a mix of the trained models only
    novel = setup.federation.novel_client_ids
    weights = setup.method.eval_weights(novel)
    trained_models = setup.method.client_weights[ids]
    assert not torch.allclose(weights, setup.clients.init_weights.expand_as(weights))
    assert torch.allclose(setup.method.personalize(novel).detach(), weights)
    assert trained_models.shape[0] == 4


# ---- novel clients chosen by name ---------------------------------------------------------------------------------

def test_named_novel_clients_are_the_same_under_every_seed(folder: Path) -> None:
    base = ["dataset.name=folder", f"dataset.data_dir={folder}", "dataset.novel_clients=[client3, client6]"]
    for seed in (0, 1, 2):
        fed = build_federation(load_config(None, [*base, f"seed={seed}"]).dataset, seed)
        assert [fed.client_names[int(i)] for i in fed.novel_client_ids] == ["client3", "client6"]
    with pytest.raises(ConfigError, match=r"dataset.novel_clients: \['clientX'\] are not clients of"):
        build_federation(load_config(None, ["dataset.name=folder", f"dataset.data_dir={folder}",
                                            "dataset.novel_clients=[clientX]"]).dataset, 0)
    with pytest.raises(ConfigError, match=r"dataset.novel_clients and dataset.novel_fraction both"):
        load_config(None, [*base, "dataset.novel_fraction=0.2"])
    digits = build_federation(load_config(None, ["dataset.name=digits", "dataset.num_clients=5",
                                                 "dataset.novel_clients=['4']"]).dataset, 0)
    assert digits.novel_client_ids.tolist() == [4]
    fl60 = build_federation(load_config(None, ["dataset.novel_clients=[3, 17]"]).dataset, 0)  # names as numbers
    assert fl60.novel_client_ids.tolist() == [3, 17]


def test_a_run_names_its_novel_clients_and_warns_a_small_federation(folder: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    base = ["dataset.name=folder", f"dataset.data_dir={folder}", "method.name=fedavg", "train.rounds=2",
            "train.eval_every=1", "train.local_steps=2", "train.clients_per_round=2"]
    with caplog.at_level(logging.INFO, logger="graphfed"):
        summary = run_config(load_config(None, [*base, "dataset.novel_fraction=0.2"]), progress=False)
    novel = summary.novel_clients
    assert len(novel) == 2
    assert f"novel clients (held out of training): {', '.join(novel)}" in caplog.text
    assert "holds out 2 of only 8 clients" in caplog.text and "dataset.novel_clients" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="graphfed"):
        run_config(load_config(None, [*base, "dataset.novel_clients=[client1]"]), progress=False)
    assert "novel clients (held out of training): client1" in caplog.text
    assert "holds out" not in caplog.text


# ---- the graph as a choice -----------------------------------------------------------------------------------------

def test_the_client_graph_is_one_setting(folder: Path) -> None:
    """A folder's graph.csv is used by default; dataset.graph=none drops it (Panacea then infers one from updates);
    dataset.graph=knn links each client to its k most similar by data; the summary records which."""
    base = ["dataset.name=folder", f"dataset.data_dir={folder}", "method.name=panacea", "train.rounds=2",
            "train.eval_every=1", "train.local_steps=2", "train.clients_per_round=2",
            "method.options={embedding_dim: 4, gnn_hidden: 8, hypernet_hidden: 8, server_steps: 1}"]
    given = run_config(load_config(None, base), progress=False)
    assert given.client_graph == {"source": "given", "edges": 7}  # two chains of 4 and one bridge
    dropped = run_config(load_config(None, [*base, "dataset.graph=none"]), progress=False)
    assert dropped.client_graph == {"source": "none", "edges": 0}
    assert any("inferring one" in note for note in dropped.notes)
    knn = build_federation(load_config(None, [*base, "dataset.graph=knn", "dataset.graph_k=2"]).dataset, 0)
    assert knn.client_graph is not None and torch.equal(knn.client_graph, knn.client_graph.T)
    assert bool((knn.client_graph.sum(1) >= 2).all())
    # clients of the same label-skew group (even / odd ids) are each other's nearest by data
    same_group = sum(float(knn.client_graph[i, j]) for i in range(8) for j in range(8) if (i - j) % 2 == 0)
    assert same_group / float(knn.client_graph.sum()) > 0.75
    summary = run_config(load_config(None, [*base, "dataset.graph=knn", "dataset.graph_k=2"]), progress=False)
    assert summary.client_graph["source"] == "knn"
    assert json.loads(json.dumps(summary.to_json()))["client_graph"]["edges"] == int(knn.client_graph.sum()) // 2


# ---- reading results ----------------------------------------------------------------------------------------------

def test_compare_names_the_metric_and_prints_full_values_without_a_terminal(folder: Path, tmp_path: Path) -> None:
    """A regression folder: compare.md and the printed table say MSE and that lower is better; the title is the
    folder's own name (meta.yaml); piped output (no terminal) is never cut to 80 columns."""
    from typer.testing import CliRunner

    from graphfed import cli
    from graphfed.data.datasets.folder import write_federation
    from graphfed.report.tables import plain

    rng = torch.Generator().manual_seed(0)
    clients = {f"station{i}": {split: (torch.randn(rows, 3, generator=rng).numpy(),
                                       (100 + torch.randn(rows, 1, generator=rng)).numpy())
                               for split, rows in (("train", 30), ("val", 10), ("test", 10))} for i in range(4)}
    air = write_federation(tmp_path / "air", clients, meta={"name": "city-air", "task": "regression"})
    config = tmp_path / "air.yaml"
    config.write_text(f"dataset: {{name: folder, data_dir: '{air}'}}\nmodel: {{options: {{hidden: 4}}}}\n"
                      "train: {rounds: 2, eval_every: 1, local_steps: 2, clients_per_round: 4}\n")
    result = CliRunner().invoke(cli.app, ["compare", str(config), "--methods", "fedavg,local", "--out",
                                          str(tmp_path / "cmp"), "--no-progress"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "city-air: personalised MSE ↓" in result.stdout and "folder:" not in result.stdout
    assert "…" not in result.stdout  # full values: nothing cut to fit 80 columns
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert markdown.startswith("Metric: MSE (lower is better)")
    assert "| method | test MSE ↓ (mean ± sample std over seeds) |" in markdown
    summaries = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert plain(summaries['fedavg'][0]['test_mean']) in result.stdout  # in full, plain decimals


def test_accuracy_tables_say_percent_and_higher_is_better() -> None:
    from graphfed.report.tables import headers, metric_label, metric_note

    assert metric_label("accuracy") == "accuracy % ↑" and metric_label("mse") == "MSE ↓"
    assert headers("accuracy")[1] == "test accuracy % ↑ (mean ± sample std over seeds)"
    assert "higher is better" in metric_note("accuracy") and "fraction" in metric_note("accuracy")


def test_collaboration_heatmaps_label_clients_by_name_and_mark_novel_ones(folder: Path, tmp_path: Path) -> None:
    from graphfed.report.plots import plot_graphs
    from graphfed.runs import load_graph_clients

    out = tmp_path / "run"
    run_config(load_config(None, ["dataset.name=folder", f"dataset.data_dir={folder}", "method.name=fedaghn",
                                  "dataset.novel_clients=[client5]", "train.rounds=2", "train.eval_every=1",
                                  "train.local_steps=2", "train.clients_per_round=3"]), out, progress=False)
    names, novel = load_graph_clients(out)
    assert names == [f"client{i}" for i in range(8)] and novel.tolist() == [i == 5 for i in range(8)]
    assert all(path.is_file() for path in plot_graphs(out))
    import matplotlib.pyplot as plt

    from graphfed.report.plots import _client_axes

    figure, axis = plt.subplots()
    axis.imshow(torch.rand(8, 8).numpy())
    _client_axes(axis, 8, (names, novel))
    labels = axis.get_xticklabels()
    assert [label.get_text() for label in labels] == [f"client{i}" + ("*" if i == 5 else "") for i in range(8)]
    assert [label.get_color() for label in labels].count("tab:red") == 1
    plt.close(figure)


def test_inspect_reports_size_imbalance_and_warns_about_a_dominant_client(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from graphfed import cli
    from graphfed.data.datasets.folder import write_federation
    from graphfed.report.federation import size_stats

    rng = torch.Generator().manual_seed(0)
    sizes = {"metro-a": 20, "metro-b": 22, "metro-c": 24, "hub": 600}
    clients = {name: {split: (torch.randn(rows, 2, generator=rng).numpy(), torch.randint(0, 2, (rows,)).numpy())
                      for split in ("train", "val", "test")} for name, rows in sizes.items()}
    root = write_federation(tmp_path / "metro", clients, meta={"name": "metro"})
    result = CliRunner().invoke(cli.app, ["inspect", str(root)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "20 / 23 / 600 (largest: hub, 90% of all rows, 26.1x the median)" in text
    assert "warning: client hub holds 600 training rows (90% of all" in text
    assert "metro-a holds" not in text
    stats = size_stats(torch.tensor([20, 22, 24, 600]), list(sizes))
    assert [name for name, _, _ in stats.dominant] == ["hub"]


# ---- datasets as plugins ------------------------------------------------------------------------------------------

def test_the_docs_plugin_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The docs' user-registered dataset (how-to/own-federation.md), run exactly as printed there."""
    from graphfed.data import DATASETS

    readme = (Path(__file__).parents[1] / "docs" / "how-to" / "own-federation.md").read_text()
    start = readme.index("```python\nimport numpy as np\nfrom graphfed.config import load_config\n")
    code = readme[start + len("```python\n"):readme.index("```", start + 10)]
    try:
        exec(compile(code, "own-federation.md", "exec"), {"__name__": "readme_example"})
        printed = capsys.readouterr().out
        assert printed.startswith("sensors: test accuracy ")
        accuracy = float(printed.split("test accuracy ")[1].split(",")[0])
        assert accuracy > 0.7
        assert "sensors" in DATASETS
        fed = build_federation(load_config(None, ["dataset.name=sensors"]).dataset, 0)
        assert fed.client_names[0] == "sensor0" and fed.train.num_rows == 8 * 84  # 70 % of 120 rows each
    finally:
        DATASETS.pop("sensors", None)


def test_registering_a_dataset_is_checked() -> None:
    from graphfed.data import register_dataset

    with pytest.raises(ValueError, match="dataset 'fl60' is already registered"):
        register_dataset("fl60", lambda cfg, streams: None, task="classification")  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="task must be 'classification' or 'regression'"):
        register_dataset("x", lambda cfg, streams: None, task="ranking")  # type: ignore[arg-type,return-value]
    from graphfed.data import DATASETS

    register_dataset("broken", lambda cfg, streams: "rows", task="classification")  # type: ignore[arg-type,return-value]
    try:
        with pytest.raises(ConfigError, match="dataset broken: its builder returned a str, not a Federation"):
            build_federation(load_config(None, ["dataset.name=broken"]).dataset, 0)
    finally:
        DATASETS.pop("broken")


def test_the_config_module_imports_no_registry() -> None:
    """graphfed.config validates names through a registered check: it imports none of the registries that import
    it (no import cycle), only the error root below everything."""
    import ast

    source = (Path(__file__).parents[1] / "src" / "graphfed" / "config.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
                 for alias in node.names}
    # the error root and the user's folders, both below everything
    assert {name for name in imported if name and name.startswith("graphfed")} == {"graphfed.errors", "graphfed.paths"}


# ---- a fixed split: the spread over seeds is training randomness only --------------------------------------------

def test_row_standard_error_matches_a_bootstrap_over_test_rows() -> None:
    """The recorded ``test_row_se`` is what resampling each client's test rows does to the mean over clients."""
    from graphfed.client.evaluation import ClientScores
    from graphfed.sim.observe import row_standard_error as _row_standard_error

    generator = torch.Generator().manual_seed(0)
    counts = torch.tensor([40, 120, 15, 300])
    rates = (0.5, 0.8, 0.6, 0.95)
    outcomes = [(torch.rand(int(n), generator=generator) < p).float() for n, p in zip(counts, rates, strict=True)]
    accuracy = torch.stack([o.mean() for o in outcomes])
    scores = ClientScores(accuracy, accuracy, counts, accuracy * counts, counts.float(), torch.zeros(4))
    resampled = torch.stack([
        torch.stack([o[torch.randint(len(o), (len(o),), generator=generator)].mean() for o in outcomes]).mean()
        for _ in range(4000)])
    assert _row_standard_error(scores) == pytest.approx(float(resampled.std()), rel=0.06)


def test_a_folder_suite_says_its_spread_is_training_randomness_and_adds_the_row_interval(folder: Path,
                                                                                          tmp_path: Path) -> None:
    import yaml

    from graphfed.bench import run_suite

    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "folder", "seeds": 2, "base": {"torch_threads": 1, "train": {"rounds": 2, "eval_every": 2}},
        "datasets": {"mine": {"config": {"dataset": {"name": "folder", "data_dir": str(folder)}},
                              "methods": ["fedavg"]}}}))
    report, done = run_suite(suite, tmp_path / "out", in_process=True, echo=lambda line: None)
    text = report.read_text()
    assert done and "the ± over seeds covers training randomness only" in text
    header = next(line for line in text.splitlines() if line.startswith("| method |"))
    assert "± over test rows (95 %)" in header
    summary = read_result(tmp_path / "out" / "runs" / "mine" / "fedavg" / "seed0")
    assert 0 < summary.test_row_se < 0.5
