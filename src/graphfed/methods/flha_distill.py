"""FLHA-distillation: FLHA-GHN's distillation baseline (Litany et al., 2022, Sec. 5.1 and appendix E).

A variant of Lin et al. (2020) that needs neither public data nor the clients' architectures:
  1. FedAvg trains one shared teacher architecture on all clients (``teacher``, by default ``arch0``);
  2. each client distils the trained teacher into its own architecture on its local data only, with
     loss = alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE(student, y),
     T = 20 and alpha = 0.7 (the paper's values).
The student starts from its architecture's seeded initialisation and is distilled at each evaluation from the
teacher of that round, for ``distill_steps`` mini-batch steps (run it with ``train.eval_every`` = the rounds: only
the final teacher matters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.client.training import train_clients
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.errors import ConfigError
from graphfed.methods.fedavg import FedAvg, FedAvgOptions
from graphfed.models.base import TargetModel
from graphfed.models.family import ArchitectureFamily


class FlhaDistillOptions(FedAvgOptions):
    teacher: str = Field(default="arch0", description="the shared architecture FedAvg trains (a member of the "
                         "model family)")
    temperature: float = Field(default=20.0, gt=0, description="T of the distillation softmax")
    alpha: float = Field(default=0.7, ge=0, le=1, description="weight of the distillation term (1 - alpha: labels)")
    distill_steps: int = Field(default=500, ge=1, description="local distillation steps into the client's own "
                               "architecture")


class FlhaDistill(FedAvg):
    adapters = ("refuses: it federates clients of different architectures (model.architectures), and a frozen base "
                "with adapters is one network (model.base does not apply to model.architectures)")
    name = "flha-distill"
    summary = "FedAvg trains a shared teacher architecture; each client distils it into its own architecture"
    server_weighting = ("the teacher: sample-weighted mean, FedAvg's rule; each client's own network is distilled "
                        "locally, never averaged")
    Options = FlhaDistillOptions
    architectures = "teacher"

    @classmethod
    def client_networks(cls, options: FlhaDistillOptions,  # type: ignore[override]
                        family: ArchitectureFamily) -> tuple[ParamSpec, torch.Tensor, list[TargetModel]]:
        if options.teacher not in family.catalogue:
            raise ConfigError(f"method.options.teacher: unknown architecture {options.teacher!r}; allowed: "
                             f"{', '.join(family.catalogue)}")
        teacher = family.member(options.teacher)
        spec = ParamSpec.from_module(teacher)
        return spec, spec.flatten_module(teacher), [teacher] * len(family.models)

    @classmethod
    def client_rule(cls, options: FlhaDistillOptions, setting: ClientSetting) -> ClientRule:  # type: ignore[override]
        return TeacherRule(setting, options)


class Distillation(ClientRule):
    """The student's local step: KD from the teacher weights each client received (``broadcast["teacher"]``)."""

    def __init__(self, setting: ClientSetting, teacher: TargetModel, teacher_spec: ParamSpec,
                 options: FlhaDistillOptions) -> None:
        super().__init__(setting)
        self.teacher, self.teacher_spec, self.options = teacher, teacher_spec, options

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        student = require_grad(tracks["model"])
        x = local.batches[0][0]
        outputs = local.outputs(student)
        with torch.no_grad():
            teacher_logits = self.teacher.batched_forward(self.teacher_spec.unflatten(local.broadcast["teacher"]), x)
        temperature, alpha = self.options.temperature, self.options.alpha
        # per client: sum over classes, mean over the batch (KL's "batchmean")
        soft = F.kl_div(F.log_softmax(outputs / temperature, -1), F.log_softmax(teacher_logits / temperature, -1),
                        reduction="none", log_target=True).sum(-1).mean(-1)
        losses = local.loss(student, outputs=outputs)
        objective = alpha * temperature**2 * soft + (1 - alpha) * losses
        return {"model": local.descend(student, objective)}, losses


class TeacherRule(ClientRule):
    """Trains the shared teacher (plain SGD); evaluates the client's own architecture distilled from it."""

    has_evaluation_network = True
    def __init__(self, setting: ClientSetting, options: FlhaDistillOptions) -> None:
        super().__init__(setting)
        self.options = options

    def evaluation_network(self, model: TargetModel, received: torch.Tensor, train: ClientSplit,
                           trained: torch.Tensor, seeds: Sequence[int],
                           ) -> tuple[TargetModel, ParamSpec, torch.Tensor]:
        student = self.setting.architecture or model  # None: the client runs the teacher's architecture itself
        spec = ParamSpec.from_module(student)
        training = replace(self.setting.training, steps=self.options.distill_steps, feedback="none")
        setting = ClientSetting(spec, student.head_names, self.setting.task, self.setting.output_dim, training)
        start = spec.flatten_module(student).unsqueeze(0).repeat(len(received), 1)
        distilled = train_clients(student, spec, start, train, Distillation(setting, model, self.spec, self.options),
                                  seeds, broadcast={"teacher": received}).trained
        return student, spec, distilled
