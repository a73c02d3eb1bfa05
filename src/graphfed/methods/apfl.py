"""APFL (Deng, Kamani and Mahdavi, 2020, "Adaptive personalized federated learning").

Algorithm 1, per round: the server sends the global model w; each sampled client i, for K local steps on a
mini-batch, updates

    w   <- w - lr grad_w f_i(w)                                   (its copy of the global model)
    v_i <- v_i - lr grad_v f_i(alpha_i v_i + (1 - alpha_i) w)    (its personal model, through the mixture)
    alpha_i <- clip_[0,1]( alpha_i - alpha_lr grad_alpha f_i(alpha_i v_i + (1 - alpha_i) w) )

uploads the change of w, and keeps v_i and alpha_i (its state; v_i starts as the first model it receives, alpha_i
at ``alpha``). The server takes the plain mean of the updates. A client evaluates with its mixture
``alpha_i v_i + (1 - alpha_i) w`` of its personal model and the model it receives; alpha_i grows where the global
model serves the client badly.
"""

from __future__ import annotations

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class ApflOptions(FedAvgOptions):
    alpha: float = Field(default=0.25, ge=0, le=1, description="each client's first mixing weight alpha_i")
    alpha_lr: float | None = Field(default=None, gt=0, description="step size of alpha (default: train.lr)")


class ApflRule(ClientRule):
    evaluates_own_weights = True

    def __init__(self, setting: ClientSetting, alpha: float, alpha_lr: float | None) -> None:
        super().__init__(setting)
        self.alpha, self.alpha_lr = alpha, alpha_lr or setting.training.lr

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"personal": received.clone(), "alpha": torch.full((len(received), 1), self.alpha,
                                                                  device=received.device)}

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": received, "personal": self.spec.unflatten(state["personal"]),
                "alpha": {"alpha": state["alpha"]}}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        model = require_grad(tracks["model"])
        losses = local.loss(model)
        new_model = local.descend(model, losses)
        personal = require_grad(tracks["personal"])
        alpha = tracks["alpha"]["alpha"].detach().requires_grad_(True)
        mixture = {name: mix(alpha, personal[name], model[name].detach()) for name in personal}
        grads = local.gradients({**personal, "alpha": alpha}, local.loss(mixture))
        with torch.no_grad():
            new_personal = {name: value - local.lr * grads[name] for name, value in personal.items()}
            new_alpha = (alpha - self.alpha_lr * grads["alpha"]).clamp(0.0, 1.0)
        return {"model": new_model, "personal": new_personal, "alpha": {"alpha": new_alpha}}, losses

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        return tracks["model"], {"personal": self.spec.flatten(tracks["personal"], batch_dims=1),
                                 "alpha": tracks["alpha"]["alpha"]}

    def eval_weights(self, received: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return state["alpha"] * state["personal"] + (1 - state["alpha"]) * received


def mix(alpha: torch.Tensor, personal: torch.Tensor, model: torch.Tensor) -> torch.Tensor:
    """``alpha v + (1 - alpha) w`` with each client's ``alpha [S, 1]`` broadcast over a tensor ``[S, ...]``."""
    weight = alpha.view(-1, *[1] * (personal.ndim - 1))
    return weight * personal + (1 - weight) * model


class Apfl(FedAvg):
    name = "apfl"
    summary = "each client mixes a personal model with the global one by a learned weight alpha_i"
    server_weighting = ("the global model: plain mean over the sampled clients, Deng et al. 2020, Algorithm 1 (w <- 1 "
                        "/ K sum_{j in U} w_j); the personal models and each alpha_i stay with their client")
    weighs_by_samples = False
    Options = ApflOptions

    @classmethod
    def client_rule(cls, options: ApflOptions, setting: ClientSetting) -> ClientRule:
        return ApflRule(setting, options.alpha, options.alpha_lr)
