"""FedRoD (Chen & Chao, ICLR 2022): one body, a generic head and a personal head per client.

Algorithm (FedRoD with linear personal heads), per round: the server sends the body + generic head;
each sampled client, on every local step's mini-batch,
  - trains body + generic head with the balanced softmax loss (logits + log of its own label counts), so the
    generic model learns the class-balanced objective every client shares;
  - trains its personal head on the task loss of  generic logits + personal logits, with the body and the
    generic head held fixed (they are detached).
  Clients upload body + generic head; the server averages them (FedAvg).
Each client evaluates body -> generic head + personal head. Both heads are linear, so their logits add up to
a linear layer whose weights are the sum: the evaluated model is the target model with head = generic +
personal. Regression has no class prior; there the generic loss is the plain task loss.

Client state: the personal head, zero at first (so a client's first personalised model is the generic one;
the reference code starts it as a copy of the head, which doubles the initial logits). Novel clients have no
personal head and evaluate the generic model as received.
"""

from __future__ import annotations

import torch

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.errors import ConfigError
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class FedRoDRule(ClientRule):
    evaluates_own_weights = True
    uses_label_counts = True

    def __init__(self, setting: ClientSetting) -> None:
        super().__init__(setting)
        if not setting.head:
            raise ConfigError("FedRoD needs a model that declares its head (TargetModel.head_module)")
        if setting.task != "classification":
            raise ConfigError("FedRoD trains its generic model with a balanced softmax over each client's class "
                              "counts: it needs a classification task")

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"personal_head": torch.zeros(len(received), self.setting.numel(self.setting.head),
                                             device=received.device)}

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": received, "personal_head": self.setting.unpack(state["personal_head"], self.setting.head)}

    def personalised(self, generic: Weights, personal_head: Weights) -> Weights:
        return {name: value + personal_head[name] if name in personal_head else value
                for name, value in generic.items()}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        generic = require_grad(tracks["model"])
        outputs = local.outputs(generic)
        losses = local.loss(generic, outputs=outputs)
        if local.task == "classification" and local.label_counts is not None:
            prior = local.label_counts.clamp_min(1e-12).log().unsqueeze(1)  # [S, 1, classes]
            balanced = local.loss(generic, outputs=outputs + prior)
        else:
            balanced = losses
        head = require_grad(tracks["personal_head"])
        frozen = {name: value.detach() for name, value in generic.items()}
        personal_losses = local.loss(self.personalised(frozen, head))
        return {"model": local.descend(generic, balanced),
                "personal_head": local.descend(head, personal_losses)}, losses.detach()

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        return tracks["model"], {"personal_head": self.setting.pack(tracks["personal_head"], self.setting.head)}

    def eval_weights(self, received: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        head = self.setting.unpack(state["personal_head"], self.setting.head)
        return self.spec.flatten(self.personalised(self.spec.unflatten(received), head), batch_dims=1)


class FedRoD(FedAvg):
    name = "fedrod"
    summary = "generic model trained with balanced softmax + a personal linear head per client on top of it"
    server_weighting = ("body and generic head: sample-weighted mean, FedAvg's rule (FedRoD's server is FedAvg's); "
                        "personal heads are never averaged")
    Options = FedAvgOptions

    @classmethod
    def client_rule(cls, options: FedAvgOptions, setting: ClientSetting) -> ClientRule:
        return FedRoDRule(setting)
