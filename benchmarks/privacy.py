"""The privacy-utility report: what client-level DP costs each method, from the committed runs of the suite.

    .venv/bin/graphfed bench privacy --out benchmarks/results/privacy --in-process
    .venv/bin/python benchmarks/privacy_audit.py    # the audit -> results/privacy/audit.json (a few minutes)
    .venv/bin/python benchmarks/privacy.py          # -> results/privacy/report.md, plots/*.png

It reads only ``summary.json`` files (and ``audit.json``), so the report regenerates exactly from them. A run's
number is the mean test accuracy over its clients at the round it reports: a private run its last evaluation
(``privacy.model_selection: last``: choosing by validation would read the clients' data outside the mechanism), the
run without DP its best validation round; a cell is mean ± sample std over seeds. Each private cell is compared with
the same method without DP, and with the clients' trivial predictors (majority class of their training rows), under
the reproduction report's rule (Welch's t-test over seeds at 5 %).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from graphfed.report.suite import current_code_id
from graphfed.report.verdicts import TEST_NAME, compare_against, sample_std
from graphfed.runs import RunResult, read_result
from graphfed.suites import packaged_suites

ROOT = Path(__file__).resolve().parent
SUITE = packaged_suites()["privacy"]
RESULTS = ROOT / "results" / "privacy"
EPSILONS = (1, 2, 4, 8)
MECHANISMS = ("local", "central")
OUTCOME_WORDS = {"beats": "higher", "loses": "lower", "undecided": "undecided"}


def suite() -> dict[str, Any]:
    return yaml.safe_load(SUITE.read_text())


def cell_key(mechanism: str, eps: int | None) -> str:
    return "none" if eps is None else f"{mechanism}-eps{eps}"


def runs_of(cell: str, method: str) -> list[RunResult]:
    """The runs of one cell that completed, or that the noise drove to NaN/Inf (the run stopped; it is scored at
    its best-validation round before that, and counted: divergence is part of what DP costs)."""
    found = [read_result(path.parent) for path in sorted((RESULTS / "runs" / cell / method).glob("seed*/summary.json"))]
    return [run for run in found if run.completed or diverged(run)]


def diverged(run: RunResult) -> bool:
    return run.status.startswith("stopped:") and "non-finite" in run.status


def scores(runs: list[RunResult], key: str = "test_mean") -> list[float]:
    return [100 * getattr(run, key) for run in runs if getattr(run, key) is not None]


def mean_std(values: list[float], runs: list[RunResult] | None = None) -> str:
    if not values and runs:  # every run stopped before its first evaluation: nothing to score
        return f"no score ({sum(diverged(run) for run in runs)} of {len(runs)} diverged before the first evaluation)"
    if not values:
        return "not run"
    notes = [] if len(values) == 3 else [f"scored in {len(values)} seed{'s' if len(values) > 1 else ''}"]
    broken = sum(diverged(run) for run in runs or [])
    if broken:  # a diverged run is scored at its best round before the noise broke it, if it had one
        notes.append(f"{broken} of {len(runs or [])} diverged")
    return f"{statistics.fmean(values):.1f} ± {sample_std(values):.1f}" + (f" ({', '.join(notes)})" if notes else "")


def versus(values: list[float], reference: list[float]) -> str:
    """How ``values`` compare with ``reference`` under the rule: higher / lower / undecided, with p."""
    if len(values) < 2 or len(reference) < 2:
        return "—"
    (comparison,) = compare_against(values, {"reference": reference}, higher_is_better=True)
    return f"{OUTCOME_WORDS[comparison.outcome]} (p = {comparison.p_value:.2g})"


def methods_of(data: dict[str, Any], mechanism: str) -> list[str]:
    return list(data["datasets"][cell_key(mechanism, EPSILONS[0])]["methods"])


def utility_table(data: dict[str, Any]) -> list[str]:
    lines = ["| method | mechanism | " + " | ".join(f"ε = {e}" for e in EPSILONS) + " | no DP |",
             "|---|---|" + "---|" * (len(EPSILONS) + 1)]
    for mechanism in MECHANISMS:
        for method in methods_of(data, mechanism):
            plain = scores(runs_of("none", method))
            cells = [mean_std(scores(runs := runs_of(cell_key(mechanism, e), method)), runs) for e in EPSILONS]
            lines.append(f"| {method} | {mechanism} | " + " | ".join(cells) + f" | {mean_std(plain)} |")
    return lines


def verdict_table(data: dict[str, Any]) -> list[str]:
    lines = ["| method | mechanism | ε | accuracy vs no DP | accuracy vs trivial predictor |", "|---|---|---|---|---|"]
    for mechanism in MECHANISMS:
        for method in methods_of(data, mechanism):
            plain = scores(runs_of("none", method))
            for eps in EPSILONS:
                runs = runs_of(cell_key(mechanism, eps), method)
                private = scores(runs)
                lines.append(f"| {method} | {mechanism} | {eps} | {versus(private, plain)} | "
                             f"{versus(private, scores(runs, 'trivial_test_mean'))} |")
    return lines


def audit_rows() -> list[dict[str, Any]]:
    path = RESULTS / "audit.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


def audited_bound(mechanism: str, eps: int) -> str:
    """The audit's epsilon lower bound for the secure mechanism at this target, against the blind attacker."""
    for row in audit_rows():
        if (row["mechanism"], row["attacker"], row["reproducible_noise"]) == (mechanism, "blind", False) \
                and row["label"] == f"secure noise, ε {eps:g}":
            return f"{row['epsilon_lower_bound']:.3g}"
    return "not audited"


def spent_table(data: dict[str, Any]) -> list[str]:
    """What each cell calibrated and spent: the noise multiplier, epsilon as the accountant reports it (central:
    over the rounds released; local: the largest and median client's, over the noised uploads each made), and the
    audit's lower bound for the same mechanism (``audit.json``)."""
    lines = ["| mechanism | target ε | noise multiplier | ε spent (central) / max, median over clients (local) | "
             "audit: ε lower bound (95 %) |", "|---|---|---|---|---|"]
    for mechanism in MECHANISMS:
        method = methods_of(data, mechanism)[0]
        for eps in EPSILONS:
            runs = runs_of(cell_key(mechanism, eps), method)
            if not runs:
                lines.append(f"| {mechanism} | {eps} | not run | | {audited_bound(mechanism, eps)} |")
                continue
            records = [run.privacy or {} for run in runs]
            noise = records[0].get("noise_multiplier")
            if mechanism == "central":
                spent = f"{statistics.fmean(r['epsilon'] for r in records):.3g}"
            else:
                spent = (f"{statistics.fmean(r['epsilon_max'] for r in records):.3g}, "
                         f"{statistics.fmean(r['epsilon_median'] for r in records):.3g}")
            lines.append(f"| {mechanism} | {eps} | {noise:.4g} | {spent} | {audited_bound(mechanism, eps)} |")
    return lines


def provenance_section(data: dict[str, Any]) -> list[str]:
    """Which runs are current (their code's behaviour and modules are today's) and why the others are stale (a table
    row mixes them only where listed here)."""
    from graphfed.bench import code_sentence

    return [code_sentence([RESULTS / "runs" / cell / method / f"seed{run.seed}" for cell in data["datasets"]
                           for method in data["datasets"][cell]["methods"] for run in runs_of(cell, method)])]


def audit_verdict(row: dict[str, Any]) -> str:
    """Whether the bound contradicts the claim (a broken mechanism) or stays below it."""
    claimed = row["claimed_epsilon"]
    if not math.isfinite(claimed):
        return "no claim to test (no noise): what the audit can certify"
    if row["epsilon_lower_bound"] > claimed:
        return "**exceeds the claim**: the mechanism does not give its ε"
    return "below the claim"


def audit_section() -> list[str]:
    path = RESULTS / "audit.json"
    if not path.exists():
        return ["The audit has not run (`benchmarks/privacy_audit.py`)."]
    audit = json.loads(path.read_text())
    code = (audit.get("code") or {}).get("code_id")
    provenance = (f"Measured by code {code}" + ("" if code == current_code_id() else " (**stale**: not this "
                  "report's code; re-run `benchmarks/privacy_audit.py`)") if code else
                  "**Stale**: measured before the audit recorded its code; re-run `benchmarks/privacy_audit.py`")
    largest = max(row["claimed_epsilon"] for row in audit["rows"] if math.isfinite(row["claimed_epsilon"]))
    broken = [row for row in audit["rows"] if row["reproducible_noise"] or row["noise_multiplier"] == 0]
    power = min(row["epsilon_lower_bound"] for row in broken) if broken else float("nan")
    lines = [audit["description"], "", provenance + ".", "",
             "| mechanism | noise | attacker | rounds | claimed ε | ε lower bound | FPR (held out) | "
             "FNR (held out) | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for row in audit["rows"]:
        claimed = "∞ (no noise)" if not math.isfinite(row["claimed_epsilon"]) else f"{row['claimed_epsilon']:.3g}"
        lines.append(f"| {row['mechanism']} | {row['label']} | {row['attacker']} | {row['rounds']} | {claimed} | "
                     f"{row['epsilon_lower_bound']:.3g} | {row['false_positives']} / {row['scored_out']} | "
                     f"{row['false_negatives']} / {row['scored_in']} | {audit_verdict(row)} |")
    lines += ["", f"Power: the broken mechanisms (no noise; noise reproducible from the seed, against an attacker "
                  f"who reads it) certify at least ε ≥ {power:.3g}, above the largest claim here ({largest:g}); "
                  f"every secure row stays below its claim"
              + ("." if all(row["epsilon_lower_bound"] <= row["claimed_epsilon"] for row in audit["rows"]
                            if row not in broken) else " **except where the verdict says otherwise**.")]
    return lines


def plot(data: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, mechanism in zip(axes, MECHANISMS, strict=True):
        for number, method in enumerate(methods_of(data, mechanism)):
            color = f"C{number}"
            means = [statistics.fmean(v) if (v := scores(runs_of(cell_key(mechanism, e), method))) else float("nan")
                     for e in EPSILONS]
            axis.plot(EPSILONS, means, marker="o", color=color, label=method)
            plain = scores(runs_of("none", method))
            if plain:
                axis.axhline(statistics.fmean(plain), color=color, linestyle=":", linewidth=1)
        axis.set_xscale("log", base=2)
        axis.set_xticks(EPSILONS, [str(e) for e in EPSILONS])
        axis.set_xlabel("ε (δ = 1e-3)")
        axis.set_title(f"{mechanism} DP (dotted: no DP)")
        axis.legend()
    axes[0].set_ylabel("test accuracy (%)")
    figure.tight_layout()
    out = RESULTS / "plots"
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(out / "privacy_utility.png", dpi=120)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(6, 4))
    for eps in EPSILONS:
        runs = runs_of(cell_key("local", eps), "fedavg")
        if runs and runs[0].privacy:
            axis.hist(list(runs[0].privacy["per_client_epsilon"].values()), bins=20, alpha=0.6, label=f"target {eps}")
    axis.set_xlabel("client's ε after its rounds (local DP, FedAvg, seed 0)")
    axis.set_ylabel("clients")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "local_epsilon.png", dpi=120)
    plt.close(figure)


def main() -> None:
    data = suite()
    if not (RESULTS / "runs").is_dir():
        sys.exit(f"no runs under {RESULTS / 'runs'}: run the suite first (see this script's docstring)")
    lines = [
        "# Privacy-utility study", "",
        f"_{data['description']}_", "",
        f"Regenerate: `python benchmarks/privacy.py` (reads the committed `summary.json` files). Rule: {TEST_NAME}.",
        "Target ε bounds every client: local DP is calibrated as if a client took part in all 100 rounds; a client "
        "that took part in fewer spends less (its ε is in its run's `per_client_epsilon`). The noise comes from a "
        "secure generator (no run's noise can be regenerated from its seed). A private run reports its last "
        "evaluation (choosing the round by the clients' validation scores would be outside the mechanism); a run "
        "the noise drove to NaN/Inf stopped there (`diverged`): it is scored at its last evaluation before that, if "
        "it had one, and its ε covers every round it released.", "",
        "## Test accuracy (%)", "", *utility_table(data), "",
        "## Verdicts", "",
        "Each private cell against the same method without DP, and against the clients' trivial predictors "
        "(higher / lower: the test rejects equality at 5 %; undecided: it does not).", "",
        *verdict_table(data), "",
        "## What was calibrated and spent", "", *spent_table(data), "",
        "## Audit: an ε lower bound that a broken mechanism exceeds", "", *audit_section(), "",
        "## Code", "", *provenance_section(data), "",
        "![privacy-utility](plots/privacy_utility.png)", "", "![local epsilon](plots/local_epsilon.png)", "",
    ]
    (RESULTS / "report.md").write_text("\n".join(lines))
    plot(data)
    print(f"wrote {RESULTS / 'report.md'}")


if __name__ == "__main__":
    main()
