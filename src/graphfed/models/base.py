"""Target models: ordinary ``nn.Module``s that can also run many clients' weights at once."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, vmap


class TargetModel(nn.Module):
    """A client model. ``batched_forward`` evaluates S different weight sets on S input batches.

    The default uses ``torch.func.vmap`` over ``functional_call``, which works for any architecture;
    models whose layers are plain matmuls override it with hand-batched ``baddbmm`` (about 2x faster
    on CPU for tiny MLPs, where per-op overhead dominates).
    """

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``params[name]``: ``[S, *shape]``; ``x``: ``[S, B, *input_shape]`` -> ``[S, B, out]``."""

        def one_client(client_params: dict[str, torch.Tensor], client_x: torch.Tensor) -> torch.Tensor:
            return functional_call(self, client_params, (client_x,))

        return vmap(one_client)(params, x)
