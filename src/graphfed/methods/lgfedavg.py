"""LG-FedAvg (Liang et al., 2020, "Think locally, act globally: federated learning with local and global
representations"): personal local representations (the body), a shared global head.

Algorithm, per round: the server sends the global model; each sampled client trains its own body and the received
head jointly for K SGD steps; it keeps the body and uploads the head; the server averages the heads (FedAvg). Each
client evaluates its own body with the received head. The server's body stays at its initialisation (no client
uploads one) and is what a novel client evaluates with. Bytes up count the head only.
"""

from __future__ import annotations

from graphfed.client.contract import ClientRule, ClientSetting, PersonalPartsRule
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class LGFedAvg(FedAvg):
    adapters = ("the head's adapter is averaged and the body's adapters stay personal: give the adapter's targets a "
                "head (else it refuses, naming the head)")
    name = "lg-fedavg"
    summary = "personal body on each client, shared head averaged by the server"
    server_weighting = ("the heads: sample-weighted mean, FedAvg's rule (LG-FedAvg averages the global layers as "
                        "FedAvg); bodies are never averaged")

    @classmethod
    def client_rule(cls, options: FedAvgOptions, setting: ClientSetting) -> ClientRule:
        setting.require_head("LG-FedAvg")
        return PersonalPartsRule(setting, setting.body)
