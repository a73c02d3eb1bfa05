"""A user's own model in three lines: ``register_model`` (or the ``graphfed.models`` entry-point group) makes
``model.name`` accept it everywhere; it trains with FedAvg, FedRep and Panacea in the simulator and on Flower's
in-process grid; a model that cannot run many clients at once is one line naming the fix."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import without_wall_time
from graphfed.config import ConfigError, load_config
from graphfed.flower.app import run_on_grid
from graphfed.flower.server import FLOWER_FIELDS
from graphfed.models import MODELS, PLUGIN_MODELS, load_model_plugins, register_model
from graphfed.sim.engine import run_config
from test_flower import grid_for


class TwoLayer(nn.Module):
    """What a user writes: a plain module, with a features() method for methods that read a representation."""

    def __init__(self, inputs: int, classes: int, width: int = 12) -> None:
        super().__init__()
        self.body = nn.Linear(inputs, width)
        self.out = nn.Linear(width, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.body(x.flatten(1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.features(x))


def two_layer(fed, width: int = 12) -> nn.Module:  # type: ignore[no-untyped-def]
    return TwoLayer(int(torch.tensor(fed.input_shape).prod()), fed.output_dim, width)


class Unvectorisable(TwoLayer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum().item() > 1e9:  # a Python branch on a tensor's value: vmap cannot trace it
            return x
        return super().forward(x)


@pytest.fixture
def registered() -> Iterator[None]:
    register_model("two-layer", two_layer, "a test's own model", head="out", replace=True)
    register_model("unvectorisable", lambda fed: Unvectorisable(int(torch.tensor(fed.input_shape).prod()),
                                                                  fed.output_dim), replace=True)
    yield
    for name in ("two-layer", "unvectorisable"):
        MODELS.pop(name, None)
        PLUGIN_MODELS.discard(name)


def config_for(method: str, *extra: str):  # type: ignore[no-untyped-def]
    small = {"panacea": ["method.options={embedding_dim: 8, gnn_hidden: 16, hypernet_hidden: 16, server_steps: 2}"]}
    return load_config(None, ["dataset.name=fln", "dataset.num_clients=6", "dataset.novel_fraction=0",
                              "model.name=two-layer", "model.options={width: 10}", f"method.name={method}",
                              *small.get(method, []), "train.rounds=8", "train.eval_every=4",
                              "train.clients_per_round=6", "train.local_steps=10", "train.batch_size=16", *extra])


@pytest.mark.parametrize("method", ["fedavg", "fedrep", "panacea"])
def test_a_registered_model_trains_in_the_simulator_and_on_flower(registered: None, method: str) -> None:
    config = config_for(method)
    simulated = run_config(config, progress=False)
    assert simulated.status == "completed"
    assert simulated.num_params == (10 * 2 + 10) + (10 * 2 + 2)  # its own layers: fln has 2 features, 2 classes
    assert simulated.test_mean > simulated.trivial_test_mean  # it learned something beyond the majority class
    on_flower = run_on_grid(grid_for(config), config, None)
    drop = (*FLOWER_FIELDS, "models_note")
    assert ({k: v for k, v in without_wall_time(on_flower).items() if k not in drop}
            == {k: v for k, v in without_wall_time(simulated).items() if k not in drop})


def test_fedrep_personalises_the_registered_head(registered: None, tmp_path: Path) -> None:
    """FedRep keeps each client's head (the registered ``out`` layer) on the client: in the saved models the
    clients' heads differ while the body they evaluate with is the shared one."""
    from graphfed.export import client_state

    result = run_config(config_for("fedrep"), tmp_path, progress=False)
    names = list(result.per_client or {})
    first, _, _ = client_state(tmp_path, names[0])
    second, _, _ = client_state(tmp_path, names[1])
    assert torch.equal(first["net.body.weight"], second["net.body.weight"])
    assert not torch.equal(first["net.out.weight"], second["net.out.weight"])


def test_a_model_that_cannot_be_vectorised_is_one_line_naming_the_fix(registered: None) -> None:
    config = load_config(None, ["dataset.name=fln", "dataset.num_clients=4", "model.name=unvectorisable",
                                "model.options={}", "train.rounds=1"])
    with pytest.raises(ConfigError, match=r"model 'unvectorisable' cannot run many clients at once under "
                                          r"torch\.func\.vmap .*no \.item\(\) or Python branches on tensor values"):
        run_config(config, progress=False)


def test_register_model_refuses_to_shadow_a_model_and_the_options_are_the_factorys(registered: None) -> None:
    with pytest.raises(ValueError, match="model 'mlp' is already registered"):
        register_model("mlp", two_layer)
    with pytest.raises(ConfigError, match=r"model.options.depth: unknown option; options of 'two-layer': width"):
        load_config(None, ["model.name=two-layer", "model.options={depth: 3}"])


def test_an_installed_package_registers_models_through_the_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = importlib.metadata.EntryPoint("plugin-two-layer", f"{__name__}:two_layer", "graphfed.models")
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [entry] if group == "graphfed.models" else [])
    load_model_plugins.cache_clear()
    try:
        config = load_config(None, ["dataset.name=fln", "dataset.num_clients=4", "model.name=plugin-two-layer",
                                    "train.rounds=2", "train.eval_every=2"])
        assert run_config(config, progress=False).status == "completed"
    finally:
        MODELS.pop("plugin-two-layer", None)
        PLUGIN_MODELS.discard("plugin-two-layer")
        load_model_plugins.cache_clear()
