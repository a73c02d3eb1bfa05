"""ParamSpec: named tensors <-> one flat row, batched, with per-layer groups."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphfed.core.params import ParamSpec
from graphfed.models.base import TargetModel
from graphfed.models.cnn import SmallCNN
from graphfed.models.mlp import MLP


def make_mlp() -> MLP:
    torch.manual_seed(0)
    return MLP(5, 3, hidden=7, num_layers=3)


def make_cnn() -> SmallCNN:
    torch.manual_seed(0)
    return SmallCNN((1, 8, 8), 4, channels=3, hidden=6)


MODELS = {"mlp": make_mlp, "cnn": make_cnn}


@pytest.fixture(params=sorted(MODELS))
def model(request: pytest.FixtureRequest) -> TargetModel:
    return MODELS[request.param]()


def test_spec_covers_every_parameter_in_module_order(model: TargetModel) -> None:
    """Names follow named_parameters(); offsets are contiguous; dim is the total parameter count."""
    spec = ParamSpec.from_module(model)
    assert spec.names == [name for name, _ in model.named_parameters()]
    assert spec.dim == sum(p.numel() for p in model.parameters())
    offset = 0
    for tensor in spec.tensors:
        assert tensor.offset == offset
        offset += tensor.numel
    assert offset == spec.dim


def test_flatten_module_then_unflatten_gives_back_every_tensor(model: TargetModel) -> None:
    """unflatten(flatten_module(m)) equals m's parameters, tensor by tensor, with the right shapes."""
    spec = ParamSpec.from_module(model)
    flat = spec.flatten_module(model)
    assert flat.shape == (spec.dim,)
    assert not flat.requires_grad
    tensors = spec.unflatten(flat)
    for name, param in model.named_parameters():
        assert tensors[name].shape == param.shape
        assert torch.equal(tensors[name], param.detach())


def test_flatten_is_the_inverse_of_unflatten(model: TargetModel) -> None:
    """flatten(unflatten(v)) == v for a single row and for arbitrary batch dimensions."""
    spec = ParamSpec.from_module(model)
    g = torch.Generator().manual_seed(1)
    for batch in [(), (4,), (2, 3)]:
        flat = torch.randn(*batch, spec.dim, generator=g)
        tensors = spec.unflatten(flat)
        for t in spec.tensors:
            assert tensors[t.name].shape == (*batch, *t.shape)
        assert torch.equal(spec.flatten(tensors, batch_dims=len(batch)), flat)


def test_batched_unflatten_rows_are_independent_models(model: TargetModel) -> None:
    """Row s of a [S, dim] batch unflattens to exactly what row s alone unflattens to."""
    spec = ParamSpec.from_module(model)
    flat = torch.randn(3, spec.dim, generator=torch.Generator().manual_seed(2))
    batched = spec.unflatten(flat)
    for s in range(3):
        single = spec.unflatten(flat[s])
        for name in spec.names:
            assert torch.equal(batched[name][s], single[name])


def test_unflatten_is_differentiable(model: TargetModel) -> None:
    """Gradients flow from the unflattened tensors back into the flat vector, slice by slice."""
    spec = ParamSpec.from_module(model)
    flat = torch.zeros(spec.dim, requires_grad=True)
    tensors = spec.unflatten(flat)
    weights = {name: float(i + 1) for i, name in enumerate(spec.names)}
    sum(weights[name] * tensors[name].sum() for name in spec.names).backward()
    for t in spec.tensors:
        assert torch.all(flat.grad[t.slice] == weights[t.name])


def test_batched_forward_with_unflattened_rows_matches_the_module(model: TargetModel) -> None:
    """The flat layout is the one the model's batched forward expects: row s gives module s's outputs."""
    spec = ParamSpec.from_module(model)
    g = torch.Generator().manual_seed(3)
    rows = spec.flatten_module(model) + 0.1 * torch.randn(2, spec.dim, generator=g)
    shape = (1, 8, 8) if isinstance(model, SmallCNN) else (5,)
    x = torch.randn(2, 4, *shape, generator=g)
    out = model.batched_forward(spec.unflatten(rows), x)
    for s in range(2):
        clone = MODELS["cnn" if isinstance(model, SmallCNN) else "mlp"]()
        for name, value in spec.unflatten(rows[s]).items():
            clone.get_parameter(name).data.copy_(value)
        torch.testing.assert_close(out[s], clone(x[s]), atol=1e-5, rtol=1e-5)


def test_mlp_layers_group_weight_and_bias() -> None:
    """Each nn.Linear is one layer holding its weight then bias; layer_index labels every coordinate."""
    model = make_mlp()
    spec = ParamSpec.from_module(model)
    assert list(spec.layers) == ["layers.0", "layers.1", "layers.2"]
    for layer, specs in spec.layers.items():
        assert [t.name for t in specs] == [f"{layer}.weight", f"{layer}.bias"]
    index = spec.layer_index()
    assert index.shape == (spec.dim,) and index.dtype == torch.long
    sizes = [7 * 5 + 7, 7 * 7 + 7, 3 * 7 + 3]
    assert torch.equal(index, torch.repeat_interleave(torch.arange(3), torch.tensor(sizes)))


def test_cnn_layers_are_conv1_conv2_fc1_fc2() -> None:
    """SmallCNN groups into its four parametric modules, in order, each a contiguous block of coordinates."""
    model = make_cnn()
    spec = ParamSpec.from_module(model)
    assert list(spec.layers) == ["conv1", "conv2", "fc1", "fc2"]
    index = spec.layer_index()
    for layer_id, (layer, slices) in enumerate(spec.layer_slices()):
        module_size = sum(p.numel() for p in model.get_submodule(layer).parameters())
        assert sum(s.stop - s.start for s in slices) == module_size
        assert all(slices[i].stop == slices[i + 1].start for i in range(len(slices) - 1))
        block = torch.nonzero(index == layer_id).flatten()
        assert int(block.min()) == slices[0].start and int(block.max()) == slices[-1].stop - 1
        assert len(block) == module_size


def test_top_level_parameter_is_its_own_layer() -> None:
    """A parameter registered directly on the root module (no dot in its name) forms a layer by itself."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(2))
            self.fc = nn.Linear(2, 2)

    spec = ParamSpec.from_module(Scaled())
    assert list(spec.layers) == ["scale", "fc"]
    assert spec.layer_index().tolist() == [0, 0] + [1] * 6


@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_size_raises_naming_the_expected_size(model: TargetModel, delta: int) -> None:
    """A flat vector of the wrong length is rejected with a message that states the size expected."""
    spec = ParamSpec.from_module(model)
    with pytest.raises(ValueError, match=rf"size {spec.dim}\b.*got {spec.dim + delta}"):
        spec.unflatten(torch.zeros(2, spec.dim + delta))
