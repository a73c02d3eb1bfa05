"""SCAFFOLD (Karimireddy et al., ICML 2020, "SCAFFOLD: stochastic controlled averaging for federated learning").

Algorithm 1, per round: the server sends the global model x and its control variate c; each sampled client i,
starting from y = x, takes K steps ``y <- y - lr (g_i(y) - c_i + c)`` (the correction removes its drift from the
global direction), then updates its own control variate

* option I:  ``c_i+ = g_i(x)``, its gradient at the server's model (on its last mini-batch),
* option II: ``c_i+ = c_i - c + (x - y) / (K lr)`` (the default: no extra gradient),

and uploads ``Delta y = y - x`` (as its update) and ``Delta c = c_i+ - c_i``. The server moves x by the plain mean
of the updates over the clients that reported (Algorithm 1's 1 / |S|, not FedAvg's sample weights; ``server_lr`` is
the global step size eta_g) and ``c <- c + (|S| / N) mean(Delta c)``. c_i is the
client's state (zero at first); c is the server's, broadcast with the model (bytes down count it, bytes up the
control update).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.methods.base import MethodContext
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class ScaffoldOptions(FedAvgOptions):
    control_update: Literal["II", "I"] = Field(default="II", description="the client's control-variate update: "
                                               "II (from the model change) or I (its gradient at the server model)")


class ScaffoldRule(ClientRule):
    def __init__(self, setting: ClientSetting, option: str) -> None:
        super().__init__(setting)
        self.option = option

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"control_delta": (self.spec.dim,)}

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"control": torch.zeros_like(received)}

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": received, "control": self.spec.unflatten(state["control"]), "received": received}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        model = require_grad(tracks["model"])
        losses = local.loss(model)
        server = self.spec.unflatten(local.broadcast["control"])
        # the gradient of <y, c - c_i> is the correction c - c_i added to every step's gradient
        correction = sum((model[n] * (server[n] - tracks["control"][n])).flatten(1).sum(1) for n in model)
        tracks = {**tracks, "model": local.descend(model, losses + correction), "server": server}
        if self.option == "I" and local.index == self.total_steps - 1:
            at_server = require_grad(received)
            tracks["gradient"] = local.gradients(at_server, local.loss(at_server))
        return tracks, losses

    def _new_control(self, tracks: dict[str, Weights], received: Weights) -> torch.Tensor:
        flat = lambda weights: self.spec.flatten(weights, batch_dims=1)  # noqa: E731
        if self.option == "I":
            return flat(tracks["gradient"])
        steps, lr = self.total_steps, self.setting.training.lr
        drift = (flat(received) - flat(tracks["model"])) / (steps * lr)
        return flat(tracks["control"]) - flat(tracks["server"]) + drift

    def uploads(self, tracks: dict[str, Weights], local: LocalStep) -> dict[str, torch.Tensor]:
        received = {name: value.detach() for name, value in tracks["received"].items()}
        return {"control_delta": self._new_control(tracks, received) - self.spec.flatten(tracks["control"],
                                                                                        batch_dims=1)}

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        return tracks["model"], {"control": self._new_control(tracks, received)}


class Scaffold(FedAvg):
    name = "scaffold"
    summary = "control variates (client and server) correct each client's drift from the global direction"
    server_weighting = ("plain mean over the sampled clients that reported, for the model (x += eta_g / |S| sum dy_i) "
                        "and the server control variate (c += 1 / N sum dc_i): Karimireddy et al. 2020, Algorithm 1 "
                        "(PFLlib's SCAFFOLD too)")
    weighs_by_samples = False
    Options = ScaffoldOptions
    asynchronous_refusal = ("its control variates are corrected by the round's mean (Karimireddy et al.'s Algorithm "
                            "1 assumes every update was computed against the same server variates)")
    central_privacy_refusal = "its server averages each client's control-variate update beside the model update"

    def __init__(self, context: MethodContext, options: ScaffoldOptions) -> None:
        super().__init__(context, options)
        self.server_control = torch.zeros_like(self.global_weights)

    @classmethod
    def client_rule(cls, options: ScaffoldOptions, setting: ClientSetting) -> ClientRule:
        return ScaffoldRule(setting, options.control_update)

    def broadcast(self, client_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"control": self.server_control.unsqueeze(0).expand(len(client_ids), -1).clone()}

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        super().update(client_ids, sent, delta, metrics)
        share = len(client_ids) / len(self.context.train_client_ids)
        self.server_control = self.server_control + share * metrics["control_delta"].mean(0)
