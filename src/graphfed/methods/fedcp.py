"""FedCP (Zhang et al., KDD 2023): separating global and personal feature information with a conditional policy.

Each client's model is a feature extractor f (the target model's body), the global head G (received, frozen
locally), its personal head P_i, and a Conditional Policy Network (CPN) shared through the server. For a
sample x with features h = f(x), the CPN reads h conditioned on the client (h * v_i, with v_i the per-feature
mean of P_i's weights) and outputs a policy r in (0, 1)^F; the prediction routes the global share of the
features through the global head and the rest through the personal head:
    y_hat = G(h * r) + P_i(h * (1 - r)).
Per round: the client receives the body, G and the CPN; for K steps it trains f, P_i and the CPN on
    task loss + lam * ||mean_B(h * r) - mean_B(h_g * r)||^2
(h_g: the received body's features; the paper's MMD between local and global features, here with a linear
kernel); it uploads f, P_i (in the head's place) and the CPN. The server averages all three (FedAvg): the new
global head is the mean of the personal heads.

Client state: the personal head (a copy of the global head at first) and the CPN it trained last, with which
it evaluates. The CPN is a 2-layer MLP (F -> F -> F, ReLU, sigmoid), F = the head's input width; its
parameters travel beside the model (bytes counted). Novel clients have no personal head: they evaluate the
received model (body + global head) as is.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.core.mixing import weighted_mean
from graphfed.data.federation import ClientSplit
from graphfed.errors import ConfigError
from graphfed.methods.base import MethodContext
from graphfed.methods.fedavg import FedAvg, FedAvgOptions
from graphfed.methods.fedpac import head_shape
from graphfed.models.base import TargetModel


class FedCPOptions(FedAvgOptions):
    lam: float = Field(default=1.0, ge=0, description="weight of the global-feature alignment (linear-kernel MMD)")


def policy_size(features: int) -> int:
    return 2 * features * features + 2 * features


def unflatten_policy(flat: torch.Tensor, features: int) -> Weights:
    """``[S, P]`` -> the CPN's ``w1 [S, F, F]``, ``b1 [S, F]``, ``w2``, ``b2``."""
    square = features * features
    w1, b1, w2, b2 = flat.split([square, features, square, features], dim=1)
    return {"w1": w1.view(-1, features, features), "b1": b1, "w2": w2.view(-1, features, features), "b2": b2}


def policy(cpn: Weights, inputs: torch.Tensor) -> torch.Tensor:
    """``[S, B, F]`` share of each feature that goes through the global head."""
    hidden = torch.relu(torch.baddbmm(cpn["b1"].unsqueeze(1), inputs, cpn["w1"].transpose(1, 2)))
    return torch.sigmoid(torch.baddbmm(cpn["b2"].unsqueeze(1), hidden, cpn["w2"].transpose(1, 2)))


class FedCPRule(ClientRule):
    has_eval_forward = True
    def __init__(self, setting: ClientSetting, lam: float) -> None:
        super().__init__(setting)
        if not setting.head:
            raise ConfigError("FedCP needs a model that declares its head (TargetModel.head_module)")
        if not any(name.endswith(".weight") for name in setting.head):
            raise ConfigError("FedCP needs a plain linear head (its weight conditions the policy); this model's head "
                              f"is {', '.join(setting.head)} (a LoRA adapter of a frozen head)")
        self.lam = lam
        self.weight_name = next(name for name in setting.head if name.endswith("weight"))
        self.num_features = head_shape(setting)[1]

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"policy": (policy_size(self.num_features),)}

    def init_state(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        head = self.setting.pack(self.spec.unflatten(received), self.setting.head)
        return {"head": head.clone(),
                "policy": torch.zeros(len(received), policy_size(self.num_features), device=received.device)}

    def start(self, received: Weights, state: dict[str, torch.Tensor]) -> dict[str, Weights]:
        return {"model": received, "head": self.setting.unpack(state["head"], self.setting.head)}

    def predict(self, model: TargetModel, body: Weights, head: Weights, cpn: Weights, features: torch.Tensor,
                global_head: Weights) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs and the policy r for ``features [S, B, F]``."""
        condition = head[self.weight_name].mean(1).detach().unsqueeze(1)  # v_i: [S, 1, F]
        share = policy(cpn, features * condition)
        outputs = model.batched_head(global_head, features * share) + model.batched_head(head, features * (1 - share))
        return outputs, share

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        cpn = tracks.get("policy") or unflatten_policy(local.broadcast["policy"], self.num_features)
        leaves = require_grad({**{f"model.{n}": tracks["model"][n] for n in self.setting.body},
                               **{f"head.{n}": v for n, v in tracks["head"].items()},
                               **{f"policy.{n}": v for n, v in cpn.items()}})
        body = {n: leaves[f"model.{n}"] for n in self.setting.body}
        head = {n: leaves[f"head.{n}"] for n in self.setting.head}
        trained_cpn = {n: leaves[f"policy.{n}"] for n in cpn}
        global_head = {n: received[n] for n in self.setting.head}
        features = local.model.batched_forward({**body, **global_head}, local.batches[0][0], features_only=True)
        outputs, share = self.predict(local.model, body, head, trained_cpn, features, global_head)
        losses = local.loss(body, outputs=outputs)
        with torch.no_grad():
            global_features = local.features(received)
        alignment = ((features * share).mean(1) - (global_features * share).mean(1)).pow(2).sum(-1)
        updated = local.descend(leaves, losses + self.lam * alignment)
        model = {**tracks["model"], **{n: updated[f"model.{n}"] for n in self.setting.body}}
        return {"model": model, "head": {n: updated[f"head.{n}"] for n in self.setting.head},
                "policy": {n: updated[f"policy.{n}"] for n in cpn}}, losses.detach()

    def flat_policy(self, cpn: Weights) -> torch.Tensor:
        return torch.cat([cpn[name].flatten(1) for name in ("w1", "b1", "w2", "b2")], dim=1)

    def uploads(self, tracks: dict[str, Weights], local: LocalStep) -> dict[str, torch.Tensor]:
        return {"policy": self.flat_policy(tracks["policy"])}

    def finish(self, tracks: dict[str, Weights], received: Weights,
               state: dict[str, torch.Tensor]) -> tuple[Weights, dict[str, torch.Tensor]]:
        upload = {**tracks["model"], **tracks["head"]}  # the personal head goes up in the head's place
        return upload, {"head": self.setting.pack(tracks["head"], self.setting.head),
                        "policy": self.flat_policy(tracks["policy"])}

    def eval_forward(self, model: TargetModel, weights: Weights, x: torch.Tensor, train: ClientSplit,
                     state: dict[str, torch.Tensor]) -> torch.Tensor:
        features = model.batched_forward(weights, x, features_only=True)
        head = self.setting.unpack(state["head"], self.setting.head)
        cpn = unflatten_policy(state["policy"], self.num_features)
        global_head = {n: weights[n] for n in self.setting.head}
        return self.predict(model, weights, head, cpn, features, global_head)[0]


class FedCP(FedAvg):
    name = "fedcp"
    summary = "conditional policy splits features between the global head and a personal head per client"
    server_weighting = ("feature extractor, global head and policy network: sample-weighted means, FedAvg's rule "
                        "(FedCP's server is FedAvg's)")
    Options = FedCPOptions
    asynchronous_refusal = "its server averages the clients' policy networks beside their updates per round"

    def __init__(self, context: MethodContext, options: FedCPOptions) -> None:
        super().__init__(context, options)
        features = head_shape(context)[1]
        bound = 1 / math.sqrt(features)  # nn.Linear's default initialisation, from the run seed
        draw = torch.rand(policy_size(features), generator=self.generator, device="cpu")  # the same on every device
        self.policy = (draw.to(context.device) * 2 - 1) * bound

    @classmethod
    def client_rule(cls, options: FedCPOptions, setting: ClientSetting) -> ClientRule:
        return FedCPRule(setting, options.lam)

    def broadcast(self, client_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"policy": self.policy.expand(len(client_ids), -1).clone()}

    central_privacy_refusal = ("its server averages the clients' policy networks beside their updates; only the "
                               "update is clipped and noised")

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        super().update(client_ids, sent, delta, metrics)
        self.policy = weighted_mean(metrics["policy"], self.mean_weights(metrics))
