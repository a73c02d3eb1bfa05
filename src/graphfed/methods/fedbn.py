"""FedBN (Li et al., ICLR 2021, "FedBN: federated learning on non-IID features via local batch normalization"):
BatchNorm stays with each client.

Algorithm, per round: the server sends the global model; each sampled client trains every tensor for K SGD steps,
starting from the received tensors and its own BatchNorm tensors; it keeps its BatchNorm tensors and uploads the
rest; the server averages them (FedAvg). Each client evaluates with its own BatchNorm. graphfed's BatchNorm layers
normalise with batch statistics (no running buffers), so the BatchNorm tensors a client keeps are its affine scale
and shift; they never travel (bytes up exclude them). A model without BatchNorm is refused.
"""

from __future__ import annotations

from graphfed.client.contract import ClientRule, ClientSetting, PersonalPartsRule
from graphfed.errors import ConfigError
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class FedBN(FedAvg):
    name = "fedbn"
    summary = "FedAvg whose BatchNorm tensors stay on each client"
    server_weighting = ("sample-weighted mean of everything but BatchNorm, FedAvg's rule (FedBN's Algorithm 1 "
                        "averages the non-BN layers; its experiments give every client the same number of rows, where "
                        "the two weightings agree)")

    @classmethod
    def client_rule(cls, options: FedAvgOptions, setting: ClientSetting) -> ClientRule:
        if not setting.norm:
            raise ConfigError("FedBN needs a model with BatchNorm layers (e.g. model.name=cnn-bn or resnet-like)")
        return PersonalPartsRule(setting, setting.norm)
