"""The privacy audit beside the privacy study's claims: an epsilon lower bound per mechanism that a broken mechanism
would exceed (``graphfed.client.audit``: canary clients, each an independent trial, Clopper-Pearson at 95 %).

The audited plans are the study's (the ``privacy`` suite: clip 1.0, delta 1e-3, FL-60's 60 training
clients, 24 per round, 100 rounds, the noise calibrated to each target epsilon), run through graphfed's own
mechanism code. Rows:

* the study's four targets per mechanism, secure noise, an attacker who sees every upload (local) or release
  (central): the bound must stay below the claim;
* the same mechanism with no noise, and with ``privacy.reproducible_noise`` against an attacker who reads the seed
  (the issue's attack): the bound must exceed every claimed epsilon, which shows the audit can fail;
* secure noise against the seed attacker: regenerating the noise from the seed must not help it.

The local rows with the seed attacker run 1 round, calibrated to epsilon 8 for that round (a seeded stream per client
and round costs ~35 us, so 100 rounds of 200,000 canaries would take 12 minutes); every other row runs the study's
100.

    .venv/bin/python benchmarks/privacy_audit.py              # -> benchmarks/results/privacy/audit.json
    .venv/bin/python benchmarks/privacy_audit.py --canaries 20000 --out /tmp/audit.json   # quicker, weaker bounds
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from graphfed.client.audit import CANARY_NORM, audit
from graphfed.client.privacy import plan_privacy
from graphfed.config import PrivacyConfig
from graphfed.provenance import code_provenance

RESULTS = Path(__file__).resolve().parent / "results" / "privacy" / "audit.json"
TRAINING_CLIENTS, PER_ROUND, ROUNDS, DELTA, CLIP = 60, 24, 100, 1e-3, 1.0
TARGETS = (1.0, 2.0, 4.0, 8.0)
CONFIDENCE = 0.95


def rows() -> list[dict[str, Any]]:
    """(label, mechanism, privacy options, rounds, seed attacker) of every audited row."""
    planned: list[dict[str, Any]] = []
    for mechanism in ("local", "central"):
        planned.append({"label": "no noise", "mechanism": mechanism, "options": {"noise_multiplier": 0.0},
                        "rounds": ROUNDS, "seed_attacker": False})
        planned.append({"label": "reproducible noise, ε 8", "mechanism": mechanism,
                        "options": {"target_epsilon": 8.0, "reproducible_noise": True},
                        "rounds": 1 if mechanism == "local" else ROUNDS, "seed_attacker": True})
        planned.append({"label": "secure noise, ε 8", "mechanism": mechanism, "options": {"target_epsilon": 8.0},
                        "rounds": 1 if mechanism == "local" else ROUNDS, "seed_attacker": True})
        planned += [{"label": f"secure noise, ε {target:g}", "mechanism": mechanism,
                     "options": {"target_epsilon": target}, "rounds": ROUNDS, "seed_attacker": False}
                    for target in TARGETS]
    return planned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canaries", type=int, default=200_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    measured = []
    for row in rows():
        plan = plan_privacy(PrivacyConfig(mechanism=row["mechanism"], delta=DELTA, clip_norm=CLIP, **row["options"]),
                            TRAINING_CLIENTS, PER_ROUND, row["rounds"])
        started = time.perf_counter()
        result = audit(plan, row["rounds"], args.canaries, seed_attacker=row["seed_attacker"], confidence=CONFIDENCE)
        seconds = time.perf_counter() - started
        measured.append({"label": row["label"], **result.record(), "seconds": round(seconds, 1)})
        print(f"{row['mechanism']:7s} {row['label']:26s} {result.attacker:5s} claimed ε {result.claimed_epsilon:7.3g}"
              f"  lower bound {result.epsilon_lower_bound:6.3g}  ({seconds:.0f} s)", flush=True)
    document = {
        "description": (
            f"graphfed.client.audit on the privacy study's plans (clip {CLIP}, delta {DELTA:g}, "
            f"{TRAINING_CLIENTS} training clients, {PER_ROUND} per round: central samples Poisson q = "
            f"{PER_ROUND / TRAINING_CLIENTS:g}; {ROUNDS} rounds unless the row says otherwise): {args.canaries:,} "
            f"canary clients, each in or out by a fair coin, an in canary's update {CANARY_NORM:g} clip norms long, "
            f"each canary an independent trial (its own uploads, or its own coordinate of the sum); the attacker sums "
            f"its canary's evidence over the rounds, its threshold chosen on a quarter of the canaries; the bound "
            f"log((1 - delta - FNR) / FPR) with Clopper-Pearson upper bounds, {CONFIDENCE:.0%} overall (Bonferroni). "
            f"`python benchmarks/privacy_audit.py --canaries {args.canaries}`."),
        "confidence": CONFIDENCE,
        "code": code_provenance(),
        "rows": measured,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
