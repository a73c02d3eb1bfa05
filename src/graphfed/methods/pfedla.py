"""pFedLA (Ma et al., CVPR 2022, "Layer-wised Model Aggregation for Personalized Federated Learning").

The server holds every client's latest model theta_j and, per client i, a dedicated hypernetwork
HN_i(v_i; phi_i): the client's embedding v_i -> 3-layer MLP (ReLU) -> one linear head per target layer r:
  alpha_i^r = softmax_j(head_i^r(MLP_i(v_i)))                  layer-wise aggregation weights over all N
  theta'_i^r = sum_j alpha_ij^r theta_j^r                      sent to client i, which trains K steps
  phi_i, v_i <- phi_i, v_i - eta_hn (d theta'_i / d (phi_i, v_i))^T Delta theta_i     (hypergradient)
Defaults: embedding 100, hidden 100, eta_hn = 5e-3 (plain SGD), as the paper and FedAGHN's appendix.

Choices: the weights are a softmax over clients (the released code applies ReLU to U(0,1)-initialised
heads and divides by the sum, which can produce an all-zero vector); the per-client hypernetworks are
held batched as [N, ...] tensors, and as in the released code each one learns only from its own client's
delta (no division by the number of clients in the round). The aggregation spans all N stored models,
like the paper, whose server initialises every client's model identically. ``hypergrad_sign: released``
reproduces the released code's opposite sign (it backpropagates trained - sent), for comparison only.
The heterogeneity-aware variant (HeurpFedLA, top-K layers kept local) is not included.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from graphfed.core.hypergrad import hypergradient_step
from graphfed.methods.aggregation import PersonalizedAggregation
from graphfed.methods.base import MethodContext, MethodOptions


class PFedLAOptions(MethodOptions):
    embedding_dim: int = Field(default=100, ge=1, description="size of each client's embedding")
    hidden: int = Field(default=100, ge=1, description="hidden width of each client's hypernetwork")
    server_lr: float = Field(default=5e-3, gt=0, description="eta_hn, SGD without momentum")
    hypergrad_sign: Literal["descent", "released"] = Field(default="descent",
            description="descent: the sign that lowers the clients' loss; released: the released code's opposite sign")


class ClientHypernetworks(nn.Module):
    """N independent hypernetworks ``v_i -> [L, N]`` logits, batched: parameter ``k`` has shape ``[N, ...]``."""

    def __init__(self, num_clients: int, num_layers: int, embedding_dim: int, hidden: int,
                 generator: torch.Generator) -> None:
        super().__init__()
        self.num_layers, self.num_clients = num_layers, num_clients

        def uniform(*shape: int, fan_in: int) -> nn.Parameter:  # nn.Linear's default initialisation
            bound = 1.0 / math.sqrt(fan_in)
            draw = torch.rand(num_clients, *shape, generator=generator, device="cpu")  # the same on every device
            return nn.Parameter((draw.to(torch.get_default_device()) * 2 - 1) * bound)

        self.embeddings = nn.Parameter(torch.randn(num_clients, embedding_dim, generator=generator, device="cpu")
                                       .to(torch.get_default_device()))
        self.w1, self.b1 = uniform(hidden, embedding_dim, fan_in=embedding_dim), uniform(hidden, fan_in=embedding_dim)
        self.w2, self.b2 = uniform(hidden, hidden, fan_in=hidden), uniform(hidden, fan_in=hidden)
        self.w3, self.b3 = uniform(hidden, hidden, fan_in=hidden), uniform(hidden, fan_in=hidden)
        self.heads = uniform(num_layers * num_clients, hidden, fan_in=hidden)  # no bias, as released

    def forward(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``[L, S, N]`` aggregation weights of ``client_ids`` (softmax over clients, per layer)."""
        h = self.embeddings[client_ids]
        for w, b in ((self.w1, self.b1), (self.w2, self.b2), (self.w3, self.b3)):
            h = torch.relu(torch.einsum("sho,so->sh", w[client_ids], h) + b[client_ids])
        logits = torch.einsum("sko,so->sk", self.heads[client_ids], h)
        logits = logits.view(len(client_ids), self.num_layers, self.num_clients)
        return torch.softmax(logits, dim=-1).transpose(0, 1)


class PFedLA(PersonalizedAggregation):
    name = "pfedla"
    summary = "per-client hypernetworks generate layer-wise aggregation weights, learned by hypergradient"
    Options = PFedLAOptions

    def __init__(self, context: MethodContext, options: PFedLAOptions) -> None:
        super().__init__(context, options)
        self.options: PFedLAOptions = options
        self.hypernets = ClientHypernetworks(context.num_clients, self.num_layers, options.embedding_dim,
                                             options.hidden, self.generator)
        self.optimizer = torch.optim.SGD(self.hypernets.parameters(), lr=options.server_lr)

    def mixing(self, client_ids: torch.Tensor) -> torch.Tensor:
        return self.hypernets(client_ids)

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        # `sent` travelled to the clients detached: regenerate it with the graph to the hypernetworks.
        hypergradient_step(self.optimizer, self.personalize(client_ids), delta, sign=self.options.hypergrad_sign)
        self.record_updates(client_ids, sent, delta)
