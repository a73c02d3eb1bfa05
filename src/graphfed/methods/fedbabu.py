"""FedBABU (Oh et al., ICLR 2022, "FedBABU: towards enhanced representation for federated image classification"):
train the body with the head frozen at its random initialisation; fine-tune the head before evaluation.

Algorithm, per round: the server sends the global model; each sampled client trains the body only for K SGD steps
(the head stays as received: the random initialisation, which no one ever changes); it uploads the body; the server
averages the bodies (FedAvg), so its head remains bit-identical to the initialisation. For evaluation each client
that trained fine-tunes the head alone for ``finetune_steps`` SGD steps on its training rows (the body as
received) and is scored with that. Bytes up count the body only.
"""

from __future__ import annotations

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class FedBABUOptions(FedAvgOptions):
    finetune_steps: int | None = Field(default=None, ge=1, description="head fine-tuning steps before evaluation "
                                       "(default: the local step count)")
    finetune_lr: float | None = Field(default=None, gt=0, description="default: train.lr")


class FedBABURule(ClientRule):
    finetunes_head_only = True

    def __init__(self, setting: ClientSetting, finetune_steps: int, finetune_lr: float | None) -> None:
        super().__init__(setting, eval_finetune_steps=finetune_steps, eval_finetune_lr=finetune_lr)
        setting.require_head("FedBABU")

    @property
    def upload_dim(self) -> int:
        return self.setting.numel(self.setting.body)

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        model = require_grad(tracks["model"])
        losses = local.loss(model)
        return {"model": local.descend(model, losses, names=self.setting.body)}, losses


class FedBABU(FedAvg):
    adapters = ("the body's adapters train and are averaged while the head's adapter stays as it started, which each "
                "client then fine-tunes: give the adapter's targets a head (else it refuses, naming the head)")
    name = "fedbabu"
    summary = "body trained with the head frozen at its random initialisation; head fine-tuned before evaluation"
    server_weighting = ("the bodies: sample-weighted mean, FedAvg's rule (FedBABU's server is FedAvg's with the head "
                        "frozen)")
    Options = FedBABUOptions

    @classmethod
    def client_rule(cls, options: FedBABUOptions, setting: ClientSetting) -> ClientRule:
        return FedBABURule(setting, options.finetune_steps or setting.training.steps, options.finetune_lr)
