"""The command line: one-line config errors with exit code 2, list, run, --resume and compare."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from conftest import ConfigFactory, read_rounds, without_wall_time
from graphfed import cli
from graphfed.config import dump_config
from graphfed.methods import METHODS
from graphfed.report.tables import format_value
from graphfed.sim.engine import Simulator, run_config

runner = CliRunner()


@pytest.fixture
def config_file(make_config: ConfigFactory, tmp_path: Path) -> Path:
    """A tiny FedAvg config written as YAML, the way a user would pass it."""
    path = tmp_path / "tiny.yaml"
    path.write_text(dump_config(make_config("fedavg", "train.rounds=6", "train.eval_every=3",
                                            "train.checkpoint_every=3")))
    return path


def invoke(*args: str | Path) -> Result:
    return runner.invoke(cli.app, [str(a) for a in args])


def error_lines(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


# ---- invalid configs -----------------------------------------------------------------------------------

BAD_OVERRIDES = {
    "unknown method": (["method.name=nope"], ["method.name", "unknown method 'nope'", *sorted(METHODS)]),
    "unknown dataset": (["dataset.name=imagenet"], ["dataset.name", "unknown dataset", "digits", "fl60", "fln"]),
    "negative lr": (["train.lr=-1"], ["train.lr", "greater than 0"]),
    "unknown field": (["train.epochs=3"], ["train.epochs", "unknown field", "rounds", "local_steps", "lr"]),
    "unknown section field": (["optimizer=sgd"], ["optimizer", "unknown field", "dataset", "method", "train"]),
    "bad method option": (["method.options.server_lr=-1"], ["method.options.server_lr", "greater than 0"]),
    "unknown method option": (["method.options.momentum=0.9"], ["method.options.momentum", "server_lr"]),
    "bad literal": (["dataset.partition=random"], ["dataset.partition", "'random'"]),
}


@pytest.mark.parametrize("case", sorted(BAD_OVERRIDES))
def test_invalid_config_exits_2_with_one_line_naming_the_field(case: str, config_file: Path) -> None:
    """Every invalid config fails before running: exit code 2, exactly one stderr line, naming the field (and the
    allowed values where there is a list), no traceback."""
    overrides, expected = BAD_OVERRIDES[case]
    args = [a for o in overrides for a in ("--set", o)]
    result = invoke("run", config_file, *args, "--out", config_file.parent / "out", "--no-progress")
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1, lines
    for text in expected:
        assert text in lines[0], (text, lines[0])
    assert "Traceback" not in result.output
    assert not (config_file.parent / "out").exists()


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    """A config path that does not exist: exit 2, one line naming the file."""
    missing = tmp_path / "nowhere.yaml"
    result = invoke("run", missing)
    assert result.exit_code == 2
    lines = error_lines(result)
    assert len(lines) == 1 and "config file not found" in lines[0] and str(missing) in lines[0]


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_yaml_that_is_not_a_mapping_exits_2(text: str, tmp_path: Path) -> None:
    """A YAML file whose top level is a list or a scalar: exit 2, one line saying it must be a mapping."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = invoke("run", path)
    assert result.exit_code == 2
    lines = error_lines(result)
    assert len(lines) == 1 and "mapping" in lines[0] and str(path) in lines[0]


def test_broken_yaml_exits_2(tmp_path: Path) -> None:
    """Unparseable YAML: exit 2, one line saying it is not valid YAML."""
    path = tmp_path / "broken.yaml"
    path.write_text("train: {rounds: [1, 2\n")
    result = invoke("run", path)
    assert result.exit_code == 2
    lines = error_lines(result)
    assert len(lines) == 1 and "not valid YAML" in lines[0]


def test_real_executable_exits_2_on_an_invalid_config(config_file: Path) -> None:
    """The installed ``graphfed`` script (not just the Typer app) returns exit status 2 and one stderr line."""
    executable = Path(sys.executable).parent / "graphfed"
    done = subprocess.run([str(executable), "run", str(config_file), "--set", "method.name=nope"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "method.name" in lines[0] and "panacea" in lines[0]


# ---- list ----------------------------------------------------------------------------------------------


def test_list_shows_methods_datasets_and_models() -> None:
    """``graphfed list`` names every registered method, dataset and model."""
    result = invoke("list")
    assert result.exit_code == 0, result.output
    for name in ("panacea", "panacea-gn", "panacea-mlp", "pfedhn", "fedavg", "local", "fl60", "fln", "tpt48",
                 "digits", "mlp", "cnn"):
        assert name in result.stdout, name
    text = " ".join(result.stdout.split())
    assert "attack.kind" in text and "model_poisoning" in text and "backdoor" in text
    assert "defense.simple_tuning" in text and "Qin et al. 2023" in text


def test_list_shows_every_method_with_its_option_defaults() -> None:
    """Options are discoverable without provoking an error: ``list`` names each method's options with their
    defaults, ``list --options`` adds a table per method with the meaning of each."""
    from graphfed.methods import METHODS

    result = invoke("list")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    for name in METHODS:
        assert name in text, name
    assert "lam=1.0" in text and "mu=0.01" in text and "variant='first_order'" in text
    detailed = invoke("list", "--options")
    assert "ditto: method.options" in detailed.stdout and "pull of the personal model" in detailed.stdout


def test_the_committed_catalogue_matches_the_registries() -> None:
    """``graphfed list`` and ``describe`` read catalogue.json so they need no torch; it must say exactly what the
    registries say. After changing a method, model or dataset: ``.venv/bin/python -m graphfed.catalogue``."""
    from graphfed import catalogue

    assert catalogue.CATALOGUE.read_text(encoding="utf-8") == catalogue.render(catalogue.build()), (
        "src/graphfed/catalogue.json is stale: run `.venv/bin/python -m graphfed.catalogue` and commit it")


def test_list_and_help_answer_without_importing_torch() -> None:
    """The look-up commands start in a fraction of a second: neither imports torch (or torch_geometric)."""
    probe = ("import sys; from graphfed import cli; sys.argv = ['graphfed', {args}]\n"
             "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
             "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)")
    for args in ("'list'", "'--help'", "'describe', 'panacea'"):
        done = subprocess.run([sys.executable, "-c", probe.format(args=args)], capture_output=True, text=True,
                              check=True)
        assert done.stderr.strip().splitlines()[-1] == "NO-TORCH", (args, done.stderr[-500:])


def test_describe_prints_the_algorithm_and_options_and_refuses_unknown_methods() -> None:
    result = invoke("describe", "pfedme")
    assert result.exit_code == 0, result.output
    assert "Moreau" in result.stdout and "inner_steps" in result.stdout and "15.0" in result.stdout
    unknown = invoke("describe", "dito")
    assert unknown.exit_code == 2
    assert error_lines(unknown) == [error_lines(unknown)[0]] and "allowed:" in error_lines(unknown)[0]


# ---- run and resume --------------------------------------------------------------------------------------


def test_run_writes_the_run_directory_and_prints_the_table(config_file: Path, tmp_path: Path) -> None:
    """``graphfed run CONFIG --out DIR`` exits 0, writes config.yaml, rounds.jsonl, summary.json, the curves plot
    and a checkpoint, and prints the results table with the summary's numbers."""
    out = tmp_path / "run"
    result = invoke("run", config_file, "--out", out, "--no-progress")
    assert result.exit_code == 0, result.output
    for name in ("config.yaml", "rounds.jsonl", "summary.json", "checkpoint.pt", "plots/curves.png"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 6
    assert "fedavg on fln" in result.stdout
    assert f"{100 * summary['test_mean']:.2f}" in result.stdout
    assert "results in" in result.stdout


def test_a_run_under_attack_prints_the_honest_clients_and_the_attack_success_rate(tmp_path: Path) -> None:
    out, config = tmp_path / "run", tmp_path / "attacked.yaml"
    config.write_text("dataset: {name: digits}\n")
    result = invoke("run", config, "--set", "dataset.name=digits", "--set", "dataset.num_clients=6", "--set",
                    "method.name=fedavg", "--set", "train.rounds=4", "--set", "train.eval_every=2", "--set",
                    "attack.kind=backdoor", "--set", "attack.count=2", "--out", out, "--no-progress")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    text = " ".join(result.stdout.split())
    assert "under attack: backdoor, 2 malicious client(s)" in text
    assert f"{100 * summary['asr_honest']:.2f} %" in text
    assert f"{100 * summary['honest_test_mean']:.2f}" in text


def test_set_overrides_reach_the_run(config_file: Path, tmp_path: Path) -> None:
    """--set on the command line overrides the YAML file (here: the number of rounds and the method)."""
    out = tmp_path / "run"
    result = invoke("run", config_file, "--set", "train.rounds=3", "--set", "method.name=local",
                    "--out", out, "--no-progress")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["method"], summary["rounds"]) == ("local", 3)


def test_resume_from_the_cli_finishes_an_interrupted_run(config_file: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupted ``graphfed run`` exits 130; ``graphfed run --resume`` on the same --out completes it with
    the same summary as an uninterrupted run and no round logged twice."""
    original = Simulator.round_steps

    def interrupted(self: Simulator, index: int):  # type: ignore[no-untyped-def]
        if index == 4:
            raise KeyboardInterrupt
        return (yield from original(self, index))

    out = tmp_path / "run"
    monkeypatch.setattr(Simulator, "round_steps", interrupted)
    first = invoke("run", config_file, "--out", out, "--no-progress")
    assert first.exit_code == 130
    monkeypatch.undo()
    resumed = invoke("run", config_file, "--out", out, "--resume", "--no-progress")
    assert resumed.exit_code == 0, resumed.output
    clean = run_config(cli.load_config(config_file), tmp_path / "clean", progress=False)
    assert without_wall_time(json.loads((out / "summary.json").read_text())) == without_wall_time(
        json.loads(json.dumps(clean.to_json())))
    assert [r["round"] for r in read_rounds(out)] == [3, 6]


def test_interrupted_run_tells_the_user_how_to_resume(config_file: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C during ``graphfed run`` exits 130 and prints main()'s hint to continue with --resume.

    Typer turns KeyboardInterrupt into a silent Exit(130) inside app(), so main()'s own handler (and its hint)
    must not be bypassed."""

    def interrupted(self: Simulator, index: int):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt
        yield  # a generator, as the round's steps are

    monkeypatch.setattr(Simulator, "round_steps", interrupted)
    monkeypatch.setattr(sys, "argv", ["graphfed", "run", str(config_file), "--out", str(tmp_path / "run"),
                                      "--no-progress"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 130
    assert "--resume" in capsys.readouterr().err


def test_resume_with_an_edited_config_exits_3_naming_the_reason(config_file: Path, tmp_path: Path) -> None:
    """--resume against a run made with another config fails with exit code 3 and a one-line reason."""
    out = tmp_path / "run"
    assert invoke("run", config_file, "--out", out, "--no-progress").exit_code == 0
    result = invoke("run", config_file, "--set", "train.lr=0.01", "--out", out, "--resume", "--no-progress")
    assert result.exit_code == 3
    lines = error_lines(result)
    assert len(lines) == 1 and "different config" in lines[0]


def test_resume_without_a_checkpoint_exits_3(config_file: Path, tmp_path: Path) -> None:
    """--resume into an empty directory: exit 3 and one line saying there is no checkpoint."""
    result = invoke("run", config_file, "--out", tmp_path / "empty", "--resume", "--no-progress")
    assert result.exit_code == 3
    lines = error_lines(result)
    assert len(lines) == 1 and "no checkpoint" in lines[0]


# ---- compare -----------------------------------------------------------------------------------------------


def test_compare_runs_every_method_and_seed_and_writes_the_table(config_file: Path, tmp_path: Path) -> None:
    """``compare --methods fedavg,local --seeds 2`` runs 2 x 2 configs, prints one table with both methods and
    writes compare.md (mean ± sample std over seeds), compare.json (every summary) and compare.png."""
    out = tmp_path / "cmp"
    result = invoke("compare", config_file, "--methods", "fedavg,local", "--seeds", "2", "--out", out,
                    "--no-progress")
    assert result.exit_code == 0, result.output
    assert "fedavg" in result.stdout and "local" in result.stdout
    summaries = json.loads((out / "compare.json").read_text())
    assert sorted(summaries) == ["fedavg", "local"]
    for name, runs in summaries.items():
        assert [(r["method"], r["seed"], r["status"]) for r in runs] == [(name, 0, "completed"),
                                                                          (name, 1, "completed")]
        assert (out / name / "seed0" / "summary.json").is_file() and (out / name / "seed1" / "summary.json").is_file()
    markdown = (out / "compare.md").read_text()
    for name, runs in summaries.items():
        tests = [r["test_mean"] for r in runs]
        cell = format_value((statistics.fmean(tests), statistics.stdev(tests)), "accuracy")
        row = next(line for line in markdown.splitlines() if line.startswith(f"| {name} |"))
        assert cell in row, (cell, row)
    assert (out / "compare.png").read_bytes().startswith(b"\x89PNG")


def test_compare_with_an_unknown_method_exits_2(config_file: Path, tmp_path: Path) -> None:
    """A bad name in --methods is a config error: exit 2, one line naming method.name, nothing run."""
    out = tmp_path / "cmp"
    result = invoke("compare", config_file, "--methods", "fedavg,nope", "--out", out, "--no-progress")
    assert result.exit_code == 2
    lines = error_lines(result)
    assert len(lines) == 1 and "method.name" in lines[0] and "nope" in lines[0]
    assert not (out / "fedavg").exists()


# ---- the error root: the user's mistakes against graphfed's bugs -------------------------------------------

def _method_update_raises(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    from graphfed.methods.fedavg import FedAvg

    def update(self: FedAvg, *args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(FedAvg, "update", update)


def test_a_plain_value_error_inside_a_method_is_an_internal_error(config_file: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A ValueError raised by a method's ``update`` is a bug, not the user's input: exit 1, a short "internal error"
    line naming it and where to report it, no traceback unless --verbose; a config error still exits 2 in one line."""
    _method_update_raises(monkeypatch, ValueError("shapes do not broadcast"))
    result = invoke("run", config_file, "--out", tmp_path / "bug", "--no-progress")
    assert result.exit_code == 1
    lines = error_lines(result)
    assert lines[0] == "internal error: ValueError: shapes do not broadcast"
    assert "report it" in lines[1] and "--verbose" in lines[1] and len(lines) == 2
    assert "Traceback" not in result.output

    verbose = invoke("run", config_file, "--out", tmp_path / "bug-verbose", "--no-progress", "--verbose")
    assert verbose.exit_code == 1
    assert "Traceback" in verbose.stderr and "in update" in verbose.stderr

    config_error = invoke("run", config_file, "--set", "train.lr=-1", "--out", tmp_path / "input")
    assert config_error.exit_code == 2
    assert len(error_lines(config_error)) == 1 and "train.lr" in config_error.stderr


def test_graphfed_errors_keep_their_exit_codes(config_file: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Each user-facing kind under GraphfedError maps to its documented exit code in one line: a stopped run 3 (its
    summary written, status "stopped: ..."), data input 2."""
    from graphfed.errors import DataError, GraphfedError, RunStoppedError

    assert issubclass(DataError, GraphfedError) and DataError.exit_code == 2 and RunStoppedError.exit_code == 3
    _method_update_raises(monkeypatch, RunStoppedError("the server solver diverged"))
    stopped = invoke("run", config_file, "--out", tmp_path / "stopped", "--no-progress")
    assert stopped.exit_code == 3  # the log names the round's problem, the last line says where the summary is
    assert error_lines(stopped)[-1].startswith("error: stopped: the server solver diverged (summary in ")
    assert json.loads((tmp_path / "stopped" / "summary.json").read_text())["status"].startswith("stopped: the server")
    _method_update_raises(monkeypatch, DataError("dataset x: file y is truncated"))
    data = invoke("run", config_file, "--out", tmp_path / "data", "--no-progress")
    assert data.exit_code == 2 and error_lines(data) == ["error: dataset x: file y is truncated"]


def test_the_engine_and_the_methods_do_not_import_torch_geometric_at_load() -> None:
    """PyG takes seconds to import: it is imported where a GNN (or a GHN) is built, never when the engine or the
    method registry loads, so `graphfed run` of a method without a GNN starts without it; the same for scikit-learn
    and matplotlib."""
    import subprocess
    import sys

    probe = ("import sys, graphfed.sim.engine, graphfed.methods, graphfed.setup; "
             "print(sorted({'torch_geometric', 'sklearn', 'matplotlib'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # nor scikit-learn (train.metrics) or matplotlib (plots): imported on use
