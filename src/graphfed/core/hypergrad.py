"""The one hypergradient helper every hypernetwork-style method uses.

A client returns ``delta = theta_sent - theta_trained``, which after K SGD steps is approximately
``eta * grad L(theta_sent)``. For server parameters ``phi`` that produced ``theta_sent``, the chain rule
gives ``dL/dphi ~ (d theta_sent / d phi)^T delta``: a vector-Jacobian product with ``delta`` as the
output gradient. Descending it (an optimizer step on ``+g``) lowers the clients' local loss; this is the
pFedHN official code. Some released codes (FedAGHN, pFedLA ports) apply the opposite sign; ``sign=
"released"`` reproduces them for comparison only.
"""

from __future__ import annotations

from typing import Literal

import torch

HypergradSign = Literal["descent", "released"]


def hypergradient_step(optimizer: torch.optim.Optimizer, sent: torch.Tensor, delta: torch.Tensor,
                       extra_loss: torch.Tensor | None = None, sign: HypergradSign = "descent") -> None:
    """One optimizer step on ``(d sent / d phi)^T delta`` (+ the gradient of ``extra_loss``).

    ``sent`` must still carry its autograd graph back to the optimizer's parameters; ``delta`` has the
    same shape and is treated as a constant. ``extra_loss`` is a scalar computed on the server (e.g.
    Panacea's graph-reconstruction loss) whose ordinary gradient is added.
    """
    if sign not in ("descent", "released"):
        raise ValueError(f"hypergradient sign must be 'descent' or 'released', got {sign!r}")
    if sent.shape != delta.shape:
        raise ValueError(f"delta shape {tuple(delta.shape)} does not match sent shape {tuple(sent.shape)}")
    direction = delta.detach() if sign == "descent" else -delta.detach()
    outputs, output_grads = [sent], [direction]
    if extra_loss is not None:
        outputs.append(extra_loss)
        output_grads.append(torch.ones_like(extra_loss))
    optimizer.zero_grad(set_to_none=True)
    torch.autograd.backward(outputs, output_grads)
    optimizer.step()
