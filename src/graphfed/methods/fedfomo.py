"""FedFomo (Zhang et al., ICLR 2021, "Personalized federated learning with first order model optimization").

Algorithm 1, per round: the server keeps every client's latest model (a bank) and an affinity matrix P; it sends
each sampled client i its own latest model theta_i and M models of the bank, chosen epsilon-greedily by P_i
(the highest-affinity clients, each slot explored at random with probability ``epsilon``). Client i scores them on
its validation rows and weights each downloaded model n by

    w_n = max(0, (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i||),   normalised to sum 1,

so a model that does not lower its validation loss gets weight 0; it starts local training from
``theta_i + sum_n w_n (theta_n - theta_i)`` (theta_i itself when every weight is 0), trains K steps, uploads its
model (as its update) with the weights and the ids they belong to, and the server stores the model in the bank and
adds the weights to P_i. Each client evaluates with its latest model; a client that never trained (novel) with the
mean of the trained clients' models. Bytes down count the M downloaded models.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting
from graphfed.methods.base import Method, MethodContext, MethodOptions


class FedFomoOptions(MethodOptions):
    models: int = Field(default=5, ge=1, description="M, models of the bank each client downloads")
    epsilon: float = Field(default=0.3, ge=0, le=1, description="probability that a slot explores a random client "
                           "instead of the next highest-affinity one")


class FedFomoRule(ClientRule):
    def __init__(self, setting: ClientSetting, models: int) -> None:
        super().__init__(setting)
        self.models = models

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"fomo_weights": (self.models,), "fomo_ids": (self.models,)}

    def fuse(self, received: torch.Tensor, broadcast: dict[str, torch.Tensor],
             validation_losses: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor,
                                                                                dict[str, torch.Tensor]]:
        candidates = broadcast["bank"]  # [S, M, dim]
        losses = validation_losses(torch.cat([received.unsqueeze(1), candidates], dim=1))  # [S, 1 + M]
        gain = (losses[:, :1] - losses[:, 1:]).clamp_min(0).nan_to_num(0.0)  # no validation rows: no evidence
        distance = torch.linalg.vector_norm(candidates - received.unsqueeze(1), dim=2).clamp_min(1e-12)
        weights = gain / distance
        total = weights.sum(1, keepdim=True)
        weights = torch.where(total > 0, weights / total.clamp_min(1e-30), torch.zeros_like(weights))
        fused = received + (weights.unsqueeze(2) * (candidates - received.unsqueeze(1))).sum(1)
        return fused, {"fomo_weights": weights, "fomo_ids": broadcast["bank_ids"]}


class FedFomo(Method):
    name = "fedfomo"
    summary = "each client combines downloaded models by the validation-loss improvement they give"
    server_weighting = ("none at the server: each client weighs the models it downloads by how much each lowers its "
                        "own validation loss (FedFomo's Algorithm 1)")
    Options = FedFomoOptions

    def __init__(self, context: MethodContext, options: FedFomoOptions) -> None:
        super().__init__(context, options)
        self.options: FedFomoOptions = options
        self.bank = context.init_weights.unsqueeze(0).repeat(context.num_clients, 1)
        # who-downloads-what bookkeeping lives on the host; the models on the method's device
        self.affinity = torch.zeros(context.num_clients, context.num_clients, device="cpu")
        self.has_trained = torch.zeros(context.num_clients, dtype=torch.bool, device="cpu")

    @classmethod
    def client_rule(cls, options: FedFomoOptions, setting: ClientSetting) -> ClientRule:
        return FedFomoRule(setting, options.models)

    def personalize(self, client_ids: torch.Tensor) -> torch.Tensor:
        """Each client's latest model; a client that never trained (a novel one) gets the mean of the bank's trained
        models, the one model the server can offer it."""
        models = self.bank[client_ids].clone()
        fresh = ~self.has_trained[client_ids.cpu()]
        if fresh.any() and self.has_trained.any():
            models[fresh.to(models.device)] = self.bank[self.has_trained.to(self.bank.device)].mean(0)
        return models

    def broadcast(self, client_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        chosen = torch.stack([self._choose(int(client)) for client in client_ids])
        return {"bank": self.bank[chosen.to(self.bank.device)],
                "bank_ids": chosen.to(device=self.bank.device, dtype=torch.float32)}

    def _choose(self, client: int) -> torch.Tensor:
        """M other training clients: by affinity, each slot replaced by a random one with probability epsilon."""
        others = self.context.train_client_ids[self.context.train_client_ids != client]
        count = min(self.options.models, len(others))
        ranked = others[torch.argsort(self.affinity[client, others], descending=True, stable=True)]
        shuffled = others[torch.randperm(len(others), generator=self.generator, device="cpu")]
        explore = torch.rand(count, generator=self.generator, device="cpu") < self.options.epsilon
        picked: list[int] = []
        for slot in range(count):
            pool = shuffled if explore[slot] else ranked
            picked.append(next(int(c) for c in pool if int(c) not in picked))
        while len(picked) < self.options.models:  # fewer other clients than M: repeat (a repeat adds nothing new)
            picked.append(picked[len(picked) % max(count, 1)] if count else client)
        return torch.tensor(picked, device="cpu")

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        self.bank[client_ids] = (sent - delta).to(self.bank.dtype)
        self.has_trained[client_ids.cpu()] = True
        ids, weights = metrics["fomo_ids"].round().long().cpu(), metrics["fomo_weights"].float().cpu()
        for row, client in enumerate(client_ids.tolist()):
            known = (ids[row] >= 0) & (ids[row] < len(self.affinity))  # an id no client has is ignored, not trusted
            self.affinity[client].index_add_(0, ids[row][known], weights[row][known])
