"""The one verdict rule of every report: a claim is decided by a stated test over seeds, never by counting wins.

The rule (printed in each report that has claims, and tested on made-up rows in ``tests/test_verdicts.py``):

* **The test.** Each comparison of the claimed method with one named baseline is Welch's two-sided t-test on the
  per-seed scores (one score per seed: the mean over clients at the run's best-validation round), at
  ``ALPHA`` = 5 %. Welch, because the methods' seed spreads differ by up to 10x (Local against a hypernetwork) and
  a pooled-variance test would then be wrong in either direction; unpaired, because it holds whether or not a seed
  fixes the same split for every method (a user's federation folder does not re-split per seed). Spreads are the
  sample standard deviation (n - 1).
* **Beats / loses.** The method beats a baseline when its mean is better and the test rejects equality; it loses
  when the baseline's mean is better and the test rejects equality after Holm's correction over the claim's
  baselines (a claim against 15 baselines must not fail on one chance loss in 15). "Beats every baseline" needs no
  correction: it is an intersection of tests, each at 5 %.
* **A factor** (MSE claims such as "about 100x"): the claimed ratio is tested the same way, Welch's test of the
  baseline's scores against ``factor`` times the method's; it is reached when the baseline's mean is larger and the
  test rejects, missed when smaller and the test rejects.
* **Verdicts.** *holds*: beats every named baseline (and reaches the factor). *does not hold here*: loses to any
  named baseline, or misses the factor. *partly*: beats at least one baseline and loses to none, the rest
  undecided (named in the row). *inconclusive*: beats none and loses to none. An undecided comparison states the
  seeds per method the observed difference would need (80 % power of the same Welch test, observed spreads taken
  as the truth), so a reader knows whether more seeds could decide it.
* With one seed of either method nothing is tested: every comparison is undecided.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, stdev
from typing import Literal

from scipy import stats

ALPHA = 0.05
POWER = 0.8
TEST_NAME = "Welch's two-sided t-test over seeds at 5 % (Holm-corrected across a claim's baselines for losses)"

Outcome = Literal["beats", "loses", "undecided"]


def sample_std(values: Sequence[float]) -> float:
    """The sample standard deviation (n - 1); 0 for a single value, which says nothing about the spread."""
    return stdev(values) if len(values) > 1 else 0.0


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test that ``a`` and ``b`` have the same mean; 1.0 when untestable (fewer
    than two values on a side). Two constant samples: 0 when their values differ, 1 when they are equal."""
    if len(a) < 2 or len(b) < 2:
        return 1.0
    if sample_std(a) == 0 and sample_std(b) == 0:
        return 0.0 if fmean(a) != fmean(b) else 1.0
    with warnings.catch_warnings():  # nearly equal samples: scipy warns of precision loss, the p-value is still 1-ish
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def seeds_needed(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA) -> int | None:
    """Seeds per method at which the observed difference of means would be detected with 80 % power by the same
    two-sided Welch test at ``alpha`` (5 %), taking the observed spreads as the truth: the smallest n with
    n >= (t_crit + t_power)^2 (s_a^2 + s_b^2) / d^2, both t quantiles at Welch-Satterthwaite's degrees of freedom
    for n seeds per method. None when the means are equal (no number of seeds decides a zero difference) or a
    side has one value (no spread to plan with)."""
    if len(a) < 2 or len(b) < 2:
        return None
    difference = abs(fmean(a) - fmean(b))
    if difference == 0:
        return None
    var_a, var_b = sample_std(a) ** 2, sample_std(b) ** 2
    if var_a + var_b == 0:
        return 2

    def enough(n: int) -> bool:
        df = (var_a + var_b) ** 2 / ((var_a ** 2 + var_b ** 2) / (n - 1))
        t = stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(POWER, df)
        return n >= t * t * (var_a + var_b) / difference ** 2

    if enough(2):
        return 2
    low, high = 2, 4
    while not enough(high):  # the requirement falls as n grows: double, then bisect (low never enough)
        low, high = high, 2 * high
    while low + 1 < high:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


@dataclass(frozen=True)
class Comparison:
    """The claimed method against one baseline (or against the claimed factor)."""

    baseline: str
    outcome: Outcome  # for a factor: beats = reached, loses = missed
    p_value: float
    method_mean: float
    baseline_mean: float
    n_method: int
    n_baseline: int
    seeds_needed: int | None  # for an undecided comparison
    factor: float | None = None  # set when this compares against a claimed ratio


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values: the k-th smallest p times (m - k + 1), made non-decreasing in that order and capped
    at 1. A hypothesis is rejected at ``alpha`` by :func:`holm_rejections` exactly when its adjusted p is at most
    ``alpha``, so the adjusted value is the one to print beside a decision."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def holm_rejections(p_values: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down procedure: which of the hypotheses are rejected, controlling the family-wise error."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, index in enumerate(order):
        if p_values[index] > alpha / (len(p_values) - rank):
            break
        rejected[index] = True
    return rejected


def compare_against(method: Sequence[float], baselines: dict[str, Sequence[float]],
                    higher_is_better: bool) -> list[Comparison]:
    """The method against each baseline under the rule in the module docstring."""
    names = list(baselines)
    p_values = [welch_p_value(method, baselines[name]) for name in names]
    loss_rejected = holm_rejections(p_values)
    comparisons = []
    for name, p_value, rejected_after_holm in zip(names, p_values, loss_rejected, strict=True):
        mine, theirs = fmean(method), fmean(baselines[name])
        better = mine > theirs if higher_is_better else mine < theirs
        worse = mine < theirs if higher_is_better else mine > theirs
        if better and p_value < ALPHA:
            outcome: Outcome = "beats"
        elif worse and rejected_after_holm:
            outcome = "loses"
        else:
            outcome = "undecided"
        comparisons.append(Comparison(name, outcome, p_value, mine, theirs, len(method), len(baselines[name]),
                                      None if outcome != "undecided" else seeds_needed(method, baselines[name])))
    return comparisons


def factor_comparison(method: Sequence[float], baseline: Sequence[float], factor: float,
                      baseline_name: str) -> Comparison:
    """Whether ``baseline / method`` reaches ``factor`` (lower is better): Welch's test of the baseline's scores
    against ``factor`` times the method's. "beats" = reached, "loses" = missed, else undecided."""
    scaled = [factor * value for value in method]
    p_value = welch_p_value(baseline, scaled)
    theirs, target = fmean(baseline), fmean(scaled)
    if p_value < ALPHA:
        outcome: Outcome = "beats" if theirs > target else "loses"
    else:
        outcome = "undecided"
    return Comparison(baseline_name, outcome, p_value, target, theirs, len(method), len(baseline),
                      None if outcome != "undecided" else seeds_needed(baseline, scaled), factor)


#: the tests ``graphfed compare --test`` offers, by name: how each is stated in a table
TESTS = {"welch": "Welch's two-sided t-test over seeds",
         "student": "Student's two-sided t-test over seeds (pooled variance)",
         "mann-whitney": "the two-sided Mann-Whitney U test over seeds"}


def p_value(a: Sequence[float], b: Sequence[float], test: str = "welch") -> float:
    """Two-sided p-value that ``a`` and ``b`` come from the same distribution (mean, for the t-tests) by the test
    named in :data:`TESTS`; 1.0 when untestable (fewer than two values on a side)."""
    if test == "welch":
        return welch_p_value(a, b)
    if len(a) < 2 or len(b) < 2:
        return 1.0
    if test == "student":
        if sample_std(a) == 0 and sample_std(b) == 0:
            return 0.0 if fmean(a) != fmean(b) else 1.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return float(stats.ttest_ind(a, b, equal_var=True).pvalue)
    if test == "mann-whitney":
        return float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    raise ValueError(f"unknown test {test!r}; choose one of {', '.join(TESTS)}")


@dataclass(frozen=True)
class Standing:
    """One method of a comparison against the best one (the best mean over seeds)."""

    method: str
    relation: Literal["best", "worse", "undecided", "untested"]  # untested: no score, or the only method
    mean: float | None
    n: int
    p_value: float | None  # against the best, before Holm's correction
    seeds_needed: int | None  # undecided: seeds per method the observed difference would need (Welch, 80 % power,
    # at alpha / the number of comparisons)
    p_holm: float | None = None  # Holm-adjusted across the comparisons with the best: what decides, and is shown
    #: every seed of this method and every seed of the best gave one same score each: no spread, so no test has a
    #: meaningful p (Welch's t is 0/0 or x/0); the relation follows the means alone
    degenerate: bool = False

    def text(self) -> str:
        """``best`` / ``worse (p_Holm = 0.003)`` / ``undecided (p_Holm = 0.41; ~9 seeds would decide)``, or for
        identical seeds on both sides ``worse (degenerate: ...)``."""
        if self.relation in ("best", "untested"):
            return self.relation
        if self.degenerate:
            return (f"{self.relation} (degenerate: every seed gave the same score on both sides, so the test has no "
                    f"spread; " + ("the scores differ at every seed)" if self.relation == "worse"
                                   else "the scores are equal)"))
        shown = f"p_Holm = {self.p_holm:.2g}" if self.p_holm is not None else "untested"
        if self.relation == "undecided" and self.seeds_needed is not None:
            shown += f"; ~{self.seeds_needed} seeds would decide"
        return f"{self.relation} ({shown})"


def standings(scores: dict[str, Sequence[float]], higher_is_better: bool,
              test: str = "welch") -> list[Standing]:
    """Each method against the best (``scores``: per-seed scores by method): the best's scores tested against each
    other method's by ``test``, Holm-corrected across those comparisons at ``ALPHA``; a rejected one is *worse*,
    the others *undecided*, with the seeds per method their observed difference would need. Methods without a
    score are *untested*."""
    scored = {name: list(values) for name, values in scores.items() if values}
    if not scored:
        return [Standing(name, "untested", None, 0, None, None) for name in scores]
    pick = max if higher_is_better else min
    best = pick(scored, key=lambda name: fmean(scored[name]))
    others = [name for name in scored if name != best]
    p_values = [p_value(scored[best], scored[name], test) for name in others]
    rejected = dict(zip(others, holm_rejections(p_values), strict=True))
    tested = dict(zip(others, p_values, strict=True))
    adjusted = dict(zip(others, holm_adjusted(p_values), strict=True))
    result = []
    for name in scores:
        values = scored.get(name)
        if not values:
            result.append(Standing(name, "untested", None, 0, None, None))
        elif name == best:
            result.append(Standing(name, "best" if others else "untested", fmean(values), len(values), None, None))
        else:
            worse = rejected[name]
            degenerate = identical_seeds(scored[best]) and identical_seeds(values)
            # planned at the level Holm's first step asks of each (alpha / comparisons): enough for any of them
            result.append(Standing(name, "worse" if worse else "undecided", fmean(values), len(values), tested[name],
                                   None if worse or degenerate else seeds_needed(scored[best], values,
                                                                                 ALPHA / len(others)),
                                   adjusted[name], degenerate))
    return result


def identical_seeds(values: Sequence[float]) -> bool:
    """At least two seeds, all with the same score: a sample without spread (a deterministic method on a federation
    that no seed re-splits)."""
    return len(values) > 1 and sample_std(values) == 0


def verdict(comparisons: Sequence[Comparison]) -> str:
    """holds / does not hold here / partly (...) / inconclusive, from the comparisons of one claim."""
    def name(c: Comparison) -> str:
        return c.baseline if c.factor is None else f"{c.factor:g}x over {c.baseline}"

    beaten = [name(c) for c in comparisons if c.outcome == "beats"]
    lost = [c.baseline for c in comparisons if c.outcome == "loses" and c.factor is None]
    missed = [name(c) for c in comparisons if c.outcome == "loses" and c.factor is not None]
    undecided = [name(c) for c in comparisons if c.outcome == "undecided"]
    if lost or missed:
        return "does not hold here (" + "; ".join([*(["loses to " + ", ".join(lost)] if lost else []),
                                                    *(["misses " + ", ".join(missed)] if missed else [])]) + ")"
    if not undecided:
        return "holds"
    if beaten:
        return f"partly (beats {', '.join(beaten)}; undecided: {', '.join(undecided)})"
    return "inconclusive"


def seeds_to_decide(comparisons: Sequence[Comparison]) -> int | None:
    """The most seeds per method any undecided comparison of the claim would need; None if none can say."""
    needed = [c.seeds_needed for c in comparisons if c.outcome == "undecided" and c.seeds_needed is not None]
    return max(needed) if needed else None


def with_seeds_to_decide(verdict_text: str, seeds: int | None) -> str:
    """``verdict_text`` and, when it is undecided (partly, inconclusive) and a number can be given, the seeds per
    method at which the observed differences would decide it."""
    if seeds is None or not verdict_text.startswith(("partly", "inconclusive")):
        return verdict_text
    return f"{verdict_text}; ~{seeds} seeds per method would decide the rest"


__all__ = ["ALPHA", "TESTS", "TEST_NAME", "Comparison", "Standing", "compare_against", "factor_comparison",
           "holm_adjusted", "holm_rejections", "identical_seeds", "p_value", "sample_std", "seeds_needed",
           "seeds_to_decide", "standings", "verdict", "welch_p_value", "with_seeds_to_decide"]
