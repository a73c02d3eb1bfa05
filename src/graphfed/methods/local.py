"""Local: every client trains only its own model; nothing is shared."""

from __future__ import annotations

import torch

from graphfed.methods.base import Method, MethodContext, MethodOptions


class Local(Method):
    name = "local"
    summary = "each client trains its own model alone (no federation)"
    server_weighting = "none: nothing leaves a client"
    adapters = "each client trains its own adapter on the frozen base; nothing travels"
    architectures = "own"
    no_novel_model = "local shares nothing: a client that never trained has no model of its own"
    asynchronous_refusal = "each client trains alone: there is no server step to take asynchronously"
    communicates = False  # the server-side rows are the simulation's bookkeeping of each client's own model

    def __init__(self, context: MethodContext, options: MethodOptions) -> None:
        super().__init__(context, options)
        if context.architectures is not None:  # each client starts from its own architecture's initialisation
            self.client_weights = context.architectures.padded_init(torch.arange(context.num_clients))
        else:
            self.client_weights = context.init_weights.unsqueeze(0).repeat(context.num_clients, 1)

    def personalize(self, client_ids: torch.Tensor) -> torch.Tensor:
        return self.client_weights[client_ids].clone()

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        self.client_weights[client_ids] = (sent - delta).detach()
