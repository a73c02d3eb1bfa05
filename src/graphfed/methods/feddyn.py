"""FedDyn (Acar et al., ICLR 2021, "Federated learning based on dynamic regularization").

Algorithm 1, per round t: the server sends theta^{t-1}; each sampled client i minimises (K local SGD steps)

    L_i(theta) - <g_i, theta> + alpha / 2 ||theta - theta^{t-1}||^2

where g_i (its state, zero at first) is its gradient of L_i at its previous solution, kept by the first-order
condition ``g_i <- g_i - alpha (theta_i - theta^{t-1})``; it uploads theta_i. The server keeps
``h <- h - alpha / N sum_{i in P} (theta_i - theta^{t-1})`` and sets ``theta^t = mean_{i in P} theta_i - h / alpha``
(the plain mean over the clients that reported, as the paper; ``server_lr`` is not used). With this dynamic
regulariser the stationary points of the clients' problems are those of the global one, so clients stop
drifting apart however many local steps they take.
"""

from __future__ import annotations

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad, squared_distance
from graphfed.methods.base import MethodContext
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class FedDynOptions(FedAvgOptions):
    alpha: float = Field(default=0.01, gt=0, description="the dynamic regulariser's weight")


class FedDynRule(ClientRule):
    def __init__(self, setting: ClientSetting, alpha: float) -> None:
        super().__init__(setting)
        self.alpha = alpha

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"gradient": torch.zeros_like(received)}

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": received, "gradient": self.spec.unflatten(state["gradient"])}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        model = require_grad(tracks["model"])
        losses = local.loss(model)
        linear = sum((model[n] * tracks["gradient"][n]).flatten(1).sum(1) for n in model)
        objective = losses - linear + 0.5 * self.alpha * squared_distance(model, received)
        return {**tracks, "model": local.descend(model, objective)}, losses

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        flat = lambda weights: self.spec.flatten(weights, batch_dims=1)  # noqa: E731
        gradient = state["gradient"] - self.alpha * (flat(tracks["model"]) - flat(received))
        return tracks["model"], {"gradient": gradient}


class FedDyn(FedAvg):
    name = "feddyn"
    summary = "a dynamic regulariser per client (and its server state h) aligns the clients' optima with the global"
    server_weighting = ("plain mean over the clients that reported, for the model and for the state h (Acar et al. "
                        "2021, FedDyn's Algorithm 1)")
    Options = FedDynOptions
    asynchronous_refusal = "its server state h counts every client's drift per round (Acar et al.'s Algorithm 1)"

    def __init__(self, context: MethodContext, options: FedDynOptions) -> None:
        super().__init__(context, options)
        self.options: FedDynOptions = options
        self.h = torch.zeros_like(self.global_weights)

    @classmethod
    def client_rule(cls, options: FedDynOptions, setting: ClientSetting) -> ClientRule:
        return FedDynRule(setting, options.alpha)

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        alpha = self.options.alpha
        # delta = theta^{t-1} - theta_i, so theta_i - theta^{t-1} = -delta
        self.h = self.h + alpha * delta.sum(0) / len(self.context.train_client_ids)
        self.global_weights = self.global_weights - delta.mean(0) - self.h / alpha

    def central_update(self, mean_delta: torch.Tensor, expected_clients: float) -> None:
        # the cohort's sum is the release times the expected cohort (the actual size is private)
        alpha = self.options.alpha
        self.h = self.h + alpha * mean_delta * expected_clients / len(self.context.train_client_ids)
        self.global_weights = self.global_weights - mean_delta - self.h / alpha
