"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020): personalised FL as model-agnostic meta-learning.

Algorithm 1 (Per-FedAvg), per round: the server sends w; each sampled client runs tau local steps, each on
independent mini-batches D, D' (and D'' for the Hessian-free variant):
    temp = w - alpha * grad f(w; D)                                 (one adaptation step)
    first-order (FO):   w <- w - beta * grad f(temp; D')
    Hessian-free (HF):  w <- w - beta * (I - alpha * H f(w; D'')) grad f(temp; D')
                                      (H f(w; D'') v computed exactly as a Hessian-vector product)
  client uploads w; the server takes their plain mean over the sampled clients.
Evaluation: a client that trained adapts the received meta-model with ONE SGD step of lr alpha on its own
data (the paper's personalised model); novel clients evaluate the meta-model as received ("no fine-tuning").

Defaults: beta = 0.001 as in the paper; alpha = the run's local lr (``train.lr``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class PerFedAvgOptions(FedAvgOptions):
    variant: Literal["first_order", "hessian_free"] = Field(default="first_order",
                                                            description="FO or HF meta-gradient")
    alpha: float | None = Field(default=None, gt=0, description="adaptation step size (default: train.lr)")
    beta: float = Field(default=0.001, gt=0, description="meta step size")


class PerFedAvgRule(ClientRule):
    def __init__(self, setting: ClientSetting, options: PerFedAvgOptions) -> None:
        alpha = setting.training.lr if options.alpha is None else options.alpha
        super().__init__(setting, eval_finetune_steps=1, eval_finetune_lr=alpha)
        self.alpha, self.beta, self.variant = alpha, options.beta, options.variant
        self.batches_per_step = 3 if options.variant == "hessian_free" else 2

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        model = require_grad(tracks["model"])
        losses = local.loss(model, batch=0)
        temp = require_grad(local.descend(model, losses, self.alpha))
        meta_gradient = local.gradients(temp, local.loss(temp, batch=1))
        if self.variant == "hessian_free":
            # (I - alpha H) g with H the Hessian of f(w; D'') at w: g - alpha * d/dw <grad f(w; D''), g>
            model = require_grad(tracks["model"])
            gradient = local.gradients(model, local.loss(model, batch=2), create_graph=True)
            inner = sum((gradient[name] * meta_gradient[name].detach()).flatten(1).sum(1) for name in model)
            curvature = local.gradients(model, inner)  # type: ignore[arg-type]
            meta_gradient = {name: meta_gradient[name] - self.alpha * curvature[name] for name in model}
        with torch.no_grad():
            updated = {name: value.detach() - self.beta * meta_gradient[name] for name, value in model.items()}
        return {"model": updated}, losses.detach()


class PerFedAvg(FedAvg):
    name = "per-fedavg"
    summary = "MAML-style meta-model (FO or Hessian-free); each client evaluates it after one local step (alpha)"
    server_weighting = ("plain mean over the sampled clients: Fallah et al. 2020, Algorithm 1 (w <- 1 / (rn) sum_{i "
                        "in A} w_i)")
    weighs_by_samples = False
    Options = PerFedAvgOptions

    @classmethod
    def client_rule(cls, options: PerFedAvgOptions, setting: ClientSetting) -> ClientRule:
        return PerFedAvgRule(setting, options)
