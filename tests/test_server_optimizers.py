"""FedOpt's server optimisers (``server_optimizer``): the server's step on the clients' mean update is exactly
torch's optimiser on that pseudo-gradient (Yogi: the paper's rule, by hand), and a resumed run keeps the
optimiser's state."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import ConfigFactory, without_wall_time
from graphfed.setup import build_setup
from graphfed.sim.engine import Simulator
from test_engine import interrupt_at


def method_with(make_config: ConfigFactory, options: str, method: str = "fedavg"):  # type: ignore[no-untyped-def]
    return build_setup(make_config(method, f"method.options={options}")).method


def rounds_of_updates(dim: int, rounds: int = 3, clients: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(clients, dim, generator=generator), torch.randint(5, 50, (clients,), generator=generator))
            for _ in range(rounds)]


def run_updates(method, updates) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    after = []
    for delta, rows in updates:
        ids = torch.arange(len(delta))
        method.update(ids, method.personalize(ids), delta, {"num_examples": rows})
        after.append(method.global_weights.clone())
    return after


@pytest.mark.parametrize(("options", "reference"), [
    ("{server_optimizer: adam, server_lr: 0.01}",
     lambda p: torch.optim.Adam([p], lr=0.01, betas=(0.9, 0.99), eps=1e-3)),
    ("{server_optimizer: momentum, server_lr: 0.5, server_momentum: 0.8}",
     lambda p: torch.optim.SGD([p], lr=0.5, momentum=0.8)),
    ("{server_optimizer: adagrad, server_lr: 0.1, server_tau: 0.01}",
     lambda p: torch.optim.Adagrad([p], lr=0.1, eps=0.01)),
])
def test_the_server_step_is_torchs_optimiser_on_the_mean_update(make_config: ConfigFactory, options: str,
                                                                 reference) -> None:  # type: ignore[no-untyped-def]
    method = method_with(make_config, options)
    start = method.global_weights.clone()
    updates = rounds_of_updates(len(start))
    param = torch.nn.Parameter(start.clone())
    optimizer = reference(param)
    for got, (delta, rows) in zip(run_updates(method, updates), updates, strict=True):
        param.grad = (delta * rows[:, None].float()).sum(0) / rows.sum()  # the sample-weighted mean update
        optimizer.step()
        assert torch.allclose(got, param.detach(), atol=1e-6, rtol=1e-5)


def test_fedyogi_follows_the_papers_update_rule(make_config: ConfigFactory) -> None:
    """Reddi et al., Algorithm 2 (FedYogi), by hand: m = b1 m + (1-b1) g; v = v - (1-b2) g^2 sign(v - g^2);
    x = x - lr m / (sqrt(v) + tau)."""
    method = method_with(make_config, "{server_optimizer: yogi, server_lr: 0.05, server_betas: [0.8, 0.95], "
                                      "server_tau: 0.01}")
    x = method.global_weights.clone().double()
    updates = rounds_of_updates(len(x))
    m, v = torch.zeros_like(x), torch.full_like(x, 1e-6)
    for got, (delta, rows) in zip(run_updates(method, updates), updates, strict=True):
        g = ((delta * rows[:, None].float()).sum(0) / rows.sum()).double()
        m = 0.8 * m + 0.2 * g
        v = v - 0.05 * g * g * torch.sign(v - g * g)
        x = x - 0.05 * m / (v.sqrt() + 0.01)
        assert torch.allclose(got.double(), x, atol=1e-5)


def test_sgd_is_fedavgs_own_step(make_config: ConfigFactory) -> None:
    method = method_with(make_config, "{server_lr: 0.7}")
    start = method.global_weights.clone()
    (delta, rows), = rounds_of_updates(len(start), rounds=1)
    (got,) = run_updates(method, [(delta, rows)])
    assert torch.allclose(got, start - 0.7 * (delta * rows[:, None].float()).sum(0) / rows.sum(), atol=1e-6)
    assert not hasattr(method, "server_optimizer")  # plain FedAvg's own arithmetic: golden runs unchanged


@pytest.mark.parametrize("method", ["fedprox", "ditto"])
def test_methods_built_on_fedavgs_step_take_the_server_optimiser(make_config: ConfigFactory, method: str) -> None:
    plain = Simulator(make_config(method), progress=False).run()
    adam = Simulator(make_config(method, "method.options={server_optimizer: adam, server_lr: 0.05}"),
                     progress=False).run()
    assert adam.status == "completed" and adam.test_mean != plain.test_mean


def test_a_resumed_run_keeps_the_server_optimisers_state(make_config: ConfigFactory, tmp_path: Path) -> None:
    config = make_config("fedavg", "method.options={server_optimizer: yogi, server_lr: 0.05}", "train.rounds=6",
                         "train.eval_every=2", "train.checkpoint_every=2")
    whole = Simulator(config, progress=False).run()
    with pytest.MonkeyPatch.context() as patch:
        interrupt_at(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            Simulator(config, tmp_path, progress=False).run()
    resumed = Simulator(config, tmp_path, progress=False).run(resume=True)
    assert without_wall_time(resumed) == without_wall_time(whole)
