"""pFedGraph (Ye et al., ICML 2023, "Personalized Federated Learning with Inferred Collaboration Graphs").

Server, per round, as the official code runs it (``optimizing_graph_matrix_neighbor``):
  Delta_i = theta_i - theta_init                       each client's model minus the initial global model
  s_ij    = cos(Delta_i, Delta_j), snapped to 1 when above 0.9 (official code)
  p_j     = n_j / sum_k n_k                            data-size proportions of the collaborating clients
  for each client i:  w_i = argmin_{w in simplex}  alpha ||w||^2 + (-s_i - 2 alpha p)^T w
                          = argmin_{w in simplex}  alpha ||w - p||^2 - sum_j w_j s_ij      (alpha = 0.8)
  theta'_i = sum_j w_ij theta_j                         sent to client i (every layer the same weights)
The QP has a closed form: completing the square, w_i is the Euclidean projection of p + s_i / (2 alpha)
onto the probability simplex, computed exactly (sort-based, vectorised over clients); the tests check it
against scipy's SLSQP on the QP as written.

Choices: collaborating clients are those that have trained (the official code solves over the round's
participants, all of whom hold trained models; here the server keeps every client's latest model); a
client that never trained gets the data-size average of the others (its Delta is 0, so s_i = 0). The
client-side regulariser of the official code (lambda = 0.01 times the cosine between the local model and
the aggregated one) is not modelled: the engine's clients offer only a proximal pull.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from graphfed.methods.aggregation import PersonalizedAggregation
from graphfed.methods.base import MethodContext, MethodOptions


class PFedGraphOptions(MethodOptions):
    alpha: float = Field(default=0.8, gt=0, description="weight of the ||w - p||^2 term of the graph QP")
    similarity_snap: float = Field(default=0.9, description="cosine above this counts as 1 (official code)")


def project_to_simplex(values: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Row-wise Euclidean projection of ``values [S, N]`` onto the simplex over the ``allowed`` entries."""
    v = values.to(torch.float64).masked_fill(~allowed, float("-inf"))
    sorted_v = v.sort(dim=1, descending=True).values
    count = allowed.sum(dim=1, keepdim=True)
    ranks = torch.arange(1, v.shape[1] + 1, dtype=torch.float64, device=v.device).unsqueeze(0)
    finite = ranks <= count
    cumulative = torch.where(finite, sorted_v, 0.0).cumsum(dim=1)
    positive = finite & (sorted_v - (cumulative - 1.0) / ranks > 0)
    rho = positive.sum(dim=1, keepdim=True).clamp_min(1)  # the support size
    tau = (cumulative.gather(1, rho - 1) - 1.0) / rho
    return (v - tau).clamp_min(0.0).masked_fill(~allowed, 0.0)


class PFedGraph(PersonalizedAggregation):
    name = "pfedgraph"
    summary = "per-client QP on the cosine similarity of model updates infers the collaboration graph"
    Options = PFedGraphOptions

    def __init__(self, context: MethodContext, options: PFedGraphOptions) -> None:
        super().__init__(context, options)
        self.options: PFedGraphOptions = options
        self.num_examples = torch.ones(context.num_clients)  # latest reported training-set sizes

    def similarity(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``s [S, N]``: cosine of the clients' updates since the initial model, snapped above the threshold."""
        updates = F.normalize(self.client_weights - self.context.init_weights, dim=1)
        cosine = updates[client_ids] @ updates.T
        return cosine.masked_fill(cosine > self.options.similarity_snap, 1.0)

    def graph(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``[S, N]`` solved weights of ``client_ids`` (rows on the simplex over the trained clients)."""
        allowed = self.has_trained.unsqueeze(0).expand(len(client_ids), -1)
        if not self.has_trained.any():
            return self.is_self(client_ids).to(torch.float32)
        counts = self.num_examples * self.has_trained
        p = counts / counts.sum()
        target = p.unsqueeze(0) + self.similarity(client_ids) / (2 * self.options.alpha)
        return project_to_simplex(target, allowed).to(torch.float32)

    def mixing(self, client_ids: torch.Tensor) -> torch.Tensor:
        return self.graph(client_ids).unsqueeze(0).expand(self.num_layers, -1, -1)

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        if "num_examples" in metrics:
            self.num_examples[client_ids] = metrics["num_examples"].to(torch.float32)
        self.record_updates(client_ids, sent, delta)
