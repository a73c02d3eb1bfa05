"""Server optimisers of FedOpt (Reddi et al., ICLR 2021, "Adaptive Federated Optimization") that torch lacks.

FedAvgM, FedAdam and FedAdagrad are torch's SGD (momentum), Adam and Adagrad applied to the pseudo-gradient (the
clients' mean update). Yogi is not in torch; it is Adam with an additive second-moment update that moves ``v``
towards ``g^2`` by at most ``(1 - beta2) g^2`` per step (the paper's Algorithm 2, FedYogi):

    m_t = beta1 m_{t-1} + (1 - beta1) g_t
    v_t = v_{t-1} - (1 - beta2) g_t^2 sign(v_{t-1} - g_t^2)
    x_t = x_{t-1} - lr m_t / (sqrt(v_t) + tau)

(The paper writes the step as ``x + lr m / (sqrt(v) + tau)`` for ``Delta = -g``; no bias correction.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


class Yogi(torch.optim.Optimizer):
    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-2, betas: tuple[float, float] = (0.9, 0.99),
                 tau: float = 1e-3, initial_v: float = 1e-6) -> None:
        if lr <= 0 or tau <= 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"Yogi: lr and tau must be positive and betas in [0, 1), got {lr}, {tau}, {betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "tau": tau, "initial_v": initial_v})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state[param]
                if not state:
                    state["m"] = torch.zeros_like(param)
                    state["v"] = torch.full_like(param, group["initial_v"])
                m, v = state["m"], state["v"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                squared = grad * grad
                v.sub_((1 - beta2) * squared * torch.sign(v - squared))
                param.sub_(group["lr"] * m / (v.sqrt() + group["tau"]))
        return loss
