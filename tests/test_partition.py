"""Behavioural tests of the partition, split and graph helpers in graphfed.data."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphfed.data.graphs import choose_novel_clients, edges_to_adjacency, knn_graph
from graphfed.data.partition import (
    dirichlet_partition,
    iid_partition,
    pathological_partition,
    split_client_indices,
)


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    """Every index in range(n) appears in exactly one part, once."""
    allidx = np.concatenate(parts)
    assert len(allidx) == n
    assert np.array_equal(np.sort(allidx), np.arange(n))


def _labels(n: int, num_classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_classes, size=n)


# --- iid ---------------------------------------------------------------------------------------------


def test_iid_covers_every_index_once_with_balanced_sizes() -> None:
    labels = _labels(1003)
    parts = iid_partition(labels, 10, np.random.default_rng(1))
    _assert_exact_cover(parts, 1003)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_iid_is_reproducible_and_seed_dependent() -> None:
    labels = _labels(500)
    a = iid_partition(labels, 5, np.random.default_rng(7))
    b = iid_partition(labels, 5, np.random.default_rng(7))
    c = iid_partition(labels, 5, np.random.default_rng(8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


# --- pathological ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("num_clients", "k"), [(10, 2), (7, 3), (20, 1), (4, 10)])
def test_pathological_gives_exactly_k_classes_and_uses_every_sample(num_clients: int, k: int) -> None:
    labels = _labels(3000)
    parts = pathological_partition(labels, num_clients, k, np.random.default_rng(0))
    _assert_exact_cover(parts, len(labels))
    for p in parts:
        assert len(np.unique(labels[p])) == k


def test_pathological_rejects_too_many_classes_per_client() -> None:
    with pytest.raises(ValueError, match=r"classes_per_client=11 exceeds the number of classes \(10\)"):
        pathological_partition(_labels(500), 5, 11, np.random.default_rng(0))


def test_pathological_rejects_uncoverable_classes() -> None:
    # 3 clients x 2 classes cannot hold 10 classes without dropping samples.
    with pytest.raises(ValueError, match="cannot cover all 10 classes"):
        pathological_partition(_labels(500), 3, 2, np.random.default_rng(0))


# --- dirichlet ---------------------------------------------------------------------------------------


def test_dirichlet_many_clients_tiny_beta_is_fast_and_respects_min_samples() -> None:
    labels = _labels(30_000)
    start = time.perf_counter()
    parts = dirichlet_partition(labels, 600, 0.05, np.random.default_rng(0), min_samples=10)
    elapsed = time.perf_counter() - start
    _assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 10
    assert elapsed < 5.0  # typically ~0.05 s; a resample-until-ok loop would hang here


def test_dirichlet_extreme_beta_still_terminates_with_min_samples() -> None:
    labels = _labels(6000)
    parts = dirichlet_partition(labels, 500, 1e-6, np.random.default_rng(3), min_samples=12)
    _assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 12


def test_dirichlet_rejects_impossible_min_samples() -> None:
    with pytest.raises(ValueError, match=r"needs 1100 samples but only 1000"):
        dirichlet_partition(_labels(1000), 110, 0.5, np.random.default_rng(0), min_samples=10)


def _mean_normalised_entropy(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> float:
    """Average over clients of the label-histogram entropy / log(num_classes): 1 = uniform, 0 = one class."""
    values = []
    for p in parts:
        hist = np.bincount(labels[p], minlength=num_classes).astype(float)
        prob = hist[hist > 0] / hist.sum()
        values.append(float(-(prob * np.log(prob)).sum() / np.log(num_classes)))
    return float(np.mean(values))


def test_dirichlet_smaller_beta_gives_more_skewed_label_histograms() -> None:
    labels = _labels(20_000)
    entropies = {
        beta: _mean_normalised_entropy(
            labels, dirichlet_partition(labels, 20, beta, np.random.default_rng(0), min_samples=10), 10)
        for beta in (0.05, 0.5, 100.0)
    }
    assert entropies[0.05] < entropies[0.5] < entropies[100.0]
    assert entropies[100.0] > 0.95  # near-iid
    assert entropies[0.05] < 0.5  # most clients dominated by few classes


# --- per-client split --------------------------------------------------------------------------------


def test_split_sizes_for_tpt48_windows() -> None:
    train, val, test = split_client_indices(133, (0.7, 0.1, 0.2), np.random.default_rng(0))
    assert (len(train), len(val), len(test)) == (93, 13, 27)
    _assert_exact_cover([train, val, test], 133)


def test_chronological_split_keeps_order_train_first() -> None:
    train, val, test = split_client_indices(10, (0.6, 0.2, 0.2), mode="chronological")
    assert train.tolist() == list(range(6))
    assert val.tolist() == [6, 7]
    assert test.tolist() == [8, 9]


def test_random_split_needs_rng_and_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="needs an rng"):
        split_client_indices(10, (0.7, 0.1, 0.2))
    with pytest.raises(ValueError, match="split mode"):
        split_client_indices(10, (0.7, 0.1, 0.2), np.random.default_rng(0), mode="sideways")  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 400), train=st.floats(0.01, 1.0), val=st.floats(0.0, 1.0), test=st.floats(0.01, 1.0),
       mode=st.sampled_from(["random", "chronological"]), seed=st.integers(0, 2**32 - 1))
def test_split_is_a_partition_with_train_and_test_when_possible(n: int, train: float, val: float, test: float,
                                                               mode: str, seed: int) -> None:
    total = train + val + test
    fractions = (train / total, val / total, test / total)
    parts = split_client_indices(n, fractions, np.random.default_rng(seed), mode)  # type: ignore[arg-type]
    _assert_exact_cover(list(parts), n)
    if n >= 2:
        assert len(parts[0]) >= 1 and len(parts[2]) >= 1
    # Rounding moves at most a couple of rows away from the requested fraction.
    for part, frac in zip(parts, fractions, strict=True):
        assert abs(len(part) - frac * n) <= 2


# --- graphs ------------------------------------------------------------------------------------------


def test_knn_graph_is_symmetric_binary_and_links_similar_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    # Two tight clusters pointing in orthogonal directions: neighbours must come from the own cluster.
    a = torch.tensor([1.0, 0.0, 0.0]) + 0.05 * torch.randn(10, 3, generator=gen)
    b = torch.tensor([0.0, 1.0, 0.0]) + 0.05 * torch.randn(10, 3, generator=gen)
    adj = knn_graph(torch.cat([a, b]), k=3)
    assert adj.shape == (20, 20)
    assert torch.equal(adj, adj.T)
    assert torch.all(adj.diagonal() == 0)
    assert set(adj.unique().tolist()) <= {0.0, 1.0}
    assert torch.all(adj.sum(1) >= 3)
    assert adj[:10, 10:].sum() == 0


def test_knn_graph_clips_k_and_handles_zero_rows() -> None:
    feats = torch.zeros(4, 5)
    feats[0, 0] = 1.0
    adj = knn_graph(feats, k=10)
    assert torch.equal(adj, torch.ones(4, 4) - torch.eye(4))
    assert not torch.isnan(adj).any()
    assert knn_graph(torch.randn(1, 3), k=2).shape == (1, 1)


def test_edges_to_adjacency_is_symmetric_with_weights_and_no_self_loops() -> None:
    adj = edges_to_adjacency([(0, 1), (2, 1), (3, 3)], 4, weights=[0.5, 2.0, 9.0])
    expected = torch.zeros(4, 4)
    expected[0, 1] = expected[1, 0] = 0.5
    expected[1, 2] = expected[2, 1] = 2.0
    assert torch.equal(adj, expected)
    with pytest.raises(ValueError, match="edge endpoints"):
        edges_to_adjacency([(0, 4)], 4)


@pytest.mark.parametrize(
    ("n", "fraction", "expected"), [(60, 0.0, 0), (60, 0.2, 12), (10, 0.01, 1), (5, 0.99, 4)]
)
def test_choose_novel_clients_counts(n: int, fraction: float, expected: int) -> None:
    mask = choose_novel_clients(n, fraction, np.random.default_rng(0))
    assert mask.dtype == torch.bool and mask.shape == (n,)
    assert int(mask.sum()) == expected
