"""FLHA-GHN (Litany et al., 2022): federated learning across heterogeneous architectures with a graph hypernetwork.

Algorithm 1 of the paper, per round:
  the server shares the GHN weights (W_G, W_H) with the sampled clients;
  client c generates theta_c = GHN(A_c; W_G, W_H) for its own architecture graph A_c and updates its copy of the
  GHN end to end through its architecture for L local steps (Eq. 5);
  the server averages the clients' GHN weights: W <- 1/C sum_c W_c.
Inference (Sec. 4.2): the client generates its weights from the trained GHN and refines only the linear head for
one epoch on its local data.

The GHN (``nn/ghn.py``) and the architecture graph (``models/arch_graph.py``) are derived from the clients' models;
the server never sees an architecture: it averages same-sized GHN weights. BatchNorm: generated networks normalise
with the statistics of the batch they run on (``resnet-like`` keeps no running statistics), in training and in
evaluation, so no client statistics are estimated or exchanged. The paper's cosine learning-rate schedule is not
modelled: clients use ``train.lr`` throughout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, HeadTraining
from graphfed.client.training import train_clients
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.methods.fedavg import FedAvg, FedAvgOptions
from graphfed.models.base import TargetModel
from graphfed.models.family import ArchitectureFamily
from graphfed.nn.ghn import GeneratedNetwork, GraphHypernetwork, vocabulary


class FlhaGhnOptions(FedAvgOptions):
    gnn_layers: int = Field(default=6, ge=0, le=32, description="T, GraphConv layers of the GHN (0: no GNN, heads "
                            "read the one-hot layer features: the paper's Table 2 ablation)")
    latent: int = Field(default=51, ge=1, le=4096, description="latent size of the GNN")
    hidden: int = Field(default=16, ge=1, le=4096, description="hidden size of each layer-type head")
    heads: Literal["mlp", "linear"] = Field(default="mlp", description="mlp: the paper's 2-layer heads with scale; "
                                            "linear: one linear map per type (FedAvg's special case)")
    refine_epochs: float = Field(default=1.0, ge=0, le=100, description="inference: epochs refining only the "
                                 "generated linear head on local data (clients that trained)")
    refine_lr: float | None = Field(default=None, gt=0, description="lr of that refinement (default: train.lr)")


class FlhaGhn(FedAvg):
    adapters = ("refuses: it federates clients of different architectures (model.architectures), and a frozen base "
                "with adapters is one network (model.base does not apply to model.architectures)")
    name = "flha-ghn"
    summary = ("clients of different architectures train one shared graph hypernetwork through their own "
               "architecture graph; the server averages GHN weights")
    server_weighting = ("the GHN's weights: sample-weighted mean, FedAvg's rule (FLHA-GHN's clients train one shared "
                        "GHN, which plain FedAvg aggregates)")
    Options = FlhaGhnOptions
    architectures = "ghn"
    asynchronous_refusal = "its server averages the clients' GHN weights across architectures round by round"

    @classmethod
    def client_networks(cls, options: FlhaGhnOptions,  # type: ignore[override]
                        family: ArchitectureFamily) -> tuple[ParamSpec, torch.Tensor, list[TargetModel]]:
        # one head per layer type of the whole model family: fixed before training, whoever joins
        types = vocabulary([family.member(arch) for arch in family.catalogue])
        ghn = GraphHypernetwork(types, options.gnn_layers, options.latent, options.hidden, options.heads)
        networks: list[TargetModel] = [GeneratedNetwork(ghn, model) for model in family.models]
        spec = ParamSpec.from_module(networks[0])
        return spec, spec.flatten_module(networks[0]), networks

    @classmethod
    def client_rule(cls, options: FlhaGhnOptions, setting: ClientSetting) -> ClientRule:  # type: ignore[override]
        return GeneratedWeightsRule(setting, options.refine_epochs, options.refine_lr)

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        # Algorithm 1 averages the clients' GHN weights uniformly: W <- 1/C sum_c W_c
        self.global_weights = self.global_weights - self.server_lr * delta.mean(0)


def epoch_steps(counts: torch.Tensor, epochs: float, batch_size: int) -> torch.Tensor:
    """``[S]`` steps of ``epochs`` passes over each client's own rows in mini-batches of ``batch_size`` (at least 1)."""
    return (epochs * counts.double() / batch_size).ceil().clamp_min(1).long()


class GeneratedWeightsRule(ClientRule):
    """FLHA-GHN's client: trains its GHN copy (the network is a :class:`GeneratedNetwork`); evaluates its own
    architecture with generated weights, the head refined for ``refine_epochs`` if it took part in training
    (clients that never trained evaluate the generated weights as received)."""

    has_evaluation_network = True
    def __init__(self, setting: ClientSetting, refine_epochs: float, refine_lr: float | None) -> None:
        super().__init__(setting)
        self.refine_epochs, self.refine_lr = refine_epochs, refine_lr

    def evaluation_network(self, model: TargetModel, received: torch.Tensor, train: ClientSplit,
                           trained: torch.Tensor, seeds: Sequence[int],
                           ) -> tuple[TargetModel, ParamSpec, torch.Tensor]:
        if not isinstance(model, GeneratedNetwork):
            raise TypeError("flha-ghn's clients train a GeneratedNetwork (set model.architectures)")
        architecture = model.architecture
        spec = ParamSpec.from_module(architecture)
        with torch.no_grad():
            weights = spec.flatten(model.generate(self.spec.unflatten(received)), batch_dims=1)
        rows = torch.nonzero(trained).flatten()
        if not self.refine_epochs or not len(rows):
            return architecture, spec, weights
        # on the host, beside the client rows it groups
        steps = epoch_steps(train.counts[rows], self.refine_epochs, self.setting.training.batch_size).cpu()
        for count in steps.unique().tolist():  # one epoch of each client's own data, whoever it trains beside
            group = rows[steps == count]
            training = replace(self.setting.training, steps=count, lr=self.refine_lr or self.setting.training.lr,
                               feedback="none")
            setting = ClientSetting(spec, architecture.head_names, self.setting.task, self.setting.output_dim,
                                    training)
            weights[group] = train_clients(architecture, spec, weights[group], train.select(group),
                                           HeadTraining(setting), [seeds[i] for i in group.tolist()]).trained
        return architecture, spec, weights
