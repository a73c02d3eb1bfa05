"""GNN encoders over the client relation graph, built from PyG layers."""

from __future__ import annotations

from itertools import pairwise
from typing import Literal

import torch
from torch import nn

# torch_geometric is imported where a GNN is built, not with graphfed: it takes seconds to import, and
# `graphfed --help`, `graphfed list` and every method without a GNN never need it.

GNNKind = Literal["gcn", "gat", "gin", "graphconv"]
GraphEdges = tuple[torch.Tensor, torch.Tensor]  # (edge_index [2, E], edge_weight [E])


def _layer(kind: GNNKind, in_dim: int, out_dim: int) -> nn.Module:
    from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv

    if kind == "gcn":
        # The symmetric normalisation is computed once per graph in `prepare`, not in every forward.
        return GCNConv(in_dim, out_dim, normalize=False)
    if kind == "gat":
        return GATConv(in_dim, out_dim, heads=1, add_self_loops=True)
    if kind == "gin":
        return GINConv(nn.Sequential(nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim)))
    if kind == "graphconv":
        return GraphConv(in_dim, out_dim)
    raise ValueError(f"unknown GNN kind '{kind}'; allowed: gcn, gat, gin, graphconv")


class GNNEncoder(nn.Module):
    """``num_layers`` message-passing layers (ReLU between) over the client graph."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 3,
                 kind: GNNKind = "gcn") -> None:
        super().__init__()
        self.kind = kind
        widths = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(_layer(kind, a, b) for a, b in pairwise(widths))

    def prepare(self, adjacency: torch.Tensor) -> GraphEdges:
        """Sparse edges of a dense ``[N, N]`` adjacency, GCN-normalised (with self loops) for ``gcn``."""
        from torch_geometric.nn.conv.gcn_conv import gcn_norm
        from torch_geometric.utils import dense_to_sparse

        edge_index, edge_weight = dense_to_sparse(adjacency)
        if self.kind == "gcn":
            edge_index, edge_weight = gcn_norm(edge_index, edge_weight, adjacency.shape[0], add_self_loops=True)
        return edge_index, edge_weight

    def forward(self, x: torch.Tensor, edges: GraphEdges) -> torch.Tensor:
        edge_index, edge_weight = edges
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h, edge_index, edge_weight) if self.kind in ("gcn", "graphconv") else layer(h, edge_index)
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return h
