"""FedProx (Li et al., MLSys 2020) and FedProx-FT.

Algorithm 1 (FedProx), per round t:
  server sends w^t to the sampled clients;
  client k approximately minimises h_k(w; w^t) = F_k(w) + mu/2 * ||w - w^t||^2 with K local SGD steps;
  server: w^{t+1} = sample-weighted mean of the clients' w_k^{t+1}.

FedProx-FT adds local fine-tuning before evaluation, as FedAvg-FT does for FedAvg: clients that trained take
K plain SGD steps from the global model; novel clients evaluate the global model as received.
"""

from __future__ import annotations

from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class FedProxOptions(FedAvgOptions):
    mu: float = Field(default=0.01, ge=0, description="proximal coefficient mu of mu/2 * ||w - w_global||^2")


class FedProx(FedAvg):
    name = "fedprox"
    summary = "FedAvg whose clients add the proximal term mu/2 * ||w - w_global||^2 to their local loss"
    server_weighting = ("sample-weighted mean, n_k / n. FedProx's Algorithm 2 samples devices with probability p_k = "
                        "n_k / n and takes their plain mean; graphfed samples clients uniformly, and under uniform "
                        "sampling the n_k / n weights give the same expected step")
    Options = FedProxOptions

    @classmethod
    def client_rule(cls, options: FedProxOptions, setting: ClientSetting) -> ClientRule:
        return ClientRule(setting, prox_mu=options.mu)


class FedProxFTOptions(FedProxOptions):
    finetune_steps: int | None = Field(default=None, ge=1, description="default: the local step count")


class FedProxFT(FedProx):
    name = "fedprox-ft"
    summary = "FedProx, then each trained client fine-tunes the global model locally before evaluation"
    Options = FedProxFTOptions

    @classmethod
    def client_rule(cls, options: FedProxFTOptions, setting: ClientSetting) -> ClientRule:
        return ClientRule(setting, prox_mu=options.mu,
                          eval_finetune_steps=options.finetune_steps or setting.training.steps)
