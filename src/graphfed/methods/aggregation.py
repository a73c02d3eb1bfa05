"""Shared base of the personalised-aggregation family (FedAGHN, pFedGAT, SFL, FedAMP, ...).

The server keeps every client's latest trained model; the model a client starts a round from is a
per-layer weighted combination of them (``graphfed.core.mixing.mix_layers``), and its personalised model is
what its local training makes of that start (FedAGHN Fig. 2, step 5), so evaluation uses each client's
latest trained model (clients that never trained, e.g. novel ones, get the aggregate). Subclasses only say
how the mixing matrices are made (and learned); the matrices are the method's collaboration graph.

Clients that never trained hold no model (their stored row is the untrained initialisation), so they take no part
in mixing: their columns are zeroed and each row renormalised over the clients that trained (a row that would mix
only untrained clients takes the plain mean of the trained ones). Before any client trained, every stored row is
the same initialisation and the mixing is used as is.
"""

from __future__ import annotations

from abc import abstractmethod

import torch
import torch.nn.functional as F

from graphfed.core.memory import check_fits
from graphfed.core.mixing import layer_bounds, mix_layers
from graphfed.methods.base import Method, MethodContext, MethodOptions

#: clients whose mixing rows are computed in one call when many clients need them (evaluation of never-trained
#: clients, saved graphs): [L, rows, N] at a time, not [L, N, N]
MIXING_ROWS_PER_CALL = 2048


class PersonalizedAggregation(Method):
    asynchronous_refusal = ("its server makes each client's model from a graph over every client's latest model, "
                            "learned from one round's uploads together; updates sent at different server steps are "
                            "not one round's models")
    adapters = ("each client's adapter is its own mix of every client's latest adapter, each LoRA factor (A or B of "
                "one layer) a layer of the mix: factor by factor, with the collaboration graph's weights")
    server_weighting = ("no shared mean: each client starts from its own per-layer mix of every client's latest "
                        "model, with the weights of the method's collaboration graph (its algorithm box says how they "
                        "are made)")

    def __init__(self, context: MethodContext, options: MethodOptions) -> None:
        super().__init__(context, options)
        n = context.num_clients
        check_fits(2 * n * context.spec.dim * 4, f"{self.name}: every client's latest model and update on the server "
                   f"({n:,} clients x {context.spec.dim:,} parameters x 2)",
                   "use fewer clients (dataset.num_clients) or a smaller model (model.options)", context.device)
        self.num_layers = len(layer_bounds(context.spec))
        self.client_weights = context.init_weights.unsqueeze(0).repeat(n, 1)  # theta_j: latest local models
        self.latest_delta = torch.zeros(n, context.spec.dim)  # each client's most recent update
        self.has_trained = torch.zeros(n, dtype=torch.bool)
        self.rounds_seen = 0

    @abstractmethod
    def mixing(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``[L, S, N]`` row-stochastic mixing weights of ``client_ids`` over all clients (may carry grad)."""

    def is_self(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``[S, N]`` bool on the server's device: column j of row i is client i itself (``client_ids`` are host
        bookkeeping; the mask meets the server's tensors)."""
        return F.one_hot(client_ids.to(self.has_trained.device), self.context.num_clients).bool()

    def personalize(self, client_ids: torch.Tensor) -> torch.Tensor:
        return mix_layers(self.trained_mixing(client_ids), self.client_weights, self.context.spec)

    def trained_mixing(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``[L, S, N]``: :meth:`mixing` restricted to clients that trained (see the module docstring)."""
        mixing = self.mixing(client_ids)
        if self.has_trained.all() or not self.has_trained.any():
            return mixing
        trained = self.has_trained.to(mixing.dtype)
        kept = mixing * trained
        total = kept.sum(-1, keepdim=True)
        return torch.where(total > 0, kept / total.clamp_min(1e-30), trained / trained.sum())

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        """Methods whose weights are a function of the stored models only just store the new ones."""
        self.record_updates(client_ids, sent, delta)

    def record_updates(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor) -> None:
        """Store the clients' trained models and updates (call after any learning that needs the old ones)."""
        self.client_weights[client_ids] = (sent - delta).detach()
        self.latest_delta[client_ids] = delta.detach()
        self.has_trained[client_ids] = True
        self.rounds_seen += 1

    @torch.no_grad()
    def eval_weights(self, client_ids: torch.Tensor) -> torch.Tensor:
        weights = self.client_weights[client_ids].clone()
        untrained = ~self.has_trained[client_ids].cpu()  # host: it picks client ids as well as weight rows
        if untrained.any():  # mixing rows are per client: a chunk at a time keeps memory O(chunk x N)
            weights[untrained] = torch.cat([self.personalize(chunk)
                                            for chunk in client_ids[untrained].split(MIXING_ROWS_PER_CALL)])
        return weights

    @torch.no_grad()
    def collaboration_graph(self, client_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``[L, rows, N]``: row i holds the weights client i's personalised model gives every client."""
        rows = torch.arange(self.context.num_clients, device="cpu") if client_ids is None else client_ids
        return torch.cat([self.trained_mixing(chunk).detach() for chunk in rows.split(MIXING_ROWS_PER_CALL)], dim=1)
