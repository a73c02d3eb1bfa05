"""Architecture -> graph, the input of FLHA-GHN's graph hypernetwork, derived from the model by ``torch.fx``.

Following the paper (Sec. 4, Figure 2): one node per parametric layer (convolution, linear, BatchNorm) and per
non-parametric operation that joins or reduces data (add, concat, pooling), plus the input; a directed edge
v -> u when v's output is u's input. Operations that only reshape or activate (ReLU, flatten, views) are not
nodes: the edge passes through them. Nothing is written per architecture: any ``nn.Module`` that ``torch.fx`` can
trace gets its graph.

Node features are one-hot blocks: the node's type, its kernel size, its stride and its output width (channels or
features, in powers of two), the categorical description the paper gives each layer.
"""

from __future__ import annotations

import inspect
import math
import operator
from dataclasses import dataclass

import torch
from torch import fx, nn

KINDS = ("input", "conv", "linear", "bn", "add", "concat", "pool")
KERNELS = (1, 3, 5, 7)  # anything else: the "other" slot
STRIDES = (1, 2)
WIDTH_BINS = 12  # output widths 1, 2, 4, ..., 2^11 (larger ones share the last bin)
FEATURES = len(KINDS) + len(KERNELS) + 1 + len(STRIDES) + 1 + WIDTH_BINS


@dataclass
class ArchGraph:
    """Nodes in data-flow order; ``edges [2, E]`` (source row, target row)."""

    names: list[str]  # the module path of a layer ("body.2.conv1.0"), or the operation's node name ("add_1")
    kinds: list[str]
    kernels: list[int | None]
    strides: list[int | None]
    widths: list[int | None]
    edges: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return len(self.names)

    def features(self) -> torch.Tensor:
        """``[V, FEATURES]`` one-hot blocks: kind, kernel, stride, output width."""
        rows = torch.zeros(self.num_nodes, FEATURES)
        for i, (kind, kernel, stride, width) in enumerate(
                zip(self.kinds, self.kernels, self.strides, self.widths, strict=True)):
            rows[i, KINDS.index(kind)] = 1.0
            offset = len(KINDS)
            if kernel is not None:
                rows[i, offset + (KERNELS.index(kernel) if kernel in KERNELS else len(KERNELS))] = 1.0
            offset += len(KERNELS) + 1
            if stride is not None:
                rows[i, offset + (STRIDES.index(stride) if stride in STRIDES else len(STRIDES))] = 1.0
            offset += len(STRIDES) + 1
            if width is not None:
                rows[i, offset + min(int(math.log2(max(width, 1))), WIDTH_BINS - 1)] = 1.0
        return rows

    def in_degree(self) -> list[int]:
        return torch.bincount(self.edges[1], minlength=self.num_nodes).tolist()


_POOL_FUNCTIONS = {torch.max_pool2d, torch.nn.functional.max_pool2d,
                   torch.nn.functional.avg_pool2d, torch.nn.functional.adaptive_avg_pool2d}
_ADD = {operator.add, torch.add}
_CONCAT = {torch.cat, torch.concat}


def _describe(node: fx.Node, modules: dict[str, nn.Module],
              fixed: set[str]) -> tuple[str, int | None, int | None, int | None] | None:
    """``(kind, kernel, stride, width)`` of a node that becomes a graph node, None for a pass-through one."""
    if node.op == "placeholder":  # the images; an argument fixed at its default (``fixed``) is no node
        return None if node.name in fixed else ("input", None, None, None)
    if node.op == "call_module":
        module = modules[str(node.target)]
        if isinstance(module, nn.Conv2d):
            return "conv", int(module.kernel_size[0]), int(module.stride[0]), module.out_channels
        if isinstance(module, nn.Linear):
            return "linear", None, None, module.out_features
        if isinstance(module, nn.BatchNorm2d | nn.BatchNorm1d):
            return "bn", None, None, module.num_features
        if isinstance(module, nn.MaxPool2d | nn.AvgPool2d | nn.AdaptiveAvgPool2d):
            return "pool", None, None, None
        if any(True for _ in module.parameters(recurse=False)):
            raise ValueError(f"arch graph: no node type for the parametric layer {node.target} "
                             f"({type(module).__name__}); known: {', '.join(KINDS)}")
        return None
    if node.op == "call_function":
        if node.target in _ADD:
            return "add", None, None, None
        if node.target in _CONCAT:
            return "concat", None, None, None
        if node.target in _POOL_FUNCTIONS:
            return "pool", None, None, None
        return None
    if node.op == "call_method":
        if node.target == "add":
            return "add", None, None, None
        if node.target == "mean":  # global average pooling written as x.mean((2, 3))
            return "pool", None, None, None
    return None


def architecture_graph(model: nn.Module) -> ArchGraph:
    """The data-flow graph of ``model`` (traced with ``torch.fx``; its ``forward`` must be traceable)."""
    # arguments with defaults (TargetModel's ``features_only``) are fixed at them: only the input is traced
    defaults = {name: parameter.default for name, parameter in inspect.signature(model.forward).parameters.items()
                if parameter.default is not inspect.Parameter.empty}
    traced = fx.symbolic_trace(model, concrete_args=defaults or None)
    placeholders = [node for node in traced.graph.nodes if node.op == "placeholder"]
    arguments = list(inspect.signature(model.forward).parameters)
    fixed = {node.name for node, name in zip(placeholders, arguments, strict=False) if name in defaults}
    modules = dict(traced.named_modules())
    names: list[str] = []
    kinds: list[str] = []
    kernels: list[int | None] = []
    strides: list[int | None] = []
    widths: list[int | None] = []
    edges: list[tuple[int, int]] = []
    # graph nodes each fx node's value comes from: itself if it is a graph node, else its inputs' sources
    sources: dict[fx.Node, list[int]] = {}
    for node in traced.graph.nodes:
        if node.op == "output":
            continue
        upstream = sorted({source for argument in node.all_input_nodes for source in sources.get(argument, [])})
        described = _describe(node, modules, fixed)
        if described is None:
            sources[node] = upstream
            continue
        index = len(names)
        kind, kernel, stride, width = described
        names.append(str(node.target) if node.op == "call_module" else node.name)
        kinds.append(kind)
        kernels.append(kernel)
        strides.append(stride)
        widths.append(width)
        edges.extend((source, index) for source in upstream)
        sources[node] = [index]
    edge_index = torch.tensor(edges, dtype=torch.long).T if edges else torch.zeros(2, 0, dtype=torch.long)
    return ArchGraph(names, kinds, kernels, strides, widths, edge_index.reshape(2, -1))
