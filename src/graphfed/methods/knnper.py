"""KNN-Per (Marfoq et al., ICML 2022): personalised FL through local memorisation.

Algorithm: train one global model with FedAvg. Each client keeps a datastore of its own training rows
represented by the global model's features phi(x) (the input of the model's head). A client predicts
    p(y | x) = lam * p_kNN(y | x) + (1 - lam) * p_global(y | x),
    p_kNN(y | x) ~ sum over the k nearest stored rows (x', y') of exp(-||phi(x) - phi(x')|| / sigma) [y' = y]
(regression: the same weights average the neighbours' targets). Nothing but the FedAvg model is learned; the
datastore is rebuilt from the current global model whenever the client evaluates.

The paper selects lam and k per client on validation data; here they are options (k = 10 as in its
experiments, lam = 0.5, sigma = 1). Novel clients have no datastore from training ("no fine-tuning"): they
predict with the global model alone.
"""

from __future__ import annotations

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, Weights
from graphfed.data.federation import ClientSplit
from graphfed.methods.fedavg import FedAvg, FedAvgOptions
from graphfed.models.base import TargetModel


class KNNPerOptions(FedAvgOptions):
    k: int = Field(default=10, ge=1, description="neighbours in the client's datastore")
    lam: float = Field(default=0.5, ge=0, le=1, description="weight of the kNN prediction in the interpolation")
    sigma: float = Field(default=1.0, gt=0, description="distance scale of the neighbours' weights")


class KNNPerRule(ClientRule):
    has_eval_forward = True
    def __init__(self, setting: ClientSetting, options: KNNPerOptions) -> None:
        super().__init__(setting)
        self.k, self.lam, self.sigma = options.k, options.lam, options.sigma

    def eval_forward(self, model: TargetModel, weights: Weights, x: torch.Tensor, train: ClientSplit,
                     state: dict[str, torch.Tensor]) -> torch.Tensor:
        query = model.batched_forward(weights, x, features_only=True)  # [S, B, F]
        datastore = train.padded()  # each client's whole training split: its datastore
        stored = model.batched_forward(weights, datastore.x, features_only=True)  # [S, M, F]
        outputs = model.batched_head(weights, query)
        distance = torch.cdist(query, stored).masked_fill(~datastore.mask.unsqueeze(1), float("inf"))  # [S, B, M]
        k = min(self.k, distance.shape[-1])
        nearest, index = distance.topk(k, dim=-1, largest=False)
        vote = torch.softmax(-nearest / self.sigma, dim=-1)  # a neighbour at infinite distance gets weight 0
        has_rows = (train.counts > 0).view(-1, 1, 1)
        if self.setting.task == "classification":
            neighbours = torch.gather(datastore.y.unsqueeze(1).expand(-1, query.shape[1], -1), 2, index)
            knn = torch.zeros_like(outputs).scatter_add_(2, neighbours, vote)
            mixed = self.lam * knn + (1 - self.lam) * torch.softmax(outputs, dim=-1)
            return torch.where(has_rows, mixed.clamp_min(1e-12).log(), outputs)  # log-probabilities as logits
        targets = datastore.y.flatten(2)  # [S, M, out]
        neighbour_targets = torch.gather(targets.unsqueeze(1).expand(-1, query.shape[1], -1, -1), 2,
                                         index.unsqueeze(-1).expand(-1, -1, -1, targets.shape[-1]))
        knn = (vote.unsqueeze(-1) * neighbour_targets).sum(2)
        return torch.where(has_rows, self.lam * knn + (1 - self.lam) * outputs, outputs)


class KNNPer(FedAvg):
    name = "knn-per"
    summary = "FedAvg model interpolated with a kNN vote over each client's own training features"
    server_weighting = ("sample-weighted mean, FedAvg's rule (kNN-Per trains a FedAvg model; the kNN part stays on "
                        "each client)")
    Options = KNNPerOptions

    @classmethod
    def client_rule(cls, options: KNNPerOptions, setting: ClientSetting) -> ClientRule:
        return KNNPerRule(setting, options)
