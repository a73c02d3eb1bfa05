"""FLHA-GHN's graph hypernetwork: architecture graph -> weights of that architecture (paper Sec. 4.2, Figure 2).

1. A GNN G of T ``GraphConv`` layers (Morris et al. 2019, the paper's Eq. 2: ``h_v <- sigma(A h_v + B sum_{u->v}
   h_u + b)``), latent size 51, runs over the architecture graph (``models.arch_graph``) from its one-hot node
   features. Messages follow the data flow (edge u -> v when u's output is v's input), as the paper's synchronous
   variant. The last layer has no activation: a node whose representation were all zeros would get all-zero
   weights.
2. One 2-layer MLP head H_l per layer type l (hidden 16, LeakyReLU) maps each parametric node's h_v to its layer's
   weights W and a scale s; the layer gets theta_v = s * W (Littwin & Wolf 2019).

Layer types: a parametric layer's type is its kind, stride and parameter shapes (what fixes the size of its
weights); the vocabulary is the model family's, fixed before training, so the server never needs to see a
client's architecture.

Initialisation (paper Sec. 4.2: generated networks must start with Kaiming statistics). The head's hidden
features u are scaled to unit length, so ``||u|| = 1`` for every node whatever the GNN outputs; the output rows
of a conv/linear weight are drawn N(0, 2 / fan_in), which gives every generated weight variance 2 / fan_in (He et
al. 2015) at the start. Unit length also keeps an SGD step on a head's output rows the size of the same step on
the layer's weights (lr x gradient), so clients train the GHN with the learning rate their network would take.
The scale s starts at 1 (its output row is zero), biases and BatchNorm shifts at 0 and BatchNorm gains at 1 (zero
rows, constant output bias). ``tests/test_flha_ghn.py`` checks the statistics on every architecture of the family.

``heads="linear"``: each head is one bias-free linear map of the unit-normalised node features, no scale. With
``gnn_layers=0`` (the GNN as identity) this is the paper's remark that FedAvg is a special case of FLHA-GHN: when
every layer has its own type, averaging the heads averages the networks, and an SGD step on a head is the SGD step
on its layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from graphfed.models.arch_graph import FEATURES, architecture_graph
from graphfed.models.base import TargetModel

PARAMETRIC = ("conv", "linear", "bn")


@dataclass(frozen=True)
class LayerType:
    """What fixes a parametric layer's weights: kind, stride and ``(name, shape)`` of each parameter."""

    kind: str
    stride: int | None
    params: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def numel(self) -> int:
        return sum(math.prod(shape) for _, shape in self.params)

    def describe(self) -> str:
        shapes = ", ".join(f"{name} {'x'.join(map(str, shape))}" for name, shape in self.params)
        return f"{self.kind}{'' if self.stride is None else f' stride {self.stride}'} ({shapes})"


@dataclass
class ArchitecturePlan:
    """An architecture as the GHN reads it: its graph and, per layer type, which nodes and parameters."""

    features: torch.Tensor  # [V, FEATURES]
    edges: torch.Tensor  # [2, E]
    #: per layer-type index present: (node rows, the parameter names of each of those nodes' layers)
    nodes_by_type: dict[int, tuple[torch.Tensor, list[list[str]]]]
    param_names: list[str]  # every parameter of the architecture, in its named_parameters order


def layer_types(model: nn.Module) -> dict[str, LayerType]:
    """Layer type of each parametric layer of ``model`` (by module path), in graph order."""
    graph = architecture_graph(model)
    modules = dict(model.named_modules())
    types = {}
    for name, kind, stride in zip(graph.names, graph.kinds, graph.strides, strict=True):
        if kind in PARAMETRIC:
            params = tuple((param, tuple(value.shape)) for param, value in modules[name].named_parameters())
            types[name] = LayerType(kind, stride, params)
    return types


def vocabulary(models: list[nn.Module]) -> list[LayerType]:
    """The sorted set of layer types of ``models`` (the family's predefined types)."""
    found = {t for model in models for t in layer_types(model).values()}
    return sorted(found, key=lambda t: (t.kind, t.stride or 0, t.params))


def plan_architecture(model: nn.Module, types: list[LayerType]) -> ArchitecturePlan:
    """The GHN's view of ``model``; refuses a layer whose type is not in ``types``."""
    graph = architecture_graph(model)
    of_layer = layer_types(model)
    index = {t: i for i, t in enumerate(types)}
    grouped: dict[int, tuple[list[int], list[list[str]]]] = {}
    for row, name in enumerate(graph.names):
        if name not in of_layer:
            continue
        layer_type = of_layer[name]
        if layer_type not in index:
            raise ValueError(f"layer {name} is a {layer_type.describe()}, a layer type this graph hypernetwork has no "
                             f"head for ({len(types)} types known)")
        rows, names = grouped.setdefault(index[layer_type], ([], []))
        rows.append(row)
        names.append([f"{name}.{param}" for param, _ in layer_type.params])
    covered = {param for _, names in grouped.values() for layer in names for param in layer}
    param_names = [name for name, _ in model.named_parameters()]
    missing = [name for name in param_names if name not in covered]
    if missing:
        raise ValueError(f"parameters outside any graph node: {missing[:5]}")
    return ArchitecturePlan(graph.features(), graph.edges,
                            {t: (torch.tensor(rows), names) for t, (rows, names) in sorted(grouped.items())},
                            param_names)


class TypeHead(nn.Module):
    """H_l: node representation -> flat weights of one layer type (see the module docstring)."""

    def __init__(self, in_dim: int, layer_type: LayerType, hidden: int, mode: Literal["mlp", "linear"]) -> None:
        super().__init__()
        self.layer_type, self.mode = layer_type, mode
        numel = layer_type.numel
        if mode == "linear":
            self.out = nn.Linear(in_dim, numel, bias=False)
        else:
            self.hidden = nn.Linear(in_dim, hidden)
            self.out = nn.Linear(hidden, numel + 1)  # + the scale s
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Output rows such that the generated weights start with Kaiming variance (module docstring)."""
        if self.mode == "mlp":
            nn.init.xavier_normal_(self.hidden.weight)
            nn.init.zeros_(self.hidden.bias)
            nn.init.zeros_(self.out.bias)
        nn.init.zeros_(self.out.weight)
        offset = 0
        for name, shape in self.layer_type.params:
            rows = slice(offset, offset + math.prod(shape))
            if name == "weight" and len(shape) >= 2:  # conv / linear weight: He et al., fan-in mode
                fan_in = math.prod(shape[1:])
                self.out.weight[rows].normal_(0.0, math.sqrt(2.0 / fan_in))
            elif name == "weight" and self.mode == "mlp":  # BatchNorm gain
                self.out.bias[rows] = 1.0
            offset += math.prod(shape)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``h [n, in_dim]`` -> ``[n, numel]`` layer weights theta = s * W."""
        if self.mode == "linear":
            return self.out(F.normalize(h, dim=-1))
        u = F.normalize(F.leaky_relu(self.hidden(h)), dim=-1)
        out = self.out(u)
        return (1.0 + out[:, -1:]) * out[:, :-1]


class GraphHypernetwork(nn.Module):
    """GNN over the architecture graph + one head per layer type; ``forward(plan)`` -> ``{param name: tensor}``."""

    def __init__(self, types: list[LayerType], gnn_layers: int = 6, latent: int = 51, hidden: int = 16,
                 heads: Literal["mlp", "linear"] = "mlp") -> None:
        super().__init__()
        self.types = list(types)
        from torch_geometric.nn import GraphConv  # imported where a GHN is built: PyG takes seconds to import

        self.gnn = nn.ModuleList(GraphConv(FEATURES if i == 0 else latent, latent, aggr="add")
                                 for i in range(gnn_layers))
        node_dim = latent if gnn_layers else FEATURES
        self.heads = nn.ModuleList(TypeHead(node_dim, t, hidden, heads) for t in self.types)

    def node_representations(self, plan: ArchitecturePlan) -> torch.Tensor:
        h = plan.features
        for i, layer in enumerate(self.gnn):
            h = layer(h, plan.edges)
            if i < len(self.gnn) - 1:
                h = torch.relu(h)
        return h

    def forward(self, plan: ArchitecturePlan) -> dict[str, torch.Tensor]:
        h = self.node_representations(plan)
        weights: dict[str, torch.Tensor] = {}
        for type_index, (rows, layers) in plan.nodes_by_type.items():
            layer_type = self.types[type_index]
            generated = self.heads[type_index](h[rows])  # [nodes of this type, numel]
            sizes = [math.prod(shape) for _, shape in layer_type.params]
            for node_weights, names in zip(generated, layers, strict=True):
                for value, name, (_, shape) in zip(node_weights.split(sizes), names, layer_type.params, strict=True):
                    weights[name] = value.view(shape)
        return {name: weights[name] for name in plan.param_names}


class GeneratedNetwork(TargetModel):
    """A client's architecture whose weights come from the GHN: the network FLHA-GHN's clients train.

    Its parameters are the GHN's (``ghn.*``, the same for every architecture: what travels on the wire); a forward
    pass generates each client's architecture weights from its own GHN copy and runs the architecture on them, so
    the loss trains the GHN end to end through the client's architecture (paper Eq. 5).
    """

    def __init__(self, ghn: GraphHypernetwork, architecture: TargetModel) -> None:
        super().__init__()
        self.ghn = ghn
        self.plan = plan_architecture(architecture, ghn.types)
        # kept outside the module tree: the architecture's own parameters are not this network's
        self._architecture = [architecture]
        self.batch_statistics = architecture.batch_statistics

    @property
    def architecture(self) -> TargetModel:
        return self._architecture[0]

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> GeneratedNetwork:
        """``.to(device)`` and friends move the plan's graph and the architecture too (both outside the module
        tree): the GHN reads them beside its own weights."""
        super()._apply(fn, recurse)
        plan = self.plan
        self.plan = replace(plan, features=fn(plan.features), edges=fn(plan.edges),
                            nodes_by_type={index: (fn(rows), layers)
                                           for index, (rows, layers) in plan.nodes_by_type.items()})
        self.architecture._apply(fn, recurse)
        return self

    @property
    def head_names(self) -> tuple[str, ...]:
        return ()  # the GHN has no output layer of its own; the architecture's head is generated

    def generate(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{ghn.*: [S, *shape]}`` -> ``{architecture param: [S, *shape]}``, each client from its own GHN."""
        # One GHN pass per client, not vmap: batched matmuls round differently with the batch size, and a client's
        # weights must not depend on which clients train beside it (the simulator and a Flower node agree bit for
        # bit). The GHN pass is small beside the architecture's forward on a batch of images.
        ghn_params = {name.removeprefix("ghn."): value for name, value in params.items()}
        num_clients = next(iter(ghn_params.values())).shape[0]
        # clone: fresh (aligned) memory, so the matmul kernels take the same path wherever the row came from (a
        # slice of the simulator's [S, dim] tensor or an array a Flower node received)
        generated = [functional_call(self.ghn, {name: value[s].clone() for name, value in ghn_params.items()},
                                     (self.plan,))
                     for s in range(num_clients)]
        return {name: torch.stack([client[name] for client in generated]) for name in self.plan.param_names}

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        return self.architecture.batched_forward(self.generate(params), x, features_only)
