"""The client step's fast paths give the numbers the plain expressions give: the batched linear layer's hand-written
backward against autograd's rule for ``baddbmm`` (up to summation order where the two are different BLAS calls:
``tests/rounding.py``), and bit for bit where both sides run the same kernels on the same data: the SGD update
written into the gradient's memory against ``value - lr * grad`` (the same two IEEE roundings), a BatchNorm
network's one-client path against its module, and a client trained as a module against the functional path.
``make test`` runs them again under MKL's AVX2 path, the one AMD CPUs take (``kernel_paths``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.func import functional_call, vmap

from graphfed.client import training
from graphfed.client.contract import IN_PLACE_MIN_VALUES, ClientRule, LocalStep, LocalTraining, plain_sgd, sgd_update
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.models import build_model
from graphfed.models.base import CONTIGUOUS_GRADIENT_MIN_WEIGHTS, _BatchedLinear, batched_linear
from rounding import assert_equal_up_to_summation_order

pytestmark = pytest.mark.kernel_paths  # every test here compares two computations of one value


def _linear_inputs(seed: int, clients: int = 3, rows: int = 10, features: int = 40, outputs: int = 7):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(clients, rows, features, generator=generator),
            torch.randn(clients, outputs, features, generator=generator),
            torch.randn(clients, outputs, generator=generator),
            torch.randn(clients, rows, outputs, generator=generator))


@pytest.mark.parametrize("seed", range(3))
def test_batched_linear_gradients_are_autograds_in_the_weights_layout(seed: int) -> None:
    """The forward, the input's and the bias's gradients are baddbmm's own bits (the same kernel calls on the same
    operands); the weight's gradient ``grad^T @ h`` is autograd's ``(h^T @ grad)^T``, the same sums over the batch
    rows in the order the BLAS picks for each layout: equal up to summation order (MKL's AVX-512 path gives the same
    bits, its AVX2 path, which AMD CPUs run, does not). It comes out contiguous, what the SGD step then reads without
    a transposed walk."""
    h, weight, bias, upstream = _linear_inputs(seed)
    leaves = [t.clone().requires_grad_() for t in (h, weight, bias)]
    ours = _BatchedLinear.apply(*leaves)
    grad_h, grad_weight, grad_bias = torch.autograd.grad(ours, leaves, upstream)
    plain = [t.clone().requires_grad_() for t in (h, weight, bias)]
    reference = torch.baddbmm(plain[2].unsqueeze(1), plain[0], plain[1].transpose(1, 2))
    reference_h, reference_weight, reference_bias = torch.autograd.grad(reference, plain, upstream)
    assert torch.equal(ours, reference)
    assert torch.equal(grad_h, reference_h) and torch.equal(grad_bias, reference_bias)
    magnitude = torch.bmm(upstream.double().abs().transpose(1, 2), h.double().abs())  # sum_b |grad_bo h_bf|
    assert_equal_up_to_summation_order(grad_weight, reference_weight, magnitude, terms=h.shape[1])
    assert grad_weight.is_contiguous() and not reference_weight.is_contiguous()


def test_batched_linear_supports_second_derivatives_and_vmap() -> None:
    """Rules that differentiate through a step (create_graph) get baddbmm's second derivatives up to summation
    order, and a transform that vmaps a client gets the batched call's bits (vmap's rule calls the same kernel).

    The Hessian-vector product of ``sum g^2`` (``g`` the weight's gradient of a squared error) chains four sums:
    the residual over the ``F`` features, ``g`` over the ``B`` rows, ``h^T h`` over the rows and the product over
    the features; each side's rounding is bounded by the chain's total terms times its magnitude."""
    h, weight, bias, upstream = _linear_inputs(5)
    w1, w2 = weight.clone().requires_grad_(), weight.clone().requires_grad_()
    (g1,) = torch.autograd.grad((_BatchedLinear.apply(h, w1, bias) - upstream).square().sum(), w1, create_graph=True)
    (g2,) = torch.autograd.grad((torch.baddbmm(bias.unsqueeze(1), h, w2.transpose(1, 2)) - upstream).square().sum(),
                                w2, create_graph=True)
    (hessian_ours,) = torch.autograd.grad(g1.square().sum(), w1)
    (hessian_plain,) = torch.autograd.grad(g2.square().sum(), w2)
    rows, features = h.shape[1], h.shape[2]
    absolute = [t.double().abs() for t in (h, weight, bias, upstream)]
    residual = torch.baddbmm(absolute[2].unsqueeze(1) + absolute[3], absolute[0], absolute[1].transpose(1, 2))
    gradient = 2 * torch.bmm(residual.transpose(1, 2), absolute[0])  # |g| bound, [S, O, F]
    magnitude = 4 * torch.bmm(gradient, torch.bmm(absolute[0].transpose(1, 2), absolute[0]))  # H = 4 g (h^T h)
    assert_equal_up_to_summation_order(hessian_ours, hessian_plain, magnitude, terms=2 * (rows + features) + 2)
    mapped = vmap(lambda x, w, b: _BatchedLinear.apply(x.unsqueeze(0), w.unsqueeze(0), b.unsqueeze(0))[0])(h, weight,
                                                                                                          bias)
    assert torch.equal(mapped, _BatchedLinear.apply(h, weight, bias))


def test_a_large_layer_gets_the_contiguous_gradient_and_a_small_one_autograds_rule() -> None:
    """The custom backward only where it pays (a large weight): a small layer keeps baddbmm's rule, whose call costs
    less; both give the same numbers."""
    small = [t.requires_grad_() for t in _linear_inputs(1)[:3]]
    large = [t.requires_grad_() for t in _linear_inputs(2, clients=2, features=CONTIGUOUS_GRADIENT_MIN_WEIGHTS // 8,
                                                         outputs=4)[:3]]
    assert batched_linear(*small).grad_fn.name() == "BaddbmmBackward0"
    out = batched_linear(*large)
    assert "BatchedLinear" in out.grad_fn.name()
    assert torch.equal(out, torch.baddbmm(large[2].unsqueeze(1), large[0], large[1].transpose(1, 2)))


def test_the_in_place_sgd_update_gives_the_expressions_bits_and_never_writes_a_shared_gradient() -> None:
    generator = torch.Generator().manual_seed(0)
    value, grad = torch.randn(64, 33, generator=generator), torch.randn(64, 33, generator=generator)
    expected = value - 0.05 * grad
    owned = grad.clone()
    updated = sgd_update(value, owned, 0.05, owned=True)
    assert torch.equal(updated, expected) and updated.data_ptr() == owned.data_ptr()  # no new weight-sized tensor
    shared = grad.clone()
    assert torch.equal(sgd_update(value, shared, 0.05, owned=False), expected) and torch.equal(shared, grad)
    transposed = grad.t().contiguous().t()  # a batched linear layer's layout under autograd's own rule
    assert torch.equal(sgd_update(value, transposed, 0.05, owned=True), expected)
    assert torch.equal(transposed, grad)  # the strided gradient was copied, not written into


def test_descend_does_not_write_into_a_gradient_two_leaves_share() -> None:
    """``a + b`` hands both leaves the same gradient tensor: updating one in place would move the other."""
    size = IN_PLACE_MIN_VALUES  # large enough for the in-place update
    a, b = torch.ones(size, requires_grad=True), torch.full((size,), 2.0, requires_grad=True)
    local = LocalStep(SimpleNamespace(), "regression", 0, [], None, 0.5, None, None, {})  # type: ignore[arg-type]
    stepped = local.descend({"a": a, "b": b}, (3 * (a + b)).sum().reshape(1))
    assert torch.equal(stepped["a"], torch.full((size,), 1 - 1.5))
    assert torch.equal(stepped["b"], torch.full((size,), 0.5))


def test_a_batchnorm_networks_one_client_path_is_its_module_bit_for_bit() -> None:
    """CNN-BN's chunk of one client runs its layers' functions on the client's weights: forward and gradients equal
    the module's (functional_call) on the images in the layout the engine hands them over in, so the faster path
    changes no number."""
    torch.manual_seed(0)
    shape = SimpleNamespace(name="x", task="classification", input_shape=(3, 32, 32), output_dim=10)
    model = build_model("cnn-bn", shape, {})  # type: ignore[arg-type]
    x = torch.randn(1, 8, 3, 32, 32)
    params = {name: value.detach().unsqueeze(0).requires_grad_() for name, value in model.named_parameters()}
    fast = model.batched_forward(params, x)
    fast_grads = torch.autograd.grad(fast.square().sum(), list(params.values()))
    module_params = {name: value.detach().clone().requires_grad_() for name, value in model.named_parameters()}
    slow = functional_call(model, module_params, (x[0].contiguous(memory_format=model.images_layout_on(x.device)),))
    slow_grads = torch.autograd.grad(slow.square().sum(), list(module_params.values()))
    assert torch.equal(fast[0], slow)
    for mine, theirs in zip(fast_grads, slow_grads, strict=True):
        assert torch.equal(mine[0], theirs)


@pytest.mark.parametrize("model_name", ["cnn-bn", "resnet-like"])
def test_a_client_trained_as_a_module_gets_the_functional_paths_weights_and_losses(
        model_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One client of a network that trains clients one by one takes the module path (parameters as leaves,
    ``backward``, the update in place): its trained weights and losses equal the functional path's bit for bit, a
    client without rows keeps its weights, and a rule that is more than plain SGD keeps the functional path."""
    torch.manual_seed(0)
    shape = SimpleNamespace(name="x", task="classification", input_shape=(3, 16, 16), output_dim=4)
    model = build_model(model_name, shape, {"width": 4} if model_name == "resnet-like" else {})  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    generator = torch.Generator().manual_seed(1)
    xs = [torch.randn(rows, 3, 16, 16, generator=generator) for rows in (23, 0)]
    ys = [torch.randint(0, 4, (len(x),), generator=generator) for x in xs]
    data = ClientSplit.from_lists(xs, ys, "classification")
    start = spec.flatten_module(model).unsqueeze(0).repeat(2, 1)
    model.clients_per_chunk = 1
    rule = plain_sgd(spec, "classification", LocalTraining(steps=4, batch_size=8, lr=0.1))
    assert training.trains_as_a_module(model, rule, data.select(torch.tensor([0])), None, None)
    assert not training.trains_as_a_module(model, ClientRule(rule.setting, prox_mu=0.1), data.select(torch.tensor([0])),
                                           None, None)
    assert not training.trains_as_a_module(model, rule, data.select(torch.tensor([1])), None, None)  # no rows
    as_module = training.train_clients(model, spec, start, data, rule, [5, 6])
    monkeypatch.setattr(training, "trains_as_a_module", lambda *args: False)
    functional = training.train_clients(model, spec, start, data, rule, [5, 6])
    assert torch.equal(as_module.trained, functional.trained)
    assert not torch.equal(as_module.trained[0], start[0])  # it trained
    assert torch.equal(as_module.trained[1], start[1])  # no rows: kept
    for key in ("loss_first", "loss_last", "num_examples"):
        assert torch.equal(as_module.metrics[key], functional.metrics[key]), key
    assert not torch.equal(as_module.metrics["loss_first"], as_module.metrics["loss_last"])



def test_cnn_bn_images_reach_the_convolutions_channels_last_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU, CNN-BN's clients train and are scored with their images channels-last (oneDNN's faster layout),
    on the engine's module step, the functional path and the scoring loop alike; the module called as a user
    calls it keeps the layout it is given."""
    shape = SimpleNamespace(name="x", task="classification", input_shape=(3, 12, 12), output_dim=4)
    model = build_model("cnn-bn", shape, {"channels": 4, "hidden": 8, "kernel_size": 3})  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    generator = torch.Generator().manual_seed(0)
    xs = [torch.randn(rows, 3, 12, 12, generator=generator) for rows in (9, 6)]
    data = ClientSplit.from_lists(xs, [torch.randint(0, 4, (len(x),), generator=generator) for x in xs],
                                  "classification")
    start = spec.flatten_module(model).unsqueeze(0).repeat(2, 1)
    layouts: list[tuple[str, bool]] = []
    conv2d = torch.nn.functional.conv2d

    def recording(images: torch.Tensor, weight: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        if images.shape[1] == 3:  # the first convolution: the images as the engine handed them over
            layouts.append((path, images.is_contiguous(memory_format=torch.channels_last)))
        return conv2d(images, weight, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "conv2d", recording)
    model.clients_per_chunk = 1
    rule = plain_sgd(spec, "classification", LocalTraining(steps=2, batch_size=4, lr=0.1))
    path = "module step"
    training.train_clients(model, spec, start, data, rule, [1, 2])
    path = "functional"
    training.train_clients(model, spec, start, data, ClientRule(rule.setting, prox_mu=0.1), [1, 2])
    path = "scoring"
    with torch.no_grad():
        model.batched_forward(spec.unflatten(start), data.padded().x)
    path = "as a user calls it"
    model(xs[0])
    assert {name for name, _ in layouts} == {"module step", "functional", "scoring", "as a user calls it"}
    assert all(channels_last for name, channels_last in layouts if name != "as a user calls it"), layouts
    assert not any(channels_last for name, channels_last in layouts if name == "as a user calls it")
