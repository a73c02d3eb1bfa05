"""FedALA (Zhang et al., AAAI 2023): adaptive local aggregation of the global model into the local one.

Algorithm 1 (FedALA), per round t, client i receives the global model Theta^t and holds its local model
Theta_i^{t-1} (from its last round):
  ALA: for the top p parameter tensors, Theta_hat = Theta_i + (Theta^t - Theta_i) * W_i (element-wise W_i in
       [0, 1]); lower tensors take Theta^t. W_i is learned on local data: W <- clip(W - eta * dL/dW, 0, 1).
  local training: K SGD steps from Theta_hat; the trained model is uploaded and becomes Theta_i^t.
  server: FedAvg over the uploaded models.
Each client evaluates its own latest local model Theta_i.

Client state: the local model and W (ones at first). A client training for the first time has no local model:
Theta_i = Theta^t, so ALA changes nothing, as in the paper's first iteration. The paper trains W on s % of the
local data (``rand_percent``) until convergence in its first real round and for one pass afterwards; here the
ALA phase is ceil(s/100 * K) steps every round, on mini-batches drawn like the training ones (K local steps
standing for the paper's one local epoch). Defaults p = 2 tensors (the output layer), s = 80, eta = 1.
Novel clients have no local model and evaluate the global model as received.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class FedALAOptions(FedAvgOptions):
    layer_index: int = Field(default=2, ge=1, description="p: ALA applies to the last p parameter tensors")
    rand_percent: float = Field(default=80.0, ge=0, le=100, description="s: ALA steps = ceil(s/100 * K)")
    eta: float = Field(default=1.0, gt=0, description="learning rate of the ALA weights W")


class FedALARule(ClientRule):
    evaluates_own_weights = True
    def __init__(self, setting: ClientSetting, top: tuple[str, ...], rand_percent: float, eta: float) -> None:
        super().__init__(setting)
        self.top = top  # the tensors ALA blends; the others take the global model's
        self.eta = eta
        self.ala_steps = math.ceil(rand_percent / 100 * setting.training.steps)

    @property
    def total_steps(self) -> int:
        return self.ala_steps + self.setting.training.steps

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"local": received.clone(),
                "ala": torch.ones(len(received), self.setting.numel(self.top), device=received.device)}

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        local = self.spec.unflatten(state["local"])
        ala = self.setting.unpack(state["ala"], self.top)
        return {"model": self.aggregate(received, local, ala), "local": local, "ala": ala}

    def aggregate(self, received: Weights, local: Weights, ala: Weights) -> Weights:
        """Theta_hat: the global model below, Theta_i + (Theta^t - Theta_i) * W on the top tensors."""
        return {name: local[name] + (value - local[name]) * ala[name] if name in ala else value
                for name, value in received.items()}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        if local.index < self.ala_steps:  # the ALA phase learns W; the model follows it
            ala = require_grad(tracks["ala"])
            losses = local.loss(self.aggregate(received, tracks["local"], ala))
            ala = {name: value.clamp(0.0, 1.0) for name, value in local.descend(ala, losses, self.eta).items()}
            model = self.aggregate(received, tracks["local"], ala)
            return {**tracks, "model": model, "ala": ala}, losses.detach()
        model = require_grad(tracks["model"])
        losses = local.loss(model)
        return {**tracks, "model": local.descend(model, losses)}, losses

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        model = tracks["model"]
        return model, {"local": self.spec.flatten(model, batch_dims=1),
                       "ala": self.setting.pack(tracks["ala"], self.top)}

    def eval_weights(self, received: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return state["local"]


class FedALA(FedAvg):
    name = "fedala"
    summary = "FedAvg whose clients blend the global model into their local one with learned element-wise weights"
    server_weighting = ("sample-weighted mean, FedAvg's rule (FedALA's server is FedAvg's; the adaptive aggregation "
                        "happens on each client)")
    Options = FedALAOptions

    @classmethod
    def client_rule(cls, options: FedALAOptions, setting: ClientSetting) -> ClientRule:
        names = setting.spec.names
        return FedALARule(setting, tuple(names[-min(options.layer_index, len(names)):]), options.rand_percent,
                          options.eta)
