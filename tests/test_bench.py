"""``graphfed bench``: the smoke suite end to end, resuming, failures and suite validation."""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import ConfigFactory
from graphfed import bench, runs
from graphfed.bench import plan_suite, run_suite
from graphfed.cli import app
from graphfed.config import ConfigError
from graphfed.report import suite as suite_report
from graphfed.runs import RunResult
from graphfed.sim.engine import run_config
from graphfed.suites import Cell, Suite, load_suite, packaged_suites, suite_cells

SMOKE = packaged_suites()["smoke"]
PAPER = packaged_suites()["paper"]
BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The smoke suite run once, in process (about 20 s), shared by the tests that only read its output."""
    out = tmp_path_factory.mktemp("smoke")
    lines: list[str] = []
    report, all_done = run_suite(SMOKE, out, in_process=True, echo=lines.append)
    assert all_done and report == out / "report.md"
    return out, lines


def test_smoke_report_has_every_cell_table_plot_and_paper_column(smoke_run: tuple[Path, list[str]]) -> None:
    out, lines = smoke_run
    suite = load_suite(SMOKE)
    cells = suite_cells(suite)
    assert len(cells) == 12 and len(lines) == 2 * len(cells)  # a "running" and a result line per cell
    report = (out / "report.md").read_text()
    for key, entry in suite.datasets.items():
        assert f"## {entry.title}" in report
        assert (out / "plots" / f"{key}.png").stat().st_size > 0
        assert f"![convergence, {key}](plots/{key}.png)" in report
        for method in entry.methods:
            assert f"\n| {method} |" in report
    # the paper's number sits in the row of its method, and the source is quoted
    fedavg_row = next(line for line in report.splitlines() if line.startswith("| fedavg |"))
    assert fedavg_row.endswith("| 97.9 ± 9.7 (novel 99.2 ± 2.9) |")
    assert "*Panacea T2*: Panacea Table II" in report
    # a variant is its own row, run with its own options
    assert "\n| fedaghn-released |" in report
    variant_config = yaml.safe_load((out / "runs/digits/fedaghn-released/seed0/config.yaml").read_text())
    assert variant_config["method"] == {"name": "fedaghn", "options": {"hypergrad_sign": "released"}}
    payload = json.loads((out / "report.json").read_text())
    runs = payload["runs"]["fl60/panacea"]
    assert [run["seed"] for run in runs] == [0, 1]
    # report.json points at each run's summary instead of repeating it
    summaries = [json.loads((out / run["summary"]).read_text()) for run in runs]
    assert [summary["seed"] for summary in summaries] == [0, 1] and all(s["peak_rss_mb"] > 0 for s in summaries)
    assert [run["test_mean"] for run in runs] == [summary["test_mean"] for summary in summaries]
    # the table's mean is the mean over seeds of each run's per-client mean
    row = next(r for r in payload["tables"]["fl60"] if r["method"] == "panacea")
    assert row["test"][0] == pytest.approx(sum(run["test_mean"] for run in runs) / 2)


def test_second_invocation_skips_finished_cells_and_resumes_an_interrupted_one(
        smoke_run: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "smoke"
    shutil.copytree(smoke_run[0], out)
    interrupted = out / "runs" / "fl60" / "fedavg" / "seed1"
    before = runs.read_result(interrupted)
    (interrupted / runs.SUMMARY).unlink()  # as if killed after its last checkpoint, before the summary
    calls: list[tuple[str, bool]] = []
    real = bench._run_in_process

    def spy(cell: Cell, directory: Path, resume: bool) -> RunResult:
        calls.append((f"{cell.dataset}/{cell.method}/{cell.config.seed}", resume))
        return real(cell, directory, resume)

    monkeypatch.setattr(bench, "_run_in_process", spy)
    lines: list[str] = []
    _, all_done = run_suite(SMOKE, out, in_process=True, echo=lines.append)
    assert all_done and calls == [("fl60/fedavg/1", True)]
    assert sum("done before, skipped" in line for line in lines) == 11
    after = runs.read_result(interrupted)
    assert after.test_mean == before.test_mean


def test_changed_config_reruns_the_cell(smoke_run: tuple[Path, list[str]], tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    shutil.copytree(smoke_run[0], out)
    lines: list[str] = []
    run_suite(SMOKE, out, datasets=["digits"], methods=["local"], seeds=1, in_process=True,
              overrides={"train": {"rounds": 5}}, echo=lines.append)
    assert lines == ["[1/1] digits local seed 0: running ...", lines[1]] and "completed" in lines[1]
    assert runs.read_result(out / "runs" / "digits" / "local" / "seed0").rounds == 5


def test_runs_recorded_under_another_root_stay_finished(smoke_run: tuple[Path, list[str]], tmp_path: Path) -> None:
    """Committed runs record the data's absolute path; a clone under another root (as CI makes) must not take
    them for other configs and re-run or drop them from the report."""
    out = tmp_path / "smoke"
    shutil.copytree(smoke_run[0], out)
    for config_file in (out / "runs").rglob(runs.CONFIG):
        config = yaml.safe_load(config_file.read_text())
        config["dataset"]["data_dir"] = "/another/checkout/shared/data"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    lines: list[str] = []
    _, all_done = run_suite(SMOKE, out, in_process=True, echo=lines.append)
    assert all_done and sum("done before, skipped" in line for line in lines) == 12


def test_run_under_other_method_defaults_is_run_again(smoke_run: tuple[Path, list[str]], tmp_path: Path) -> None:
    """config.yaml keeps only the options that were set; the summary records all of them, so a run made
    before a method's default changed is not taken for a finished cell of the same config."""
    out = tmp_path / "smoke"
    shutil.copytree(smoke_run[0], out)
    cell = out / "runs" / "digits" / "fedaghn-released" / "seed0"
    summary = json.loads((cell / runs.SUMMARY).read_text())  # the file, as an older graphfed may have left it
    assert summary["method_options"]["init_p"] == 0.03 and summary["method_options"]["hypergrad_sign"] == "released"
    summary["method_options"]["init_p"] = 0.5  # as if init_p's default had been 0.5 when this ran
    (cell / runs.SUMMARY).write_text(json.dumps(summary))
    lines: list[str] = []
    run_suite(SMOKE, out, datasets=["digits"], methods=["fedaghn-released"], seeds=1, in_process=True,
              echo=lines.append)
    assert "running" in lines[0] and runs.read_result(cell).method_options["init_p"] == 0.03


def test_failed_cell_is_reported_and_the_grid_goes_on(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "partly broken", "seeds": 1,
        "base": {"train": {"rounds": 2, "local_steps": 2, "eval_every": 1}},
        "datasets": {
            "tpt48": {"config": {"dataset": {"name": "tpt48", "data_dir": str(tmp_path / "nowhere")}},
                      "methods": ["fedavg"]},
            "fln": {"config": {"dataset": {"name": "fln", "num_clients": 6}}, "methods": ["local"]},
        }}))
    result = CliRunner().invoke(app, ["bench", str(suite), "--out", str(tmp_path / "out"), "--in-process"])
    assert result.exit_code == 3
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Not completed (left out of the table): `fedavg`: failed:" in report and "nowhere" in report
    assert "\n| local |" in report


def test_cells_in_their_own_processes_run_side_by_side_record_their_peak_memory_and_the_same_numbers(
        tmp_path: Path) -> None:
    """``--jobs 2``: two cells at once, each in its own process with its own peak memory, scoring exactly what the
    same cells score one after the other in this process."""
    arguments = ["--datasets", "fl60", "--methods", "fedavg", "--seeds", "2", "--set", "train.rounds=2"]
    result = CliRunner().invoke(app, ["bench", str(SMOKE), "--out", str(tmp_path / "jobs"), *arguments,
                                      "--jobs", "2"])
    assert result.exit_code == 0, result.output
    sequential = tmp_path / "sequential"
    run_suite(SMOKE, sequential, datasets=["fl60"], methods=["fedavg"], seeds=2, overrides={"train": {"rounds": 2}},
              in_process=True, echo=lambda line: None)
    for seed in (0, 1):
        summary = runs.read_result(tmp_path / "jobs" / "runs" / "fl60" / "fedavg" / f"seed{seed}")
        assert summary.status == "completed" and summary.rounds == 2
        assert 50 < summary.peak_rss_mb < 4096  # a real process's own peak, in MiB
        reference = runs.read_result(sequential / "runs" / "fl60" / "fedavg" / f"seed{seed}")
        assert (summary.test_mean, summary.val_mean) == (reference.test_mean, reference.val_mean)
    # the report still covers the whole suite and says what this partial invocation left out
    report = (tmp_path / "jobs" / "report.md").read_text()
    assert "Not run yet: `panacea`, `pfedhn`" in report and "--datasets fl60" in report and "--jobs 2" in report


def test_jobs_need_a_process_per_cell() -> None:
    with pytest.raises(ConfigError, match="--jobs 2 runs each cell in its own process: leave out --in-process"):
        bench.run_cells(suite_cells(load_suite(SMOKE), datasets=["digits"]), Path("unused"), in_process=True, jobs=2)


def test_jobs_over_the_cores_this_process_may_use_get_a_note(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The note counts the cores the process may use (its affinity: a container or taskset can give it fewer than
    the machine has), not the machine's."""
    cells = suite_cells(load_suite(SMOKE), datasets=["fl60"], methods=["fedavg"], seeds=1)
    cells = [replace(cell, config=cell.config.model_copy(update={"torch_threads": 1})) for cell in cells]
    for cores, noted in ((1, True), (2, False)):
        monkeypatch.setattr(bench, "usable_cores", lambda cores=cores: cores)
        monkeypatch.setattr(bench, "_reuse_or_plan", lambda *args: (RunResult.model_construct(), None))
        lines: list[str] = []
        bench.run_cells(cells, tmp_path, jobs=2, echo=lines.append)
        notes = [line for line in lines if line.startswith("note:")]
        assert bool(notes) == noted, lines
        if noted:
            assert "2 jobs x 1 torch threads is more than the 1 CPU cores this process may use" in notes[0]


def test_relative_data_dir_is_relative_to_the_suite_file(tmp_path: Path) -> None:
    (tmp_path / "suites").mkdir()
    suite = tmp_path / "suites" / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "x", "datasets": {"t": {
        "config": {"dataset": {"name": "tpt48", "data_dir": "../data"}}, "methods": ["fedavg"]}}}))
    cell = suite_cells(load_suite(suite), seeds=1)[0]
    assert cell.config.dataset.data_dir == str((tmp_path / "data").resolve())


def test_variant_settings_and_late_joiners_reach_the_cells_and_the_report(tmp_path: Path) -> None:
    """A variant's own config (an ablation of K_c) is merged into its cells and listed under the section's budget;
    runs with late clients add their last-round score as a column, which a claim can test."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "variants", "seeds": 1,
        "base": {"train": {"rounds": 3, "local_steps": 4, "eval_every": 3, "late_clients": 2, "join_round": 3}},
        "claims": [{"claim": "late joiners", "seed_file": "002", "table": "Fig. 4", "dataset": "fln",
                    "better": "fedavg", "than": ["local-k1"], "column": "late"}],
        "datasets": {"fln": {"config": {"dataset": {"name": "fln", "num_clients": 6}},
                             "methods": ["fedavg", "local-k1"],
                             "variants": {"local-k1": {"method": "local", "config": {"train": {"local_steps": 1}}}}}},
    }))
    cells = suite_cells(load_suite(suite))
    assert [(c.method, c.config.train.local_steps) for c in cells] == [("fedavg", 4), ("local-k1", 1)]
    report, all_done = run_suite(suite, tmp_path / "out", in_process=True, echo=lambda line: None)
    text = report.read_text()
    assert all_done and "4 local steps of batch" in text
    assert "Rows with their own settings (the rest as above): `local-k1` train.local_steps=1." in text
    header = next(line for line in text.splitlines() if line.startswith("| method |"))
    assert header.split(" | ")[-1] == "late joiners, last round |"
    summary = runs.read_result(tmp_path / "out" / "runs" / "fln" / "fedavg" / "seed0")
    late_cell = f"{100 * summary.late_test_final:.2f} (n=1)"
    assert next(line for line in text.splitlines() if line.startswith("| fedavg |")).endswith(f"| {late_cell} |")
    assert "| late joiners |" in text and "`fln`, late:" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "x", "datasets": {"a": {"methods": ["v"], "variants": {
        "v": {"method": "local", "config": {"method": {"name": "fedavg"}}}}}}}))
    with pytest.raises(ConfigError, match="a variant's config cannot set method or seed"):
        load_suite(bad)


@pytest.mark.parametrize(("content", "message"), [
    ("name: x\ndatasets: {}\n", "datasets: Dictionary should have at least 1 item"),
    ("name: x\ndatasets: {a: {methods: [fedavg]}}\nextra: 1\n", "extra: Extra inputs are not permitted"),
    ("name: x\ndatasets: {a: {methods: [nope]}}\n", "datasets.a, method nope: method.name: unknown method"),
    ("name: x\ndatasets: {a: {methods: [fedavg], config: {train: {rounds: 0}}}}\n",
     "datasets.a, method fedavg: train.rounds: Input should be greater than or equal to 1"),
    ("name: [x\n", "not valid YAML"),
    ("name: x\nreport: ../x.md\ndatasets: {a: {methods: [fedavg]}}\n", "report file name '../x.md' cannot name a"),
    ("name: x\nreport: report.json\ndatasets: {a: {methods: [fedavg]}}\n", "a markdown file name ending in .md"),
    ("name: x\ndatasets: {a: {methods: [fedavg]}}\nclaims: [{claim: c, seed_file: s0, table: T, dataset: b, "
     "better: fedavg, than: [local]}]\n",
     "dataset 'b' is not a key of the suite"),
])
def test_invalid_suite_is_one_clear_error_before_anything_runs(tmp_path: Path, content: str, message: str) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(content)
    result = CliRunner().invoke(app, ["bench", str(suite), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "out").exists()


def test_unknown_dataset_filter_names_the_suite_keys() -> None:
    with pytest.raises(ConfigError, match="not in the suite: nope; the suite has fl60, digits"):
        suite_cells(load_suite(SMOKE), datasets=["nope"])


def test_robustness_suite_covers_the_issue_grid() -> None:
    """Model poisoning 0-50 % on FL-60 and Fashion-MNIST for the eight methods, label flipping at 30/40 %, the
    backdoor with and without Simple-Tuning for Table V's six methods; 10 seeds; its own report name."""
    suite = load_suite(packaged_suites()["robustness"])
    assert suite.report == "bench.md"
    cells = suite_cells(suite)
    sweep = {"panacea", "panacea-gn", "pfedhn", "fedavg", "fedavg-median", "ditto", "fedaghn", "pfedgat"}
    for data in ("fl60", "fmnist"):
        for ratio in (0, 10, 20, 30, 40, 50):
            key = f"{data}-mp-{ratio:02d}" if ratio == 0 else f"{data}-mp-{ratio}"
            found = [c for c in cells if c.dataset == key]
            assert {c.method for c in found} == sweep and {c.config.seed for c in found} == set(range(10))
            assert all(c.config.attack.kind == "model_poisoning" and c.config.attack.fraction == ratio / 100
                       and c.config.attack.poison_lambda == 0.5 for c in found)
    median = next(c for c in cells if c.method == "fedavg-median")
    assert median.config.method.options == {"aggregation": "fedmedian"}
    assert {c.config.attack.fraction for c in cells if c.config.attack.kind == "label_flip"} == {0.3, 0.4}
    backdoor = [c for c in cells if c.config.attack.kind == "backdoor"]
    assert {c.method for c in backdoor} == {"fedavg", "ditto", "panacea", "pfedhn", "fedaghn", "pfedgat"}
    assert {c.config.defense.simple_tuning for c in backdoor} == {False, True}
    assert all(c.config.attack.count == 1 and c.config.attack.blend == 0.2 for c in backdoor)


def test_paper_suite_is_valid_and_covers_the_issue_grid() -> None:
    suite = load_suite(PAPER)
    cells = suite_cells(suite)
    datasets = {cell.config.dataset.name for cell in cells}
    assert {"fl60", "tpt48", "metr-la-week", "fashion-mnist", "cifar10", "femnist"} <= datasets
    # 3 seeds, or at least 2 where a cell takes minutes on CIFAR-10 and the section says so
    for key, entry in suite.datasets.items():
        seeds = entry.seeds or suite.seeds
        assert seeds >= 3 or (seeds == 2 and "2 seeds" in entry.description), key
    # the issue's layouts: pFedGAT Table 1 (three partitions, all its baselines), FedAGHN Tables 1-2 and its
    # ablation, Panacea's K_c / K_s sweep, pFedGAT without the GAT and with late joiners
    partitions = {(c.config.dataset.name, c.config.dataset.partition, c.config.dataset.dirichlet_beta) for c in cells}
    assert {("fashion-mnist", "iid", 0.5), ("fashion-mnist", "pathological", 0.5), ("fashion-mnist", "dirichlet", 0.5),
            ("cifar10", "pathological", 0.5), ("cifar10", "dirichlet", 0.1), ("cifar10", "dirichlet", 0.2),
            ("cifar10", "dirichlet", 0.5)} <= partitions
    fedaghn_table1 = {"local", "fedavg", "fedavg-ft", "fedprox", "fedprox-ft", "ditto", "fedrep", "pfedhn", "fedcp",
                      "fedpac", "cfl", "fedamp", "h-fedamp", "pfedla", "fedala", "fedaghn"}
    for key in ("cifar10-dir0.1", "cifar10-pathological", "cifar10-dir0.2", "cifar10-dir0.5"):  # Tables 1 and 2
        assert fedaghn_table1 <= {c.method for c in cells if c.dataset == key}, key
    table1 = {c.method for c in cells if c.dataset == "fashion-mnist-dir0.5"}
    assert {"local", "fedavg", "fedprox", "sfl", "cfl", "per-fedavg", "pfedme", "fedamp", "pfedhn", "fedrod",
            "knn-per", "fedah", "pfedgat"} <= table1
    ablation = {(c.config.method.options.get("p", "learned"), c.config.method.options.get("q", "learned"),
                 c.config.method.options.get("layerwise", True))
                for c in cells if c.dataset == "cifar10-fedaghn-ablation"}
    assert ablation == {("learned", "learned", True), ("absent", "absent", True), ("frozen", "frozen", True),
                        ("absent", "learned", True), ("learned", "absent", True), ("learned", "learned", False)}
    steps = {(c.config.train.local_steps, c.config.method.options.get("server_steps", 10))
             for c in cells if c.dataset == "tpt48-steps"}
    assert steps == {(50, 10), (1, 10), (10, 10), (25, 10), (50, 1), (50, 5)}
    assert any(c.config.method.options.get("attention") == "uniform" for c in cells)
    assert any(c.config.method.options.get("attention") == "direct" for c in cells)  # the paper's "without GAT"
    assert any(c.config.method.options.get("feedback") == "loss_only" for c in cells)
    assert any(c.config.train.late_clients == 2 and c.config.method.name == "pfedgat" for c in cells)


def _tiny_fln_suite(tmp_path: Path, name: str, seeds: int, methods: list[str]) -> Path:
    """A two-round FL-N suite of ``methods`` x ``seeds`` (a few seconds per run)."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": name, "seeds": seeds,
        "base": {"torch_threads": 1, "train": {"rounds": 2, "local_steps": 2, "eval_every": 2}},
        "datasets": {"fln": {"config": {"dataset": {"name": "fln", "num_clients": 4}}, "methods": methods}}}))
    return suite


def _edit_summary(out: Path, method: str, seed: int, **changes: object) -> dict:
    """Overwrite fields of a finished run's summary.json (what another code version or a stopped run wrote)."""
    path = out / "runs" / "fln" / method / f"seed{seed}" / "summary.json"
    summary = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps(summary))
    return summary


def test_bench_reruns_a_cell_from_other_code_unless_told_to_keep_it_and_the_report_marks_it(tmp_path: Path) -> None:
    """summary.json records the code a run ran (its engine's behaviour, its own modules); a finished cell whose
    engine behaved otherwise is run again, or, with keep_stale, kept and marked stale (†) in its table with why."""
    from graphfed.provenance import behaviour, cpu_kernels

    suite = _tiny_fln_suite(tmp_path, "provenance", 1, ["fedavg"])
    out = tmp_path / "out"
    run_suite(suite, out, in_process=True, echo=lambda line: None)
    summary_path = out / "runs" / "fln" / "fedavg" / "seed0" / "summary.json"
    summary = json.loads(summary_path.read_text())
    assert summary["code"]["behaviour"] == behaviour() and len(summary["code"]["code_id"]) == 16
    assert {"methods/fedavg.py", "models/mlp.py", "data/datasets/fl_n.py"} <= set(summary["code"]["modules"])
    assert summary["code"]["cpu"] == cpu_kernels()  # the kernels beside the code: other kernels, other roundings
    lines: list[str] = []
    run_suite(suite, out, in_process=True, echo=lines.append)
    assert any("done before, skipped" in line for line in lines)  # today's code: reused

    _edit_summary(out, "fedavg", 0, code={**summary["code"], "behaviour": "0123456789abcdef"})
    why = f"the engine behaves otherwise (behaviour 0123456789abcdef, today {behaviour()})"
    lines.clear()
    report, _ = run_suite(suite, out, in_process=True, echo=lines.append, keep_stale=True)
    assert any(f"by other code ({why}), kept" in line for line in lines)
    text = report.read_text()
    assert "| fedavg † |" in text and f"fedavg` 1 of 1 ({why})" in text
    assert f"1 of 1 runs are stale ({why}: 1)" in text

    lines.clear()
    report, _ = run_suite(suite, out, in_process=True, echo=lines.append)  # default: refuse to reuse, run again
    assert any(f"finished by other code ({why})" in line and "running again" in line for line in lines)
    assert json.loads(summary_path.read_text())["code"]["behaviour"] == behaviour()
    assert "| fedavg |" in report.read_text() and "All 1 runs are current." in report.read_text()
    assert "CPU kernels (summary.json `code.cpu`; runs before they were recorded say nothing): this machine: 1." in (
        report.read_text())


def test_cpu_kernels_name_the_vendor_vector_level_and_the_extensions_kernels_branch_on() -> None:
    """What decides a float sum's rounding on a CPU is named from /proc/cpuinfo: two machines whose kernels differ
    (an AVX-512 Xeon with AMX, an AVX2 EPYC) get different names, and flags no kernel branches on are left out."""
    from graphfed.provenance import cpu_kernels

    sapphire = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni avx512_bf16 amx_tile ht\n"
    epyc = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma ht\n"
    intel, amd = cpu_kernels(sapphire), cpu_kernels(epyc)
    assert intel.endswith("avx2+fma+avx512f+avx512_vnni+avx512_bf16+amx_tile") and "GenuineIntel" in intel
    assert amd.endswith("avx2+fma") and "AuthenticAMD" in amd and "ht" not in amd.split()
    assert cpu_kernels("") and "+" not in cpu_kernels("")  # no cpuinfo (not Linux): architecture and torch's level


def test_cpu_kernels_name_a_kernel_path_cap_and_onednn_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose MKL was held to its AVX2 path (the one AMD CPUs take) or whose oneDNN was off ran other kernels
    than the CPU's own: its name says so, and an uncapped run's name is what it was."""
    import torch

    from graphfed.provenance import cpu_kernels

    sapphire = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 fma avx512f\n"
    for name in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    cpu_kernels.cache_clear()
    plain = cpu_kernels(sapphire)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    cpu_kernels.cache_clear()
    try:
        assert cpu_kernels(sapphire) == f"{plain} MKL_ENABLE_INSTRUCTIONS=AVX2 oneDNN off"
    finally:
        cpu_kernels.cache_clear()


def test_the_report_counts_runs_by_cpu_kernels_and_says_other_kernels_round_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """... and on which kernels the vouch of today's engine compared its runs, when one recorded it."""
    from graphfed.provenance import cpu_kernels
    from graphfed.report import suite
    from graphfed.report.suite import kernels_sentence
    from graphfed.runs import RunResult

    def run(cpu: str | None) -> RunResult:
        return RunResult(status="completed", method="fedavg", dataset="fln", metric="accuracy",
                         code={} if cpu is None else {"cpu": cpu})

    runs = [run(cpu_kernels()), run(cpu_kernels()), run("x86_64 AuthenticAMD AVX2 avx2+fma"), run(None)]
    monkeypatch.setattr(suite, "vouches_checked_on", lambda: [])
    sentence = kernels_sentence(runs)
    assert "this machine: 2; x86_64 AuthenticAMD AVX2 avx2+fma: 1; not recorded: 1." in sentence
    assert "agree to float rounding" in sentence and "vouch" not in sentence
    monkeypatch.setattr(suite, "vouches_checked_on", lambda: ["x86_64 GenuineIntel AVX512", "x86_64 GenuineIntel "
                                                               "AVX512 MKL_ENABLE_INSTRUCTIONS=AVX2"])
    assert kernels_sentence(runs) == sentence + (
        " The vouch that relates earlier engines to today's compared their runs on: x86_64 GenuineIntel AVX512; "
        "x86_64 GenuineIntel AVX512 MKL_ENABLE_INSTRUCTIONS=AVX2.")


def test_plan_counts_current_stale_and_missing_runs_and_their_time_without_running(tmp_path: Path) -> None:
    """``graphfed bench --plan`` runs and writes nothing; it tells runs of today's code from stale and missing ones
    and estimates the training time of the rest: a stale run by its own recorded time, a missing one by its
    method's finished runs, else its section's."""
    suite = _tiny_fln_suite(tmp_path, "plan", 2, ["fedavg", "local"])
    out = tmp_path / "out"
    run_suite(suite, out, methods=["fedavg"], in_process=True, echo=lambda line: None)
    code = json.loads((out / "runs" / "fln" / "fedavg" / "seed1" / "summary.json").read_text())["code"]
    changed = {**code["modules"], "methods/fedavg.py": "0123456789abcdef"}  # the method's own file changed since
    _edit_summary(out, "fedavg", 1, code={**code, "modules": changed}, wall_seconds=30.0)
    _edit_summary(out, "fedavg", 0, wall_seconds=10.0)
    before = sorted(path.relative_to(out) for path in out.rglob("*"))

    (section,) = plan_suite(suite, out)
    assert (section.dataset, section.current, dict(section.stale), section.missing) == (
        "fln", 1, {"methods/fedavg.py changed": 1}, 2)
    # the stale run: its own 30 s; local's two missing runs: the section's mean (no local run finished), 20 s each
    assert section.to_run == 3 and section.seconds == 30.0 + 2 * 20.0 and section.unestimated == 0
    (only_fedavg,) = plan_suite(suite, out, methods=["fedavg"])
    assert only_fedavg.to_run == 1 and only_fedavg.seconds == 30.0

    result = CliRunner().invoke(app, ["bench", str(suite), "--out", str(out), "--plan"])
    assert result.exit_code == 0, result.output
    assert "fln: methods/fedavg.py changed: 1" in result.output and "0.0 h" in result.output
    assert sorted(path.relative_to(out) for path in out.rglob("*")) == before  # nothing run, nothing written


def test_a_report_rewrite_lists_a_stopped_run_as_not_completed_never_as_not_run(tmp_path: Path) -> None:
    """A run that stopped (say, on a NaN update) is part of the evidence: ``--report-only`` names it and why, as the
    invocation that ran it did, rather than calling the cell not run."""
    from graphfed.provenance import behaviour

    suite = _tiny_fln_suite(tmp_path, "stopped", 1, ["fedavg", "local"])
    out = tmp_path / "out"
    run_suite(suite, out, in_process=True, echo=lambda line: None)
    _edit_summary(out, "local", 0, status="stopped: round 2: non-finite (NaN/Inf) update from client(s) 1")
    report, _ = run_suite(suite, out, in_process=True, echo=lambda line: None, report_only=True)
    text = report.read_text()
    assert "Not completed (left out of the table): `local`: stopped: round 2: non-finite" in text
    assert "Not run yet" not in text and "| fedavg |" in text

    # The stop is the run's own outcome, which today's code reproduces: bench keeps it rather than running it
    # again on every invocation, and --plan counts it as current; from other code it is stale like any run.
    (section,) = plan_suite(suite, out)
    assert (section.current, section.missing, section.to_run) == (2, 0, 0)
    lines: list[str] = []
    run_suite(suite, out, in_process=True, echo=lines.append)
    assert any("local seed 0: ended before (stopped: round 2: non-finite" in line and line.endswith("skipped")
               for line in lines)
    assert not any("running" in line for line in lines)
    code = json.loads((out / "runs" / "fln" / "local" / "seed0" / "summary.json").read_text())["code"]
    _edit_summary(out, "local", 0, code={**code, "behaviour": "0123456789abcdef"})
    (section,) = plan_suite(suite, out)
    assert list(section.stale) == [f"the engine behaves otherwise (behaviour 0123456789abcdef, today "
                                   f"{behaviour()})"] and section.to_run == 1
    lines.clear()
    run_suite(suite, out, methods=["local"], in_process=True, echo=lines.append)
    assert any("local seed 0: finished by other code" in line for line in lines)
    assert json.loads((out / "runs" / "fln" / "local" / "seed0" / "summary.json").read_text())["status"] == "completed"


def test_a_report_over_runs_copied_from_another_folder_says_no_invocation_is_recorded(tmp_path: Path) -> None:
    """Runs made in a git worktree and copied into the committed folder leave their invocation behind: the report
    must not print an empty "produced by" list, and must point at each run's recorded code instead."""
    suite = _tiny_fln_suite(tmp_path, "copied", 1, ["local"])
    made_here, copied_in = tmp_path / "worktree", tmp_path / "committed"
    run_suite(suite, made_here, in_process=True, echo=lambda line: None)
    text = (made_here / "report.md").read_text()
    assert "Produced by these invocations" in text and "Time spent in cells run by each invocation: " in text
    shutil.copytree(made_here / "runs", copied_in / "runs")
    report, _ = run_suite(suite, copied_in, in_process=True, echo=lambda line: None, report_only=True)
    text = report.read_text()
    assert "Produced by these invocations" not in text
    assert "No invocation is recorded in this folder." in text and "records the code id and git commit" in text
    assert json.loads((copied_in / "report.json").read_text())["invocations"] == []


def test_regression_table_adds_mae_in_data_units_mean_and_std_over_seeds(tmp_path: Path) -> None:
    suite = load_suite(SMOKE)
    cells = [cell for cell in suite_cells(suite) if cell.dataset == "fl60" and cell.method == "fedavg"]
    summaries = [RunResult(status="completed", metric="mse", seed=seed, test_mean=0.01 * (seed + 1), test_std=0.001,
                           test_pooled=0.01, wall_seconds=1.0, bytes_up=0, peak_rss_mb=100.0 + seed,
                           test_mae_original_units=mae) for seed, mae in enumerate([4.0, 6.0])]
    text, rows = suite_report._dataset_section("fl60", suite.datasets["fl60"], cells, {("fl60", "fedavg"): summaries},
                                        tmp_path)
    assert "| MAE, data units |" in text
    row = next(line for line in text.splitlines() if line.startswith("| fedavg"))
    assert "| 5.000 ± 1.414 |" in row and "| 101 |" in row  # MAE mean ± sample std over seeds; the largest peak RSS
    assert rows[0]["test"] == pytest.approx((0.015, 0.005 * 2 ** 0.5))
    assert rows[0]["per_seed"]["test"] == [0.01, 0.02]  # what the verdicts test


def _regenerated_body(suite_path: Path, out: Path) -> tuple[Suite, list[Cell], str, dict[str, list[RunResult]]]:
    """What the report writer makes of the committed runs in ``out``: (suite, cells, the report's sections and
    deviations as one text, table rows). Stale marks are today's judgement of each run (its engine's behaviour and
    its own modules): a change that stales a run must come with the report regenerated."""
    from graphfed.bench import finished_results, stale_judge
    from graphfed.report.suite import deviations_section, report_sections

    suite = load_suite(suite_path)
    cells, results = finished_results(suite, out)
    sections, tables = report_sections(suite, cells, results, out, plots=False, stale_of=stale_judge(cells))
    return suite, cells, "\n".join(sections + deviations_section(suite)), tables


def test_the_paper_report_tables_are_regenerated_from_the_committed_runs() -> None:
    """Every section of ``benchmarks/results/paper/report.md`` (its tables, notes and the cells not run yet) is exactly
    what the report writer makes of the committed run directories: no hand-edited number."""
    from graphfed.report.suite import verdict_table

    out = BENCHMARKS / "results" / "paper"
    suite, _, body, tables = _regenerated_body(PAPER, out)
    committed = (out / "report.md").read_text()
    assert committed.endswith(body)
    verdicts = "\n".join(verdict_table(suite, tables))
    assert verdicts and verdicts in committed  # the verdict table on top, from the same rows
    assert committed[:-len(body)].count("## ") == 1  # nothing but the header and the verdicts precede the sections
    assert sum(len(rows) for rows in tables.values()) >= 40  # rows of methods with finished runs


def test_the_aggregation_report_is_regenerated_from_the_committed_runs_graphs_included(tmp_path: Path) -> None:
    """``benchmarks/results/aggregation/report.md`` is what the report writer and ``aggregation_family.py``'s
    collaboration-graph appendix make of the committed runs: no hand-edited number, and no rewrite by
    ``graphfed bench --report-only`` alone, which leaves the appendix out."""
    spec = importlib.util.spec_from_file_location("aggregation_family",
                                                  BENCHMARKS / "aggregation_family.py")
    assert spec is not None and spec.loader is not None
    family = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(family)
    out = family.RESULTS
    _, cells, body, tables = _regenerated_body(family.SUITE, out)
    # the appendix draws heatmaps: it reads copies of the runs that carry graphs, so the committed pictures stay
    for key in (family.GROUPED, family.IID):
        shutil.copytree(out / "runs" / key, tmp_path / "runs" / key)
    appendix, failures = family.collaboration_section(family.SUITE, tmp_path)
    committed = (out / "report.md").read_text()
    assert committed.endswith(body + "\n" + "\n".join(appendix))
    assert not failures and "**Checks** (on fedaghn, pfedgat): all passed." in appendix
    assert sorted(path.name for path in (tmp_path / "heatmaps").iterdir()) == sorted(
        f"{key}-{cell.method}-seed{cell.config.seed}" for cell in cells for key in (family.GROUPED, family.IID)
        if cell.dataset == key)
    assert sum(len(rows) for rows in tables.values()) >= 25


def test_the_gpu_suite_holds_the_papers_budgets_as_valid_cells() -> None:
    """``paper-gpu.yaml`` validates cell by cell (every method exists, every option parses) and holds the papers'
    budgets: FedAGHN's 200 rounds x 5 epochs on CNN-BN, Panacea's 800 rounds, FLHA-GHN at width 64; each section
    states its measured or expected time."""
    from graphfed.setup import resolve_method

    suite = load_suite(PAPER.parent / "paper-gpu.yaml")
    cells = suite_cells(suite)
    for cell in cells:
        resolve_method(cell.config)  # the method's options parse
        assert (cell.config.train.device, cell.config.train.precision) == ("cuda", "tf32")
    by_key = {cell.dataset: cell.config for cell in cells}
    fedaghn = by_key["fedaghn-cifar10-dir0.1"]
    assert (fedaghn.train.rounds, fedaghn.model.name, fedaghn.train.clients_per_round) == (200, "cnn-bn", 20)
    assert fedaghn.train.local_steps * fedaghn.train.batch_size >= 5 * 2000  # 5 epochs of ~2,100 images
    assert by_key["panacea-metr-la"].train.rounds == 800
    assert by_key["flha-ghn-cifar10"].model.options["width"] == 64
    # at the papers' budgets: each section's rows processed are within a few % of its paper's
    from graphfed.report.suite import budget_line

    for key, entry in suite.datasets.items():
        share = budget_line(entry, by_key[key].train).split(": ")[1].split(" %")[0]
        assert 95 <= float(share) <= 110, (key, share)
    # each section's time per run: measured on an H100 (benchmarks/results/gpu.json) or, where not yet, projected
    assert all("Measured:" in entry.description or "Expected about" in entry.description
               for entry in suite.datasets.values())


@pytest.mark.parametrize("module", ["methods/pfedhn.py", "methods/fedavg.py"])
def test_a_run_whose_own_module_changed_is_stale_whether_or_not_a_vouch_knows_the_module(
        module: str, make_config: ConfigFactory) -> None:
    """A run is stale once a module it ran has other bytes, for a module no vouch ever placed in a class (its hash
    is its class) as for one a vouch did (``behaviour.json``'s ``modules``); today's own hashes are current."""
    from graphfed.provenance import _behaviour_table, stale_reason
    from graphfed.setup import run_roots

    method = module.removeprefix("methods/").removesuffix(".py")
    known = module in _behaviour_table()["modules"]
    assert known == (method == "fedavg")  # the two cases: pfedhn.py has no entry, fedavg.py has one
    config = make_config(method, "train.rounds=1")
    code = run_config(config, progress=False).code
    roots = run_roots(config)
    assert stale_reason(code, roots) is None
    edited = {**code, "modules": {**code["modules"], module: "0123456789abcdef" * 4}}
    assert stale_reason(edited, roots) == f"{module} changed"


def test_a_vouch_without_private_runs_stales_private_runs_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              make_config: ConfigFactory) -> None:
    """A change to the DP mechanisms is vouched without the private runs (``vouch.py --no-privacy``): today's engine
    joins its predecessor's class for every other run, while private runs get a behaviour of their own, so a
    private run of the predecessor is stale and a plain one is current; a private run of today's engine is
    current."""
    from graphfed import provenance
    from graphfed.setup import run_roots

    today = provenance.engine_hash()
    table = {"engines": {"ab" * 32: "0123456789abcdef", today: "0123456789abcdef"},
             "private_engines": {today: today[:16]}}
    path = tmp_path / "behaviour.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(provenance, "BEHAVIOUR", path)
    for cached in (provenance._behaviour_table, provenance.behaviour):
        cached.cache_clear()
    try:
        config = make_config("fedavg", "train.rounds=1")
        roots = run_roots(config)
        code = run_config(config, progress=False).code
        assert code["behaviour"] == "0123456789abcdef" == provenance.behaviour()
        earlier = {**code, "behaviour": "0123456789abcdef"}  # the predecessor's runs recorded its class
        assert provenance.stale_reason(earlier, roots) is None
        assert provenance.stale_reason(earlier, roots, private=True) == (
            f"the engine behaves otherwise (behaviour 0123456789abcdef, today {today[:16]})")
        private = run_config(make_config("fedavg", "train.rounds=1", "privacy.mechanism=central",
                                         "privacy.noise_multiplier=1.0"), progress=False).code
        assert private["behaviour"] == today[:16] == provenance.behaviour(private=True)
        assert provenance.stale_reason(private, roots, private=True) is None
    finally:
        for cached in (provenance._behaviour_table, provenance.behaviour):
            cached.cache_clear()


@pytest.mark.parametrize("pack", [1, 0], ids=["cell by cell", "as one pack"])
def test_a_stale_cell_whose_rerun_fails_is_a_failure_not_its_old_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pack: int) -> None:
    """A cell re-run in its own process (alone or in a pack) that fails before writing a summary is reported failed:
    the summary an earlier run left in its folder is not the new run's result, and it is kept (nothing lost)."""
    import sys

    suite = _tiny_fln_suite(tmp_path, "failed rerun", 2, ["fedavg"])
    out = tmp_path / "out"
    run_suite(suite, out, in_process=True, echo=lambda line: None)
    for seed in (0, 1):
        summary = json.loads((out / "runs" / "fln" / "fedavg" / f"seed{seed}" / "summary.json").read_text())
        _edit_summary(out, "fedavg", seed, code={**summary["code"], "behaviour": "0123456789abcdef"})
    left = {seed: (out / "runs" / "fln" / "fedavg" / f"seed{seed}" / "summary.json").read_text() for seed in (0, 1)}
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # the cells' processes exit 1 at once, silent
    lines: list[str] = []
    report, all_done = run_suite(suite, out, pack=pack, echo=lines.append)
    assert not all_done
    assert sum("failed (exit 1): no output" in line for line in lines) == 2, lines
    assert not any("completed" in line for line in lines), lines
    assert {seed: (out / "runs" / "fln" / "fedavg" / f"seed{seed}" / "summary.json").read_text()
            for seed in (0, 1)} == left
    assert "Not completed (left out of the table): `fedavg`: failed (exit 1): no output" in report.read_text()


TEXTS = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "shakespeare"


@pytest.mark.skipif(not TEXTS.is_dir(), reason="../shared/data/shakespeare is absent")
def test_a_section_that_pretrains_starts_its_models_cells_from_one_base_named_by_how_it_was_made(
        tmp_path: Path) -> None:
    from graphfed.config import same_run

    lora = {"width": 16, "layers": 1, "heads": 2, "adapter": {"kind": "lora", "rank": 2}}
    section = {"pretrain": {"steps": 2, "batch": 4, "stride": 400},
               "config": {"dataset": {"name": "shakespeare", "plays": ["macbeth"], "num_clients": 3,
                                      "novel_fraction": 0.0, "text_stride": 80},
                          "model": {"name": "char-transformer", "options": lora}},
               "methods": ["fedavg", "lstm"],
               "variants": {"lstm": {"method": "fedavg", "config": {"model": {"name": "leaf-lstm"}}}}}
    suite = Suite.model_validate({"name": "t", "seeds": 2, "datasets": {"text": section},
                                  "base": {"train": {"rounds": 1, "local_steps": 1, "batch_size": 4}}})
    cells = suite_cells(suite, out=tmp_path)
    bases = {str(cell.config.model.base) for cell in cells if cell.method == "fedavg"}
    assert len(bases) == 1 and Path(bases.pop()).parent == tmp_path / "bases"  # one base for every seed
    lstm = next(cell for cell in cells if cell.method == "lstm")
    assert lstm.config.model.base is None and lstm.config.model.options == {}  # another model: none of its options
    # pretrained otherwise, the base is another file, so the runs from it are runs of another config
    section["pretrain"]["steps"] = 3
    other = suite_cells(Suite.model_validate({"name": "t", "datasets": {"text": section}}), out=tmp_path)[0]
    assert other.config.model.base != cells[0].config.model.base
    # where the bases lie is not part of a run
    moved = cells[0].config.model_copy(update={"model": cells[0].config.model.model_copy(
        update={"base": f"/elsewhere/{Path(str(cells[0].config.model.base)).name}"})})
    assert same_run(moved, cells[0].config) and not same_run(other.config, cells[0].config)
    said: list[str] = []
    bench.ensure_bases(suite, cells, TEXTS.parent, said.append)
    assert Path(str(cells[0].config.model.base)).is_file() and "pretraining" in said[0]
    bench.ensure_bases(suite, cells, TEXTS.parent, said.append)
    assert said[-1].endswith("pretrained before, reused")
