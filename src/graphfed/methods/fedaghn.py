"""FedAGHN (attentive graph hypernetworks), as the official code implements it.

Per client i and layer r, from the PREVIOUS round's updates Delta_theta:
  a_ij^r = softmax_{j != i}( q_i^r * cos(Delta_theta_i^r, Delta_theta_j^r) )
  w_i^r  = [p_i^r (self), a_ij^r (others)] / (1 + p_i^r)          p >= 0, so self = p / (1 + p)
  theta'_i^r = sum_j w_ij^r theta_j^r                              (uniform weights in round 0)
Server: p, q learn by the hypergradient of theta'_i with the client's delta (SGD, lr 0.005, no momentum); p is
projected back to p >= 0 after each step. (Clamping inside the forward pass, as the released code does, gives a
p that crossed 0 zero gradient for ever: it could never come back.)
``hypergrad_sign: released`` reproduces the released code's opposite sign, for comparison only.

Step size. p_i and q_i belong to client i alone, so only client i's delta reaches them. ``step_scale: mean``
(the default, kept so earlier results stand) divides the round's hypergradient by the S clients of the round, as
for parameters every client shares: each p_i then moves S times less than a per-client update (the official code
steps per client) would move it, and over 30 rounds of 20 clients the self weight p/(1+p) barely leaves its start.
``step_scale: client`` gives each client's p and q its full step (benchmarks/fedaghn_self_weight.py measures both).

The paper's ablation (Appendix D.1, Table 1) is three options: ``p`` and ``q`` each ``learned`` (default),
``frozen`` at their initial value, or ``absent`` (no self term, p = 0; plain softmax of the cosines, q = 1), and
``layerwise: false`` for one p and q per client shared by all layers.
BatchNorm layers use batch statistics (graphfed's ``cnn-bn``), so there are no running statistics to share.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from graphfed.core.hypergrad import hypergradient_step
from graphfed.core.mixing import layer_bounds
from graphfed.methods.aggregation import PersonalizedAggregation
from graphfed.methods.base import MethodContext, MethodOptions


class FedAGHNOptions(MethodOptions):
    init_p: float = Field(default=0.03, ge=0, description="initial self-participation strength")
    init_q: float = Field(default=0.5, description="initial attention temperature on cosine similarity")
    server_lr: float = Field(default=0.005, gt=0, description="SGD lr of p and q (hypergradient steps)")
    hypergrad_sign: Literal["descent", "released"] = Field(default="descent",
            description="descent: the sign that lowers the clients' loss; released: the released code's opposite sign")
    p: Literal["learned", "frozen", "absent"] = Field(default="learned", description="the self weight p: learned, "
                                                      "frozen at init_p, or absent (p = 0: no self term)")
    q: Literal["learned", "frozen", "absent"] = Field(default="learned", description="the temperature q: learned, "
                                                      "frozen at init_q, or absent (q = 1)")
    layerwise: bool = Field(default=True, description="one p and q per client and layer (false: per client, shared "
                                                       "by all layers)")
    step_scale: Literal["mean", "client"] = Field(default="mean", description="mean: the hypergradient is averaged "
                                                  "over the round's clients, so each client's own p and q step 1/S as "
                                                  "far; client: each client's p and q take its full step, as a "
                                                  "per-client update does (see the module docstring)")


class FedAGHN(PersonalizedAggregation):
    name = "fedaghn"
    summary = "per-client, per-layer attentive collaboration graphs (p self weight, q on update cosine)"
    Options = FedAGHNOptions
    asynchronous_refusal = ("its attentive graph hypernetwork weighs each client's layers against the other clients' "
                            "updates of the same round (cosine attention over the round's deltas); a buffer of "
                            "updates sent at different server steps compares stale and fresh models as one round's")

    def __init__(self, context: MethodContext, options: FedAGHNOptions) -> None:
        super().__init__(context, options)
        self.options: FedAGHNOptions = options
        shape = (context.num_clients, self.num_layers if options.layerwise else 1)
        p0 = 0.0 if options.p == "absent" else options.init_p
        q0 = 1.0 if options.q == "absent" else options.init_q
        self.self_strength = nn.Parameter(torch.full(shape, p0), requires_grad=options.p == "learned")  # p_i^r
        self.temperature = nn.Parameter(torch.full(shape, q0), requires_grad=options.q == "learned")  # q_i^r
        learned = [param for param in (self.self_strength, self.temperature) if param.requires_grad]
        # an SGD over nothing would refuse to exist; with nothing learned the optimizer is never stepped
        self.optimizer = torch.optim.SGD(learned or [nn.Parameter(torch.zeros(1))], lr=options.server_lr)
        self.learns = bool(learned)

    def mixing(self, client_ids: torch.Tensor) -> torch.Tensor:
        n = self.context.num_clients
        if self.rounds_seen == 0:
            return torch.full((self.num_layers, len(client_ids), n), 1.0 / n, device=self.self_strength.device)
        is_self = self.is_self(client_ids)  # [S, N]
        layers = []
        for r, (lo, hi) in enumerate(layer_bounds(self.context.spec)):
            updates = F.normalize(self.latest_delta[:, lo:hi], dim=1)
            cosine = updates[client_ids] @ updates.T  # [S, N]
            column = r if self.options.layerwise else 0
            logits = (self.temperature[client_ids, column].unsqueeze(1) * cosine).masked_fill(is_self, float("-inf"))
            others = torch.softmax(logits, dim=1)  # sums to 1 over j != i
            p = self.self_strength[client_ids, column].unsqueeze(1)  # >= 0: projected after every step
            layers.append((others + is_self * p) / (1.0 + p))
        return torch.stack(layers)

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        if self.rounds_seen > 0 and self.learns:  # round 0 is uniform: p and q played no part in what was sent
            regenerated = self.personalize(client_ids)
            scale = len(client_ids) if self.options.step_scale == "mean" else 1
            hypergradient_step(self.optimizer, regenerated, delta / scale, sign=self.options.hypergrad_sign)
            with torch.no_grad():  # projection onto p >= 0 (a clamp in the forward pass would freeze p at 0)
                self.self_strength.clamp_(min=0.0)
        self.record_updates(client_ids, sent, delta)
