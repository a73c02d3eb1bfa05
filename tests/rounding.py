"""Tolerances tied to float rounding, for two computations of one value that add their terms in different orders.

Bit equality is asserted only where both sides run the same kernel on the same data (a run against itself, a
client on one thread against the same client on a worker thread): a deterministic kernel gives the same bits for
the same inputs. Two different BLAS calls (a product against its transposed form, a batched call against a loop)
may sum in different orders, and which order a library picks depends on the CPU (MKL's AVX-512 and AVX2 paths
differ: ``MKL_ENABLE_INSTRUCTIONS=AVX2``). There the tests allow what rounding can do, no more: a sum of ``n``
products computed in any order is within ``gamma_n * sum |a_k b_k|`` of the exact value (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., eq. 3.5), with ``gamma_n = n u / (1 - n u)``, so two such orders are
within twice that of each other.

What the suite's bit-for-bit assertions rest on:

* a deterministic kernel gives the same bits for the same operands, shapes, strides and thread count (a run against
  itself, a resume against an uninterrupted run, clients side by side on one intra-op thread each);
* an elementwise IEEE operation is correctly rounded on every CPU (the SGD update's product, then difference);
* a member of a batched call (a client of a batched product, a run of a pack, a Flower node's one client) is its
  own problem, computed by the same kernel whatever the batch count: seen on MKL's AVX-512 and AVX2 paths and on an
  AMD EPYC, not promised by MKL, so FedAvg's Flower parity and pack are re-run under the AVX2 path;
* the golden runs compute on portable kernels (``tests/golden_runs.py``).

Tests marked ``kernel_paths`` are what must hold on every CPU's kernels; ``make test`` re-runs them with
``MKL_ENABLE_INSTRUCTIONS=AVX2``, which on an Intel CPU reproduces the failure an AMD CPU showed.
"""

from __future__ import annotations

import torch

#: unit roundoff u of each float type (half the distance from 1 to the next float)
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53, torch.bfloat16: 2.0 ** -8}


def gamma(terms: int, dtype: torch.dtype = torch.float32) -> float:
    """``gamma_n``: the relative error bound of a sum of ``terms`` rounded products, in any order."""
    nu = terms * UNIT_ROUNDOFF[dtype]
    return nu / (1 - nu)


def assert_equal_up_to_summation_order(mine: torch.Tensor, theirs: torch.Tensor, magnitude: torch.Tensor,
                                       terms: int) -> None:
    """``mine`` and ``theirs`` compute the same sums of ``terms`` products each, in possibly different orders:
    each element differs by at most ``2 gamma_terms`` times ``magnitude`` (the sum of the products' absolute
    values, computed in float64), the most rounding can move either side. A wrong term, a sign, a missed row or a
    transposed operand moves an element by about its magnitude, far beyond that."""
    assert mine.shape == theirs.shape == magnitude.shape and mine.dtype == theirs.dtype
    bound = 2 * gamma(terms, mine.dtype) * magnitude.double()
    error = (mine.double() - theirs.double()).abs()
    worst = int((error - bound).argmax())
    assert bool((error <= bound).all()), (
        f"element {worst}: {mine.flatten()[worst].item()!r} vs {theirs.flatten()[worst].item()!r} differ by "
        f"{error.flatten()[worst].item():.3g}, more than summation order allows ({bound.flatten()[worst].item():.3g})")
