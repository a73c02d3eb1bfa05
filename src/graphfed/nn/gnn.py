"""GNN encoders over the client relation graph, built from PyG layers."""

from __future__ import annotations

import itertools
from typing import Literal

import torch
from torch import nn
from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv
from torch_geometric.utils import dense_to_sparse

GNNKind = Literal["gcn", "gat", "gin", "graphconv"]


def _layer(kind: GNNKind, in_dim: int, out_dim: int) -> nn.Module:
    if kind == "gcn":
        return GCNConv(in_dim, out_dim)
    if kind == "gat":
        return GATConv(in_dim, out_dim, heads=1, add_self_loops=True)
    if kind == "gin":
        return GINConv(nn.Sequential(nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim)))
    if kind == "graphconv":
        return GraphConv(in_dim, out_dim)
    raise ValueError(f"unknown GNN kind '{kind}'; allowed: gcn, gat, gin, graphconv")


class GNNEncoder(nn.Module):
    """``num_layers`` message-passing layers (ReLU between) over a dense client adjacency."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 3,
                 kind: GNNKind = "gcn") -> None:
        super().__init__()
        widths = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(_layer(kind, a, b) for a, b in itertools.pairwise(widths))

    def forward(self, x: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
        edge_index, edge_weight = dense_to_sparse(adjacency)
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h, edge_index, edge_weight) if isinstance(layer, GCNConv | GraphConv) else layer(h, edge_index)
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return h
