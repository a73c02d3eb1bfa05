"""Ditto (Li et al., ICML 2021): fair and robust federated learning through personalisation.

Algorithm 1 (Ditto), per round t:
  server sends the global model w^t to the sampled clients;
  client k, for K local steps on its mini-batches:
      w_k   <- w_k - eta * grad F_k(w_k)                                (the global objective, from w^t)
      v_k   <- v_k - eta * (grad F_k(v_k) + lambda * (v_k - w^t))        (its personal model)
  client uploads w_k; server: w^{t+1} = sample-weighted mean of the w_k (FedAvg).
  Each client evaluates with its personal model v_k.

Client state: the personal model ``v`` (``[dim]`` per client), created from the global weights the first time
the client trains. Both models take their step on the same mini-batch (the reference code draws separate
batches for v; sharing them halves the data passes and changes nothing in expectation). Novel clients never
trained and have no v: they evaluate the global model as received.
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
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class DittoOptions(FedAvgOptions):
    lam: float = Field(default=1.0, ge=0, description="lambda: pull of the personal model to the global one")
    personal_lr: float | None = Field(default=None, gt=0, description="SGD lr of the personal model "
                                      "(default: train.lr)")


class DittoRule(PersonalModelRule):
    def __init__(self, setting: ClientSetting, lam: float, personal_lr: float | None) -> None:
        super().__init__(setting)
        self.lam = lam
        self.personal_lr = personal_lr

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": received, "personal": self.spec.unflatten(state["personal"])}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        model, personal = require_grad(tracks["model"]), require_grad(tracks["personal"])
        losses = local.loss(model)
        personal_objective = local.loss(personal) + 0.5 * self.lam * squared_distance(personal, received)
        return {"model": local.descend(model, losses),
                "personal": local.descend(personal, personal_objective, self.personal_lr)}, losses


class Ditto(FedAvg):
    name = "ditto"
    summary = "FedAvg global model + a personal model per client pulled towards it (lambda); clients evaluate theirs"
    server_weighting = ("the global model: sample-weighted mean of the clients' w_k, as FedAvg (Ditto's Algorithm 1 "
                        "aggregates w by FedAvg's rule); the personal models are never averaged")
    Options = DittoOptions

    @classmethod
    def client_rule(cls, options: DittoOptions, setting: ClientSetting) -> ClientRule:
        return DittoRule(setting, options.lam, options.personal_lr)
