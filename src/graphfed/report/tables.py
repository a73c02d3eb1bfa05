"""Aggregate run summaries into comparison tables (mean ± std over seeds)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphfed.runs import RunResult


def _present(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def _mean_std(values: Sequence[float | None]) -> tuple[float, float] | None:
    """Mean and sample standard deviation (n - 1; 0 for one value, which tables print as n=1)."""
    present = _present(values)
    if not present:
        return None
    return statistics.fmean(present), statistics.stdev(present) if len(present) > 1 else 0.0


#: width tables are laid out in when output is not a terminal (a pipe, a file, CI): wide enough that no value is
#: ever cut to "8.206e…"; a terminal keeps its own width
PIPE_WIDTH = 1000


def print_table(console: Any, table: Any) -> None:
    """Print a rich table: in a terminal, at its width; elsewhere, every value in full (rich would lay it out in
    80 columns, folding or cutting cells)."""
    if console.is_terminal:
        console.print(table)
        return
    from rich.console import Console

    Console(file=console.file, width=PIPE_WIDTH).print(table)


def metric_label(metric: str) -> str:
    """The metric as every table and plot names it, with its unit and direction: accuracy is shown in % (summary.json
    keeps fractions), MSE as is."""
    return "accuracy % ↑" if metric == "accuracy" else f"{metric.upper()} ↓"


def metric_note(metric: str) -> str:
    """One sentence saying what the numbers of a table are."""
    if metric == "accuracy":
        return "Metric: accuracy in % (higher is better; summary.json stores it as a fraction)."
    return f"Metric: {metric.upper()} (lower is better), in the units summary.json stores."


def format_value(stats: tuple[float, float] | None, metric: str, n: int | None = None) -> str:
    """``mean ± sample std``; with ``n == 1`` the mean and "(n=1)": one seed measures no spread."""
    if stats is None:
        return "—"
    mean, std = stats
    if metric == "accuracy":
        return f"{100 * mean:.2f} (n=1)" if n == 1 else f"{100 * mean:.2f} ± {100 * std:.2f}"
    return f"{mean:.3e} (n=1)" if n == 1 else f"{mean:.3e} ± {std:.1e}"


def compare_rows(summaries: dict[str, list[RunResult]]) -> list[dict[str, Any]]:
    """One row per method: mean ± std over seeds of the per-client mean, plus the other columns."""
    rows = []
    for method, runs in summaries.items():
        metric = runs[0].metric
        rows.append({
            "method": method, "metric": metric, "seeds": len(runs),
            "test": _mean_std([r.test_mean for r in runs]),
            "client_std": _mean_std([r.test_std for r in runs]),
            "pooled": _mean_std([r.test_pooled for r in runs]),
            "novel": _mean_std([r.novel_mean for r in runs]),
            "novel_adapted": _mean_std([r.novel_adapted_mean for r in runs]),
            "wall_seconds": statistics.fmean(r.wall_seconds or 0.0 for r in runs),
            "mb_up": statistics.fmean(r.bytes_up or 0 for r in runs) / 1e6,
            # regression with a known target scale only; runs written before these fields existed lack them
            "mae_original_units": _mean_std([r.test_mae_original_units for r in runs]),
            # runs with clients that joined late (train.late_clients): their score at the last round
            "late": _mean_std([r.late_test_final for r in runs]),
            # standard error over test rows (classification; runs before it was recorded lack it)
            "row_se": _mean_std([r.test_row_se for r in runs]),
            "peak_rss_mb": max((r.peak_rss_mb for r in runs if r.peak_rss_mb is not None), default=None),
            # the per-seed scores the verdicts test (report.json keeps them, and each run's summary with its seed)
            "per_seed": {"test": _present([r.test_mean for r in runs]),
                         "novel": _present([r.novel_mean for r in runs]),
                         "late": _present([r.late_test_final for r in runs])},
        })
    return rows


def headers(metric: str) -> list[str]:
    """The comparison table's columns, the metric named in the first number column."""
    return ["method", f"test {metric_label(metric)} (mean ± sample std over seeds)", "std over clients", "pooled",
            "novel", "novel (adapted)", "wall s", "MB up"]


def row_cells(row: dict[str, Any]) -> list[str]:
    metric = row["metric"]
    client_std = row["client_std"]
    std_text = "—" if client_std is None else (
        f"{100 * client_std[0]:.2f}" if metric == "accuracy" else f"{client_std[0]:.1e}")
    n = row["seeds"]
    return [row["method"], format_value(row["test"], metric, n), std_text, format_value(row["pooled"], metric, n),
            format_value(row["novel"], metric, n), format_value(row["novel_adapted"], metric, n),
            f"{row['wall_seconds']:.1f}", f"{row['mb_up']:.2f}"]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    metric = rows[0]["metric"] if rows else "accuracy"
    columns = headers(metric)
    lines = [metric_note(metric), "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"
