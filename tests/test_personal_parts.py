"""FedBN, FedPer, LG-FedAvg and FedBABU: which tensors stay on the client, which travel, and what that does.

Each asserts the method's defining behaviour on a seeded run: the personal tensors differ between clients after
training while the shared ones are the server's; the personal tensors never count in bytes up; FedBABU's head is
bit-identical to its initialisation on the server and changes only in the clients' evaluation fine-tuning.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import ConfigFactory
from graphfed.export import client_state
from graphfed.sim.engine import Simulator
from graphfed.sim.stages import BYTES_PER_VALUE

#: MNIST (from ../shared/data), 4 clients at 1 % of the rows, a small CNN with BatchNorm
FEDBN = ["dataset.name=mnist", "dataset.num_clients=4", "dataset.client_fraction=0.01", "model.name=cnn-bn",
         "model.options={channels: 4, hidden: 16}", "train.rounds=4", "train.eval_every=4"]


def run(make_config: ConfigFactory, method: str, tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    simulator = Simulator(make_config(method, "dataset.novel_fraction=0", "train.clients_per_round=12",
                                      *extra), tmp_path, progress=False)
    return simulator, simulator.run()


def states(tmp_path: Path, names: list[str]) -> list[dict[str, torch.Tensor]]:
    return [client_state(tmp_path, name)[0] for name in names]


def shared_and_personal(state: list[dict[str, torch.Tensor]], personal: tuple[str, ...]) -> tuple[bool, bool]:
    """(every shared tensor equal across clients, every personal tensor different between the first two)."""
    shared_equal = all(torch.equal(state[0][k], s[k]) for s in state[1:] for k in state[0] if k not in personal)
    personal_differ = all(not torch.equal(state[0][k], state[1][k]) for k in personal)
    return shared_equal, personal_differ


@pytest.mark.parametrize(("method", "part"), [("fedper", "head"), ("lg-fedavg", "body")])
def test_the_personal_part_stays_on_each_client_and_out_of_bytes_up(make_config: ConfigFactory, tmp_path: Path,
                                                                    method: str, part: str) -> None:
    simulator, result = run(make_config, method, tmp_path)
    setting = simulator.setup.client_rule.setting
    personal = setting.head if part == "head" else setting.body
    shared_equal, personal_differ = shared_and_personal(states(tmp_path, list(result.per_client or {})), personal)
    assert shared_equal and personal_differ
    uploads = result.rounds * config_clients(simulator)
    assert result.bytes_up == uploads * (setting.spec.dim - setting.numel(personal)) * BYTES_PER_VALUE
    assert result.bytes_down == uploads * setting.spec.dim * BYTES_PER_VALUE
    assert result.test_mean > result.trivial_test_mean


def config_clients(simulator: Simulator) -> int:
    return simulator.clients_per_round


def test_fedbn_keeps_batchnorm_on_each_client_and_never_uploads_it(make_config: ConfigFactory,
                                                                   tmp_path: Path) -> None:
    simulator, result = run(make_config, "fedbn", tmp_path, *FEDBN)
    setting = simulator.setup.client_rule.setting
    assert setting.norm == ("bn1.weight", "bn1.bias", "bn2.weight", "bn2.bias")
    shared_equal, personal_differ = shared_and_personal(states(tmp_path, list(result.per_client or {})), setting.norm)
    assert shared_equal and personal_differ
    uploads = result.rounds * config_clients(simulator)
    assert result.bytes_up == uploads * (setting.spec.dim - setting.numel(setting.norm)) * BYTES_PER_VALUE


def test_fedbn_refuses_a_model_without_batchnorm(make_config: ConfigFactory) -> None:
    from graphfed.errors import ConfigError

    with pytest.raises((ConfigError, ValueError), match="FedBN needs a model with BatchNorm layers"):
        Simulator(make_config("fedbn", "dataset.name=fln", "dataset.client_fraction=null", "model.name=mlp",
                              "model.options={hidden: 8}"), progress=False)


def test_fedbabus_head_stays_at_its_initialisation_until_fine_tuning(make_config: ConfigFactory,
                                                                     tmp_path: Path) -> None:
    simulator, result = run(make_config, "fedbabu", tmp_path)
    method, setting = simulator.setup.method, simulator.setup.client_rule.setting
    head = simulator.setup.method.context.head_index()
    init = simulator.setup.method.context.init_weights
    assert torch.equal(method.global_weights[head], init[head])  # bit-identical on the server
    assert not torch.equal(method.global_weights[~torch.isin(torch.arange(len(init)), head)],
                           init[~torch.isin(torch.arange(len(init)), head)])  # the body learned
    # the clients scored with heads fine-tuned from it (different per client), on the shared body
    saved = states(tmp_path, list(result.per_client or {}))
    shared_equal, personal_differ = shared_and_personal(saved, setting.head)
    assert shared_equal and personal_differ
    uploads = result.rounds * config_clients(simulator)
    assert result.bytes_up == uploads * setting.numel(setting.body) * BYTES_PER_VALUE
