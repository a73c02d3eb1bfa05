"""Panacea (Lin et al.): graph hypernetwork over the client relation graph + graph generator.

Algorithm 1 of the paper, per round:
  sample clients S_t
  theta_t = M(E(h0, A))_t for t in S_t            GNN encoder E over the client graph, MLP hypernet M
  each client runs K_c SGD steps -> delta_t = theta_t - theta_t~
  repeat K_s times:
      psi_e <- psi_e - alpha * (d theta_t/d psi_e)^T delta_t - alpha * lambda_d * dL_d/d psi_e
      psi_m <- psi_m - alpha * (d theta_t/d psi_m)^T delta_t
where L_d = BCE(sigmoid(<z^_u, z^_v>), A_uv) reconstructs the graph from the embeddings.

Across the K_s server steps the client's target theta_t~ stays fixed and the direction is recomputed
as ``theta_t(psi_k) - theta_t~`` (the gradient of the paper's MSE objective L_GH); at k = 0 it equals
delta_t, the usual hypergradient. Variants: Panacea-GN (lambda_d = 0), Panacea-MLP (no GNN, no
generator). When no client graph is given, the graph is inferred by kNN over the cosine similarity of
the clients' latest updates and refreshed every ``graph_refresh_rounds`` rounds.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from graphfed.data.graphs import knn_graph
from graphfed.methods.base import EmbeddingHypernetwork, EmbeddingHypernetworkOptions, MethodContext
from graphfed.nn.gnn import GNNEncoder, GraphEdges
from graphfed.nn.graph_generator import InnerProductGraphGenerator
from graphfed.nn.hypernet import MLPHypernet


class PanaceaOptions(EmbeddingHypernetworkOptions):
    embedding_dim: int = Field(default=100, ge=1, description="size of the learnable client embeddings h0")
    gnn: Literal["gcn", "gat", "gin", "graphconv", "none"] = Field(default="gcn",
            description="PyG encoder over the client graph (none: no GNN)")
    gnn_layers: int = Field(default=3, ge=1, description="GNN layers")
    gnn_hidden: int = Field(default=100, ge=1, description="GNN hidden and output width")
    hypernet_hidden: int = Field(default=100, ge=1, description="hidden width of the MLP hypernetwork")
    hypernet_layers: int = Field(default=3, ge=1, description="layers of the MLP hypernetwork")
    lambda_d: float = Field(default=0.01, ge=0, description="weight of the graph generator's loss L_d")
    server_steps: int = Field(default=10, ge=1, description="K_s")
    server_optimizer: Literal["sgd", "adam"] = Field(default="adam",
            description="optimizer of the server steps (Algorithm 1 takes plain gradient steps)")
    server_lr: float = Field(default=1e-3, gt=0, description="lr of the server optimizer")
    graph_loss_pairs: int | None = Field(default=None, ge=1,
            description="edges sampled per server step for L_d (plus as many non-edges); default: every edge")
    knn: int = Field(default=5, ge=1, description="neighbours when the graph is inferred")
    graph_refresh_rounds: int = Field(default=10, ge=1,
            description="with no graph given: rebuild the kNN graph from updates every this many rounds")


class Panacea(EmbeddingHypernetwork):
    adapters = ("its hypernetwork writes each client's LoRA factors from the client's embedding passed through the GNN "
                "over the client graph (on shakespeare: the dialogue graph, so a role's adapter draws on the roles it "
                "answers); the client trains them on the frozen base and sends back their change")
    name = "panacea"
    summary = "GNN over the client graph + MLP hypernetwork + graph generator (lambda_d)"
    Options = PanaceaOptions

    def __init__(self, context: MethodContext, options: PanaceaOptions) -> None:
        super().__init__(context, options)
        self.options: PanaceaOptions = options
        n, dim = context.num_clients, options.embedding_dim
        self.embeddings = nn.Embedding(n, dim)  # h0 ~ N(0, 1)
        self.encoder = (GNNEncoder(dim, options.gnn_hidden, options.gnn_hidden, options.gnn_layers, options.gnn)
                        if options.gnn != "none" else nn.Identity())
        z_dim = options.gnn_hidden if options.gnn != "none" else dim
        self.hypernet = MLPHypernet(z_dim, context.spec, options.hypernet_hidden, options.hypernet_layers)
        self.graph_generator = InnerProductGraphGenerator(z_dim)
        modules = [self.embeddings, self.encoder, self.hypernet, self.graph_generator]
        params = [p for module in modules for p in module.parameters()]
        if options.server_optimizer == "adam":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adam(params, lr=options.server_lr, foreach=True)
        else:
            self.optimizer = torch.optim.SGD(params, lr=options.server_lr, momentum=0.9, foreach=True)
        self.infer_graph = context.client_graph is None
        self.adjacency = (torch.zeros(n, n) if self.infer_graph
                          else context.client_graph.to(torch.float32).clone())
        self._edges = self._prepare_edges()
        # each client's latest update, for inferring the graph; allocated up front so a checkpoint restores into it
        inferring = self.infer_graph and self.uses_graph
        self.latest_delta = torch.zeros(n if inferring else 0, context.spec.dim if inferring else 0)
        self.rounds_seen = 0
        if self.infer_graph and self.uses_graph:
            k = min(options.knn, max(len(context.train_client_ids) - 1, 1))  # what knn_graph can link
            self.notes.append(f"{self.name}: no client graph given; inferring one by kNN (k={k}) over "
                              f"cosine similarity of client updates, refreshed every "
                              f"{options.graph_refresh_rounds} rounds")

    def central_privacy_problem(self) -> str | None:
        if self.infer_graph and self.uses_graph:
            return ("without a client graph it infers one from the clients' raw updates, which central DP would "
                    "release unprotected; give the dataset's graph, or set method.options.gnn=none and lambda_d=0")
        return None

    def reads_client_graph(self) -> bool:
        return self.uses_graph and not self.infer_graph

    def server_steps_per_round(self) -> int:
        return self.options.server_steps

    @property
    def uses_graph(self) -> bool:
        return self.options.gnn != "none" or self.options.lambda_d > 0

    def _prepare_edges(self) -> GraphEdges | None:
        """Sparse forms of the adjacency, computed once per graph (not per step): the GNN's edges and the graph
        loss's positive pairs (each undirected edge once)."""
        self._positives = torch.nonzero(torch.triu(self.adjacency > 0, diagonal=1))
        return self.encoder.prepare(self.adjacency) if isinstance(self.encoder, GNNEncoder) else None

    def _client_embeddings(self, h0: torch.Tensor) -> torch.Tensor:
        if self._edges is None:
            return self.encoder(h0)
        return self.encoder(h0, self._edges)

    def weights_from_embeddings(self, embeddings: torch.Tensor, client_ids: torch.Tensor) -> torch.Tensor:
        return self.hypernet(self._client_embeddings(embeddings)[client_ids])

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        self._maybe_refresh_graph(client_ids, delta)
        target = (sent - delta).detach()
        for _ in range(self.options.server_steps):
            z = self._client_embeddings(self.embeddings.weight)
            theta = self.hypernet(z[client_ids])
            graph_loss = None
            if self.options.lambda_d > 0:
                graph_loss = self.options.lambda_d * self.graph_generator.reconstruction_loss(
                    z, self.adjacency, self._positives, self.generator, self.options.graph_loss_pairs)
            self.server_step(theta, (theta.detach() - target) / len(client_ids), graph_loss)

    def _maybe_refresh_graph(self, client_ids: torch.Tensor, delta: torch.Tensor) -> None:
        self.rounds_seen += 1
        if not (self.infer_graph and self.uses_graph):
            return
        self.latest_delta[client_ids] = delta.detach()
        if self.rounds_seen % self.options.graph_refresh_rounds == 0:
            seen = torch.nonzero(self.latest_delta.abs().sum(1) > 0).flatten()
            if len(seen) > 1:
                sub_graph = knn_graph(self.latest_delta[seen], min(self.options.knn, len(seen) - 1))
                self.adjacency = torch.zeros_like(self.adjacency)
                self.adjacency[seen.unsqueeze(1), seen.unsqueeze(0)] = sub_graph
                self._edges = self._prepare_edges()

    def state_dict(self) -> dict[str, Any]:
        """The client graph is saved as its edges (a dense [N, N] matrix is 400 MB at 10,000 clients), and only
        when it was inferred: a given graph comes from the federation again on resume."""
        state = super().state_dict()
        adjacency = state.pop("adjacency")
        if self.infer_graph:
            edges = torch.nonzero(adjacency).T
            state["adjacency_edges"], state["adjacency_weights"] = edges, adjacency[edges[0], edges[1]]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        edges, weights = state.pop("adjacency_edges", None), state.pop("adjacency_weights", None)
        if self.infer_graph:
            n = self.context.num_clients
            if not (isinstance(edges, torch.Tensor) and isinstance(weights, torch.Tensor) and edges.ndim == 2
                    and edges.shape[0] == 2 and not edges.is_floating_point() and weights.shape == (edges.shape[1],)
                    and bool(((edges >= 0) & (edges < n)).all()) and bool(torch.isfinite(weights).all())):
                raise ValueError(f"state 'adjacency_edges': the inferred client graph must be [2, E] client ids "
                                 f"below {n} with E finite weights")
            self.adjacency = torch.zeros(n, n).index_put((edges[0], edges[1]), weights.to(torch.float32))
        super().load_state_dict(state)
        self._edges = self._prepare_edges()

    def collaboration_graph(self, client_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        if not self.uses_graph:
            return None
        return self.adjacency.clone() if client_ids is None else self.adjacency[client_ids]


class PanaceaGNOptions(PanaceaOptions):
    # the variant's definition, in its options: what a run records is what parse_options resolves
    lambda_d: Literal[0.0] = Field(default=0.0, description="Panacea-GN has no graph generator: always 0")


class PanaceaGN(Panacea):
    name = "panacea-gn"
    summary = "Panacea without the graph generator (lambda_d = 0)"
    Options = PanaceaGNOptions


class PanaceaMLPOptions(PanaceaOptions):
    gnn: Literal["none"] = Field(default="none", description="Panacea-MLP has no GNN: always none")
    lambda_d: Literal[0.0] = Field(default=0.0, description="Panacea-MLP has no graph generator: always 0")


class PanaceaMLP(Panacea):
    name = "panacea-mlp"
    summary = "Panacea's MLP hypernetwork alone: no GNN, no graph generator"
    Options = PanaceaMLPOptions
