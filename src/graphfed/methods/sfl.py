"""SFL (Chen et al., IJCAI 2022, "Personalized Federated Learning With a Graph"), server aggregation.

Per round, over every client's latest trained model W = [theta_1; ...; theta_N]:
  A      = the given client graph, or (none given) the kNN graph (k = ``knn``) over the cosine similarity
           of the clients' models, recomputed from the latest models whenever it is needed
  A_hat  = row-normalise(A + I)                                   self loops; each row sums to 1
  P      = alpha * A_hat^L W + (1 - alpha) * W                    L = ``hops`` graph propagations
  theta'_i = P_i, sent to client i, which trains locally from it (every layer uses the same matrix).

Choices where the paper and its code leave room:
- Normalisation: the official code uses the symmetric GCN normalisation D^-1/2 (A + I) D^-1/2, which is
  not row-stochastic; here rows are normalised so the personalised model stays a convex combination.
- Clients that never trained hold only the initial weights: their columns are dropped (a client keeps
  its own self loop), so they never pull anyone back to the initialisation. In round 0 P = I.
- The official client adds 0.3 ||theta - theta'_i|| + 0.3 ||theta - theta_global|| to its loss; the engine
  offers only a squared pull to the received weights, exposed as ``prox_mu`` (0 = off, the default).
"""

from __future__ import annotations

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting
from graphfed.data.graphs import knn_graph
from graphfed.methods.aggregation import PersonalizedAggregation
from graphfed.methods.base import MethodContext, MethodOptions


class SFLOptions(MethodOptions):
    alpha: float = Field(default=0.5, ge=0, le=1, description="weight of the graph-propagated models")
    hops: int = Field(default=1, ge=1, description="L: powers of the normalised adjacency")
    knn: int = Field(default=5, ge=1, description="neighbours of the similarity graph when no graph is given")
    prox_mu: float = Field(default=0.0, ge=0, description="client proximal pull to the received weights")


class SFL(PersonalizedAggregation):
    name = "sfl"
    summary = "graph propagation of client models: alpha * A_hat^L W + (1 - alpha) W"
    Options = SFLOptions

    def __init__(self, context: MethodContext, options: SFLOptions) -> None:
        super().__init__(context, options)
        self.options: SFLOptions = options
        self.infer_graph = context.client_graph is None
        n = context.num_clients
        self.adjacency = (torch.zeros(n, n) if self.infer_graph
                          else context.client_graph.to(torch.float32).clamp_min(0).clone())
        if self.infer_graph:
            self.notes.append(f"sfl: no client graph given; using the kNN graph (k={options.knn}) over cosine "
                              f"similarity of the clients' latest models")

    @classmethod
    def client_rule(cls, options: SFLOptions, setting: ClientSetting) -> ClientRule:
        return ClientRule(setting, prox_mu=options.prox_mu)

    def reads_client_graph(self) -> bool:
        return not self.infer_graph

    def graph(self) -> torch.Tensor:
        """``A [N, N]`` among clients that have trained (zero elsewhere), without self loops."""
        trained = self.has_trained
        if not self.infer_graph:
            return self.adjacency * trained.unsqueeze(0) * trained.unsqueeze(1)
        adjacency = torch.zeros_like(self.adjacency)
        seen = torch.nonzero(trained).flatten()
        if len(seen) > 1:
            sub = knn_graph(self.client_weights[seen], min(self.options.knn, len(seen) - 1))
            adjacency[seen.unsqueeze(1), seen.unsqueeze(0)] = sub
        return adjacency

    def propagation(self) -> torch.Tensor:
        """``P [N, N] = alpha * A_hat^L + (1 - alpha) * I``, row-stochastic."""
        n = self.context.num_clients
        graph = self.graph()
        eye = torch.eye(n, device=graph.device)
        adjacency = graph * (1 - eye) + eye
        normalised = adjacency / adjacency.sum(dim=1, keepdim=True)
        propagated = torch.linalg.matrix_power(normalised, self.options.hops)
        return self.options.alpha * propagated + (1 - self.options.alpha) * eye

    def mixing(self, client_ids: torch.Tensor) -> torch.Tensor:
        rows = self.propagation()[client_ids]
        return rows.unsqueeze(0).expand(self.num_layers, -1, -1)
