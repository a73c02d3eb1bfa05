"""The report's verdict rule on made-up rows: a baseline that beats the method is "does not hold here", a missed
factor is "does not hold here", overlapping seeds are "inconclusive", and the numbers behind each are Welch's test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy import stats

from graphfed.report.suite import claim_verdict, verdict_table
from graphfed.report.verdicts import holm_rejections, seeds_needed, welch_p_value
from graphfed.suites import Claim, load_suite, packaged_suites


def _row(method: str, values: list[float], metric: str = "accuracy", column: str = "test") -> dict:
    per_seed = {"test": [], "novel": [], "late": []}
    per_seed[column] = values
    return {"method": method, "metric": metric, "per_seed": per_seed}


def _claim(better: str, than: list[str], **extra: object) -> Claim:
    return Claim(claim="c", seed_file="000", table="Table II", dataset="d", better=better, than=than, **extra)


def test_a_baseline_that_beats_the_method_means_does_not_hold() -> None:
    """The old rule said "partly" here because the method beat one baseline; a loss decides the claim."""
    table = {"d": [_row("m", [0.80, 0.81, 0.79, 0.80]), _row("weak", [0.60, 0.61, 0.59, 0.62]),
                   _row("strong", [0.90, 0.91, 0.89, 0.90])]}
    result = claim_verdict(_claim("m", ["weak", "strong"]), table)
    assert result["verdict"] == "does not hold here (loses to strong)"
    outcomes = {c["baseline"]: c["outcome"] for c in result["comparisons"]}
    assert outcomes == {"weak": "beats", "strong": "loses"}


def test_a_small_ratio_against_a_large_factor_claim_does_not_hold() -> None:
    """METR-LA as audited: FedAvg / Panacea = 1.05x against a claimed 100x (MSE, lower is better)."""
    table = {"d": [_row("panacea", [0.01399, 0.0141, 0.0139], "mse"), _row("fedavg", [0.01465, 0.0147, 0.0146], "mse")]}
    result = claim_verdict(_claim("panacea", ["fedavg"], factor=100), table)
    assert result["verdict"].startswith("does not hold here")
    assert result["verdict"] == "does not hold here (misses 100x over fedavg)"
    assert "1.05x against 100x: missed" in result["here"]
    reached = {"d": [_row("p", [0.001, 0.0011, 0.0009], "mse"), _row("f", [0.5, 0.52, 0.48], "mse")]}
    assert claim_verdict(_claim("p", ["f"], factor=100), reached)["verdict"] == "holds"


def test_overlapping_seeds_are_inconclusive_and_say_how_many_seeds_would_decide() -> None:
    table = {"d": [_row("a", [0.80, 0.84, 0.78]), _row("b", [0.79, 0.82, 0.79])]}
    result = claim_verdict(_claim("a", ["b"]), table)
    assert result["verdict"] == "inconclusive"
    a, b = [0.80, 0.84, 0.78], [0.79, 0.82, 0.79]
    assert result["seeds_to_decide"] == seeds_needed(a, b) and result["seeds_to_decide"] > 3
    lines = verdict_table(load_suite_with([_claim("a", ["b"])]), table)
    assert any("inconclusive; ~" in line and "seeds per method would decide" in line for line in lines)


def test_partly_means_beats_some_and_loses_to_none() -> None:
    table = {"d": [_row("m", [0.80, 0.81, 0.79]), _row("weak", [0.60, 0.61, 0.59]),
                   _row("close", [0.79, 0.83, 0.78])]}
    assert claim_verdict(_claim("m", ["weak", "close"]), table)["verdict"] == "partly (beats weak; undecided: close)"
    assert claim_verdict(_claim("m", ["weak"]), table)["verdict"] == "holds"


def test_the_p_values_are_welchs_and_the_spread_is_the_sample_std() -> None:
    a, b = [0.81, 0.80, 0.83, 0.79], [0.75, 0.78, 0.74]
    assert welch_p_value(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    table = {"d": [_row("a", a), _row("b", b)]}
    result = claim_verdict(_claim("a", ["b"]), table)
    assert "a 80.75 ± 1.71 (n=4)" in result["here"]  # sample std of a is 0.0171 (population std: 0.0148)
    assert welch_p_value([0.9], [0.1, 0.2]) == 1.0  # one seed: nothing is tested
    assert claim_verdict(_claim("a", ["b"]), {"d": [_row("a", [0.9]), _row("b", [0.1])]})["verdict"] == "inconclusive"


def test_losses_are_holm_corrected_across_a_claims_baselines() -> None:
    assert holm_rejections([0.01, 0.04, 0.03]) == [True, False, False]
    assert holm_rejections([0.001, 0.02, 0.04]) == [True, True, True]


def test_missing_cells_and_other_reports() -> None:
    table = {"d": [_row("a", [0.8, 0.9])]}
    assert claim_verdict(_claim("a", ["e"]), table)["verdict"] == "not run yet"
    see = Claim(claim="robust", seed_file="000", table="Fig. 4", see="../robustness/report.md")
    assert claim_verdict(see, table)["verdict"] == "see that report"
    with pytest.raises(ValueError, match="give dataset, better and than"):
        Claim(claim="vague", seed_file="000", table="Table I")
    with pytest.raises(ValueError, match=r"name the paper \(seed_file\)"):  # a paper's claim names its paper
        Claim(claim="no source", table="Table I", dataset="d", better="a", than=["b"])
    # a question of our own (the baselines' FEMNIST rows) may name none
    assert Claim(claim="ours", table="our cell", question=True, dataset="d", better="a", than=["b"]).seed_file is None


def load_suite_with(claims: list[Claim]):
    from graphfed.suites import Suite

    return Suite(name="s", datasets={"d": {"methods": ["a", "b"]}}, claims=claims)


def test_the_committed_paper_report_states_its_counts_and_cites_every_claim() -> None:
    """The report's first section counts its verdicts, and every verdict row cites a seed file and a table; the
    report's JSON keeps every seed's score behind them."""
    out = Path(__file__).parents[1] / "benchmarks" / "results" / "paper"
    text = (out / "report.md").read_text()
    verdicts = text[text.index("## Verdicts"):]
    assert verdicts.splitlines()[2].endswith(".") and "claims: " in verdicts.splitlines()[2]
    rows = [line for line in verdicts.splitlines() if line.startswith("| ") and "| seed 0" in line]
    suite = load_suite(packaged_suites()["paper"])
    assert len(rows) == len(suite.claims)
    payload = json.loads((out / "report.json").read_text())
    assert len(payload["verdicts"]) == len(suite.claims)
    assert all("per_seed" in row for rows_ in payload["tables"].values() for row in rows_)


def test_seeds_needed_gives_the_stated_power_when_the_observed_spreads_are_true() -> None:
    """Drawing n = seeds_needed seeds per method from normals with the observed means and spreads, Welch's test at
    5 % rejects in about 80 % of draws (and clearly less often with half as many seeds)."""
    import numpy as np

    a, b = [0.80, 0.84, 0.78], [0.79, 0.82, 0.79]
    n = seeds_needed(a, b)
    assert n is not None and n > 3
    rng = np.random.default_rng(0)

    def power(seeds: int) -> float:
        mean_a, mean_b = np.mean(a), np.mean(b)
        sd_a, sd_b = np.std(a, ddof=1), np.std(b, ddof=1)
        draws = 2000
        rejections = sum(welch_p_value(list(rng.normal(mean_a, sd_a, seeds)), list(rng.normal(mean_b, sd_b, seeds)))
                         < 0.05 for _ in range(draws))
        return rejections / draws

    assert 0.75 <= power(n) <= 0.86
    assert power(max(2, n // 2)) < 0.6


@pytest.mark.parametrize("test", ["welch", "student", "mann-whitney"])
def test_a_comparisons_standings_are_scipys_tests_with_holm_against_the_best(test: str) -> None:
    """Planted per-seed scores: one method clearly better, one tied with it, one between. The standings name the
    best, test it against each other method with scipy's test of that name, correct by Holm across the
    comparisons, and call the rejected ones worse and the others undecided with the seeds they would need."""
    from scipy import stats

    from graphfed.report.verdicts import standings

    scores = {"clear": [0.90, 0.91, 0.92, 0.905, 0.915], "tied": [0.905, 0.90, 0.915, 0.92, 0.91],
              "behind": [0.60, 0.62, 0.61, 0.59, 0.605], "no score": []}
    ranked = {standing.method: standing for standing in standings(scores, higher_is_better=True, test=test)}
    best = "clear" if sum(scores["clear"]) >= sum(scores["tied"]) else "tied"
    other = "tied" if best == "clear" else "clear"
    scipy_test = {"welch": lambda a, b: stats.ttest_ind(a, b, equal_var=False).pvalue,
                  "student": lambda a, b: stats.ttest_ind(a, b, equal_var=True).pvalue,
                  "mann-whitney": lambda a, b: stats.mannwhitneyu(a, b, alternative="two-sided").pvalue}[test]
    p_other, p_behind = scipy_test(scores[best], scores[other]), scipy_test(scores[best], scores["behind"])
    assert ranked[best].relation == "best" and ranked["no score"].relation == "untested"
    assert ranked[other].p_value == pytest.approx(p_other) and ranked["behind"].p_value == pytest.approx(p_behind)
    # Holm over the two comparisons: the smaller p against 5 % / 2, then the larger against 5 %
    assert p_behind <= 0.025 and ranked["behind"].relation == "worse" and ranked["behind"].seeds_needed is None
    assert p_other > 0.05 and ranked[other].relation == "undecided"
    # what is shown is Holm-adjusted: the larger p of two, times 1 (after the smaller's 2x, never below it)
    adjusted = max(p_other, min(1.0, 2 * p_behind))
    assert ranked[other].p_holm == pytest.approx(adjusted) and ranked["behind"].p_holm == pytest.approx(2 * p_behind)
    assert ranked[other].text().startswith(f"undecided (p_Holm = {adjusted:.2g}")


def test_holm_keeps_a_difference_significant_alone_undecided_among_several() -> None:
    """p = 0.045 against the best decides alone (5 %) but not as the smallest of two comparisons (Holm's first step
    asks 5 % / 2), when the other comparison (a method tied with the best) is no rejection."""
    from graphfed.report.verdicts import standings

    best, close = [1.0, 1.1, 1.2, 1.05], [0.8, 1.0, 1.0, 0.9]
    alone = {s.method: s for s in standings({"best": best, "close": close}, True)}
    pair = {s.method: s for s in standings({"best": best, "close": close, "tied": [1.02, 1.08, 1.15, 1.1]}, True)}
    p = alone["close"].p_value
    assert p is not None and 0.025 < p < 0.05 and pair["tied"].relation == "undecided"
    assert alone["close"].relation == "worse" and pair["close"].relation == "undecided"
    # planned at 5 % over the two comparisons, as Holm's first step asks: 8 seeds here, where 5 % alone says 7
    assert pair["close"].seeds_needed == seeds_needed(best, close, 0.05 / 2) == 8
    assert seeds_needed(best, close, 0.05) == 7


def test_holm_adjusted_p_values_decide_exactly_as_holms_rejections() -> None:
    """Each shown p_Holm is at most 5 % exactly where Holm's step-down procedure rejects (ties and caps included)."""
    from graphfed.report.verdicts import holm_adjusted

    for p_values in ([0.01, 0.04, 0.03], [0.02, 0.02, 0.5], [0.001, 0.2, 0.012, 0.0125], [0.9, 0.6], [0.026, 0.03]):
        adjusted = holm_adjusted(p_values)
        assert [value <= 0.05 for value in adjusted] == holm_rejections(p_values)
        assert all(1.0 >= a >= p for a, p in zip(adjusted, p_values, strict=True))
    assert holm_adjusted([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_identical_seeds_on_both_sides_are_called_degenerate_not_p_zero() -> None:
    """Two methods whose every seed gives one same score (a deterministic method on a folder no seed re-splits): the
    test has no spread, so no p-value is printed; the means decide, and no seed count is planned."""
    from graphfed.report.verdicts import standings

    ranked = {s.method: s for s in standings({"fedavg": [0.853] * 3, "local": [0.7124] * 3,
                                               "ditto": [0.80, 0.84, 0.82]}, True)}
    assert ranked["local"].degenerate and ranked["local"].relation == "worse" and ranked["local"].seeds_needed is None
    assert "degenerate" in ranked["local"].text() and "p_Holm" not in ranked["local"].text()
    assert not ranked["ditto"].degenerate and "p_Holm" in ranked["ditto"].text()
    same = {s.method: s for s in standings({"a": [0.5, 0.5], "b": [0.5, 0.5]}, True)}
    assert same["b"].degenerate and same["b"].relation == "undecided" and "are equal" in same["b"].text()


def test_each_section_states_its_budget_as_training_rows_against_each_papers() -> None:
    """The paper suite's budgets in rows processed over a run: FL-60's 300 of Panacea's 800 rounds of the same round
    (37.5 %), the 5-step CIFAR-10 grid against FedAGHN's 200 rounds x 20 clients x 5 epochs of 2,100 rows and
    pFedGAT's 50 rounds x 25 clients x 5 epochs of 1,680 (50 x 20 x 5 x 32 rows: 0.38 % and 1.5 %), a section no
    paper runs states none; a budget that gives neither or both kinds of local work is refused."""
    from pydantic import ValidationError

    from graphfed.report.suite import budget_line
    from graphfed.suites import PaperBudget

    suite = load_suite(packaged_suites()["paper"])

    def line(key: str) -> str:
        entry = suite.datasets[key]
        return budget_line(entry, type("Train", (), entry.config["train"])())

    assert "38 % of Panacea's (800 rounds x 5 clients x 50 steps of batch 64; rounds: 300 of 800)" in line("fl60")
    assert "100 % of Panacea's" in line("fl60-800")
    grid = line("cifar10-dir0.1")
    assert "0.38 % of FedAGHN's (200 rounds x its clients x 5 epochs of 2,100 rows" in grid
    assert "1.5 % of pFedGAT's (50 rounds x 25 clients x 5 epochs of 1,680 rows" in grid
    assert line("femnist") == ""  # no paper runs it (its description says so)
    for wrong in ({}, {"local_steps": 5, "batch_size": 32, "local_epochs": 5, "rows_per_client": 100}):
        with pytest.raises(ValidationError, match="local_steps and batch_size, or local_epochs"):
            PaperBudget(paper="X", rounds=10, **wrong)
