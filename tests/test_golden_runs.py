"""Every method's numbers on a tiny seeded run equal those recorded in ``tests/data/golden_runs.json``.

The file was first written by ``python tests/golden_runs.py write`` on the commit before the structural refactor of
issue 25 (code id c95b655023f18fde): moving code must not move numbers. A change that is meant to change numbers
rewrites the file in the same commit and says why. A method may hold several outcomes, one per CPU code path (see
``tests/golden_runs.py``); a run must equal one of them.
"""

from __future__ import annotations

import json

import pytest

from golden_runs import GOLDEN, KEYS, matches, methods, numbers

RECORDED: dict[str, list[dict]] = json.loads(GOLDEN.read_text())


def test_every_method_has_a_recorded_run() -> None:
    assert sorted(RECORDED) == methods()
    assert all(outcomes and all(set(KEYS) <= set(outcome) for outcome in outcomes) for outcomes in RECORDED.values())


def test_a_moved_number_matches_no_outcome() -> None:
    """The comparison itself: one float off by 1e-4 relative, or a count off by one, is a different outcome."""
    outcome = RECORDED["fedavg"][0]
    assert matches(dict(outcome), outcome)
    assert not matches({**outcome, "test_mean": outcome["test_mean"] * (1 + 1e-4)}, outcome)
    assert not matches({**outcome, "bytes_up": outcome["bytes_up"] + 1}, outcome)
    assert not matches({**outcome, "best_round": outcome["best_round"] - 2}, outcome)


@pytest.mark.parametrize("method", sorted(RECORDED))
def test_same_numbers_as_recorded(method: str) -> None:
    got, outcomes = numbers(method), RECORDED[method]
    assert any(matches(got, outcome) for outcome in outcomes), (
        f"{method}: {got} equals none of the {len(outcomes)} recorded outcome(s) "
        f"(first: {outcomes[0]}); a change meant to move numbers re-records them with tests/golden_runs.py write"
    )
