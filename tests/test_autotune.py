"""How many clients train at once (``graphfed.client.autotune``): every choice gives the same weights to float
rounding, the measured choice is cached and recorded, and ``train.clients_per_chunk`` pins it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import model_client_data
from graphfed.client import autotune
from graphfed.client.autotune import choose_clients_per_chunk
from graphfed.client.contract import ClientRule, ClientSetting, LocalTraining
from graphfed.client.training import train_clients
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.models import MODELS, build_model
from graphfed.sim.engine import Simulator

COUNTS = (7, 12, 9, 5, 10)


def _model_and_rule(name: str) -> tuple[object, ParamSpec, ClientSplit, ClientRule, torch.Tensor]:
    fed, split = model_client_data(name, COUNTS, seed=1)
    torch.manual_seed(0)
    model = build_model(name, fed, {})  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    rule = ClientRule(ClientSetting(spec, model.head_names, fed.task, fed.output_dim, LocalTraining(3, 4, 0.05)))
    start = spec.flatten_module(model).unsqueeze(0).repeat(len(COUNTS), 1)
    return model, spec, split, rule, start


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_chunk_size_trains_every_model_to_the_same_weights(name: str) -> None:
    """Clients are independent: one at a time (a per-client loop), a few at a time or all at once train each
    client to the same weights up to float rounding, so autotuning changes speed, not results."""
    model, spec, split, rule, start = _model_and_rule(name)
    trained = {}
    for size in (1, 2, len(COUNTS)):
        model.clients_per_chunk = size  # type: ignore[attr-defined]
        trained[size] = train_clients(model, spec, start, split, rule, [11, 12, 13, 14, 15]).trained  # type: ignore[arg-type]
    moved = (trained[1] - start).abs().max()
    assert moved > 1e-3  # the clients did train
    for size in (2, len(COUNTS)):
        torch.testing.assert_close(trained[size], trained[1], rtol=1e-4, atol=1e-5)


def test_the_measured_choice_is_the_fastest_and_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, spec, split, rule, _ = _model_and_rule("lenet")
    cache = tmp_path / "autotune.json"
    # a fake clock in which two clients per chunk is the fastest: the choice follows the measurement
    fake = {1: 3.0, 2: 1.0, 4: 2.0, 5: 2.5}
    monkeypatch.setattr(autotune, "synchronised_seconds", lambda run, device: fake[model.clients_per_chunk])
    torch.manual_seed(123)
    choice = choose_clients_per_chunk(model, spec, split, rule, clients_at_once=5, cache_file=cache)  # type: ignore[arg-type]
    assert choice.clients_per_chunk == 2 and choice.source == "measured"
    assert set(choice.seconds_per_client) == {1, 2, 4, 5}  # candidates up to the clients trained at once
    assert model.clients_per_chunk == 8  # type: ignore[attr-defined]  # the model's declaration is left as it was
    entry = next(iter(json.loads(cache.read_text()).values()))
    assert entry["clients_per_chunk"] == 2

    def no_measuring(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached choice must not be measured again")

    monkeypatch.setattr(autotune, "measure", no_measuring)
    again = choose_clients_per_chunk(model, spec, split, rule, clients_at_once=5, cache_file=cache)  # type: ignore[arg-type]
    assert (again.clients_per_chunk, again.source) == (2, "cached")
    # pinned wins; autotune off, a model with no declared chunk size, or a single client keep the declaration
    assert choose_clients_per_chunk(model, spec, split, rule, 5, pinned=3, cache_file=cache).clients_per_chunk == 3  # type: ignore[arg-type]
    assert choose_clients_per_chunk(model, spec, split, rule, 5, autotune=False, cache_file=cache).source == "model"  # type: ignore[arg-type]
    assert choose_clients_per_chunk(model, spec, split, rule, 1, cache_file=cache).source == "model"  # type: ignore[arg-type]


def test_calibration_does_not_consume_the_global_random_stream(tmp_path: Path) -> None:
    """A model with dropout draws its masks from the global RNG: calibrating must not shift them."""
    model, spec, split, rule, _ = _model_and_rule("lenet")
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    choose_clients_per_chunk(model, spec, split, rule, 3, cache_file=tmp_path / "a.json")  # type: ignore[arg-type]
    assert torch.equal(torch.rand(3), expected)


def test_a_corrupt_cache_is_measured_again_and_rewritten(tmp_path: Path) -> None:
    model, spec, split, rule, _ = _model_and_rule("lenet")
    cache = tmp_path / "autotune.json"
    cache.write_text('{"lenet|...": {"clients_per_chunk": "eight"}, ')  # truncated, wrong types
    choice = choose_clients_per_chunk(model, spec, split, rule, 2, cache_file=cache)  # type: ignore[arg-type]
    assert choice.source == "measured" and choice.clients_per_chunk in (1, 2)
    assert len(json.loads(cache.read_text())) == 1


def test_a_run_records_its_execution_and_a_pinned_chunk_size_reproduces_it(make_config, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary says how the clients were batched; pinning that size with ``train.clients_per_chunk`` gives
    the same numbers (how a run is reproduced on a machine whose calibration chose otherwise)."""
    monkeypatch.setenv("GRAPHFED_CACHE", str(tmp_path / "cache"))
    images = ["dataset.name=mnist", "dataset.num_clients=4", "dataset.client_fraction=0.01", "model.name=lenet",
              "model.options={}", "train.rounds=2", "train.eval_every=2", "train.clients_per_round=3"]
    measured = Simulator(make_config("fedavg", *images), progress=False).run()
    choice = measured.execution["lenet"]
    assert choice["source"] == "measured" and set(choice["seconds_per_client"]) == {"1", "2", "3"}
    pinned = Simulator(make_config("fedavg", *images, f"train.clients_per_chunk={choice['clients_per_chunk']}"),
                       progress=False).run()
    assert pinned.execution["lenet"]["source"] == "pinned"
    assert pinned.test_mean == measured.test_mean and pinned.val_mean == measured.val_mean
    mlp = Simulator(make_config("fedavg"), progress=False).run()
    assert mlp.execution == {"mlp": {"clients_per_chunk": None, "source": "model", "seconds_per_client": {}}}


def test_a_larger_chunk_must_be_clearly_faster_to_be_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two calibration steps cannot rank sizes within a few per cent: the smallest size within 5 % of the fastest
    wins (chunk 1, the per-client loop, is the safe side on a CPU)."""
    model, spec, split, rule, _ = _model_and_rule("lenet")
    fake = {1: 1.04, 2: 1.0, 4: 1.2, 5: 0.5}
    monkeypatch.setattr(autotune, "synchronised_seconds", lambda run, device: fake[model.clients_per_chunk])
    assert choose_clients_per_chunk(model, spec, split, rule, 5, cache_file=tmp_path / "a.json").clients_per_chunk == 5
    fake[5] = 1.2
    assert choose_clients_per_chunk(model, spec, split, rule, 5, cache_file=tmp_path / "b.json").clients_per_chunk == 1
