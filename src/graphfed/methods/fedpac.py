"""FedPAC (Xu, Tong & Huang, ICLR 2023): personalised FL with feature alignment and classifier collaboration.

Algorithm 1 (FedPAC), per round t; the server holds the global body theta, global class centroids c_k and
one personalised head phi_i per client:
  client i receives (theta, phi_i) and the centroids;
    1. trains its head phi_i for ``head_steps`` steps with the body fixed (task loss);
    2. trains the body for K steps with the head fixed on  CE + lam * mean_f (f_theta(x) - c_y)^2  (feature
       alignment to the global centroid of the sample's class, where one exists; mean over features, as the
       reference's MSELoss);
    3. uploads theta_i, phi_i and the statistics of its features under the new body: class centroids c_{i,k},
       class counts n_{i,k} and the within-class feature variance V_i (divided by its row count: the variance of
       its estimate).
  server: theta = FedAvg of the bodies; c_k = count-weighted mean of the c_{i,k};
    classifier collaboration: for each client i of the round,
      alpha_i = argmin_{alpha in simplex} sum_j alpha_j^2 V_j + || sum_j alpha_j (h_i - h_j) ||^2,
      h_j = class-prior-weighted centroids of client j (its [classes, features] matrix);
      phi_i <- sum_j alpha_ij phi_j   (over the clients of this round).
Each client evaluates the global body with its personalised head.

The QP is the paper's bias-variance estimate; it is solved by accelerated projected gradient descent (FISTA with
adaptive restart, exact simplex projection as in pFedGraph) until its Frank-Wolfe duality gap, an upper bound on
the distance of the objective to its optimum, is at most ``qp_tolerance`` times the objective; a row that has not
got there in ``qp_max_iterations`` stops the run with the gap it reached (tests compare it with scipy). The
released code drops the diagonal of the bias term; here the bias term is the full square. Classification only.
Novel clients receive the global body and the sample-weighted mean head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting, LocalStep, Weights, require_grad
from graphfed.client.evaluation import scoring_blocks
from graphfed.core.mixing import weighted_mean
from graphfed.errors import ConfigError, SolverError
from graphfed.methods.base import MethodContext
from graphfed.methods.fedavg import FedAvg, FedAvgOptions
from graphfed.methods.pfedgraph import project_to_simplex


class FedPACOptions(FedAvgOptions):
    lam: float = Field(default=1.0, ge=0, description="weight of the feature-alignment term")
    head_steps: int | None = Field(default=None, ge=0, description="head steps before the body's K steps "
                                   "(default: K)")
    qp_tolerance: float = Field(default=1e-7, gt=0, lt=1, description="the QP stops when its duality gap is at "
                                "most this share of its objective (an optimality certificate)")
    qp_max_iterations: int = Field(default=100_000, ge=1, description="iterations after which a QP that has not "
                                   "reached the tolerance stops the run")


def head_shape(setting_or_context: ClientSetting | MethodContext) -> tuple[int, int]:
    """(classes, features) of the model's linear head."""
    weight = next(t for t in setting_or_context.spec.tensors
                  if t.name in setting_or_context.head and len(t.shape) == 2)
    return weight.shape[0], weight.shape[1]


class FedPACRule(ClientRule):
    def __init__(self, setting: ClientSetting, lam: float, head_steps: int) -> None:
        super().__init__(setting)
        if setting.task != "classification" or not setting.head:
            raise ConfigError("FedPAC needs a classification task and a model that declares its head")
        if not any(name.endswith(".weight") for name in setting.head):
            raise ConfigError("FedPAC needs a plain linear head (its classifiers are combined); this model's head is "
                              f"{', '.join(setting.head)} (a LoRA adapter of a frozen head)")
        self.lam, self.head_steps = lam, head_steps
        self.num_classes, self.num_features = head_shape(setting)

    @property
    def total_steps(self) -> int:
        return self.head_steps + self.setting.training.steps

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"centroids": (self.num_classes, self.num_features), "class_counts": (self.num_classes,),
                "feature_variance": (1,)}

    def step(self, local: LocalStep, tracks: dict[str, Weights], received: Weights) -> tuple[dict[str, Weights],
                                                                                          torch.Tensor]:
        model = require_grad(tracks["model"])
        if local.index < self.head_steps:
            losses = local.loss(model)
            return {"model": local.descend(model, losses, names=self.setting.head)}, losses
        features = local.features(model)
        losses = local.loss(model, outputs=local.model.batched_head(model, features))
        labels = local.batches[0][1]
        centroid = torch.gather(local.broadcast["centroids"], 1,
                                labels.unsqueeze(-1).expand(-1, -1, self.num_features))
        known = torch.gather(local.broadcast["centroid_counts"], 1, labels) > 0
        # Mean over features and rows, as the reference's nn.MSELoss: a sum over features would scale the pull
        # with the feature width (200x at hidden 200).
        alignment = torch.where(known, (features - centroid).pow(2).mean(-1), 0.0).mean(1)
        objective = losses + self.lam * alignment
        return {"model": local.descend(model, objective, names=self.setting.body)}, losses

    @torch.no_grad()
    def uploads(self, tracks: dict[str, Weights], local: LocalStep) -> dict[str, torch.Tensor]:
        data, model = local.data, local.model
        spec = self.setting.spec
        flat = spec.flatten(tracks["model"], batch_dims=1)
        counts = torch.zeros(data.num_clients, self.num_classes, device=flat.device)
        feature_sums = torch.zeros(data.num_clients, self.num_classes, self.num_features, device=flat.device)
        squared_norms = torch.zeros(data.num_clients, device=flat.device)
        for block in scoring_blocks(model, data, spec.dim):  # every training row, a block at a time
            features = model.batched_forward(spec.unflatten(flat[block.owner]), block.x, features_only=True)
            one_hot = F.one_hot(torch.where(block.mask, block.y, 0), self.num_classes).to(features.dtype)
            one_hot = one_hot * block.mask.unsqueeze(-1)  # [P, B, C]
            counts.index_add_(0, block.owner, one_hot.sum(1))
            feature_sums.index_add_(0, block.owner, one_hot.transpose(1, 2) @ features)
            squared_norms.index_add_(0, block.owner, (features.pow(2).sum(-1) * block.mask).sum(1))
        centroids = feature_sums / counts.clamp_min(1).unsqueeze(-1)  # [S, C, F]
        rows = counts.sum(1).clamp_min(1)
        second_moment = squared_norms / rows
        within = second_moment - (counts / rows.unsqueeze(1) * centroids.pow(2).sum(-1)).sum(1)
        return {"centroids": centroids, "class_counts": counts,
                "feature_variance": (within.clamp_min(0) / rows).unsqueeze(1)}


def collaboration_weights(profiles: torch.Tensor, variance: torch.Tensor, tolerance: float = 1e-7,
                          max_iterations: int = 100_000) -> torch.Tensor:
    """``[S, S]``: row i solves min_{alpha in simplex} sum_j alpha_j^2 V_j + ||sum_j alpha_j (h_i - h_j)||^2.

    ``profiles [S, C, F]`` are the class-prior-weighted centroids h_j, ``variance [S]`` the V_j. Solved in float64
    to a duality gap of at most ``tolerance`` times the objective (see the module docstring)."""
    num = len(profiles)
    difference = (profiles.unsqueeze(1) - profiles.unsqueeze(0)).flatten(2).double()  # [i, j, C*F] = h_i - h_j
    quadratic = difference @ difference.transpose(1, 2) + torch.diag(variance.double()).unsqueeze(0)  # [i, j, k]
    step = 1.0 / (2 * torch.linalg.eigvalsh(quadratic).amax(dim=1).clamp_min(1e-300)).unsqueeze(1)
    allowed = torch.ones(num, num, dtype=torch.bool, device=profiles.device)

    def objective_and_gradient(alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_alpha = (quadratic @ alpha.unsqueeze(-1)).squeeze(-1)
        return (alpha * q_alpha).sum(1), 2 * q_alpha

    alpha = torch.full((num, num), 1.0 / num, dtype=torch.float64, device=profiles.device)
    momentum_point, t = alpha.clone(), torch.ones(num, 1, dtype=torch.float64, device=profiles.device)
    value, gradient = objective_and_gradient(alpha)
    for _ in range(max_iterations):
        # Frank-Wolfe gap g.alpha - min_j g_j >= f(alpha) - f*: the certificate the loop stops on
        gap = (gradient * alpha).sum(1) - gradient.min(1).values
        if bool((gap <= tolerance * value.abs() + 1e-300).all()):
            return alpha.to(profiles.dtype)
        _, momentum_gradient = objective_and_gradient(momentum_point)
        candidate = project_to_simplex(momentum_point - step * momentum_gradient, allowed)
        candidate_value, candidate_gradient = objective_and_gradient(candidate)
        restart = (candidate_value > value).unsqueeze(1)  # O'Donoghue & Candes: restart momentum on an uphill step
        t_next = torch.where(restart, 1.0, (1 + torch.sqrt(1 + 4 * t * t)) / 2)
        momentum_point = torch.where(restart, candidate, candidate + (t - 1) / t_next * (candidate - alpha))
        alpha, value, gradient, t = candidate, candidate_value, candidate_gradient, t_next
    worst = float((gap / value.abs().clamp_min(1e-300)).max())
    raise SolverError(f"FedPAC: the classifier-collaboration QP did not reach qp_tolerance={tolerance:g} in "
                      f"qp_max_iterations={max_iterations} iterations (relative duality gap {worst:.2e})")


class FedPAC(FedAvg):
    name = "fedpac"
    summary = "shared body aligned to global class centroids + per-client heads combined by a bias-variance QP"
    server_weighting = ("the body: sample-weighted mean (FedPAC's Algorithm 1 averages it as FedAvg); the centroids: "
                        "count-weighted per class; each head: the QP's classifier-collaboration weights over the "
                        "round's clients")
    Options = FedPACOptions
    asynchronous_refusal = ("its server solves each round's head combination (a QP) over the round's class centroids "
                            "and feature statistics together")
    sends_global_model = False  # each client gets its own head

    def __init__(self, context: MethodContext, options: FedPACOptions) -> None:
        super().__init__(context, options)
        self.options: FedPACOptions = options
        self.head_index = context.head_index()
        num_classes, num_features = head_shape(context)
        self.client_heads = context.init_weights[self.head_index].unsqueeze(0).repeat(context.num_clients, 1)
        self.centroids = torch.zeros(num_classes, num_features)
        self.centroid_counts = torch.zeros(num_classes)

    @classmethod
    def client_rule(cls, options: FedPACOptions, setting: ClientSetting) -> ClientRule:
        head_steps = setting.training.steps if options.head_steps is None else options.head_steps
        return FedPACRule(setting, options.lam, head_steps)

    def personalize(self, client_ids: torch.Tensor) -> torch.Tensor:
        weights = super().personalize(client_ids)
        weights[:, self.head_index] = self.client_heads[client_ids]
        return weights

    def broadcast(self, client_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        count = len(client_ids)
        return {"centroids": self.centroids.expand(count, -1, -1).clone(),
                "centroid_counts": self.centroid_counts.expand(count, -1).clone()}

    central_privacy_refusal = "its server reads each client's class centroids and counts, not only the sum of updates"

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        heads = (sent - delta)[:, self.head_index]
        super().update(client_ids, sent, delta, metrics)  # the body (and the mean head, for novel clients)
        self.global_weights[self.head_index] = weighted_mean(heads, self.mean_weights(metrics))
        counts, centroids = metrics["class_counts"], metrics["centroids"]
        total = counts.sum(0)
        pooled = (counts.unsqueeze(-1) * centroids).sum(0) / total.clamp_min(1).unsqueeze(-1)
        self.centroids = torch.where(total.unsqueeze(-1) > 0, pooled, self.centroids)
        self.centroid_counts = torch.maximum(self.centroid_counts, total)
        prior = counts / counts.sum(1, keepdim=True).clamp_min(1)
        alpha = collaboration_weights(prior.unsqueeze(-1) * centroids, metrics["feature_variance"][:, 0],
                                      self.options.qp_tolerance, self.options.qp_max_iterations)
        self.client_heads[client_ids] = alpha @ heads
