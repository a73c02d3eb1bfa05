"""pFedMe (T. Dinh et al., NeurIPS 2020): personalised FL with Moreau envelopes.

Algorithm 1 (pFedMe), per round t:
  server sends w^t; each sampled client sets its local model w = w^t;
  for each of the R local steps (mini-batch D):
      theta <- approximate argmin_theta f(theta; D) + lambda/2 * ||theta - w||^2
               (K steps of SGD with the personal lr, starting from the previous theta)
      w     <- w - eta * lambda * (w - theta)
  client uploads w; server: w^{t+1} = (1 - beta) * w^t + beta * mean_k w_k   (beta = 1 is FedAvg).
  Each client evaluates with its personalised theta.

Client state: theta after the round (what it evaluates with). theta starts each round at the received w^t,
as in the reference code. The K inner steps solve the Moreau envelope on the step's one mini-batch; the round
keeps R = ``train.local_steps`` outer steps. Novel clients have no theta and evaluate w^t as received.
Defaults as in the paper's MNIST setting: lambda = 15, K = 5, personal lr 0.09, beta = 1.
"""

from __future__ import annotations

import torch
from pydantic import Field

from graphfed.client.contract import (
    ClientRule,
    ClientSetting,
    LocalStep,
    PersonalModelRule,
    Weights,
    require_grad,
    squared_distance,
)
from graphfed.methods.base import MethodContext, MethodOptions
from graphfed.methods.fedavg import FedAvg


class PFedMeOptions(MethodOptions):
    lam: float = Field(default=15.0, gt=0, description="lambda of the Moreau envelope")
    inner_steps: int = Field(default=5, ge=1, description="K: SGD steps solving for theta per local step")
    personal_lr: float = Field(default=0.09, gt=0, description="SGD lr of the inner problem (theta)")
    beta: float = Field(default=1.0, gt=0, description="server mixing: w <- (1-beta) w + beta * mean(w_k)")


class PFedMeRule(PersonalModelRule):
    def __init__(self, setting: ClientSetting, options: PFedMeOptions) -> None:
        super().__init__(setting)
        self.lam, self.inner_steps, self.personal_lr = options.lam, options.inner_steps, options.personal_lr

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": received, "personal": received}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        model = tracks["model"]
        personal = tracks["personal"]
        losses = torch.zeros(0, device=next(iter(model.values())).device)
        # The Moreau envelope's inner problem, on this step's mini-batch: part of one local step, not a loop
        # over data.
        for inner in range(self.inner_steps):
            personal = require_grad(personal)
            data_loss = local.loss(personal)
            if inner == 0:
                losses = data_loss.detach()
            objective = data_loss + 0.5 * self.lam * squared_distance(personal, model)
            personal = local.descend(personal, objective, self.personal_lr)
        with torch.no_grad():
            model = {name: value - local.lr * self.lam * (value - personal[name]) for name, value in model.items()}
        return {"model": model, "personal": personal}, losses


class PFedMe(FedAvg):
    name = "pfedme"
    summary = "Moreau-envelope personalisation: personal theta solved per step, local w pulled to it, beta mixing"
    server_weighting = ("plain mean over the sampled clients, then beta-mixing: Dinh et al. 2020, Algorithm 1 (w <- "
                        "(1 - beta) w + beta sum_{i in S} w_i / S); the authors' released code weighs by training "
                        "rows instead")
    weighs_by_samples = False
    Options = PFedMeOptions

    def __init__(self, context: MethodContext, options: PFedMeOptions) -> None:
        # the server's beta-mixing is FedAvg's step with server_lr = beta
        super().__init__(context, options, server_lr=options.beta)  # type: ignore[arg-type]

    @classmethod
    def client_rule(cls, options: PFedMeOptions, setting: ClientSetting) -> ClientRule:
        return PFedMeRule(setting, options)
