"""Every method's numbers on a tiny seeded run equal those recorded in ``tests/data/golden_runs.json``.

The file was written by ``python tests/golden_runs.py write`` on the commit before the structural refactor of
issue 25 (code id c95b655023f18fde): moving code must not move numbers. A change that is meant to change numbers
rewrites the file in the same commit and says why."""

from __future__ import annotations

import json
import math

import pytest

from golden_runs import GOLDEN, methods, numbers

RECORDED = json.loads(GOLDEN.read_text())


def test_every_method_has_a_recorded_run() -> None:
    assert sorted(RECORDED) == methods()


@pytest.mark.parametrize("method", sorted(RECORDED))
def test_same_numbers_as_recorded(method: str) -> None:
    got, expected = numbers(method), RECORDED[method]
    for key, value in expected.items():
        if isinstance(value, float):
            assert math.isclose(got[key], value, rel_tol=1e-6, abs_tol=1e-9), (key, got[key], value)
        else:
            assert got[key] == value, (key, got[key], value)
