"""The reproduction report of a suite (``report.md`` and ``report.json``): one table per dataset, the claims'
verdicts on top, every number from the runs' results. It reads runs and renders; ``graphfed.bench`` runs them."""

from __future__ import annotations

import json
import os
import platform
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from statistics import fmean
from typing import Any

import torch

from graphfed import runs
from graphfed.config import runs_on_a_clock
from graphfed.provenance import code_provenance, cpu_kernels, vouches_checked_on
from graphfed.report.plots import plot_comparison
from graphfed.report.tables import (
    add_standings,
    compare_rows,
    format_value,
    metric_note,
    row_cells,
    time_to_target_line,
)
from graphfed.report.tables import headers as table_headers
from graphfed.report.verdicts import (
    TEST_NAME,
    compare_against,
    factor_comparison,
    sample_std,
    seeds_to_decide,
    verdict,
    with_seeds_to_decide,
)
from graphfed.runs import RunResult
from graphfed.suites import Cell, Claim, Suite, SuiteDataset


def current_code_id() -> str:
    """The running code's id over all its computing sources (benchmarks that are not runs record it)."""
    return str(code_provenance()["code_id"])


#: why a run of a suite's cell is stale, given its dataset key, method and result (None: made by today's code);
#: ``graphfed.bench.stale`` decides it from the run's recorded engine behaviour and modules
StaleOf = Callable[[str, str, RunResult], "str | None"]


def _current(key: str, method: str, run: RunResult) -> str | None:
    """A judge that finds no run stale (tests of a report's layout; a report of runs just made)."""
    return None


# ---- the report ----------------------------------------------------------------------------------------
NOT_RUN = "not run"
EXTRA_HEADERS = ["peak RSS MiB"]  # after the comparison table's own columns

PROTOCOL = (
    "Each run is scored at its best-validation round (evaluated every `train.eval_every` rounds); a run's score "
    "is the mean over its training clients of each client's test metric. Tables give the mean ± std over seeds "
    "of that score, and the std over clients averaged over seeds. Novel clients (where the dataset holds some "
    "out) never train and are scored at the same round without fine-tuning; 'novel (adapted)' is a separate "
    "embedding-only adaptation. 'wall s' is the training loop of one run, 'peak RSS' the largest peak memory of "
    "a run's process over the seeds: a cell run by `graphfed bench --in-process` shares the bench's process "
    "with the cells before it, so its peak counts theirs. Paper columns quote the paper as printed (its ± is "
    "usually the spread over clients): they are context, not the same experiment — see each reference's notes.")


def _paper_cells(entry: SuiteDataset, method: str) -> list[str]:
    cells = []
    for reference in entry.paper:
        number = reference.numbers.get(method)
        test = number.test if number and number.test else "—"
        cells.append(test if not (number and number.novel) else f"{test} (novel {number.novel})")
    return cells


def _dataset_section(key: str, entry: SuiteDataset, cells: list[Cell],
                     results: dict[tuple[str, str], list[RunResult]], out: Path,
                     plots: bool = True, stale_of: StaleOf | None = None) -> tuple[str, list[dict]]:
    own = [cell for cell in cells if cell.dataset == key]
    methods = list(dict.fromkeys(cell.method for cell in own))
    completed = {method: [s for s in results.get((key, method), []) if s.completed] for method in methods}
    failed = {method: [s.status for s in results.get((key, method), []) if s.status not in ("completed", NOT_RUN)]
              for method in methods}
    not_run = [method for method in methods if not completed[method] and not failed[method]]
    rows = compare_rows({method: runs for method, runs in completed.items() if runs})
    add_standings(rows)  # each row against the section's best: the test compare prints
    # runs made by code that changed since: marked in the table and listed under it, never mixed silently
    stale_of = stale_of or _current
    stale = {method: [why for s in runs if (why := stale_of(key, method, s))]
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
    units = rows[0].get("units") if rows else None
    headers = [*table_headers(config_metric(rows), units=units), *EXTRA_HEADERS,
               *(["MAE, data units"] if with_mae else []), *(["± over test rows (95 %)"] if with_rows else []),
               *(["late joiners, last round"] if with_late else []), *(reference.label for reference in entry.paper)]
    lines = [f"## {entry.title or key}", ""]
    if entry.description:
        lines += [entry.description, ""]
    seeds = sorted({cell.config.seed for cell in own})
    lines += [f"`{key}`: dataset `{config.dataset.name}`, model `{config.model.name}` "
              f"{json.dumps(config.model.options) if config.model.options else ''}; {train.rounds} rounds, "
              f"{train.clients_per_round} clients per round, {train.local_steps} local steps of batch "
              f"{train.batch_size} at lr {train.lr}; evaluation every {train.eval_every} rounds; seeds "
              f"{', '.join(map(str, seeds))}. {metric_note(config_metric(rows), units)} {budget_line(entry, train)}"
              .rstrip(),
              ""]
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
    stale_rows = [f"`{method}` {len(reasons)} of {len(completed[method])} ({'; '.join(sorted(set(reasons)))})"
                  for method, reasons in stale.items() if reasons]
    if stale_rows:
        lines += ["", "† Stale: runs made by code that has changed since, kept until re-run: "
                  + "; ".join(stale_rows) + "."]
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
    timing = time_to_target_line(rows, train.target_score)
    if timing:
        lines += ["", timing[0].upper() + timing[1:] + "."]
    for reference in entry.paper:
        lines += ["", f"*{reference.label}*: {reference.source}" + (f" ({reference.unit})" if reference.unit else "")
                  + (f". {reference.notes}" if reference.notes else "")]
    if rows:
        if plots:
            histories = {row["method"]: runs.RoundLog(Cell(key, row["method"], config).directory(out)).read()
                         for row in rows}
            plot_comparison(histories, out / "plots" / f"{key}.png", config_metric(rows),
                            title=f"{entry.title or key} (seed {config.seed})",
                            x="sim_seconds" if runs_on_a_clock(config) else "round")
        lines += ["", f"![convergence, {key}](plots/{key}.png)"]
    return "\n".join(lines) + "\n", rows


def budget_line(entry: SuiteDataset, train: Any) -> str:
    """The section's budget as a fraction of each paper's, in training rows processed over a run (rounds x clients
    per round x a client's rows a round)."""
    if not entry.paper_budgets:
        return ""
    ours = train.rounds * train.clients_per_round * train.local_steps * train.batch_size
    parts = []
    for budget in entry.paper_budgets:
        theirs = budget.rounds * (budget.clients_per_round or train.clients_per_round) * budget.rows_per_round()
        parts.append(f"{_percent(ours / theirs)} of {budget.paper}'s ({budget.describe()}; rounds: {train.rounds} of "
                     f"{budget.rounds})")
    return "Budget, in training rows processed: " + "; ".join(parts) + "."


def _percent(share: float) -> str:
    return f"{100 * share:.2g} %" if share < 0.1 else f"{100 * share:.0f} %"


def config_metric(rows: list[dict[str, Any]]) -> str:
    return rows[0]["metric"] if rows else "accuracy"


def environment() -> dict[str, Any]:
    return {"torch": torch.__version__, "platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "cpu": cpu_kernels()}


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
    missing = [m for m in needed if m not in rows or not (rows[m]["per_seed"][claim.column]
                                                          or (claim.column == "time" and rows[m]["time_unreached"]))]
    if missing:
        return {"here": f"no {claim.column} score yet for {', '.join(missing)}", "verdict": "not run yet",
                "comparisons": [], "seeds_to_decide": None}
    unreached = [f"{m} ({rows[m]['time_unreached']} of {rows[m]['seeds']} seeds)" for m in needed
                 if claim.column == "time" and rows[m]["time_unreached"]]
    if unreached:  # a seed that never reached the target has no time: the rest alone would flatter its row
        return {"here": f"`{claim.dataset}`, time to the target: never reached by {', '.join(unreached)}",
                "verdict": "inconclusive: a seed never reached the target within its run", "comparisons": [],
                "seeds_to_decide": None}
    mine = rows[claim.better]["per_seed"][claim.column]
    higher = rows[claim.better]["metric"] == "accuracy" and claim.column != "time"
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
    if claim.column == "time":  # how many times faster, as timing claims are made
        shown += [f"{other} / {claim.better} = {fmean(theirs) / fmean(mine):.2f}x the time" for other, theirs
                  in baselines.items() if fmean(mine) > 0]
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
        verdict_text = with_seeds_to_decide(item["verdict"], item["seeds_to_decide"])
        title = claim.claim + (" *(our question)*" if claim.question else "") + (f" ({claim.note})" if claim.note
                                                                                  else "")
        where = f"seed {claim.seed_file}, {claim.table}" if claim.seed_file else claim.table
        lines.append(f"| {title} | {where} | {claim.paper_numbers or '—'} | {item['here']} | {verdict_text} |")
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
                    out: Path, plots: bool = True, stale_of: StaleOf | None = None,
                    ) -> tuple[list[str], dict[str, list[RunResult]]]:
    """Each dataset's section of the report (its table, notes and plot) and its table rows. Runs ``stale_of`` finds
    stale are marked (default: none is; ``graphfed bench`` passes its judgement of each run's code)."""
    stale_of = stale_of or _current
    sections, tables = [], {}
    for key, entry in suite.datasets.items():
        if any(cell.dataset == key for cell in cells):
            text, rows = _dataset_section(key, entry, cells, results, out, plots, stale_of)
            sections.append(text)
            tables[key] = rows
    return sections, tables


def write_report(suite: Suite, cells: list[Cell], results: dict[tuple[str, str], list[RunResult]],
                 out: Path, command: str | None, seconds: float, stale_of: StaleOf | None = None) -> Path:
    """``OUT/report.md`` (or the suite's ``report`` name: tables, plots, paper numbers) and ``OUT/report.json``
    (every summary and row)."""
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    code = code_provenance()
    total_run_seconds = sum(s.cell_seconds or 0.0 for results_of_cell in results.values() for s in results_of_cell)
    stale_of = stale_of or _current
    sections, tables = report_sections(suite, cells, results, out, stale_of=stale_of)
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
    header += [*_invocation_lines(invocations, env), "", code_line(results, stale_of), "", PROTOCOL, ""]
    report = out / suite.report
    runs.atomic_write_text(report, "\n".join(header + sections + deviations_section(suite)))
    payload = {"suite": suite.model_dump(mode="json"), "invocations": invocations, "environment": env,
               "code": code, "verdicts": claim_verdicts(suite, tables), "tables": tables,
               "runs": run_index(results, stale_of)}
    runs.atomic_write_text(out / "report.json", json.dumps(payload, indent=2, default=str) + "\n")
    return report


def run_index(results: dict[tuple[str, str], list[RunResult]], stale_of: StaleOf) -> dict[str, list[dict[str, Any]]]:
    """Each cell's runs as ``report.json`` lists them: seed, status, headline score, the code that ran it (and why it
    is stale when the report was written, else None) and where its ``summary.json`` lies (relative to the report),
    not the summaries again (they are committed beside it)."""
    return {f"{key}/{method}": [{"seed": result.seed, "status": result.status, "test_mean": result.test_mean,
                                 "code_id": (result.code or {}).get("code_id"),
                                 "stale": stale_of(key, method, result) if result.completed else None,
                                 "summary": None if result.seed is None  # a cell not run has no summary
                                 else f"runs/{key}/{method}/seed{result.seed}/{runs.SUMMARY}"}
                                for result in results_of_cell]
            for (key, method), results_of_cell in results.items()}


def _invocation_lines(invocations: list[dict[str, Any]], env: dict[str, Any]) -> list[str]:
    """The invocations that wrote runs into this folder, with their time in new cells; runs made in another folder
    (a git worktree, another machine) and copied in leave no invocation here, so the lines say where to look."""
    machine = (f"torch {env['torch']}, {env['cpu_count']} CPU(s) ({env.get('cpu', 'kernels unrecorded')}), "
               f"{env['platform']}.")
    copied = ("Runs made in another folder and copied in are not listed here; each run's `summary.json` records "
              "the code id and git commit that made it.")
    if not invocations:
        return [f"No invocation is recorded in this folder. {copied}", "", f"Report written on {machine}"]
    return ["Produced by these invocations, in order (each reuses the cells finished before it):", "", "```",
            *(item["command"] for item in invocations), "```", "",
            f"{machine} Time spent in cells run by each invocation: "
            + ", ".join(f"{item['seconds_in_new_cells']:.0f} s" for item in invocations) + f". {copied}"]


def code_line(results: dict[tuple[str, str], list[RunResult]], stale_of: StaleOf) -> str:
    """One paragraph: whether every run is a run of the code that wrote the report (its engine's behaviour and the
    run's own modules, :mod:`graphfed.provenance`), how many are stale, why, and on which CPU kernels they ran."""
    finished = [(key, method, s) for (key, method), results_of_cell in results.items() for s in results_of_cell
                if s.completed]
    reasons = Counter(why for key, method, run in finished if (why := stale_of(key, method, run)))
    text = ("Code: a run is current while its engine's behaviour and its own method, model and dataset modules are "
            "the code's that wrote this report (each summary.json records them). ")
    if not reasons:
        text += f"All {len(finished)} runs are current."
    else:
        text += (f"{sum(reasons.values())} of {len(finished)} runs are stale ("
                 + "; ".join(f"{why}: {count}" for why, count in reasons.most_common())
                 + "): marked † in their tables and listed under them until re-run (`graphfed bench` re-runs them).")
    return text + " " + kernels_sentence([run for _, _, run in finished])


def kernels_sentence(finished: list[RunResult]) -> str:
    """Which CPU kernels the runs ran on (summary.json ``code.cpu``): a config re-run on other kernels gives its
    numbers to float rounding only, so a reader re-running a table needs to know."""
    kinds = Counter(str((run.code or {}).get("cpu") or "not recorded") for run in finished)
    here = cpu_kernels()
    listed = "; ".join(f"{'this machine' if kind == here else kind}: {count}" for kind, count in kinds.most_common())
    checked = vouches_checked_on()
    vouched = (f" The vouch that relates earlier engines to today's compared their runs on: {'; '.join(checked)}."
               if checked else "")
    return (f"CPU kernels (summary.json `code.cpu`; runs before they were recorded say nothing): {listed}. Re-run "
            "on the same kernels, torch and thread count, a run gives its numbers bit for bit; on others they agree "
            "to float rounding, and what feeds rounding back (a novel client's adaptation) can move further."
            + vouched)


__all__ = ["NOT_RUN", "StaleOf", "claim_verdict", "claim_verdicts", "code_line", "current_code_id",
           "deviations_section", "kernels_sentence", "report_sections", "verdict_counts", "verdict_table",
           "write_report"]
