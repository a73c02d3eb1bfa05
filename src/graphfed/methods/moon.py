"""MOON (Li et al., CVPR 2021, "Model-contrastive federated learning").

Algorithm 1, per round: the server sends the global model; each sampled client trains it for K SGD steps on

    loss = task loss + mu * l_con,
    l_con = -log( exp(sim(z, z_glob) / tau) / (exp(sim(z, z_glob) / tau) + exp(sim(z, z_prev) / tau)) )

per row, where z is the row's representation under the model being trained, z_glob under the received global
model and z_prev under the client's own model of its previous round (frozen; the received model the first time),
and sim is cosine similarity; it keeps its trained model as the next round's z_prev and uploads the update; the
server averages (FedAvg). The representation is what the head reads (``TargetModel.features``; the paper uses a
projection head on top of it, left out here). Client state: the previous local model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class MoonOptions(FedAvgOptions):
    mu: float = Field(default=1.0, ge=0, description="weight of the model-contrastive term")
    temperature: float = Field(default=0.5, gt=0, description="tau of the contrastive softmax")


def contrastive_term(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """``[S]``: MOON's l_con averaged over each client's rows (``z*``: ``[S, B, F]``)."""
    positive = F.cosine_similarity(z, z_global, dim=-1) / temperature
    negative = F.cosine_similarity(z, z_previous, dim=-1) / temperature
    # -log(e^p / (e^p + e^n)) = logsumexp(p, n) - p
    return (torch.logsumexp(torch.stack([positive, negative]), dim=0) - positive).mean(-1)


class MoonRule(ClientRule):
    def __init__(self, setting: ClientSetting, mu: float, temperature: float) -> None:
        super().__init__(setting)
        self.mu, self.temperature = mu, temperature

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"previous": received.clone()}

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": received, "previous": self.spec.unflatten(state["previous"])}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        model = require_grad(tracks["model"])
        losses = local.loss(model)
        with torch.no_grad():
            z_global, z_previous = local.features(received), local.features(tracks["previous"])
        term = contrastive_term(local.features(model), z_global, z_previous, self.temperature)
        return {**tracks, "model": local.descend(model, losses + self.mu * term)}, losses

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        model = tracks["model"]
        return model, {"previous": self.spec.flatten({k: v.detach() for k, v in model.items()}, batch_dims=1)}


class Moon(FedAvg):
    name = "moon"
    summary = "FedAvg whose clients add a model-contrastive term: closer to the global representation than to their own"
    server_weighting = "sample-weighted mean, |D_i| / |D| (Li et al. 2021, MOON's Algorithm 1)"
    Options = MoonOptions

    @classmethod
    def client_rule(cls, options: MoonOptions, setting: ClientSetting) -> ClientRule:
        return MoonRule(setting, options.mu, options.temperature)
