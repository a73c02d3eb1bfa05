"""Group-weight and uniformity summaries of collaboration graphs."""

from __future__ import annotations

import numpy as np
import pytest

from graphfed.report.collaboration import group_weights, max_deviation_from_uniform


def test_group_weights_average_per_client_over_layers() -> None:
    groups = np.array([0, 0, 1, 1])
    # layer 0: self 0.4, same-group partner 0.4, each other-group client 0.1; layer 1: uniform
    layer0 = np.array([[0.4, 0.4, 0.1, 0.1], [0.4, 0.4, 0.1, 0.1], [0.1, 0.1, 0.4, 0.4], [0.1, 0.1, 0.4, 0.4]])
    weights = group_weights(np.stack([layer0, np.full((4, 4), 0.25)]), groups)
    assert weights.self_weight == pytest.approx(0.325)
    assert weights.similar == pytest.approx(0.325)
    assert weights.other == pytest.approx(0.175)


def test_group_weights_needs_groups_on_both_sides() -> None:
    with pytest.raises(ValueError, match="at least two groups"):
        group_weights(np.full((3, 3), 1 / 3), np.zeros(3))
    with pytest.raises(ValueError, match="groups must have 3 entries"):
        group_weights(np.full((3, 3), 1 / 3), np.zeros(4))


def test_deviation_from_uniform_is_in_units_of_one_over_n() -> None:
    uniform = np.full((2, 5, 5), 0.2)
    assert max_deviation_from_uniform(uniform) == pytest.approx(0.0)
    uniform[1, 2, 3] += 0.05
    assert max_deviation_from_uniform(uniform) == pytest.approx(0.25)
