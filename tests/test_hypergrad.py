"""The hypergradient helper on a toy quadratic where the right sign provably lowers the client loss.

Setup: a linear hypernetwork ``theta = W phi`` produces the client weights; the client loss is
``L(theta) = 0.5 ||theta - theta*||^2``; the client runs K SGD steps of size eta from ``theta_sent`` and
returns ``delta = theta_sent - theta_trained = (1 - (1 - eta)^K) (theta_sent - theta*)``, a positive
multiple of ``grad L(theta_sent)``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphfed.core.hypergrad import hypergradient_step

DIM_THETA, DIM_PHI = 6, 3
ETA, K = 0.1, 5


def client_loss(theta: torch.Tensor, target: torch.Tensor) -> float:
    return float(0.5 * (theta - target).pow(2).sum())


def client_delta(sent: torch.Tensor, target: torch.Tensor, steps: int = K, lr: float = ETA) -> torch.Tensor:
    """``sent - trained`` after ``steps`` plain SGD steps on ``0.5 ||theta - target||^2``."""
    theta = sent.detach().clone()
    for _ in range(steps):
        theta = theta - lr * (theta - target)
    return sent.detach() - theta


def make_problem(seed: int = 0) -> tuple[torch.Tensor, nn.Parameter, torch.Tensor]:
    """(W fixed [6, 3], phi parameter [3], theta* [6]) with theta* far from the hypernetwork's output."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(DIM_THETA, DIM_PHI, generator=g)
    phi = nn.Parameter(torch.randn(DIM_PHI, generator=g))
    target = 3.0 * torch.randn(DIM_THETA, generator=g)
    return weight, phi, target


def test_delta_is_a_positive_multiple_of_the_gradient() -> None:
    """Sanity of the toy: delta = (1 - (1 - eta)^K) * grad L(sent), the premise of the sign convention."""
    _, _, target = make_problem()
    sent = torch.randn(DIM_THETA)
    expected = (1 - (1 - ETA) ** K) * (sent - target)
    torch.testing.assert_close(client_delta(sent, target), expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_descent_sign_lowers_and_released_sign_raises_the_client_loss(seed: int) -> None:
    """One server step with sign="descent" strictly lowers L(W phi); sign="released" strictly raises it."""
    weight, phi, target = make_problem(seed)
    start = phi.detach().clone()
    loss_before = client_loss(weight @ start, target)
    losses = {}
    for sign in ("descent", "released"):
        with torch.no_grad():
            phi.copy_(start)
        optimizer = torch.optim.SGD([phi], lr=1e-2)
        sent = weight @ phi
        hypergradient_step(optimizer, sent, client_delta(sent, target), sign=sign)
        losses[sign] = client_loss(weight @ phi.detach(), target)
    assert losses["descent"] < loss_before
    assert losses["released"] > loss_before


def test_repeated_descent_steps_converge_towards_the_best_reachable_weights() -> None:
    """Iterating the helper is gradient descent on L(W phi): the loss falls to its least-squares minimum."""
    weight, phi, target = make_problem()
    optimizer = torch.optim.SGD([phi], lr=0.05)
    for _ in range(300):
        sent = weight @ phi
        hypergradient_step(optimizer, sent, client_delta(sent, target))
    best_phi = torch.linalg.lstsq(weight, target.unsqueeze(1)).solution.squeeze(1)
    assert client_loss(weight @ phi.detach(), target) == pytest.approx(client_loss(weight @ best_phi, target),
                                                                        rel=1e-3)


def test_gradient_on_phi_is_the_vector_jacobian_product_by_hand() -> None:
    """The gradient left on phi is J^T delta with J = d theta / d phi = W, and the step is phi - lr * W^T delta."""
    weight, phi, target = make_problem()
    start = phi.detach().clone()
    optimizer = torch.optim.SGD([phi], lr=0.3)
    sent = weight @ phi
    delta = client_delta(sent, target)
    hypergradient_step(optimizer, sent, delta)
    expected_grad = weight.T @ delta
    torch.testing.assert_close(phi.grad, expected_grad)
    torch.testing.assert_close(phi.detach(), start - 0.3 * expected_grad)


def test_released_sign_places_the_negated_gradient() -> None:
    """sign="released" is exactly the opposite direction: grad = -W^T delta."""
    weight, phi, target = make_problem()
    optimizer = torch.optim.SGD([phi], lr=0.0)
    sent = weight @ phi
    delta = client_delta(sent, target)
    hypergradient_step(optimizer, sent, delta, sign="released")
    torch.testing.assert_close(phi.grad, -(weight.T @ delta))


def test_batched_clients_and_a_learnable_hypernetwork_matrix() -> None:
    """With S clients (rows) and W itself learnable, grad W = sum_s delta_s phi_s^T and grad phi_s = W^T delta_s."""
    g = torch.Generator().manual_seed(3)
    weight = nn.Parameter(torch.randn(DIM_THETA, DIM_PHI, generator=g))
    phis = nn.Parameter(torch.randn(4, DIM_PHI, generator=g))  # one embedding per client
    targets = torch.randn(4, DIM_THETA, generator=g)
    optimizer = torch.optim.SGD([weight, phis], lr=0.0)
    sent = phis @ weight.T  # [S, dim_theta]
    delta = torch.stack([client_delta(sent[s], targets[s]) for s in range(4)])
    hypergradient_step(optimizer, sent, delta)
    torch.testing.assert_close(weight.grad, delta.T @ phis.detach())
    torch.testing.assert_close(phis.grad, delta @ weight.detach())


def test_extra_loss_gradient_is_added() -> None:
    """``extra_loss`` contributes its ordinary gradient: grad = W^T delta + d(extra)/d phi."""
    weight, phi, target = make_problem()
    optimizer = torch.optim.SGD([phi], lr=0.0)
    sent = weight @ phi
    delta = client_delta(sent, target)
    extra = 0.7 * phi.pow(2).sum()  # gradient 1.4 * phi
    hypergradient_step(optimizer, sent, delta, extra_loss=extra)
    torch.testing.assert_close(phi.grad, weight.T @ delta + 1.4 * phi.detach())


def test_stale_gradients_are_cleared_before_the_step() -> None:
    """A gradient left on the parameters from earlier work does not leak into the hypergradient."""
    weight, phi, target = make_problem()
    phi.grad = torch.full_like(phi, 100.0)
    optimizer = torch.optim.SGD([phi], lr=0.0)
    sent = weight @ phi
    delta = client_delta(sent, target)
    hypergradient_step(optimizer, sent, delta)
    torch.testing.assert_close(phi.grad, weight.T @ delta)


def test_delta_is_treated_as_a_constant() -> None:
    """A delta that still carries autograd history adds no second-order term."""
    weight, phi, target = make_problem()
    optimizer = torch.optim.SGD([phi], lr=0.0)
    sent = weight @ phi
    delta_with_graph = sent - target  # depends on phi
    hypergradient_step(optimizer, sent, delta_with_graph)
    torch.testing.assert_close(phi.grad, weight.T @ (sent.detach() - target))


@pytest.mark.parametrize("bad_shape", [(DIM_THETA + 1,), (1, DIM_THETA), (2, DIM_THETA)])
def test_shape_mismatch_raises_and_leaves_parameters_untouched(bad_shape: tuple[int, ...]) -> None:
    """A delta whose shape differs from ``sent`` raises ValueError naming both shapes; phi is not moved."""
    weight, phi, _ = make_problem()
    start = phi.detach().clone()
    optimizer = torch.optim.SGD([phi], lr=1.0)
    with pytest.raises(ValueError, match=r"delta shape .* does not match sent shape \(6,\)"):
        hypergradient_step(optimizer, weight @ phi, torch.ones(bad_shape))
    torch.testing.assert_close(phi.detach(), start)
