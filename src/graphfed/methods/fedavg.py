"""FedAvg (McMahan et al., 2017) and FedAvg-FT (FedAvg + local fine-tuning before evaluation).

Algorithm: the server sends the global model to the sampled clients; each runs K local SGD steps; the
server moves the global model by the sample-weighted mean of the clients' changes.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from graphfed.attacks.defenses import Aggregation, robust_aggregate
from graphfed.client.contract import ClientRule, ClientSetting
from graphfed.methods.base import Method, MethodContext, MethodOptions


class FedAvgOptions(MethodOptions):
    server_lr: float = Field(default=1.0, gt=0, description="1.0 = plain FedAvg averaging")
    aggregation: Aggregation = Field(default="fedavg", description="how the server combines the updates, named as "
                                     "Flower's strategies: fedavg (sample-weighted mean), fedmedian, fedtrimmedavg, "
                                     "krum, multikrum (graphfed.attacks.defenses)")
    beta: float = Field(default=0.2, ge=0.0, lt=0.5, description="fedtrimmedavg: share cut from each end")
    num_malicious_nodes: int = Field(default=0, ge=0, description="krum/multikrum: f, the attackers tolerated")
    num_nodes_to_select: int = Field(default=1, ge=1, description="multikrum: updates averaged")
    clipping_norm: float | None = Field(default=None, gt=0, description="clip each update to this L2 norm before "
                                        "aggregating (Flower's fixed clipping, no noise); default: no clipping")


class FedAvg(Method):
    name = "fedavg"
    summary = "one global model, sample-weighted averaging of client updates"
    Options = FedAvgOptions
    #: every client is sent the one global model (a subclass that personalises what it sends says False: FedPAC)
    sends_global_model: ClassVar[bool] = True

    def __init__(self, context: MethodContext, options: FedAvgOptions, server_lr: float | None = None) -> None:
        super().__init__(context, options)
        self.options: FedAvgOptions = options
        self.global_weights = context.init_weights.clone()
        self.server_lr = options.server_lr if server_lr is None else server_lr

    def personalize(self, client_ids: torch.Tensor) -> torch.Tensor:
        return self.global_weights.unsqueeze(0).expand(len(client_ids), -1).clone()

    def eval_weights(self, client_ids: torch.Tensor) -> torch.Tensor:
        if not self.sends_global_model:
            return super().eval_weights(client_ids)
        # a read-only view: 1,000 clients of a 1.6M-parameter model would otherwise copy 6.4 GB per evaluation
        return self.global_weights.detach().unsqueeze(0).expand(len(client_ids), -1)

    #: the server learns from a round only through the mean update: central DP noises the clipped sum instead
    central_privacy_refusal = None

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        # delta = sent - trained, so subtracting the mean delta moves towards the clients' models.
        self.global_weights = self.global_weights - self.server_lr * self.aggregate(delta, metrics["num_examples"])

    def aggregate(self, updates: torch.Tensor, num_examples: torch.Tensor) -> torch.Tensor:
        """``[dim]``: the clients' updates (or any per-client rows the server averages) combined under the
        ``aggregation`` option (the sample-weighted mean by default; always, for a subclass whose options are not
        FedAvg's, e.g. pFedMe, whose ``beta`` is its own)."""
        options = self.options
        if not isinstance(options, FedAvgOptions):
            return robust_aggregate(updates, num_examples)
        return robust_aggregate(updates, num_examples, options.aggregation, options.beta, options.num_malicious_nodes,
                                options.num_nodes_to_select, options.clipping_norm)


class FedAvgFTOptions(FedAvgOptions):
    finetune_steps: int | None = Field(default=None, ge=1, description="default: the local step count")


class FedAvgFT(FedAvg):
    name = "fedavg-ft"
    summary = "FedAvg, then each trained client fine-tunes the global model locally before evaluation"
    Options = FedAvgFTOptions

    @classmethod
    def client_rule(cls, options: FedAvgFTOptions, setting: ClientSetting) -> ClientRule:
        # Clients that trained fine-tune the global model before evaluating; novel clients do not.
        return ClientRule(setting, eval_finetune_steps=options.finetune_steps or setting.training.steps)
