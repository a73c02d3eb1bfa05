"""FedPer (Arivazhagan et al., 2019, "Federated learning with personalization layers"): a shared body, a personal
head.

Algorithm, per round: the server sends the global model; each sampled client trains body and its own head jointly
for K SGD steps (starting from the received body and the head it kept); it keeps the head and uploads the body;
the server averages the bodies (FedAvg). Each client evaluates the received body with its own head. Unlike FedRep
there is no head-first phase. "Head" is the model's declared output layer (``TargetModel.head_module``); bytes up
count the body only.
"""

from __future__ import annotations

from graphfed.client.contract import ClientRule, ClientSetting, PersonalPartsRule
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class FedPer(FedAvg):
    adapters = ("the head's adapter is the personal part and the body's adapters are averaged: give the adapter's "
                "targets a head (else it refuses, naming the head); the frozen base never travels")
    name = "fedper"
    summary = "shared body averaged by the server, personal head trained jointly with it on each client"
    server_weighting = ("the bodies: sample-weighted mean, FedAvg's rule (FedPer's server step is FedAvg's on the "
                        "base layers); heads are never averaged")

    @classmethod
    def client_rule(cls, options: FedAvgOptions, setting: ClientSetting) -> ClientRule:
        setting.require_head("FedPer")
        return PersonalPartsRule(setting, setting.head)
