"""FLHA-GHN's architecture family and the architecture graphs derived from it with torch.fx."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from graphfed import cli
from graphfed.models.arch_graph import FEATURES, KINDS, architecture_graph
from graphfed.models.resnet_like import ARCHITECTURES, ResNetLike

# conv layers (3x3 ones + 1x1 projections of downsampling skips), add nodes, layers as the paper counts them
EXPECTED = {"arch0": (17 + 3, 8, 18), "arch1": (9, 0, 10), "arch2": (11 + 1, 2, 12), "arch3": (11 + 3, 4, 12),
            "small": (3, 0, 4), "plain4": (3, 0, 4), "plain7": (6, 0, 7), "plain10": (9, 0, 10),
            "plain13": (12, 0, 13)}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_architecture_graph_has_its_layers_skips_and_data_flow(arch: str) -> None:
    model = ResNetLike((3, 32, 32), 10, arch)
    graph = architecture_graph(model)
    kinds = Counter(graph.kinds)
    convs, adds, layers = EXPECTED[arch]
    assert kinds["conv"] == convs and kinds["bn"] == convs and kinds["add"] == adds
    assert kinds["input"] == 1 and kinds["pool"] == 1 and kinds["linear"] == 1
    projections = sum(1 for name in graph.names if ".shortcut." in name and name.endswith(".0"))
    assert kinds["conv"] - projections + kinds["linear"] == layers
    degree = graph.in_degree()
    assert degree[graph.kinds.index("input")] == 0
    assert all(degree[i] == 2 for i, kind in enumerate(graph.kinds) if kind == "add")  # a skip joins the main path
    assert all(degree[i] == 1 for i, kind in enumerate(graph.kinds) if kind not in ("add", "input"))
    assert (graph.edges[0] < graph.edges[1]).all()  # nodes come in data-flow order
    assert graph.kinds[-1] == "linear" and graph.names[-1] == "fc"
    if adds == 0:
        assert graph.edges.shape[1] == graph.num_nodes - 1  # no skips: a chain
    # every parametric node is a real layer of the model, in the order the model runs them
    layer_names = [name for name, _ in model.named_modules()]
    assert all(name in layer_names for name, kind in zip(graph.names, graph.kinds, strict=True)
               if kind in ("conv", "bn", "linear"))


def test_node_features_are_one_hot_type_kernel_stride_and_width() -> None:
    graph = architecture_graph(ResNetLike((3, 32, 32), 10, "arch0", width=8))
    features = graph.features()
    assert features.shape == (graph.num_nodes, FEATURES)
    assert (features[:, :len(KINDS)].sum(1) == 1).all()
    first_conv = graph.kinds.index("conv")
    downsample = next(i for i, (kind, stride) in enumerate(zip(graph.kinds, graph.strides, strict=True))
                      if kind == "conv" and stride == 2)
    assert not torch.equal(features[first_conv], features[downsample])  # stride and width differ
    assert features[first_conv].sum() == 4  # kind, kernel 3, stride 1, width 8
    assert features[graph.kinds.index("add")].sum() == 1  # a join: its type only


def test_a_parametric_layer_without_a_node_type_is_named() -> None:
    class WithEmbedding(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Embedding(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.table(x)

    with pytest.raises(ValueError, match=r"table \(Embedding\)"):
        architecture_graph(WithEmbedding())


def test_the_family_trains_many_clients_at_once_like_their_own_modules() -> None:
    torch.manual_seed(0)
    model = ResNetLike((3, 32, 32), 10, "arch3", width=4)
    params = {name: p.detach() + 0.02 * torch.randn(3, *p.shape) for name, p in model.named_parameters()}
    x = torch.rand(3, 5, 3, 32, 32)
    batched = model.batched_forward(params, x)
    for s in range(3):
        module = copy.deepcopy(model)
        with torch.no_grad():
            for name, value in params.items():
                module.get_parameter(name).copy_(value[s])
        torch.testing.assert_close(batched[s], module(x[s]), atol=1e-5, rtol=1e-5)


def test_arch_graph_command_prints_and_draws(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli.app, ["arch-graph", "resnet-like", "--option", "arch=arch3", "--draw",
                                     str(tmp_path / "arch3.png")])
    assert result.exit_code == 0, result.output
    assert "body.3.shortcut.0" in result.stdout and "add" in result.stdout
    assert (tmp_path / "arch3.png").stat().st_size > 1000
    bad = runner.invoke(cli.app, ["arch-graph", "resnet-like", "--option", "arch=arch9"])
    assert bad.exit_code == 2 and "arch9" in bad.output
    missing = runner.invoke(cli.app, ["arch-graph", "resnet-like", "--option", "arch"])
    assert missing.exit_code == 2 and "--option 'arch': expected KEY=VALUE" in missing.output
