"""pFedGAT: a server-side graph attention network learns how to aggregate client models.

Per round (paper Sec. 3; the decisions the paper leaves open are below):
  h_i = LayerNorm(flatten(theta_i - mean_j theta_j))   node features: clients' latest models (centred, see below)
  alpha = GAT(h) on the complete graph with self loops (K heads, LeakyReLU 0.2, softmax over j)
  R = mean over heads of alpha                         row-stochastic: R[i, j] = weight of client j for i
  theta'_i = sum_j R_ij theta_j                        sent to client i, which trains locally from it
  the GAT learns from every selected client's validation loss of theta'_i:
      phi <- phi - lr * mean_i (d theta'_i / d phi)^T  dL_val_i/d theta'_i   (SGD, lr 0.01 as in the paper;
      the paper sums over clients: the mean keeps one lr right whatever the number of clients per round)

What the client sends back. The paper says clients upload only a scalar (their validation loss), but a
scalar cannot carry dL_val/d theta'_i, which the GAT's gradient needs. ``feedback: gradient`` (default)
is the honest protocol: the client returns the gradient of its validation loss at theta'_i, as large as a
model, and ``bytes_up`` counts it. ``feedback: loss_only`` keeps the paper's scalar budget: the client
returns its validation loss at theta'_i +- mu*u for a unit direction u drawn from a seed both sides know,
and the server forms the two-point zeroth-order estimate  dim * (L+ - L-) / (2 mu) * u  — unbiased but
with variance growing with the model size, so it learns far more slowly.

Which attention layer. The paper's layer scores e_ij = LeakyReLU(a_dst.W h_i + a_src.W h_j), which is static
attention (Brody et al. 2022). The a_dst term is the same for every j of row i and cancels in the softmax
wherever the LeakyReLU stays on one side of its kink. Every row of R then ranks the clients alike: the layer can
learn which models are good, but not which clients resemble client i. On FedAGHN's case-study split its rows
coincided to 4 decimals. Raw LayerNorm(theta_i) features also differ little between clients, because client
models share most of their weights.

The defaults are therefore ``attention: gatv2``, PyG's GATv2Conv, which scores a^T LeakyReLU(W_l h_j + W_r h_i)
so that the score depends on the pair. They also set ``node_features: centred``, h_i = LayerNorm(theta_i -
mean_j theta_j), which is what sets client i apart; at round 0 every h_i is zero and R is uniform.
``attention: gat, node_features: model`` is the paper's literal layer, with the paper's SGD at lr 0.01. On the
case-study split the defaults give same-group clients 0.146 each against 0.026 for other groups; under an IID
split R stays within 0.4/N of uniform (benchmarks/results/aggregation).

Ablations. ``attention: direct`` is the paper's "without GAT" (Table 4, "directly optimizing the weight allocation
matrix"): R = softmax of a free N x N matrix of logits (zeros at the start, so R starts uniform; the softmax keeps
each row on the simplex, which the paper does not say how it ensures), learned from the same client feedback with
the same optimizer. ``attention: uniform`` is a further row: R = 1/N fixed, and clients send no feedback.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from graphfed.core.hypergrad import hypergradient_step
from graphfed.core.rng import unit_direction
from graphfed.methods.aggregation import PersonalizedAggregation
from graphfed.methods.base import MethodContext, MethodOptions

#: attention edges (client pairs) scored at once: bounds the GAT's per-edge messages to ~250 MB at 8 x 16 heads
ATTENTION_EDGES_PER_CHUNK = 500_000


class PFedGATOptions(MethodOptions):
    heads: int = Field(default=8, ge=1, description="attention heads K; R is their mean")
    head_dim: int = Field(default=16, ge=1, description="d' of each attention head")
    attention: Literal["gat", "gatv2", "direct", "uniform"] = Field(
        default="gatv2", description="gatv2: dynamic attention (Brody et al. 2022); gat: the paper's layer (static); "
                                     "direct: the paper's ablation without the GAT, R = softmax(free logits) learned "
                                     "from the same feedback; uniform: R = 1/N and no feedback")
    node_features: Literal["centred", "model"] = Field(
        default="centred",
        description="centred: LayerNorm(theta_i - mean_j theta_j); model: LayerNorm(theta_i), the paper")
    optimizer: Literal["sgd", "adam"] = Field(default="sgd", description="the GAT's optimizer (the paper: SGD)")
    server_lr: float = Field(default=1e-2, gt=0, description="learning rate of the GAT (the paper: 0.01)")
    feedback: Literal["gradient", "loss_only"] = Field(default="gradient",
            description="gradient: clients return dL_val/dtheta (model-sized); "
                        "loss_only: two scalars, zeroth-order estimate")
    zo_mu: float = Field(default=1e-3, gt=0, description="perturbation size of the loss_only estimate")


class PFedGAT(PersonalizedAggregation):
    name = "pfedgat"
    summary = "server-side GAT over client models learns the aggregation weights from validation feedback"
    Options = PFedGATOptions
    asynchronous_refusal = ("its server GAT learns the aggregation from each client's validation feedback on the "
                            "mix it was sent this round; a stale update's feedback is on a mix the GAT no longer "
                            "makes")

    @classmethod
    def client_feedback(cls, options: MethodOptions) -> tuple[str, float]:
        assert isinstance(options, PFedGATOptions)
        if options.attention == "uniform":  # the ablation learns nothing, so it asks for nothing
            return "none", 1e-3
        return ("val_gradient" if options.feedback == "gradient" else "val_loss_pair"), options.zo_mu

    def __init__(self, context: MethodContext, options: PFedGATOptions) -> None:
        super().__init__(context, options)
        self.options: PFedGATOptions = options
        if options.attention == "uniform":  # the ablation: nothing to learn, so no GAT and no client feedback
            return
        if options.attention == "direct":
            n = context.num_clients
            self.logits = nn.Parameter(torch.zeros(n, n))  # R = softmax(logits): uniform at the start
            params = [self.logits]
        else:
            dim = context.spec.dim
            self.norm = nn.LayerNorm(dim)
            from torch_geometric.nn import GATConv, GATv2Conv  # imported only where a GAT is built (slow import)

            layer = GATConv if options.attention == "gat" else GATv2Conv
            self.gat = layer(dim, options.head_dim, heads=options.heads, negative_slope=0.2, add_self_loops=False)
            params = [*self.norm.parameters(), *self.gat.parameters()]
        optimizer = torch.optim.SGD if options.optimizer == "sgd" else torch.optim.Adam
        self.optimizer = optimizer(params, lr=options.server_lr)

    def attention(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``R [S, N]``: rows ``client_ids`` of the mean over heads of the GAT attention; each row sums to 1.

        A row of attention depends only on its own client's and every client's features, so rows are computed
        a chunk of clients at a time (edges j -> i for i in the chunk, all j, self loop included): memory is
        O(N x chunk x heads), never the N^2 x heads of the complete graph at once."""
        n = self.context.num_clients
        if self.options.attention == "uniform":
            return torch.full((len(client_ids), n), 1.0 / n, device=self.client_weights.device)
        if self.options.attention == "direct":
            return self.logits[client_ids].softmax(dim=1)
        models = self.client_weights
        if self.options.node_features == "centred":
            models = models - models.mean(dim=0)
        features = self.norm(models)
        sources = torch.arange(n, device=features.device)
        chunk = max(1, ATTENTION_EDGES_PER_CHUNK // n)
        rows = []
        for targets in client_ids.split(chunk):
            edges = torch.stack([sources.repeat(len(targets)),
                                 torch.arange(len(targets), device=features.device).repeat_interleave(n)])
            _, (edges, alpha) = self.gat((features, features[targets]), edges, return_attention_weights=True)
            rows.append(torch.zeros(len(targets), n, dtype=alpha.dtype, device=alpha.device).index_put(
                (edges[1], edges[0]), alpha.mean(dim=1)))
        return torch.cat(rows)

    def mixing(self, client_ids: torch.Tensor) -> torch.Tensor:
        rows = self.attention(client_ids)
        return rows.unsqueeze(0).expand(self.num_layers, -1, -1)  # one R for every layer

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        if self.options.attention != "uniform":
            self._learn_attention(client_ids, metrics)
        self.record_updates(client_ids, sent, delta)

    def _learn_attention(self, client_ids: torch.Tensor, metrics: dict[str, torch.Tensor]) -> None:
        gradient = self._validation_gradient(metrics)
        hypergradient_step(self.optimizer, self.personalize(client_ids), gradient / len(client_ids))

    def _validation_gradient(self, metrics: dict[str, torch.Tensor]) -> torch.Tensor:
        feedback = metrics["feedback"]
        if self.options.feedback == "gradient":
            return feedback
        dim = self.context.spec.dim
        directions = torch.stack([unit_direction(int(seed), dim)
                                  for seed in metrics["feedback_seed"]]).to(feedback.device)
        slope = (feedback[:, 0] - feedback[:, 1]) / (2 * self.options.zo_mu)
        return dim * slope.unsqueeze(1) * directions
