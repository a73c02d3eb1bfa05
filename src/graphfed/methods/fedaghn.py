"""FedAGHN (attentive graph hypernetworks), as the official code implements it.

Per client i and layer r, from the PREVIOUS round's updates Delta_theta:
  a_ij^r = softmax_{j != i}( q_i^r * cos(Delta_theta_i^r, Delta_theta_j^r) )
  w_i^r  = [p_i^r (self), a_ij^r (others)] / (1 + p_i^r)          p clamped >= 0, so self = p / (1 + p)
  theta'_i^r = sum_j w_ij^r theta_j^r                              (uniform weights in round 0)
Server: p, q learn by the hypergradient of theta'_i with the client's delta (SGD, lr 0.005, no momentum).
``hypergrad_sign: released`` reproduces the released code's opposite sign, for comparison only.
BatchNorm layers use batch statistics (graphfed's ``cnn-bn``), so there are no running statistics to share.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from graphfed.core.hypergrad import hypergradient_step
from graphfed.core.mixing import layer_bounds
from graphfed.methods.aggregation import PersonalizedAggregation
from graphfed.methods.base import MethodContext, MethodOptions


class FedAGHNOptions(MethodOptions):
    init_p: float = Field(default=0.03, ge=0, description="initial self-participation strength")
    init_q: float = Field(default=0.5, description="initial attention temperature on cosine similarity")
    server_lr: float = Field(default=0.005, gt=0, description="SGD lr of p and q (hypergradient steps)")
    hypergrad_sign: Literal["descent", "released"] = Field(default="descent",
            description="descent: the sign that lowers the clients' loss; released: the released code's opposite sign")


class FedAGHN(PersonalizedAggregation):
    name = "fedaghn"
    summary = "per-client, per-layer attentive collaboration graphs (p self weight, q on update cosine)"
    Options = FedAGHNOptions

    def __init__(self, context: MethodContext, options: FedAGHNOptions) -> None:
        super().__init__(context, options)
        self.options: FedAGHNOptions = options
        shape = (context.num_clients, self.num_layers)
        self.self_strength = nn.Parameter(torch.full(shape, options.init_p))  # p_i^r
        self.temperature = nn.Parameter(torch.full(shape, options.init_q))  # q_i^r
        self.optimizer = torch.optim.SGD([self.self_strength, self.temperature], lr=options.server_lr)

    def mixing(self, client_ids: torch.Tensor) -> torch.Tensor:
        n = self.context.num_clients
        if self.rounds_seen == 0:
            return torch.full((self.num_layers, len(client_ids), n), 1.0 / n)
        is_self = F.one_hot(client_ids, n).bool()  # [S, N]
        layers = []
        for r, (lo, hi) in enumerate(layer_bounds(self.context.spec)):
            updates = F.normalize(self.latest_delta[:, lo:hi], dim=1)
            cosine = updates[client_ids] @ updates.T  # [S, N]
            logits = (self.temperature[client_ids, r].unsqueeze(1) * cosine).masked_fill(is_self, float("-inf"))
            others = torch.softmax(logits, dim=1)  # sums to 1 over j != i
            p = self.self_strength[client_ids, r].clamp_min(0.0).unsqueeze(1)
            layers.append((others + is_self * p) / (1.0 + p))
        return torch.stack(layers)

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        if self.rounds_seen > 0:  # round 0 is uniform: p and q played no part in what was sent
            regenerated = self.personalize(client_ids)
            hypergradient_step(self.optimizer, regenerated, delta / len(client_ids),
                               sign=self.options.hypergrad_sign)
        self.record_updates(client_ids, sent, delta)
