"""CFL (Sattler et al., IEEE TNNLS 2020, "Clustered Federated Learning"), Algorithm 1 as the official code runs it.

Clusters start as one cluster of all clients. Per round, after the clients' updates Delta_i arrive:
  within each cluster c, the personalised model of every member is the average of the members' latest
  trained models (FedAvg inside the cluster; uniform weights, as FedAGHN's collaboration graphs show it)
  for each cluster c, over its members that reported this round:
      mean_norm = || mean_i Delta_i ||,   max_norm = max_i || Delta_i ||
      if round > start_round and mean_norm < eps_1 and max_norm > eps_2:
          alpha_ij = cos(Delta_i, Delta_j)
          c -> c_1, c_2 = the bipartition of complete-linkage clustering on the distance 1 - alpha
          (kept only if both parts have at least ``min_cluster_size`` members)
Near a stationary point of the cluster's joint objective (small mean update) while some client still
wants to move (a large individual update), the members' objectives disagree and the cluster is split.

Choices for partial participation (the paper has every client report every round): the criterion and
the bipartition use the members that reported this round; a member that did not report joins the part
whose mean update is more cosine-similar to its latest update (a member that never trained joins the
larger part). Defaults eps_1 = 0.4, eps_2 = 1.6, minimum cluster size 2 are FedAGHN's (ResNet) settings;
start_round = 20 is the official code's warm-up (``c_round > 20``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from graphfed.methods.aggregation import PersonalizedAggregation
from graphfed.methods.base import MethodContext, MethodOptions


class CFLOptions(MethodOptions):
    eps1: float = Field(default=0.4, gt=0, description="split only when ||mean update|| of a cluster is below")
    eps2: float = Field(default=1.6, gt=0, description="... and the largest member update norm is above")
    min_cluster_size: int = Field(default=2, ge=1, description="both parts of a split need this many members")
    start_round: int = Field(default=20, ge=0, description="no split during the first start_round rounds")


def bipartition(updates: torch.Tensor) -> np.ndarray:
    """Labels 0/1 of complete-linkage clustering (2 clusters) of ``updates [M, dim]`` by cosine distance."""
    unit = F.normalize(updates.to(torch.float64), dim=1)
    distance = (1.0 - unit @ unit.T).clamp_min(0.0).numpy()
    np.fill_diagonal(distance, 0.0)
    tree = linkage(squareform((distance + distance.T) / 2, checks=False), method="complete")
    return fcluster(tree, t=2, criterion="maxclust") - 1


class CFL(PersonalizedAggregation):
    name = "cfl"
    summary = "clustered FL: FedAvg within clusters, split by update cosine when the cluster has converged"
    Options = CFLOptions

    def __init__(self, context: MethodContext, options: CFLOptions) -> None:
        super().__init__(context, options)
        self.options: CFLOptions = options
        self.cluster_of = torch.zeros(context.num_clients, dtype=torch.long)

    def mixing(self, client_ids: torch.Tensor) -> torch.Tensor:
        same = self.cluster_of[client_ids].unsqueeze(1) == self.cluster_of.unsqueeze(0)  # [S, N]
        members = same & self.has_trained.unsqueeze(0)
        alone = ~members.any(dim=1, keepdim=True)  # nobody in the cluster trained yet: keep its own model
        members = members | (alone & self.is_self(client_ids))
        rows = members.to(torch.float32)
        rows = rows / rows.sum(dim=1, keepdim=True)
        return rows.unsqueeze(0).expand(self.num_layers, -1, -1)

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        self.record_updates(client_ids, sent, delta)
        if self.rounds_seen <= self.options.start_round:
            return
        for cluster in self.cluster_of.unique().tolist():
            self._maybe_split(cluster, client_ids, delta.detach())

    def _maybe_split(self, cluster: int, client_ids: torch.Tensor, delta: torch.Tensor) -> None:
        opts = self.options
        in_cluster = self.cluster_of[client_ids] == cluster
        reported, updates = client_ids[in_cluster], delta[in_cluster]
        if len(reported) < max(2, 2 * opts.min_cluster_size):
            return
        mean_norm = updates.mean(dim=0).norm()
        max_norm = updates.norm(dim=1).max()
        if not (mean_norm < opts.eps1 and max_norm > opts.eps2):
            return
        labels = torch.as_tensor(bipartition(updates), device=updates.device)
        sizes = torch.stack([(labels == 0).sum(), (labels == 1).sum()])
        if sizes.min() < opts.min_cluster_size:
            return
        larger = int(sizes.argmax())
        labels = labels if larger == 0 else 1 - labels  # part 0 is the larger one
        new_cluster = int(self.cluster_of.max()) + 1
        # members that did not report: the part whose mean update points like their latest one
        part_means = torch.stack([updates[labels == 0].mean(0), updates[labels == 1].mean(0)])
        members = torch.nonzero(self.cluster_of == cluster).flatten()
        silent = members[~torch.isin(members, reported)]
        if len(silent):
            similarity = F.normalize(self.latest_delta[silent], dim=1) @ F.normalize(part_means, dim=1).T
            goes_to_second = similarity[:, 1] > similarity[:, 0]
            self.cluster_of[silent[goes_to_second]] = new_cluster
        self.cluster_of[reported[labels == 1]] = new_cluster
