"""FedAvg (McMahan et al., 2017) and FedAvg-FT (FedAvg + local fine-tuning before evaluation).

Algorithm: the server sends the global model to the sampled clients; each runs K local SGD steps; the
server moves the global model by the sample-weighted mean of the clients' changes. With ``server_optimizer``
the mean change is a pseudo-gradient for a server optimiser (FedOpt, Reddi et al., ICLR 2021: FedAvgM, FedAdam,
FedYogi, FedAdagrad), for FedAvg and every method built on its server step (FedProx, Ditto, FedRep, ...).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field, field_validator

from graphfed.attacks.defenses import Aggregation, robust_aggregate
from graphfed.client.contract import ClientRule, ClientSetting
from graphfed.core.optim import Yogi
from graphfed.core.params import TensorSpec
from graphfed.errors import ConfigError
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
    server_optimizer: Literal["sgd", "momentum", "adam", "yogi", "adagrad"] = Field(
        default="sgd", description="FedOpt (Reddi et al., 2021): how the server applies the aggregated update, as "
        "a pseudo-gradient: sgd (FedAvg: x -= server_lr * update), momentum (FedAvgM), adam (FedAdam), yogi "
        "(FedYogi), adagrad (FedAdagrad); server_lr is the optimiser's learning rate")
    server_momentum: float = Field(default=0.9, ge=0, lt=1, description="momentum: the server's momentum")
    server_betas: list[float] = Field(default_factory=lambda: [0.9, 0.99], min_length=2, max_length=2,
                                      description="adam / yogi: [beta1, beta2]")
    server_tau: float = Field(default=1e-3, gt=0, description="adam / yogi / adagrad: the adaptivity tau (eps)")
    lora_aggregation: Literal["factors", "product"] = Field(
        default="factors", description="LoRA adapters (model.options.adapter): factors averages A and B each on its "
        "own (FlowerTune's recipe; the mean of the products B A is not the product of the means, so it is biased), "
        "product averages each client's B A and factorises the mean back to rank r by SVD")

    @field_validator("server_betas")
    @classmethod
    def _betas_in_range(cls, betas: list[float]) -> list[float]:
        if not all(0 <= beta < 1 for beta in betas):
            raise ValueError(f"each beta must lie in [0, 1), got {list(betas)}")
        return betas


class FedAvg(Method):
    name = "fedavg"
    summary = "one global model, sample-weighted averaging of client updates"
    Options = FedAvgOptions
    #: every client is sent the one global model (a subclass that personalises what it sends says False: FedPAC)
    sends_global_model: ClassVar[bool] = True
    #: True: the server's mean weighs each client by its training rows (FedAvg's n_k / n); False: the plain mean
    #: over the clients that reported, where the method's algorithm box says so (SCAFFOLD, FedDyn, pFedMe, ...)
    weighs_by_samples: ClassVar[bool] = True
    server_weighting = "sample-weighted mean over the clients that reported, n_k / n (McMahan et al. 2017, Algorithm 1)"
    adapters = ("averages the clients' adapters with its server rule: factor by factor by default (lora_aggregation: "
                "factors, FlowerTune's recipe, biased: the mean of B A is not the product of the means), or the mean "
                "of each client's product B A factorised back to rank r by SVD (lora_aggregation: product); methods "
                "built on FedAvg's server (FedProx, Ditto's global model, ...) inherit the choice")

    def __init__(self, context: MethodContext, options: FedAvgOptions, server_lr: float | None = None) -> None:
        super().__init__(context, options)
        self.options: FedAvgOptions = options
        self.global_weights = context.init_weights.clone()
        self.server_lr = options.server_lr if server_lr is None else server_lr
        if getattr(options, "lora_aggregation", "factors") == "product":
            if not self.lora_pairs():
                raise ConfigError(f"method.options.lora_aggregation=product: {self.name}'s model has no LoRA adapter "
                                  f"(model.options.adapter)")
            if options.aggregation != "fedavg":
                raise ConfigError(f"method.options.lora_aggregation=product averages the clients' products; "
                                  f"aggregation {options.aggregation} combines the updates otherwise")
        optimizer = getattr(options, "server_optimizer", "sgd")  # subclasses with their own options: plain FedAvg
        if optimizer != "sgd":
            # the optimiser steps a parameter that mirrors global_weights (subclasses write global_weights in place)
            self._server_param = torch.nn.Parameter(self.global_weights.clone())
            self.server_optimizer = server_optimizer(optimizer, [self._server_param], self.server_lr, options)

    def personalize(self, client_ids: torch.Tensor) -> torch.Tensor:
        return self.global_weights.unsqueeze(0).expand(len(client_ids), -1).clone()

    def eval_weights(self, client_ids: torch.Tensor) -> torch.Tensor:
        if not self.sends_global_model:
            return super().eval_weights(client_ids)
        # a read-only view: 1,000 clients of a 1.6M-parameter model would otherwise copy 6.4 GB per evaluation
        return self.global_weights.detach().unsqueeze(0).expand(len(client_ids), -1)

    #: the server learns from a round only through the mean update: central DP noises the clipped sum instead
    central_privacy_refusal = None
    asynchronous_refusal = None
    asynchronous = ("FedBuff's and FedAsync's own setting: the global model moves by each buffer's staleness-weighted "
                    "deltas, each the change from the model that client was sent (fedbuff), or mixes with each "
                    "arriving client model (fedasync)")

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        # delta = sent - trained, so subtracting the mean delta moves towards the clients' models.
        weights = self.mean_weights(metrics)
        update = self.aggregate(delta, weights)
        if getattr(self.options, "lora_aggregation", "factors") == "product":
            update = self.product_update(sent - delta, weights, update)
        self.apply_update(update)

    def lora_pairs(self) -> list[tuple[TensorSpec, TensorSpec]]:
        """Each LoRA layer's ``(A [r, in], B [out, r])`` in the model's flat weights."""
        by_name = {tensor.name: tensor for tensor in self.context.spec.tensors}
        return [(tensor, by_name[tensor.name.removesuffix("lora_A") + "lora_B"]) for tensor in self.context.spec.tensors
                if tensor.name.endswith(".lora_A") and tensor.name.removesuffix("lora_A") + "lora_B" in by_name]

    def product_update(self, trained: torch.Tensor, weights: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        """``update`` with each LoRA layer's coordinates replaced so that the step lands on the rank-r factorisation
        (truncated SVD, the singular values split evenly between B and A) of the weighted mean of the clients' B A."""
        update = update.clone()
        share = (weights / weights.sum()).to(trained.dtype)
        for a, b in self.lora_pairs():
            rank = a.shape[0]
            factors_a = trained[:, a.slice].view(-1, *a.shape)
            factors_b = trained[:, b.slice].view(-1, *b.shape)
            product = torch.einsum("k,kor,kri->oi", share, factors_b, factors_a)
            left, values, right = torch.linalg.svd(product, full_matrices=False)
            root = values[:rank].sqrt()
            update[b.slice] = self.global_weights[b.slice] - (left[:, :rank] * root).reshape(-1)
            update[a.slice] = self.global_weights[a.slice] - (root[:, None] * right[:rank]).reshape(-1)
        return update

    def central_privacy_problem(self) -> str | None:
        if getattr(self.options, "lora_aggregation", "factors") == "product":
            return ("lora_aggregation=product multiplies each client's own factors; central DP releases only the "
                    "noised mean of the updates (use lora_aggregation=factors)")
        return super().central_privacy_problem()

    def mean_weights(self, metrics: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[n]``: each reporting client's weight in the server's mean (:attr:`weighs_by_samples`)."""
        counts = metrics["num_examples"]
        return counts if self.weighs_by_samples else torch.ones_like(counts)

    def central_update(self, mean_delta: torch.Tensor, expected_clients: float) -> None:
        # the released mean is the whole round: one row, aggregated as the method aggregates any update
        self.apply_update(self.aggregate(mean_delta.unsqueeze(0), torch.ones(1, device=mean_delta.device)))

    def apply_update(self, update: torch.Tensor) -> None:
        """Move the global model by the aggregated ``update`` (``[dim]``, a pseudo-gradient): FedAvg's step, or the
        server optimiser's (FedOpt)."""
        if not hasattr(self, "server_optimizer"):
            self.global_weights = self.global_weights - self.server_lr * update
            return
        with torch.no_grad():
            self._server_param.copy_(self.global_weights)
        self._server_param.grad = update.detach().to(self._server_param.dtype)
        self.server_optimizer.step()
        self.global_weights = self._server_param.detach().clone()

    def aggregate(self, updates: torch.Tensor, num_examples: torch.Tensor) -> torch.Tensor:
        """``[dim]``: the clients' updates (or any per-client rows the server averages) combined under the
        ``aggregation`` option (the sample-weighted mean by default; always, for a subclass whose options are not
        FedAvg's, e.g. pFedMe, whose ``beta`` is its own)."""
        options = self.options
        if not isinstance(options, FedAvgOptions):
            return robust_aggregate(updates, num_examples)
        return robust_aggregate(updates, num_examples, options.aggregation, options.beta, options.num_malicious_nodes,
                                options.num_nodes_to_select, options.clipping_norm)


def server_optimizer(name: str, params: list[torch.nn.Parameter], lr: float,
                     options: FedAvgOptions) -> torch.optim.Optimizer:
    """FedOpt's server optimisers: torch's SGD with momentum, Adam and Adagrad; Yogi from ``graphfed.core.optim``."""
    beta1, beta2 = options.server_betas
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=options.server_momentum)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(beta1, beta2), eps=options.server_tau)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=options.server_tau)
    return Yogi(params, lr=lr, betas=(beta1, beta2), tau=options.server_tau)


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
