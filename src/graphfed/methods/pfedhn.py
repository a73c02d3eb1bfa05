"""pFedHN (Shamsian et al., 2021): an MLP hypernetwork generates each client's weights.

Algorithm 1 of the paper, per round:
  sample clients; theta_i = h(v_i; phi); client runs K SGD steps -> delta_i = theta_i - theta_i~;
  phi, v <- phi, v - alpha * (d theta_i / d (phi, v))^T delta_i      (the hypergradient step)
Novel clients (paper Sec. 5.3): keep phi fixed and learn only the new client's embedding v.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from graphfed.methods.base import EmbeddingHypernetwork, EmbeddingHypernetworkOptions, MethodContext
from graphfed.nn.hypernet import ArchitectureHypernet, MLPHypernet


class PFedHNOptions(EmbeddingHypernetworkOptions):
    embedding_dim: int | None = Field(default=None, ge=1, description="default 1 + N/4 (paper)")
    hidden: int = Field(default=100, ge=1, description="hidden width of the MLP hypernetwork")
    num_layers: int = Field(default=3, ge=1, description="layers of the MLP hypernetwork")
    server_lr: float = Field(default=1e-2, gt=0, description="SGD lr of the hypernetwork and embeddings")
    momentum: float = Field(default=0.9, ge=0, lt=1, description="SGD momentum of the server step")
    weight_decay: float = Field(default=1e-3, ge=0, description="SGD weight decay of the server step")


class PFedHN(EmbeddingHypernetwork):
    name = "pfedhn"
    summary = "MLP hypernetwork maps a learned client embedding to the client's weights"
    Options = PFedHNOptions
    #: clients of different architectures: one output head per architecture (FLHA-GHN's pFedHN variant)
    architectures = "own"

    def __init__(self, context: MethodContext, options: PFedHNOptions) -> None:
        super().__init__(context, options)
        self.options: PFedHNOptions = options
        dim = options.embedding_dim or 1 + context.num_clients // 4
        self.embeddings = nn.Embedding(context.num_clients, dim)
        family = context.architectures
        self.hypernet: nn.Module = (MLPHypernet(dim, context.spec, options.hidden, options.num_layers)
                                    if family is None else
                                    ArchitectureHypernet(dim, family.specs, family.init_weights, options.hidden,
                                                         options.num_layers))
        params = [*self.embeddings.parameters(), *self.hypernet.parameters()]
        self.optimizer = torch.optim.SGD(params, lr=options.server_lr, momentum=options.momentum,
                                         weight_decay=options.weight_decay, foreach=True)

    def weights_from_embeddings(self, embeddings: torch.Tensor, client_ids: torch.Tensor) -> torch.Tensor:
        if self.context.architectures is not None:
            return self.hypernet(embeddings[client_ids], self.context.architectures.assignment[client_ids])
        return self.hypernet(embeddings[client_ids])

    def update(self, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
               metrics: dict[str, torch.Tensor]) -> None:
        # `sent` may be detached (it travelled to clients); regenerate it with the graph attached.
        self.server_step(self.personalize(client_ids), delta / len(client_ids))
