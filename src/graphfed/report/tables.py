"""Aggregate run summaries into comparison tables (mean ± std over seeds)."""

from __future__ import annotations

import math
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
    type(console)(file=console.file, width=PIPE_WIDTH).print(table)  # its class: its rule for a closed pipe


def metric_label(metric: str, units: str | None = None) -> str:
    """The metric as every table and plot names it, with its unit and direction: accuracy is shown in % (summary.json
    keeps fractions), an error in the units the federation declares (``units``; squared for MSE) or as stored."""
    if metric == "accuracy":
        return "accuracy % ↑"
    unit = "" if units is None else f" ({units})²" if metric == "mse" else f" ({units})"
    return f"{metric.upper()} ↓{unit}"


def metric_note(metric: str, units: str | None = None) -> str:
    """One sentence saying what the numbers of a table are."""
    if metric == "accuracy":
        return "Metric: accuracy in % (higher is better; summary.json stores it as a fraction)."
    if units is not None:
        squared = f"({units})²" if metric == "mse" else units
        return (f"Metric: {metric.upper()} (lower is better), in {squared}, the units the federation declares "
                f"(summary.json stores the targets divided by its target_scale).")
    return f"Metric: {metric.upper()} (lower is better), in the units summary.json stores."


def plain(value: float) -> str:
    """A number as a reader reads it: 4 significant digits in plain decimals (0.2447, 20.81, 1234), scientific only
    where plain decimals would hide it (below 0.001, from a million)."""
    size = abs(value)
    if value == 0 or 1e-3 <= size < 1e4:
        return f"{value:.4g}"
    return f"{value:,.0f}" if 1e4 <= size < 1e6 else f"{value:.3e}"


def plain_spread(mean: float, std: float) -> str:
    """``mean ± std`` in one number format: the mean as :func:`plain` writes it, the spread to the same decimals
    (or both in scientific notation where the mean is): never ``0.001309 ± 5.037e-04`` in one cell."""
    shown = plain(mean)
    if "e" in shown:
        return f"{mean:.3e} ± {std:.3e}"
    decimals = len(shown.partition(".")[2])
    return f"{shown} ± {std:,.{decimals}f}"


def format_value(stats: tuple[float, float] | None, metric: str, n: int | None = None) -> str:
    """``mean ± sample std``; with ``n == 1`` the mean and "(n=1)": one seed measures no spread."""
    if stats is None:
        return "—"
    mean, std = stats
    if metric == "accuracy":
        return f"{100 * mean:.2f} (n=1)" if n == 1 else f"{100 * mean:.2f} ± {100 * std:.2f}"
    return f"{plain(mean)} (n=1)" if n == 1 else plain_spread(mean, std)


#: the error fields of a summary (and of each client's scores), in stored units squared for MSE
_ERROR_FIELDS = ("test_mean", "test_std", "test_pooled", "val_mean", "novel_mean", "novel_std", "novel_adapted_mean",
                 "novel_adapted_std", "trivial_test_mean", "honest_test_mean", "honest_test_std",
                 "malicious_test_mean", "final_test_mean", "late_test_final")


def in_declared_units(result: RunResult) -> RunResult:
    """A regression run's summary with every error in the units its federation declares (``target_units``, each
    stored unit being ``target_scale`` of them; MSE scales by its square): what ``compare``, ``show`` and the
    reports print. A summary without declared units is returned as it is."""
    scale, metric = result.target_scale, result.metric
    if scale is None or result.target_units is None or metric not in LOWER_IS_BETTER:
        return result
    factor = unit_factor(metric, scale)
    update: dict[str, Any] = {name: getattr(result, name) * factor for name in _ERROR_FIELDS
                              if isinstance(getattr(result, name, None), float)}
    if isinstance(result.test_mae, float):
        update["test_mae"] = result.test_mae * scale

    def converted(key: str, value: Any) -> Any:
        """A per-client score in declared units: the headline's (val, test, trivial_test) and ``train.metrics``'
        errors (``test_mae``, ``val_rmse``...); anything else as it is."""
        if not isinstance(value, float):
            return value
        if key in ("val", "test", "trivial_test"):
            return value * factor
        chosen = key.partition("_")[2]
        return value * unit_factor(chosen, scale) if chosen in LOWER_IS_BETTER else value

    if result.per_client:
        update["per_client"] = {name: {key: converted(key, value) for key, value in scores.items()}
                                for name, scores in result.per_client.items()}
    if result.metrics:
        update["metrics"] = {name: {key: value * unit_factor(name, scale) if name in LOWER_IS_BETTER
                                    and isinstance(value, float) else value for key, value in means.items()}
                             for name, means in result.metrics.items()}
    return result.model_copy(update={**update, "target_scale": None})  # converted: never twice


def unit_factor(metric: str, scale: float) -> float:
    """What one stored unit of ``metric`` is in the declared units, a stored target unit being ``scale`` of them:
    ``scale`` for errors in the target's units (MAE, RMSE), its square for MSE, 1 for scores (accuracy, AUROC)."""
    if metric == "mse":
        return scale * scale
    return scale if metric in LOWER_IS_BETTER else 1.0


def compare_rows(summaries: dict[str, list[RunResult]]) -> list[dict[str, Any]]:
    """One row per method: mean ± std over the seeds that completed of the per-client mean, plus the other columns;
    ``stopped`` counts the seeds that stopped (their summaries say why), ``privacy`` what the runs spent."""
    rows = []
    for method, every_run in summaries.items():
        metric = every_run[0].metric
        runs = [in_declared_units(run) for run in every_run if run.completed]
        rows.append({
            "method": method, "metric": metric, "seeds": len(runs), "stopped": len(every_run) - len(runs),
            "units": every_run[0].target_units if every_run[0].target_scale is not None else None,
            "privacy": row_privacy(runs),
            "test": _mean_std([r.test_mean for r in runs]),
            # each run's trivial predictors (majority class / mean target of each client's training rows)
            "trivial": _mean_std([r.trivial_test_mean for r in runs]),
            "client_std": _mean_std([r.test_std for r in runs]),
            "pooled": _mean_std([r.test_pooled for r in runs]),
            "novel": _mean_std([r.novel_mean for r in runs]),
            "novel_adapted": _mean_std([r.novel_adapted_mean for r in runs]),
            # what the row cost: every seed's run, a stopped one's rounds included (they were trained and sent)
            "wall_seconds": statistics.fmean([r.wall_seconds or 0.0 for r in every_run] or [0.0]),
            "mb_up": statistics.fmean([r.bytes_up or 0 for r in every_run] or [0]) / 1e6,
            # regression with a known target scale only; runs written before these fields existed lack them
            "mae_original_units": _mean_std([r.test_mae_original_units for r in runs]),
            # runs with clients that joined late (train.late_clients): their score at the last round
            "late": _mean_std([r.late_test_final for r in runs]),
            # standard error over test rows (classification; runs before it was recorded lack it)
            "row_se": _mean_std([r.test_row_se for r in runs]),
            "peak_rss_mb": max((r.peak_rss_mb for r in runs if r.peak_rss_mb is not None), default=None),
            # under attack: the honest clients' score (the headline `compare` prints), the attackers', the ASR
            "attacked": any(r.attack.get("kind", "none") != "none" for r in runs),
            "honest": _mean_std([r.honest_test_mean for r in runs]),
            "malicious": _mean_std([r.malicious_test_mean for r in runs]),
            "asr": _mean_std([r.asr_mean for r in runs]),
            # train.metrics (AUROC, balanced accuracy...): each one's test mean over clients, mean ± std over seeds
            "chosen": {name: _mean_std([(r.metrics or {}).get(name, {}).get("test_mean") for r in runs])
                       for name in chosen_metrics(runs)},
            # the per-seed scores the verdicts test (report.json keeps them, and each run's summary with its seed)
            # train.target_score: simulated seconds to reach it, over the seeds that did; how many never did
            "time": _mean_std([(r.time_to_target or {}).get("sim_seconds") for r in runs]),
            "time_unreached": sum(1 for r in runs if r.time_to_target is not None
                                  and r.time_to_target.get("sim_seconds") is None),
            "per_seed": {"test": _present([r.test_mean for r in runs]),
                         "time": _present([(r.time_to_target or {}).get("sim_seconds") for r in runs]),
                         "novel": _present([r.novel_mean for r in runs]),
                         "late": _present([r.late_test_final for r in runs])},
        })
    return rows


def row_privacy(runs: Sequence[RunResult]) -> dict[str, Any] | None:
    """What a row's runs spent: the mechanism, the largest epsilon over its seeds (central: the run's; local: the
    most any client spent) and delta; None when its runs are not private."""
    records = [run.privacy for run in runs if run.privacy]
    if not records:
        return None
    spent = [record.get("epsilon", record.get("epsilon_max")) for record in records]
    return {"mechanism": records[0]["mechanism"], "epsilon": max(value for value in spent if value is not None),
            "delta": records[0]["delta"]}


def privacy_cell(row: dict[str, Any]) -> str:
    """The comparison's privacy column: what the row spent (``—``: no mechanism; ``0``: it releases nothing)."""
    if row.get("releases_nothing"):
        return "ε 0 (releases nothing)"
    spent = row.get("privacy")
    if spent is None:
        return "—"
    amount = (f"ε ≤ {spent['epsilon']:.3g} per client" if spent["mechanism"] == "local"  # the most any client spent
              else f"ε {spent['epsilon']:.3g}")
    return f"{amount} at δ {spent['delta']:.2g} ({spent['mechanism']})"


def privacy_lines(summaries: dict[str, list[RunResult]]) -> list[str]:
    """Under the comparison: each private guarantee once (per row where rows differ), with how delta was chosen,
    the neighbour relation, and what lies outside the guarantee (once, for every row)."""
    stated: dict[str, list[str]] = {}
    outside: list[str] = []
    for name, runs in summaries.items():
        record = next((run.privacy for run in runs if run.privacy), None)
        if record is None:
            continue
        sentence = (f"{record['mechanism']} DP at δ = {record['delta']:.2g} ({record.get('delta_source', 'given')}), "
                    f"{record.get('neighbours_meaning', record.get('neighbours'))}; noise multiplier "
                    f"{record['noise_multiplier']:.3g}, {record.get('sized_for') or record.get('calibrated_for')}")
        stated.setdefault(sentence, []).append(name)
        outside += [item for item in record.get("outside_the_guarantee", []) if item not in outside]
    if not stated:
        return []
    lines = ([f"privacy (every private row): {sentence}" for sentence in stated] if len(stated) == 1 else
             [f"privacy ({', '.join(names)}): {sentence}" for sentence, names in stated.items()])
    return lines + [f"outside the guarantee: {item}" for item in outside]


def chosen_metrics(runs: Sequence[RunResult]) -> list[str]:
    """The ``train.metrics`` the runs scored, in the order they name them."""
    names: list[str] = []
    for run in runs:
        names += [name for name in run.metrics or {} if name not in names]
    return names


def format_score(stats: tuple[float, float] | None, n: int | None = None, metric: str = "") -> str:
    """A chosen metric as ``mean ± sample std``, or "(n=1)" for one seed: a score (AUROC, F1...: fractions) to 3
    decimals, an error (MAE, RMSE: in the target's units) as :func:`plain` writes every error."""
    if stats is None:
        return "—"
    if metric in LOWER_IS_BETTER:
        return f"{plain(stats[0])} (n=1)" if n == 1 else plain_spread(*stats)
    return f"{stats[0]:.3f} (n=1)" if n == 1 else f"{stats[0]:.3f} ± {stats[1]:.3f}"


def chosen_header(name: str, units: str | None) -> str:
    """A ``train.metrics`` column: ``test auroc``, or an error with its units (``test mae (µg/m³)``)."""
    if units is None or name not in LOWER_IS_BETTER:
        return f"test {name}"
    return f"test {name} ({units})" + ("²" if name == "mse" else "")


def signed(value: float, metric: str) -> str:
    """A difference of two scores (a gain) with its sign: accuracy in points, an error as :func:`plain` writes it."""
    if metric == "accuracy":
        return f"{100 * value:+.2f}"
    return ("+" if value >= 0 else "") + plain(value)


def headers(metric: str, chosen: Sequence[str] = (), private: bool = False, units: str | None = None) -> list[str]:
    """The comparison table's columns, the metric named in the first number column, the trivial predictor and the
    standing against the best beside it, then ``train.metrics`` (and what each row spent, in a private
    comparison)."""
    return ["method", f"test {metric_label(metric, units)} (mean ± sample std over seeds)", "trivial predictor",
            "against the best", "std over clients", "pooled", *[chosen_header(name, units) for name in chosen],
            "novel",
            "novel (adapted)", *(["privacy"] if private else []), "wall s", "MB up"]


def method_cell(row: dict[str, Any]) -> str:
    """The row's name, and how many of its seeds stopped (their numbers are left out of the row)."""
    stopped = row.get("stopped", 0)
    return row["method"] + (f" ({stopped} of {stopped + row['seeds']} seeds stopped)" if stopped else "")


def row_cells(row: dict[str, Any], chosen: Sequence[str] = (), private: bool = False) -> list[str]:
    metric = row["metric"]
    client_std = row["client_std"]
    std_text = "—" if client_std is None else (
        f"{100 * client_std[0]:.2f}" if metric == "accuracy" else plain(client_std[0]))
    n = row["seeds"]
    relation = row_versus_trivial(row)
    test = format_value(row["test"], metric, n) + (f" {TRIVIAL_MARKS[relation]}" if relation else "")
    standing = row.get("standing")
    return [method_cell(row), test, format_value(row["trivial"], metric, n),
            standing.text() if standing is not None else "—", std_text, format_value(row["pooled"], metric, n),
            *[format_score(row["chosen"].get(name), n, name) for name in chosen],
            format_value(row["novel"], metric, n), format_value(row["novel_adapted"], metric, n),
            *([privacy_cell(row)] if private else []), f"{row['wall_seconds']:.1f}", f"{row['mb_up']:.2f}"]


#: the error metrics (lower is better); every other headline metric is a score (``client.metrics.HIGHER_IS_BETTER``,
#: which imports torch: the tables are read by commands that must not)
LOWER_IS_BETTER = frozenset({"mse", "rmse", "mae"})


def higher_is_better(metric: str) -> bool:
    return metric not in LOWER_IS_BETTER


def versus_trivial(score: float | None, trivial: float | None, higher: bool) -> str | None:
    """``below`` when ``score`` is worse than its trivial predictor's, ``ties`` when it is the same number (a model
    that learned exactly the majority class or the mean target: it does not beat it either), else None."""
    if score is None or trivial is None:
        return None
    if math.isclose(score, trivial, rel_tol=TIE_TOLERANCE, abs_tol=TIE_TOLERANCE):
        return "ties"
    return "below" if (score < trivial if higher else score > trivial) else None


#: two scores this close (relative, and absolute near 0) are the same number printed twice
TIE_TOLERANCE = 1e-9
#: what a table writes beside a score that does not beat its trivial predictor
TRIVIAL_MARKS = {"below": "(below trivial)", "ties": "(= trivial)"}


def row_versus_trivial(row: dict[str, Any]) -> str | None:
    """:func:`versus_trivial` of the row's mean over its seeds."""
    test, trivial = row.get("test"), row.get("trivial")
    return versus_trivial(None if test is None else test[0], None if trivial is None else trivial[0],
                          higher_is_better(row["metric"]))


def below_trivial(row: dict[str, Any]) -> bool:
    """Whether the row's trained clients score worse, on average over its seeds, than their trivial predictors."""
    return row_versus_trivial(row) == "below"


def time_to_target_line(rows: list[dict[str, Any]], target: float | None) -> str | None:
    """``train.target_score``: each row's simulated seconds to reach it (mean ± std over the seeds that did, and how
    many never did), one line; None without a target."""
    if target is None or not rows:
        return None
    shown = f"{100 * target:g} %" if higher_is_better(rows[0]["metric"]) else f"{target:g}"
    cells = [f"{row['method']} " + ("never" if row["time"] is None else
                                     f"{row['time'][0]:.0f} ± {row['time'][1]:.0f} s")
             + (f" ({row['seeds'] - row['time_unreached']} of {row['seeds']} seeds reached it)"
                if row["time_unreached"] else "") for row in rows]
    return (f"simulated seconds until the test mean first reached {shown} (train.clock; at evaluated rounds; mean ± "
            f"std over the seeds that reached it): " + "; ".join(cells))


def add_standings(rows: list[dict[str, Any]], test: str = "welch") -> None:
    """Each row's standing against the best row (``row["standing"]``, :func:`graphfed.report.verdicts.standings`
    over the rows' per-seed test scores): the statistics ``graphfed bench``'s verdicts use, in one place."""
    from graphfed.report.verdicts import standings  # scipy: only when a comparison is tested

    if not rows:
        return
    higher = higher_is_better(rows[0]["metric"])
    ranked = standings({row["method"]: row["per_seed"]["test"] for row in rows}, higher, test)
    for row, standing in zip(rows, ranked, strict=True):
        row["standing"] = standing


def verdict_lines(rows: list[dict[str, Any]], test: str = "welch") -> list[str]:
    """Under the table: how the standings were decided, and one line per row whose trained clients score below
    their trivial predictors (what to check first)."""
    from graphfed.report.verdicts import ALPHA, TESTS

    tested = [row for row in rows if row.get("standing") is not None and row["standing"].relation != "untested"]
    lines = []
    if tested:
        lines.append(f"against the best: {TESTS[test]} of the best row's per-seed scores against each other row's, "
                     f"Holm-corrected across the {len(tested) - 1} comparison(s) at {100 * ALPHA:g} %; an undecided "
                     f"row says how many seeds per method its observed difference would need (Welch, 80 % power at "
                     f"{100 * ALPHA:g} % over the comparisons). p_Holm is the p-value Holm-adjusted across those "
                     f"comparisons (worse: at most {100 * ALPHA:g} %); 'degenerate': every seed of both rows gave the "
                     f"same score, so no test has a spread and the means alone decide")
    for row in rows:
        relation = row_versus_trivial(row)
        if relation is None:
            continue
        metric, n = row["metric"], row["seeds"]
        guess = f"each client's training {'majority class' if higher_is_better(metric) else 'mean'}"
        scores = f"({format_value(row['test'], metric, n)} against {format_value(row['trivial'], metric, n)})"
        if relation == "below":
            lines.append(f"{row['method']}: its trained clients score below their trivial predictors {scores}: the "
                         f"model learned less than predicting {guess}; check the features' scales (graphfed inspect "
                         f"flags them; dataset.standardize: pooled, or client under DP, fixes them)")
        else:
            lines.append(f"{row['method']}: its trained clients score exactly their trivial predictors {scores}: "
                         f"the model predicts what {guess} predicts and does not beat it, whatever its standing; "
                         f"check the features' scales (graphfed inspect flags them)")
    return lines


def standings_json(rows: list[dict[str, Any]], test: str = "welch") -> dict[str, Any]:
    """The comparison's verdicts as data (``verdicts.json`` beside ``compare.md``)."""
    from graphfed.report.verdicts import ALPHA, TESTS

    return {"test": TESTS[test], "correction": "Holm across the comparisons with the best", "alpha": ALPHA,
            "rows": [{"method": row["method"], "metric": row["metric"], "seeds": row["seeds"],
                      "stopped": row.get("stopped", 0), "mean": None if row["test"] is None else row["test"][0],
                      "std": None if row["test"] is None else row["test"][1],
                      "trivial_mean": None if row["trivial"] is None else row["trivial"][0],
                      "below_trivial": below_trivial(row), "versus_trivial": row_versus_trivial(row),
                      "against_the_best": None if row.get("standing") is None else row["standing"].relation,
                      "p_value": None if row.get("standing") is None else row["standing"].p_value,
                      "p_value_holm": None if row.get("standing") is None else row["standing"].p_holm,
                      "degenerate": None if row.get("standing") is None else row["standing"].degenerate,
                      "seeds_needed": None if row.get("standing") is None else row["standing"].seeds_needed}
                     for row in rows]}


def table_metrics(rows: list[dict[str, Any]]) -> list[str]:
    """Every chosen metric any row scored (columns of the comparison)."""
    names: list[str] = []
    for row in rows:
        names += [name for name in row.get("chosen", {}) if name not in names]
    return names


def attack_headers(metric: str) -> list[str]:
    """`compare`'s columns when malicious clients took part: the honest clients' score first."""
    return ["method", f"honest clients' test {metric_label(metric)}", "malicious clients' test",
            "attack success rate", "all clients' test", "wall s", "MB up"]


def attack_cells(row: dict[str, Any]) -> list[str]:
    metric, n = row["metric"], row["seeds"]
    asr = row["asr"]
    asr_text = "—" if asr is None else (f"{100 * asr[0]:.2f} (n=1)" if n == 1 else
                                        f"{100 * asr[0]:.2f} ± {100 * asr[1]:.2f}")
    return [method_cell(row), format_value(row["honest"], metric, n), format_value(row["malicious"], metric, n),
            asr_text, format_value(row["test"], metric, n), f"{row['wall_seconds']:.1f}", f"{row['mb_up']:.2f}"]


def comparison(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The comparison table as (columns, cells): the attack layout when malicious clients took part, else the
    metric's, with a column per chosen metric. The console, compare.md and compare.csv all print this."""
    metric = rows[0]["metric"] if rows else "accuracy"
    if any(row["attacked"] for row in rows):
        return attack_headers(metric), [attack_cells(row) for row in rows]
    chosen = table_metrics(rows)
    private = any(row.get("privacy") or row.get("releases_nothing") for row in rows)
    units = rows[0].get("units") if rows else None
    return headers(metric, chosen, private, units), [row_cells(row, chosen, private) for row in rows]


def comparison_csv(rows: list[dict[str, Any]]) -> str:
    """The comparison as numbers (mean and sample std in their own columns; fractions for accuracy)."""
    chosen = table_metrics(rows)
    stats = ["test", "trivial", "pooled", "novel", "novel_adapted", "honest", "malicious", "asr"]
    columns = ["method", "seeds", *[f"{key}_{part}" for key in stats for part in ("mean", "std")],
               *[f"{m}_{part}" for m in chosen for part in ("mean", "std")], "wall_seconds", "mb_up"]

    def pair(value: tuple[float, float] | None) -> list[Any]:
        return ["", ""] if value is None else [value[0], value[1]]

    cells = [[row["method"], row["seeds"], *[v for key in stats for v in pair(row[key])],
              *[v for m in chosen for v in pair(row["chosen"].get(m))], row["wall_seconds"], row["mb_up"]]
             for row in rows]
    return csv_text(columns, cells)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    metric = rows[0]["metric"] if rows else "accuracy"
    columns, cells = comparison(rows)
    lines = [metric_note(metric, rows[0].get("units") if rows else None), "", "| " + " | ".join(columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def csv_text(columns: list[str], cells: list[list[Any]]) -> str:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(cells)
    return buffer.getvalue()


def privacy_sentence(record: dict[str, Any]) -> str:
    """A private run's guarantee in one sentence (``summary.json``'s ``privacy``): what it spent, against whom,
    and where its noise came from."""
    delta = f"δ = {record['delta']:.2g}"
    if record["mechanism"] == "central":
        spent = (f"central DP: ε = {record['epsilon']:.3g} at {delta} over {record['rounds_released']} released "
                 f"round(s)")
    else:
        spent = (f"local DP: ε ≤ {record['epsilon_max']:.3g} per client (median {record['epsilon_median']:.3g}) at "
                 f"{delta}, each client's composing its own noised uploads")
    neighbours = str(record.get("neighbours", "")).replace("_", "-")
    if record.get("reproducible_noise"):
        return f"{spent}, {neighbours} neighbours; NOISE REPRODUCIBLE FROM THE SEED: this run protects nobody"
    return f"{spent}, {neighbours} neighbours; noise from a secure generator (nothing the run writes regenerates it)"


def per_client_rows(result: RunResult) -> list[dict[str, Any]]:
    """One row per client at the selected round: its scores, its trivial predictor's and the gain over it (positive:
    the model beats predicting the client's majority class / mean target), best gain first."""
    higher = result.metric == "accuracy"
    rows = []
    for name, scores in (result.per_client or {}).items():
        test, trivial = scores.get("test"), scores.get("trivial_test")
        gain = None if test is None or trivial is None else (test - trivial if higher else trivial - test)
        role = ", ".join(label for label, flag in (("novel", scores.get("novel")),
                                                   ("malicious", scores.get("malicious"))) if flag)
        extra = {key: value for key, value in scores.items() if key.startswith("test_") and key != "test_trivial"}
        rows.append({"client": name, "val": scores.get("val"), "test": test, "trivial": trivial, "gain": gain,
                     "role": role, "metrics": extra})
    return sorted(rows, key=lambda row: (row["gain"] is None, -(row["gain"] or 0.0)))


def per_client_over_seeds(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Each client's test score as mean ± sample std over the seeds' runs beside its trivial predictor's, the gain
    over it, each chosen metric (``train.metrics``) likewise, and its role: the practitioner's per-client rows.
    Clients are matched by name; a client that is novel under some seeds only says so."""
    higher = (results[0].metric or "accuracy") == "accuracy"
    results = [in_declared_units(result) for result in results]
    chosen = chosen_metrics(results)
    names: list[str] = []
    for result in results:
        names += [name for name in result.per_client or {} if name not in names]
    records = []
    for name in names:
        entries = [result.per_client[name] for result in results if name in (result.per_client or {})]
        test = _mean_std([entry.get("test") for entry in entries])
        trivial = _mean_std([entry.get("trivial_test") for entry in entries])
        gain = None if test is None or trivial is None else (test[0] - trivial[0] if higher else trivial[0] - test[0])
        novel = sum(bool(entry.get("novel")) for entry in entries)
        relation = versus_trivial(None if test is None else test[0], None if trivial is None else trivial[0], higher)
        role = [*(["novel" if novel == len(entries) else f"novel in {novel} of {len(entries)} seeds"]
                  if novel else []),
                *(["malicious"] if any(entry.get("malicious") for entry in entries) else []),
                *([TRIVIAL_MARKS[relation].strip("()")] if relation else []),
                *(["no graph neighbours"] if any(entry.get("no_graph_neighbours") for entry in entries) else [])]
        records.append({"client": name, "test": test, "trivial": trivial, "gain": gain,
                        "chosen": {m: _mean_std([entry.get(f"test_{m}") for entry in entries]) for m in chosen},
                        "seeds": len(_present([entry.get("test") for entry in entries])), "role": ", ".join(role)})
    return records


def per_client_cells(records: list[dict[str, Any]], metric: str,
                     units: str | None = None) -> tuple[list[str], list[list[str]]]:
    """:func:`per_client_over_seeds`'s rows as a printed table (accuracy in %, errors in the declared ``units``)."""
    chosen = list(records[0]["chosen"]) if records else []
    columns = ["client", f"test {metric_label(metric, units)}", "trivial", "gain over trivial",
               *[chosen_header(name, units) for name in chosen], "seeds", "role"]
    cells = [[record["client"], format_value(record["test"], metric, record["seeds"]),
              format_value(record["trivial"], metric, record["seeds"]),
              "—" if record["gain"] is None else signed(record["gain"], metric),
              *[format_score(record["chosen"][m], record["seeds"], m) for m in chosen], str(record["seeds"]),
              record["role"]] for record in records]
    return columns, cells


def per_client_csv_rows(label: str, records: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The same rows as numbers for a spreadsheet or a plot: mean and sample std in their own columns (fractions
    for accuracy, as summary.json keeps them)."""
    chosen = list(records[0]["chosen"]) if records else []
    columns = ["row", "client", "test_mean", "test_std", "trivial_mean", "trivial_std", "gain_over_trivial",
               *[f"{m}_{part}" for m in chosen for part in ("mean", "std")], "seeds", "role"]

    def pair(stats: tuple[float, float] | None) -> list[Any]:
        return ["", ""] if stats is None else [stats[0], stats[1]]

    rows = [[label, record["client"], *pair(record["test"]), *pair(record["trivial"]),
             "" if record["gain"] is None else record["gain"],
             *[value for m in chosen for value in pair(record["chosen"][m])], record["seeds"], record["role"]]
            for record in records]
    return columns, rows


def per_client_table(result: RunResult, limit: int | None = None) -> Any:
    """The per-client rows as a rich table (accuracy in %, errors in the declared units: give it
    :func:`in_declared_units`' result)."""
    from rich.table import Table

    metric = result.metric or "accuracy"
    units = result.target_units if metric in LOWER_IS_BETTER and result.target_scale is None else None

    def cell(value: float | None) -> str:
        return "—" if value is None else f"{100 * value:.2f}" if metric == "accuracy" else plain(value)

    def chosen_cell(name: str, value: float | None) -> str:
        return "—" if value is None else plain(value) if name in LOWER_IS_BETTER else f"{value:.3f}"

    table = Table(title=f"{result.method} on {result.dataset}: each client at round {result.best_round} "
                        f"({metric_label(metric, units)}; trivial = majority class / mean target of its own "
                        f"training rows)")
    chosen = list(result.metrics or {})
    for header in ("client", "val", "test", "trivial", "gain over trivial",
                   *[chosen_header(m, units) for m in chosen], "role"):
        table.add_column(header)
    rows = per_client_rows(result)
    for row in rows[:limit]:
        extra = [chosen_cell(m, row["metrics"].get(f"test_{m}")) for m in chosen]
        table.add_row(row["client"], cell(row["val"]), cell(row["test"]), cell(row["trivial"]),
                      "—" if row["gain"] is None else signed(row["gain"], metric), *extra, row["role"])
    if limit is not None and len(rows) > limit:
        table.add_row(f"... {len(rows) - limit} more (--all)", *[""] * (5 + len(chosen)))
    return table
