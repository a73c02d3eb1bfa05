"""``graphfed bench SUITE.yaml``: a resumable grid of methods x datasets x seeds and its markdown report.

A suite file names the grid and, where a paper reports a cell, the paper's number beside it::

    name: smoke
    seeds: 2                      # seeds per cell: seed, seed+1, ... from the config's seed
    base:                         # RunConfig fields shared by every cell
      torch_threads: 1
      train: {rounds: 20, local_steps: 10}
    datasets:
      fl60:                       # a key of your choice: one table in the report
        title: FL-60
        config: {dataset: {name: fl60, novel_fraction: 0.2}}   # merged over base
        methods: [panacea, panacea-big, fedavg]
        method_options: {panacea: {server_steps: 2}}
        variants: {panacea-big: {method: panacea, options: {hypernet_hidden: 200}}}  # a row of its own
        paper:
          - label: Panacea T2
            source: "Panacea Table II (accuracy %, mean ± std over clients)"
            numbers: {panacea: {test: "100.0 ± 0.0", novel: "100.0 ± 0.0"}}

A relative ``dataset.data_dir`` in a suite is relative to the suite file; a dataset whose config names none
reads ``--data-dir``, then ``$GRAPHFED_DATA``, then ``../shared/data``.

Every cell runs in its own directory ``OUT/runs/<dataset key>/<method>/seed<k>``. A cell whose directory holds
a completed summary of the same config is skipped; one with a checkpoint of the same config resumes from it, so
an interrupted grid continues where it stopped. By default each cell runs in a fresh ``graphfed run``
process, which isolates failures and makes each summary's ``peak_rss_mb`` that cell's own peak memory.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from graphfed import runs
from graphfed.config import (
    ConfigError,
    RunConfig,
    dump_config,
    load_config,
    read_yaml_mapping,
    same_run,
    validate_config,
)
from graphfed.errors import GraphfedError, UntrustedInputError
from graphfed.provenance import code_id_of, code_provenance
from graphfed.report.plots import plot_comparison
from graphfed.report.tables import compare_rows, format_value, metric_note, row_cells
from graphfed.report.tables import headers as table_headers
from graphfed.report.verdicts import TEST_NAME, compare_against, factor_comparison, sample_std, seeds_to_decide, verdict
from graphfed.runs import RunResult
from graphfed.setup import resolve_method
from graphfed.sim import checkpoint


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PaperCell(_Strict):
    test: str | None = None
    novel: str | None = None


class PaperReference(_Strict):
    """Numbers one paper reports for one dataset setting (as printed, with the paper's own ± and unit)."""

    label: str = Field(description="short column header, e.g. 'FedAGHN T2'")
    source: str = Field(description="table caption and setting")
    unit: str = ""
    notes: str = ""
    numbers: dict[str, PaperCell] = Field(default_factory=dict)


class Variant(_Strict):
    """A method under its own label with fixed options, e.g. ``fedaghn-released``, and optionally its own run
    settings merged over the dataset's (an ablation of K_c is ``config: {train: {local_steps: 1}}``)."""

    method: str
    options: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _method_is_named_once(self) -> Variant:
        if "method" in self.config or "seed" in self.config:
            raise ValueError("a variant's config cannot set method or seed: use its method and options")
        return self


#: Names that become folder names (suite dataset keys, method labels): no separators, no leading dot, no
#: control characters, so a hostile suite cannot write outside ``--out`` (``../../x``, ``/abs``).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def check_safe_name(name: str, what: str) -> str:
    if not SAFE_NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r} cannot name a folder: use letters, digits, '.', '_', '+', '-' "
                         f"(not first), at most 100 characters")
    return name


class SuiteDataset(_Strict):
    title: str | None = None
    description: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    methods: list[str] = Field(min_length=1, description="method names or labels of `variants`")
    method_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    variants: dict[str, Variant] = Field(default_factory=dict)
    seeds: int | None = Field(default=None, ge=1, description="default: the suite's seeds")
    paper: list[PaperReference] = Field(default_factory=list)

    @model_validator(mode="after")
    def _labels_are_folder_names(self) -> SuiteDataset:
        for label in (*self.methods, *self.variants):
            check_safe_name(label, "method label")
        return self


class Claim(_Strict):
    """A paper's headline claim, checked against the suite's own cells (or answered by another report)."""

    claim: str = Field(description="the claim as the paper makes it")
    seed_file: str = Field(description="the paper in ../shared/seeds/ (its number, e.g. '003')")
    table: str = Field(description="where the paper makes the claim: table, figure or section")
    paper_numbers: str = Field(default="", description="the paper's own numbers for the claim, as printed")
    question: bool = Field(default=False, description="our own question, not a claim the paper makes")
    note: str = ""
    dataset: str | None = Field(default=None, description="the suite's dataset key whose table tests the claim")
    better: str | None = Field(default=None, description="the method claimed to be better")
    than: list[str] = Field(default_factory=list, description="the methods it is claimed to beat")
    column: Literal["test", "novel", "late"] = "test"
    factor: float | None = Field(default=None, gt=1, description="MSE only: claimed ratio (theirs / ours), e.g. 100")
    see: str | None = Field(default=None, description="instead of a cell: the report that answers the claim")

    @model_validator(mode="after")
    def _a_cell_or_a_report(self) -> Claim:
        if self.see is None and (self.dataset is None or self.better is None or not self.than):
            raise ValueError(f"claim {self.claim!r}: give dataset, better and than (or see: another report)")
        return self


class Suite(_Strict):
    name: str
    description: str = ""
    seeds: int = Field(default=3, ge=1)
    base: dict[str, Any] = Field(default_factory=dict)
    datasets: dict[str, SuiteDataset] = Field(min_length=1)
    report: str = Field(default="report.md", description="file name of the report in --out (a suite whose own "
                        "script writes report.md, e.g. robustness.yaml, names another)")
    claims: list[Claim] = Field(default_factory=list, description="the papers' claims: a verdict table on top")
    deviations: dict[str, list[str]] = Field(default_factory=dict, description="per paper, every way this suite "
                                             "differs from it, with the reason")

    @model_validator(mode="after")
    def _keys_are_folder_names(self) -> Suite:
        for key in self.datasets:
            check_safe_name(key, "dataset key")
        for claim in self.claims:
            if claim.dataset is not None and claim.dataset not in self.datasets:
                raise ValueError(f"claim {claim.claim!r}: dataset {claim.dataset!r} is not a key of the suite")
        check_safe_name(self.report, "report file name")
        if not self.report.endswith(".md"):
            raise ValueError(f"report {self.report!r}: a markdown file name ending in .md")
        return self


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    dataset: str  # the suite's key
    method: str  # the method's name, or a variant's label
    config: RunConfig

    def directory(self, out: Path) -> Path:
        path = out / "runs" / self.dataset / self.method / f"seed{self.config.seed}"
        if not path.resolve().is_relative_to(out.resolve()):  # the names are checked on load; never trust them
            raise ConfigError(f"cell {self.dataset}/{self.method} would be written outside {out}")
        return path


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_suite(path: Path) -> Suite:
    """Read and validate a suite file; ConfigError with one line naming the file and the field."""
    data = read_yaml_mapping(path, "suite file")
    try:
        suite = Suite.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{path}: {field}: {message}" if field else f"{path}: {message}") from None
    for config in (suite.base, *(entry.config for entry in suite.datasets.values())):
        _anchor_data_dir(config, path.parent)
    return suite


def _anchor_data_dir(config: dict[str, Any], folder: Path) -> None:
    """A relative ``dataset.data_dir`` in a suite is relative to the suite file, not to where bench runs."""
    dataset = config.get("dataset")
    data_dir = dataset.get("data_dir") if isinstance(dataset, dict) else None
    if isinstance(data_dir, str) and not Path(data_dir).expanduser().is_absolute():
        dataset["data_dir"] = str((folder / data_dir).resolve())


def suite_cells(suite: Suite, datasets: list[str] | None = None, methods: list[str] | None = None,
                seeds: int | None = None, overrides: dict[str, Any] | None = None) -> list[Cell]:
    """Every cell's validated config, all checked before anything runs. Filters select a part of the grid."""
    unknown = [key for key in datasets or [] if key not in suite.datasets]
    if unknown:
        raise ConfigError(f"--datasets: not in the suite: {', '.join(unknown)}; the suite has "
                          f"{', '.join(suite.datasets)}")
    cells = []
    for key, entry in suite.datasets.items():
        if datasets and key not in datasets:
            continue
        shared = _deep_merge(_deep_merge(suite.base, entry.config), overrides or {})
        for method in entry.methods:
            if methods and method not in methods:
                continue
            variant = entry.variants.get(method) or Variant(method=method, options=entry.method_options.get(method, {}))
            data = _deep_merge(_deep_merge(shared, variant.config),
                               {"method": {"name": variant.method, "options": variant.options}})
            first_seed = int(data.get("seed", 0))
            for k in range(seeds or entry.seeds or suite.seeds):
                data["seed"] = first_seed + k
                try:
                    config = validate_config(data)
                except ConfigError as err:
                    raise ConfigError(f"datasets.{key}, method {method}: {err}") from None
                cells.append(Cell(key, method, config))
    return cells


# ---- running -------------------------------------------------------------------------------------------
def _same_config(directory: Path, config: RunConfig) -> bool:
    """Whether ``directory`` ran ``config``. Compared after validation, so a config.yaml written before a new
    field with a default existed still matches; the data's location is not compared (``same_run``), so committed
    results stay finished in a clone under another root."""
    try:
        return same_run(load_config(directory / runs.CONFIG), config)
    except (ConfigError, OSError):
        return False


def _completed_summary(directory: Path) -> RunResult | None:
    try:
        summary = runs.read_result(directory)
    except (OSError, UntrustedInputError):
        return None
    return summary if summary.completed else None


def _ran_with_options(summary: RunResult, config: RunConfig) -> bool:
    """Whether the run ran ``config``'s method options as they resolve now. config.yaml keeps only the options
    that were set; the summary records all, so a run made before a default changed is not reused. An option added
    since the run (not in its summary) is taken to be at its default: a new option's default keeps the behaviour
    the method had before it existed."""
    resolved = resolve_method(config).options.model_dump(mode="json")
    recorded = resolved if summary.method_options is None else summary.method_options  # older ones lack them
    return all(key in resolved and resolved[key] == value for key, value in recorded.items())


def _finished_summary(directory: Path, config: RunConfig) -> RunResult | None:
    """The completed summary of this config in ``directory``, if there is one, whatever code produced it (the
    report marks a run from other code as stale)."""
    summary = _completed_summary(directory) if _same_config(directory, config) else None
    return summary if summary is not None and _ran_with_options(summary, config) else None


def current_code_id() -> str:
    return str(code_provenance()["code_id"])


@contextmanager
def _data_dir_env(data_dir: Path | None) -> Iterator[None]:
    """Point datasets whose config names no data_dir at ``data_dir`` (cells' configs stay location-free)."""
    previous = os.environ.get("GRAPHFED_DATA")
    if data_dir is not None:
        os.environ["GRAPHFED_DATA"] = str(data_dir.resolve())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("GRAPHFED_DATA", None)
        else:
            os.environ["GRAPHFED_DATA"] = previous


def _run_in_process(cell: Cell, directory: Path, resume: bool) -> RunResult:
    from graphfed.sim.engine import run_config

    return run_config(cell.config, directory, resume=resume, progress=False)


def _run_in_subprocess(cell: Cell, directory: Path, resume: bool) -> RunResult:
    directory.mkdir(parents=True, exist_ok=True)
    cell_config = directory / "cell.yaml"
    runs.atomic_write_text(cell_config, dump_config(cell.config))
    command = [sys.executable, "-m", "graphfed.cli", "run", str(cell_config), "--out", str(directory),
               "--no-progress", *(["--resume"] if resume else [])]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        return runs.read_result(directory)
    except (OSError, UntrustedInputError):
        last_lines = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
        return RunResult(status=f"failed (exit {completed.returncode}): {' / '.join(last_lines) or 'no output'}")


def run_cells(cells: list[Cell], out: Path, in_process: bool = False, data_dir: Path | None = None,
              echo: Any = print, keep_stale: bool = False) -> dict[tuple[str, str], list[RunResult]]:
    """Run (or reuse) every cell; returns summaries by (dataset key, method). A failed cell does not stop the grid.

    A finished cell is reused only when the code that produced it is today's (its summary's code id); a cell from
    other code runs again from scratch, unless ``keep_stale`` (then the report marks it stale)."""
    today = current_code_id()
    results: dict[tuple[str, str], list[RunResult]] = {}
    with _data_dir_env(data_dir):
        for index, cell in enumerate(cells, 1):
            directory = cell.directory(out)
            label = f"[{index}/{len(cells)}] {cell.dataset} {cell.method} seed {cell.config.seed}"
            same_config = _same_config(directory, cell.config)  # read config.yaml once per cell
            completed = _completed_summary(directory) if same_config else None
            summary = completed if completed is not None and _ran_with_options(completed, cell.config) else None
            stale = summary is not None and code_id_of(summary) != today
            if summary is not None and (keep_stale or not stale):
                echo(f"{label}: done before{f' by other code ({code_id_of(summary)}), kept' if stale else ''}, "
                     "skipped")
            else:
                if stale:
                    echo(f"{label}: finished by other code (code id {code_id_of(summary)}; today {today}), "
                         "running again")
                # a run completed under other method defaults or other code starts over rather than resuming
                resume = same_config and completed is None and (directory / checkpoint.CHECKPOINT).is_file()
                echo(f"{label}: {'resuming' if resume else 'running'} ...")
                begin = time.perf_counter()
                try:
                    summary = (_run_in_process if in_process else _run_in_subprocess)(cell, directory, resume)
                except GraphfedError as err:  # the cell's input or run state; a bug is not caught here
                    summary = RunResult(status=f"failed: {err}")
                summary.cell_seconds = round(time.perf_counter() - begin, 1)
                echo(f"{label}: {summary.status}, test {summary.metric or ''} {summary.test_mean}, "
                     f"{summary.cell_seconds} s")
            results.setdefault((cell.dataset, cell.method), []).append(summary)
    return results


# ---- the report ----------------------------------------------------------------------------------------
NOT_RUN = "not run"
EXTRA_HEADERS = ["peak RSS MiB"]  # after the comparison table's own columns

PROTOCOL = (
    "Each run is scored at its best-validation round (evaluated every `train.eval_every` rounds); a run's score "
    "is the mean over its training clients of each client's test metric. Tables give the mean ± std over seeds "
    "of that score, and the std over clients averaged over seeds. Novel clients (where the dataset holds some "
    "out) never train and are scored at the same round without fine-tuning; 'novel (adapted)' is a separate "
    "embedding-only adaptation. 'wall s' is the training loop of one run, 'peak RSS' the peak memory of the "
    "run's process. Paper columns quote the paper as printed (its ± is usually the spread over clients): "
    "they are context, not the same experiment — see each reference's notes.")


def _paper_cells(entry: SuiteDataset, method: str) -> list[str]:
    cells = []
    for reference in entry.paper:
        number = reference.numbers.get(method)
        test = number.test if number and number.test else "—"
        cells.append(test if not (number and number.novel) else f"{test} (novel {number.novel})")
    return cells


def _dataset_section(key: str, entry: SuiteDataset, cells: list[Cell],
                     results: dict[tuple[str, str], list[RunResult]], out: Path,
                     plots: bool = True, reference_code: str | None = None) -> tuple[str, list[dict]]:
    own = [cell for cell in cells if cell.dataset == key]
    methods = list(dict.fromkeys(cell.method for cell in own))
    completed = {method: [s for s in results.get((key, method), []) if s.completed] for method in methods}
    failed = {method: [s.status for s in results.get((key, method), []) if s.status not in ("completed", NOT_RUN)]
              for method in methods}
    not_run = [method for method in methods if not completed[method] and not failed[method]]
    rows = compare_rows({method: runs for method, runs in completed.items() if runs})
    reference_code = reference_code or current_code_id()
    # runs from other code than the report's: marked in the table and listed under it, never mixed silently
    stale = {method: [code_id_of(s) for s in runs if code_id_of(s) != reference_code]
             for method, runs in completed.items() if runs}
    for row in rows:
        row["stale_runs"] = len(stale.get(row["method"], []))  # a verdict on them says so
    with_mae = any(row["mae_original_units"] for row in rows)  # regression with a known target scale
    with_late = any(row["late"] for row in rows)  # clients that joined late (train.late_clients)
    own_settings = {label: variant.config for label, variant in entry.variants.items() if variant.config}
    config = next((cell.config for cell in own if cell.method not in own_settings), own[0].config)
    train = config.train
    # a federation folder keeps its split under every seed: the seeds' spread is training randomness only
    fixed_split = config.dataset.name == "folder"
    with_rows = fixed_split and any(row["row_se"] for row in rows)
    headers = [*table_headers(config_metric(rows)), *EXTRA_HEADERS, *(["MAE, data units"] if with_mae else []),
               *(["± over test rows (95 %)"] if with_rows else []),
               *(["late joiners, last round"] if with_late else []), *(reference.label for reference in entry.paper)]
    lines = [f"## {entry.title or key}", ""]
    if entry.description:
        lines += [entry.description, ""]
    seeds = sorted({cell.config.seed for cell in own})
    lines += [f"`{key}`: dataset `{config.dataset.name}`, model `{config.model.name}` "
              f"{json.dumps(config.model.options) if config.model.options else ''}; {train.rounds} rounds, "
              f"{train.clients_per_round} clients per round, {train.local_steps} local steps of batch "
              f"{train.batch_size} at lr {train.lr}; evaluation every {train.eval_every} rounds; seeds "
              f"{', '.join(map(str, seeds))}. {metric_note(config_metric(rows))}", ""]
    if own_settings:
        lines += ["Rows with their own settings (the rest as above): " + "; ".join(
            f"`{label}` {', '.join(f'{name}={value}' for name, value in _flatten(settings))}"
            for label, settings in own_settings.items()) + ".", ""]
    lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        rss = "—" if row["peak_rss_mb"] is None else f"{row['peak_rss_mb']:.0f}"
        mae = row["mae_original_units"]
        mae_cells = ([] if not with_mae else ["—" if mae is None else f"{mae[0]:.3f} ± {mae[1]:.3f}"])
        late_cells = [format_value(row["late"], row["metric"], row["seeds"])] if with_late else []
        row_cells_ = ([] if not with_rows else ["—" if row["row_se"] is None
                                                else f"± {100 * 1.96 * row['row_se'][0]:.2f}"])
        cells_of_row = row_cells(row)
        if stale.get(row["method"]):
            cells_of_row[0] += " †"
        lines.append("| " + " | ".join([*cells_of_row, rss, *mae_cells, *row_cells_, *late_cells,
                                         *_paper_cells(entry, row["method"])]) + " |")
    if fixed_split:
        lines += ["", "This federation's split is the same under every seed: the ± over seeds covers training "
                  "randomness only." + (" '± over test rows' is the 95 % half-width that resampling the test rows "
                                        "would add (binomial per client, normal approximation; mean over seeds)."
                                        if with_rows else "")]
    stale_rows = [f"`{method}` {len(ids)} of {len(completed[method])} (code {', '.join(sorted(set(ids)))})"
                  for method, ids in stale.items() if ids]
    if stale_rows:
        lines += ["", f"† Stale: runs from other code than this report's (code id {reference_code}), kept until "
                  "re-run: " + "; ".join(stale_rows) + "."]
    torch_versions = Counter(str((s.code or {}).get("torch", "unrecorded"))
                             for runs in completed.values() for s in runs)
    if len(torch_versions) > 1:  # the same code can compute other numbers under another torch: say so
        lines += ["", "Runs by torch version (summary.json `code.torch`; the same code and config can give other "
                  "numbers under another torch): " + ", ".join(f"{version} {count}" for version, count
                                                              in sorted(torch_versions.items())) + "."]
    missing = [f"`{method}`: {'; '.join(statuses)}" for method, statuses in failed.items() if statuses]
    if missing:
        lines += ["", "Not completed (left out of the table): " + " — ".join(missing)]
    if not_run:
        lines += ["", "Not run yet: " + ", ".join(f"`{method}`" for method in not_run)]
    partial = [f"`{row['method']}` ({row['seeds']} of {len(seeds)})" for row in rows if row["seeds"] < len(seeds)]
    if partial:
        lines += ["", "Fewer seeds than the suite asks: " + ", ".join(partial)]
    for reference in entry.paper:
        lines += ["", f"*{reference.label}*: {reference.source}" + (f" ({reference.unit})" if reference.unit else "")
                  + (f". {reference.notes}" if reference.notes else "")]
    if rows:
        if plots:
            histories = {row["method"]: runs.RoundLog(Cell(key, row["method"], config).directory(out)).read()
                         for row in rows}
            plot_comparison(histories, out / "plots" / f"{key}.png", config_metric(rows),
                            title=f"{entry.title or key} (seed {config.seed})")
        lines += ["", f"![convergence, {key}](plots/{key}.png)"]
    return "\n".join(lines) + "\n", rows


def config_metric(rows: list[dict[str, Any]]) -> str:
    return rows[0]["metric"] if rows else "accuracy"


def environment() -> dict[str, Any]:
    return {"torch": torch.__version__, "platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count()}


def _previous_invocations(out: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads((out / "report.json").read_text()).get("invocations", []))
    except (OSError, ValueError, AttributeError):
        return []


def _score_text(value: float, higher: bool, digits: int = 4) -> str:
    return f"{100 * value:.2f}" if higher else f"{value:.{digits}g}"


def claim_verdict(claim: Claim, tables: dict[str, list[RunResult]]) -> dict[str, Any]:
    """One claim decided by the report's rule (:mod:`graphfed.report.verdicts`) from its table's per-seed scores.

    Returns ``{"here": what the cells show, "verdict": ..., "comparisons": [...], "seeds_to_decide": n | None}``;
    "not run yet" while a needed cell has no score, "see that report" for a claim another report answers."""
    if claim.see is not None:
        return {"here": f"answered in [{claim.see}]({claim.see})", "verdict": "see that report", "comparisons": [],
                "seeds_to_decide": None}
    rows = {row["method"]: row for row in tables.get(claim.dataset or "", [])}
    needed = [claim.better, *claim.than]
    missing = [m for m in needed if m not in rows or not rows[m]["per_seed"][claim.column]]
    if missing:
        return {"here": f"no {claim.column} score yet for {', '.join(missing)}", "verdict": "not run yet",
                "comparisons": [], "seeds_to_decide": None}
    mine = rows[claim.better]["per_seed"][claim.column]
    higher = rows[claim.better]["metric"] == "accuracy"
    baselines = {other: rows[other]["per_seed"][claim.column] for other in claim.than}
    comparisons = compare_against(mine, baselines, higher)
    if claim.factor is not None:
        comparisons += [factor_comparison(mine, baselines[other], claim.factor, other) for other in claim.than]
    shown = [f"{claim.better} {_score_text(fmean(mine), higher)} ± {_score_text(sample_std(mine), higher, 2)} "
             f"(n={len(mine)})"]
    for comparison in comparisons:
        if comparison.factor is None:
            theirs = baselines[comparison.baseline]
            shown.append(f"{comparison.baseline} {_score_text(fmean(theirs), higher)} ± "
                         f"{_score_text(sample_std(theirs), higher, 2)} (n={len(theirs)}): {comparison.outcome}, "
                         f"p={comparison.p_value:.2g}")
        else:  # a factor
            ratio = comparison.baseline_mean / comparison.method_mean * claim.factor if comparison.method_mean else 0
            reached = {"beats": "reached", "loses": "missed", "undecided": "undecided"}[comparison.outcome]
            shown.append(f"ratio {comparison.baseline}/{claim.better} = {ratio:.3g}x against "
                         f"{claim.factor:g}x: {reached}, p={comparison.p_value:.2g}")
    stale = [m for m in needed if rows[m].get("stale_runs")]
    if stale:
        shown.append(f"runs from older code (†) in {', '.join(stale)}")
    return {"here": f"`{claim.dataset}`, {claim.column}: " + "; ".join(shown), "verdict": verdict(comparisons),
            "comparisons": [asdict(c) for c in comparisons], "seeds_to_decide": seeds_to_decide(comparisons),
            "stale_methods": stale}


VERDICT_KINDS = ("holds", "partly", "inconclusive", "does not hold here", "not run yet", "see that report")


def verdict_kind(text: str) -> str:
    return next(kind for kind in VERDICT_KINDS if text.startswith(kind))


def verdict_counts(verdicts: list[dict[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(VERDICT_KINDS, 0)
    for item in verdicts:
        counts[verdict_kind(item["verdict"])] += 1
    return {kind: count for kind, count in counts.items() if count}


def claim_verdicts(suite: Suite, tables: dict[str, list[RunResult]]) -> list[dict[str, Any]]:
    return [{"claim": claim.claim, **claim_verdict(claim, tables)} for claim in suite.claims]


def verdict_table(suite: Suite, tables: dict[str, list[RunResult]]) -> list[str]:
    if not suite.claims:
        return []
    verdicts = claim_verdicts(suite, tables)
    counts = verdict_counts(verdicts)
    lines = ["## Verdicts", "",
             f"{len(verdicts)} claims: " + ", ".join(f"{kind} {count}" for kind, count in counts.items()) + ".", "",
             f"Rule: {TEST_NAME}; per-seed scores, spreads are sample standard deviations. *holds*: the method beats "
             "every named baseline (and reaches the claimed factor); *does not hold here*: a named baseline beats "
             "it, or the factor is missed; *partly*: it beats some and loses to none, the rest undecided; "
             "*inconclusive*: it beats none and loses to none. An undecided verdict gives the seeds per method the "
             "observed differences would need (80 % power). Rows marked *(our question)* test something the paper "
             "does not claim. The budgets are smaller than the papers' (each section states its own): a claim that "
             "does not hold here may hold at the papers' budget.", "",
             "| claim | paper | paper's numbers | here | verdict |", "|---|---|---|---|---|"]
    for claim, item in zip(suite.claims, verdicts, strict=True):
        decide = item["seeds_to_decide"] if verdict_kind(item["verdict"]) in ("partly", "inconclusive") else None
        verdict_text = item["verdict"] + (f"; ~{decide} seeds per method would decide the rest"
                                          if decide is not None else "")
        title = claim.claim + (" *(our question)*" if claim.question else "") + (f" ({claim.note})" if claim.note
                                                                                  else "")
        lines.append(f"| {title} | seed {claim.seed_file}, {claim.table} | {claim.paper_numbers or '—'} | "
                     f"{item['here']} | {verdict_text} |")
    return [*lines, ""]


def deviations_section(suite: Suite) -> list[str]:
    if not suite.deviations:
        return []
    lines = ["## Deviations from the papers", ""]
    for paper, items in suite.deviations.items():
        lines += [f"**{paper}**", "", *(f"- {item}" for item in items), ""]
    return lines


def _flatten(settings: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{train: {local_steps: 1}}`` -> ``[("train.local_steps", 1)]``."""
    items: list[tuple[str, Any]] = []
    for name, value in settings.items():
        if isinstance(value, dict):
            items += _flatten(value, f"{prefix}{name}.")
        else:
            items.append((f"{prefix}{name}", value))
    return items


def report_sections(suite: Suite, cells: list[Cell], results: dict[tuple[str, str], list[RunResult]],
                    out: Path, plots: bool = True, reference_code: str | None = None,
                    ) -> tuple[list[str], dict[str, list[RunResult]]]:
    """Each dataset's section of the report (its table, notes and plot) and its table rows. Runs whose code id is
    not ``reference_code`` (default: the running code's) are marked stale."""
    sections, tables = [], {}
    for key, entry in suite.datasets.items():
        if any(cell.dataset == key for cell in cells):
            text, rows = _dataset_section(key, entry, cells, results, out, plots, reference_code)
            sections.append(text)
            tables[key] = rows
    return sections, tables


def write_report(suite: Suite, cells: list[Cell], results: dict[tuple[str, str], list[RunResult]],
                 out: Path, command: str | None, seconds: float) -> Path:
    """``OUT/report.md`` (or the suite's ``report`` name: tables, plots, paper numbers) and ``OUT/report.json``
    (every summary and row)."""
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    code = code_provenance()
    total_run_seconds = sum(s.cell_seconds or 0.0 for results_of_cell in results.values() for s in results_of_cell)
    sections, tables = report_sections(suite, cells, results, out, reference_code=code["code_id"])
    # Every invocation that added cells to this directory, oldest first (a grid is often run in parts); a
    # report-only rewrite (command None) adds none.
    invocations = _previous_invocations(out)
    if command is not None:
        invocations.append({"command": command, "seconds": round(seconds, 1),
                            "seconds_in_new_cells": round(total_run_seconds, 1),
                            "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
    header = [f"# {suite.name}", ""]
    if suite.description:
        header += [suite.description.strip(), ""]
    header += [*verdict_table(suite, tables)]
    header += ["Produced by these invocations, in order (each reuses the cells finished before it):", "", "```",
               *(item["command"] for item in invocations), "```", "",
               f"torch {env['torch']}, {env['cpu_count']} CPU(s), {env['platform']}. Time spent in cells run by "
               "each invocation: " + ", ".join(f"{item['seconds_in_new_cells']:.0f} s" for item in invocations) + ".",
               "", code_line(results, code["code_id"]), "", PROTOCOL, ""]
    report = out / suite.report
    runs.atomic_write_text(report, "\n".join(header + sections + deviations_section(suite)))
    payload = {"suite": suite.model_dump(mode="json"), "invocations": invocations, "environment": env,
               "code": code, "verdicts": claim_verdicts(suite, tables), "tables": tables,
               "runs": {f"{key}/{method}": [result.to_json() for result in results_of_cell]
                        for (key, method), results_of_cell in results.items()}}
    runs.atomic_write_text(out / "report.json", json.dumps(payload, indent=2, default=str) + "\n")
    return report


def code_line(results: dict[tuple[str, str], list[RunResult]], reference_code: str) -> str:
    """One sentence: the code id the report was written by, and how many of its runs come from other code."""
    finished = [s for results_of_cell in results.values() for s in results_of_cell if s.completed]
    stale = sorted({code_id_of(s) for s in finished if code_id_of(s) != reference_code})
    count = sum(code_id_of(s) != reference_code for s in finished)
    text = f"Code: this report was written by code id `{reference_code}` (graphfed's computing sources, SHA-256). "
    if not count:
        return text + f"All {len(finished)} runs are from that code."
    return text + (f"{count} of {len(finished)} runs are from other code ({', '.join(stale)}): stale, marked † in "
                   "their tables and listed under them until re-run (`graphfed bench` re-runs them).")


def run_suite(suite_path: Path, out: Path, datasets: list[str] | None = None, methods: list[str] | None = None,
              seeds: int | None = None, overrides: dict[str, Any] | None = None, data_dir: Path | None = None,
              in_process: bool = False, command: str | None = None, echo: Any = print,
              report_only: bool = False, keep_stale: bool = False) -> tuple[Path, bool]:
    """Run a suite end to end; returns the report path and whether every cell completed. ``report_only``: run
    nothing, rewrite the report from the finished run directories. ``keep_stale``: reuse finished cells from other
    code instead of running them again (the report marks them)."""
    begin = time.perf_counter()
    suite = load_suite(suite_path)
    cells = suite_cells(suite, seeds=seeds, overrides=overrides)
    selected = [] if report_only else suite_cells(suite, datasets, methods, seeds, overrides)
    results = run_cells(selected, out, in_process=in_process, data_dir=data_dir, echo=echo, keep_stale=keep_stale)
    all_done = all(s.completed for results_of_cell in results.values() for s in results_of_cell)
    # The report covers the whole suite: cells a filtered invocation skipped count if an earlier one finished them.
    for cell in cells:
        if cell not in selected:
            finished = _finished_summary(cell.directory(out), cell.config)
            results.setdefault((cell.dataset, cell.method), []).append(finished or RunResult(status=NOT_RUN))
    command = command or shlex.join(["graphfed", "bench", str(suite_path), "--out", str(out)])
    report = write_report(suite, cells, results, out, None if report_only else command, time.perf_counter() - begin)
    return report, all_done


def finished_results(suite: Suite, out: Path) -> tuple[list[Cell], dict[tuple[str, str], list[RunResult]]]:
    """Every cell of ``suite`` and, per (dataset, method), the finished summaries in ``out`` (or a "not run"
    marker): what a report is written from."""
    cells = suite_cells(suite)
    results: dict[tuple[str, str], list[RunResult]] = {}
    for cell in cells:
        finished = _finished_summary(cell.directory(out), cell.config)
        results.setdefault((cell.dataset, cell.method), []).append(finished or RunResult(status=NOT_RUN))
    return cells, results


__all__ = [
    "Cell",
    "Claim",
    "PaperReference",
    "Suite",
    "claim_verdict",
    "claim_verdicts",
    "code_line",
    "deviations_section",
    "finished_results",
    "load_suite",
    "report_sections",
    "run_cells",
    "run_suite",
    "suite_cells",
    "verdict_counts",
    "verdict_table",
    "write_report",
]
