"""Every method's numbers on a tiny seeded run equal those recorded in ``tests/data/golden_runs.json``.

The file was first written by ``python tests/golden_runs.py write`` on the commit before the structural refactor of
issue 25 (code id c95b655023f18fde): moving code must not move numbers. A change that is meant to change numbers
rewrites the file in the same commit and says why. The runs compute on portable kernels, whose numbers are the same on
every x86-64 CPU (``tests/golden_runs.py`` says why); a method may hold one outcome per architecture and a run must
equal one of them. The convolutional runs are marked ``kernel_paths``: ``make test`` re-runs them under MKL's AVX2
path, where the CPU's own kernels give other numbers and the portable ones must not.
"""

from __future__ import annotations

import json

import pytest

from conftest import on_kernel_paths
from golden_runs import GOLDEN, KEYS, config_of, matches, methods, numbers

RECORDED: dict[str, list[dict]] = json.loads(GOLDEN.read_text())
#: the golden runs whose models go through convolution kernels (the others are MLPs)
CONVOLUTIONAL = {method for method in RECORDED if config_of(method)["model"]["name"] != "mlp"}


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


@pytest.mark.parametrize("method", on_kernel_paths(sorted(RECORDED), CONVOLUTIONAL))
def test_same_numbers_as_recorded(method: str) -> None:
    got, outcomes = numbers(method), RECORDED[method]
    assert any(matches(got, outcome) for outcome in outcomes), (
        f"{method}: {got} equals none of the {len(outcomes)} recorded outcome(s) "
        f"(first: {outcomes[0]}); a change meant to move numbers re-records them with tests/golden_runs.py write, "
        f"a new architecture adds its own with tests/golden_runs.py add"
    )
