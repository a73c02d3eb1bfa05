"""LEAF's reference model for Shakespeare: an 8-dimensional character embedding, two LSTM layers of 256 and a linear
layer over the characters, predicting the next character from the last step (Caldas et al. 2018; LEAF's
``shakespeare/stacked_lstm.py``).

The recurrence is written with explicit batched products over a leading client axis (as ``models/gru.py`` does,
and for the same reason: ``nn.LSTM`` does not run under ``torch.func.vmap``); the parameters live in
``nn.LSTMCell`` modules (PyTorch's names, shapes, gate order i, f, g, o and initialisation), so one client's
``forward`` is PyTorch's LSTM, which the tests check.
"""

from __future__ import annotations

import torch
from torch import nn

from graphfed.models.base import TargetModel


class LeafLSTM(TargetModel):
    """``x [B, T]`` character classes -> ``[B, vocab]`` logits of the next character."""

    def __init__(self, vocab: int, embedding: int = 8, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.vocab, self.hidden = vocab, hidden
        self.embed = nn.Embedding(vocab, embedding)
        self.cells = nn.ModuleList(nn.LSTMCell(embedding if i == 0 else hidden, hidden) for i in range(layers))
        self.head = nn.Linear(hidden, vocab)
        self.head_module = "head"

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                        features_only: bool = False) -> torch.Tensor:
        clients, batch, steps = x.shape
        tokens = x.long()
        h = params["embed.weight"][torch.arange(clients, device=x.device).view(-1, 1, 1), tokens]  # [S, B, T, E]
        for i in range(len(self.cells)):
            name = f"cells.{i}"
            # the input projections of all steps in one product: [S, B*T, in] @ [S, in, 4H]
            gates_x = torch.baddbmm((params[f"{name}.bias_ih"] + params[f"{name}.bias_hh"]).unsqueeze(1),
                                    h.reshape(clients, batch * steps, -1),
                                    params[f"{name}.weight_ih"].transpose(1, 2)).view(clients, batch, steps, -1)
            weight_hh = params[f"{name}.weight_hh"].transpose(1, 2)
            state = cell = x.new_zeros(clients, batch, self.hidden)
            outputs = []
            for t in range(steps):
                gates = gates_x[:, :, t] + torch.bmm(state, weight_hh)
                entry, forget, candidate, exit_ = gates.chunk(4, dim=-1)
                cell = torch.sigmoid(forget) * cell + torch.sigmoid(entry) * torch.tanh(candidate)
                state = torch.sigmoid(exit_) * torch.tanh(cell)
                outputs.append(state)
            h = torch.stack(outputs, dim=2)
        last = h[:, :, -1]
        return last if features_only else self.batched_head(params, last)

    def forward(self, x: torch.Tensor, features_only: bool = False) -> torch.Tensor:
        params = {name: value.unsqueeze(0) for name, value in self.named_parameters()}
        return self.batched_forward(params, x.unsqueeze(0), features_only).squeeze(0)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x, features_only=True)
