"""FedRep (Collins et al., ICML 2021): a shared representation (body) and a personal head per client.

Algorithm 1 (FedRep), per round t: the server sends the global body phi^t; each sampled client i
  1. keeps phi^t fixed and trains its own head h_i for ``head_steps`` SGD steps;
  2. keeps h_i fixed and trains the body for K steps;
  uploads only the body; the server takes the plain mean of the bodies over the sampled clients.
Each client evaluates the received body with its own head.

"Head" is the target model's declared output layer (``TargetModel.head_module``). Client state: the head,
created from the head in the first weights the client receives. The server's copy of the head stays at its
initialisation (clients upload no head; their head coordinates of the delta are zero) and is what a novel
client, which has no head of its own, evaluates with. Bytes up count the body only.
"""

from __future__ import annotations

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class FedRepOptions(FedAvgOptions):
    head_steps: int | None = Field(default=None, ge=0, description="SGD steps on the head before the body's K "
                                   "steps (default: K, as the paper's head epochs >= body epochs)")


class FedRepRule(ClientRule):
    evaluates_own_weights = True
    def __init__(self, setting: ClientSetting, head_steps: int) -> None:
        super().__init__(setting)
        setting.require_head("FedRep")
        self.head_steps = head_steps

    @property
    def total_steps(self) -> int:
        return self.head_steps + self.setting.training.steps

    @property
    def upload_dim(self) -> int:
        return self.setting.numel(self.setting.body)

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"head": self.setting.pack(self.spec.unflatten(received), self.setting.head).clone()}

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": {**received, **self.setting.unpack(state["head"], self.setting.head)}}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        model = require_grad(tracks["model"])
        losses = local.loss(model)
        phase = self.setting.head if local.index < self.head_steps else self.setting.body
        return {"model": local.descend(model, losses, names=phase)}, losses

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        model = tracks["model"]
        upload = {name: received[name] if name in self.setting.head else value for name, value in model.items()}
        return upload, {"head": self.setting.pack(model, self.setting.head)}

    def eval_weights(self, received: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.spec.flatten({**self.spec.unflatten(received), **self.setting.unpack(state["head"],
                                                                                          self.setting.head)},
                                 batch_dims=1)


class FedRep(FedAvg):
    adapters = ("the head's adapter is the personal part and the body's adapters are averaged: give the adapter's "
                "targets a head (else it refuses, naming the head); the frozen base never travels")
    name = "fedrep"
    summary = "shared body averaged by the server, personal head per client (head steps, then body steps)"
    server_weighting = ("the bodies: plain mean over the sampled clients, Collins et al. 2021, Algorithm 1 (phi <- 1 "
                        "/ (rn) sum_{i in I} phi_i); heads are never averaged")
    weighs_by_samples = False
    Options = FedRepOptions

    @classmethod
    def client_rule(cls, options: FedRepOptions, setting: ClientSetting) -> ClientRule:
        head_steps = setting.training.steps if options.head_steps is None else options.head_steps
        return FedRepRule(setting, head_steps)
