"""An audit of a run's privacy mechanism that can fail: a lower bound on its epsilon from canary clients.

Any (epsilon, delta)-DP mechanism bounds every test that tells neighbours apart: its false-negative and
false-positive rates satisfy ``FNR + e^epsilon FPR >= 1 - delta`` (Kairouz et al., 2015), so a test seen to reach
rates FPR and FNR proves ``epsilon >= log((1 - delta - FNR) / FPR)``. The audit runs the mechanism graphfed runs
(:func:`~graphfed.client.privacy.privatize_uploads`, :func:`~graphfed.client.privacy.noised_mean` with
:func:`~graphfed.client.privacy.poisson_sample`, the plan and noise source a config resolves to) on many canary
clients at once, each a trial of its own:

* every canary is *in* or *out* by a fair coin of the auditor's (add/remove or zero-out neighbours: an out canary
  uploads nothing under central DP, a zero update under local DP); an in canary's update is ``CANARY_NORM`` clip
  norms long, in every round it is sampled (a mechanism that skipped the clip would let it through whole);
* under ``local`` each canary's uploads are its own, and under ``central`` each canary owns one coordinate of the
  model (its update ``clip_norm * e_j``), so every canary's evidence depends on its own coin, its own sampling and
  its own noise: the trials are independent, as many independent runs would be, but cost one run (the idea of
  Steinke, Nasr and Jagielski, NeurIPS 2023, "Privacy auditing with one (1) training run", made exact here by the
  disjoint coordinates);
* the attacker sums what it sees of its canary over the rounds (rescaled by the expected cohort under central) and
  guesses *in* above a threshold. The threshold is chosen on the first quarter of the canaries and the bound is
  computed on the rest, with Clopper-Pearson upper confidence bounds on both error rates (each at ``1 - (1 -
  confidence) / 2``, Bonferroni, so the bound holds with the stated confidence).

The *seed* attacker reads the run's seed, as anyone reading ``config.yaml`` can, and subtracts the noise that seed
regenerates: against ``privacy.reproducible_noise`` it removes the noise entirely and the bound is limited only by
the number of canaries; against the secure generator it adds an independent error. A mechanism with no noise gives
the same unlimited bound. Those rows are the audit's power; a correct mechanism's rows must stay below its claim.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats

from graphfed.client.privacy import (
    PrivacyPlan,
    SeededNoise,
    noised_mean,
    poisson_sample,
    privatize_uploads,
)

#: canaries whose coin is decided per batch (local: rows of one upload tensor; central: coordinates of one sum)
LOCAL_BATCH = 50_000
CENTRAL_BATCH = 4_000
#: the share of the canaries that chooses the attack's threshold; the bound is computed on the others
CALIBRATION_SHARE = 0.25
#: an in canary's update, in clip norms: the clip must cut it to one
CANARY_NORM = 4.0


@dataclass(frozen=True)
class AuditResult:
    """One audit: the claim, what the attack achieved on the held-out canaries, and the bound it proves."""

    mechanism: str
    attacker: str  #: "blind" (sees the uploads or releases) or "seed" (also subtracts the seed's noise)
    reproducible_noise: bool
    noise_multiplier: float
    rounds: int
    claimed_epsilon: float
    delta: float
    canaries: int
    scored_in: int  #: held-out canaries that were in (positives)
    scored_out: int
    false_negatives: int
    false_positives: int
    confidence: float
    epsilon_lower_bound: float

    def record(self) -> dict[str, Any]:
        return asdict(self)


def clopper_pearson_upper(failures: int, trials: int, level: float) -> float:
    """The one-sided upper confidence bound at ``level`` on a rate seen ``failures`` times in ``trials``."""
    if failures >= trials:
        return 1.0
    return float(stats.beta.ppf(level, failures + 1, trials - failures))


def epsilon_lower_bound(false_positives: int, negatives: int, false_negatives: int, positives: int, delta: float,
                        confidence: float = 0.95) -> float:
    """``log((1 - delta - FNR_ub) / FPR_ub)`` with Clopper-Pearson upper bounds at ``1 - (1 - confidence) / 2`` each:
    the epsilon a mechanism must have spent for the test to do this well, with the stated confidence (0 when the
    test proves nothing)."""
    level = 1 - (1 - confidence) / 2
    fpr = clopper_pearson_upper(false_positives, negatives, level)
    fnr = clopper_pearson_upper(false_negatives, positives, level)
    if 1 - delta - fnr <= 0:
        return 0.0
    return max(0.0, math.log((1 - delta - fnr) / fpr))


def _threshold(scores: np.ndarray, inside: np.ndarray, delta: float, confidence: float) -> float:
    """The guess threshold with the best bound on these (calibration) canaries."""
    out_scores, in_scores = np.sort(scores[~inside]), np.sort(scores[inside])
    if len(out_scores) == 0 or len(in_scores) == 0:
        return 0.0
    candidates = list(np.quantile(out_scores, [0.5, 0.9, 0.99, 0.999, 0.9999]))
    candidates += list(np.quantile(in_scores, [0.0001, 0.001, 0.01, 0.1, 0.5]))
    if out_scores[-1] < in_scores[0]:  # separable: the middle of the gap
        candidates.append((out_scores[-1] + in_scores[0]) / 2)

    def bound(threshold: float) -> float:
        guesses = scores > threshold
        return epsilon_lower_bound(int((guesses & ~inside).sum()), int((~inside).sum()),
                                   int((~guesses & inside).sum()), int(inside.sum()), delta, confidence)

    return float(max(candidates, key=bound))


def _local_scores(plan: PrivacyPlan, rounds: int, inside: torch.Tensor, first_id: int, seed: int,
                  seed_attacker: bool) -> torch.Tensor:
    """Each canary's summed uploads (in clip norms) under ``local``: in canaries' updates are ``CANARY_NORM`` clip
    norms long, out ones 0."""
    noise = plan.noise_source(seed)
    ids = torch.arange(first_id, first_id + len(inside))
    update = inside.to(torch.float32).unsqueeze(1) * CANARY_NORM * plan.clip_norm
    score = torch.zeros(len(inside), dtype=torch.float64)
    attacker = SeededNoise(seed)
    std = plan.noise_multiplier * plan.clip_norm
    for round_index in range(rounds):
        uploads = privatize_uploads(update, plan, noise, round_index, ids)
        if seed_attacker and std > 0:
            uploads = uploads - attacker.gaussian_rows(len(ids), 1, std, "cpu", round_index, "privacy", ids)
        score += uploads[:, 0].double()
    return score / plan.clip_norm


def _central_scores(plan: PrivacyPlan, rounds: int, inside: torch.Tensor, seed: int,
                    seed_attacker: bool) -> torch.Tensor:
    """Each canary's summed coordinate of the releases (in clip norms) under ``central``: canary ``j`` owns
    coordinate ``j`` (its update ``CANARY_NORM * clip_norm * e_j``); in canaries join each round by their Poisson
    coin, out canaries are absent."""
    assert plan.sampling_rate is not None
    noise = plan.noise_source(seed)
    count = len(inside)
    expected = plan.sampling_rate * count  # the release divides by the expected cohort, a public number
    members = torch.nonzero(inside).flatten()
    score = torch.zeros(count, dtype=torch.float64)
    attacker = SeededNoise(seed)
    std = plan.sum_noise_multiplier * plan.clip_norm
    for round_index in range(rounds):
        # every canary gets a coin (out canaries' coins are drawn and unused: absent clients)
        sampled = poisson_sample(torch.arange(count), plan, noise, round_index)
        joined = members[torch.isin(members, sampled)]
        updates = torch.zeros(len(joined), count)
        updates[torch.arange(len(joined)), joined] = CANARY_NORM * plan.clip_norm
        release = noised_mean(updates, plan, expected, noise, round_index) * expected
        if seed_attacker and std > 0:
            release = release - attacker.gaussian((count,), std, "cpu", round_index, "privacy")
        score += release.double()
    return score / plan.clip_norm


def audit(plan: PrivacyPlan, rounds: int, canaries: int, seed_attacker: bool = False, seed: int = 0,
          confidence: float = 0.95) -> AuditResult:
    """Audit ``plan``'s mechanism over ``rounds`` rounds with ``canaries`` canary clients (see the module).

    ``seed``: the auditor's coins and, for a reproducible plan, each batch's run seed (``seed + batch``; each batch
    is a run of its own). ``seed_attacker``: the attacker subtracts the noise the run's seed regenerates."""
    if plan.mechanism not in ("local", "central"):
        raise ValueError(f"nothing to audit: privacy.mechanism is {plan.mechanism}")
    if plan.mechanism == "central" and plan.adaptive_quantile is not None:
        raise ValueError("the audit runs a fixed clip: leave privacy.adaptive_quantile unset")
    coins = np.random.default_rng(seed)
    batch = LOCAL_BATCH if plan.mechanism == "local" else CENTRAL_BATCH
    scores, insides = [], []
    for number, start in enumerate(range(0, canaries, batch)):
        inside = torch.from_numpy(coins.random(min(batch, canaries - start)) < 0.5)
        if plan.mechanism == "local":
            scores.append(_local_scores(plan, rounds, inside, start, seed + number, seed_attacker))
        else:
            scores.append(_central_scores(plan, rounds, inside, seed + number, seed_attacker))
        insides.append(inside)
    score, inside = torch.cat(scores).numpy(), torch.cat(insides).numpy()
    split = int(CALIBRATION_SHARE * canaries)
    threshold = _threshold(score[:split], inside[:split], plan.delta, confidence)
    held_score, held_in = score[split:], inside[split:]
    guesses = held_score > threshold
    false_positives, false_negatives = int((guesses & ~held_in).sum()), int((~guesses & held_in).sum())
    positives, negatives = int(held_in.sum()), int((~held_in).sum())
    return AuditResult(plan.mechanism, "seed" if seed_attacker else "blind", plan.reproducible,
                       plan.noise_multiplier, rounds, plan.epsilon_of_rounds(rounds), plan.delta, canaries,
                       positives, negatives, false_negatives, false_positives, confidence,
                       epsilon_lower_bound(false_positives, negatives, false_negatives, positives, plan.delta,
                                           confidence))


__all__ = ["AuditResult", "audit", "clopper_pearson_upper", "epsilon_lower_bound"]
