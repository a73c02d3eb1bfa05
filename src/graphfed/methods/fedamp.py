"""FedAMP and HeurFedAMP (Huang et al., AAAI 2021, "Personalized Cross-Silo Federated Learning on Non-IID Data").

FedAMP, attentive message passing (paper Sec. 4, Eq. 6-7). Over every client's latest trained model w_j:
  xi_ij = alpha_k * A'(||w_i - w_j||^2) = (alpha_k / sigma) * exp(-||w_i - w_j||^2 / sigma)     j != i
  xi_ii = 1 - sum_{j != i} xi_ij
  u_i   = xi_ii w_i + sum_{j != i} xi_ij w_j                        the cloud model sent to client i
  client i minimises F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2    (``prox_mu = lambda / alpha_k``)
with A(x) = 1 - exp(-x / sigma), the paper's negative-exponential attention function.

H-FedAMP, the paper's heuristic for deep networks (Sec. 6), as FedAGHN compares it: a fixed self weight
  xi_ii = self_weight,   xi_ij = (1 - xi_ii) * softmax_{j != i}(sigma * cos(w_i, w_j)).

Defaults are FedAGHN's appendix settings (which follow Ye et al., 2023): FedAMP alpha_k = 100,
lambda = 1, sigma = 1e4; H-FedAMP sigma = 100, xi_ii = 0.05 (its CNN setting), lambda = 1, alpha_k = 1.
Choices: the message passing runs over the clients that have trained (the others hold only the initial
weights; with none, a client keeps its own model). If the FedAMP weights of the others ever sum past 1
(alpha_k / sigma * (N - 1) > 1 for near-identical models) they are rescaled to sum 1 and xi_ii = 0, so
the mixing stays a convex combination. Every layer uses the same weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting
from graphfed.methods.aggregation import PersonalizedAggregation
from graphfed.methods.base import MethodContext, MethodOptions


class FedAMPOptions(MethodOptions):
    alpha_k: float = Field(default=100.0, gt=0, description="step size of the attention message passing")
    sigma: float = Field(default=1e4, gt=0, description="scale of the attention function A(x) = 1 - exp(-x/sigma)")
    lam: float = Field(default=1.0, ge=0, description="lambda of the client's pull to its cloud model")


class HFedAMPOptions(MethodOptions):
    self_weight: float = Field(default=0.05, ge=0, le=1, description="fixed xi_ii")
    sigma: float = Field(default=100.0, gt=0, description="scale of the cosine similarity in the softmax")
    lam: float = Field(default=1.0, ge=0, description="lambda of the client's pull to its cloud model")
    alpha_k: float = Field(default=1.0, gt=0, description="divides lambda in the client's proximal term")


def _others(method: PersonalizedAggregation, client_ids: torch.Tensor) -> torch.Tensor:
    """``[S, N]`` bool: the clients j != i that have trained, the candidates of message passing."""
    return method.has_trained.unsqueeze(0) & ~method.is_self(client_ids)


class FedAMP(PersonalizedAggregation):
    name = "fedamp"
    summary = "attentive message passing: weights exp(-||w_i - w_j||^2 / sigma), self weight 1 - sum"
    Options = FedAMPOptions

    def __init__(self, context: MethodContext, options: FedAMPOptions) -> None:
        super().__init__(context, options)
        self.options: FedAMPOptions = options

    @classmethod
    def client_rule(cls, options: FedAMPOptions, setting: ClientSetting) -> ClientRule:
        return ClientRule(setting, prox_mu=options.lam / options.alpha_k)

    def attention(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``[S, N]`` rows xi_i: xi_ij for the others, 1 - sum on the diagonal."""
        opts = self.options
        squared = torch.cdist(self.client_weights[client_ids], self.client_weights).square()
        others = _others(self, client_ids)
        xi = torch.where(others, opts.alpha_k / opts.sigma * torch.exp(-squared / opts.sigma), 0.0)
        xi = xi / xi.sum(dim=1, keepdim=True).clamp_min(1.0)  # keep xi_ii >= 0
        is_self = self.is_self(client_ids).to(xi.dtype)
        return xi + is_self * (1.0 - xi.sum(dim=1, keepdim=True))

    def mixing(self, client_ids: torch.Tensor) -> torch.Tensor:
        return self.attention(client_ids).unsqueeze(0).expand(self.num_layers, -1, -1)


class HFedAMP(FedAMP):
    name = "h-fedamp"
    summary = "heuristic FedAMP: fixed self weight, softmax(sigma * cos(w_i, w_j)) over the others"
    Options = HFedAMPOptions

    options: HFedAMPOptions  # type: ignore[assignment]

    def attention(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``[S, N]`` rows: xi_ii = self_weight, the rest split by a softmax over cosine similarity."""
        models = F.normalize(self.client_weights, dim=1)
        cosine = models[client_ids] @ models.T
        others = _others(self, client_ids)
        logits = (self.options.sigma * cosine).masked_fill(~others, float("-inf"))
        has_others = others.any(dim=1, keepdim=True)
        shares = torch.softmax(logits.masked_fill(~has_others, 0.0), dim=1).masked_fill(~others, 0.0)
        self_weight = torch.where(has_others, self.options.self_weight, 1.0)  # alone: keep its own model
        is_self = self.is_self(client_ids).to(shares.dtype)
        return (1.0 - self_weight) * shares + self_weight * is_self
