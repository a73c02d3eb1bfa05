"""No combination a config can name is "a bug in graphfed": every method with every registered model on a tabular, an
image and a sequence federation, and every model option's invalid values, either runs a round or stops with one
line under ``GraphfedError`` (exit 2). Anything else (a ValueError, a TypeError, a RuntimeError from torch) fails
here with the combination that raised it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TEXT_MODELS, TINY_METHOD_OPTIONS
from graphfed.config import load_config
from graphfed.data import DATASETS, build_federation, federation_from_clients, register_dataset
from graphfed.data.federation import Federation
from graphfed.errors import ConfigError, GraphfedError
from graphfed.methods import METHODS
from graphfed.models import MODELS
from graphfed.sim.engine import run_config

#: one round on a few clients: the walk asks whether a combination runs, not how well
ONE_ROUND = ["train.rounds=1", "train.eval_every=1", "train.local_steps=1", "train.batch_size=8",
             "train.clients_per_round=3", "train.novel_adapt_rounds=1", "train.autotune=false", "torch_threads=1"]
#: small versions of each model (the options the walk does not vary)
SMALL_MODELS = {"mlp": "{hidden: 8}", "cnn": "{channels: 4, hidden: 16}", "pfl-cnn": "{}",
                "resnet-like": "{width: 4}", "cnn-bn": "{channels: 4, hidden: 16}",
                "lenet": "{channels: 4, hidden: 16, hidden2: 8}", "gru": "{hidden: 8}",
                "char-transformer": "{width: 8, layers: 1, heads: 2, adapter: {kind: lora, rank: 2, targets: [qkv, "
                                    "head]}}",
                "leaf-lstm": "{embedding: 4, hidden: 8, layers: 1}"}
#: methods that federate clients of different architectures: they need model.architectures
ARCHITECTURE_METHODS = ("flha-ghn", "flha-distill")


@dataclass
class Kind:
    """A kind of federation: its dataset overrides and the federation they build (built once, shared)."""

    overrides: list[str]
    federation: Federation


def _text(cfg, streams):  # type: ignore[no-untyped-def]
    """6 speakers of 16-character windows over an 80-character alphabet, a dialogue chain (Shakespeare's shape)."""
    rng = np.random.default_rng(0)
    xs = [rng.integers(0, 80, (40, 16)).astype(np.float32) for _ in range(6)]
    ys = [x[:, -1].astype(np.int64) for x in xs]  # the next character: here the last one again
    chain = torch.zeros(6, 6)
    chain[torch.arange(5), torch.arange(1, 6)] = chain[torch.arange(1, 6), torch.arange(5)] = 1.0
    return federation_from_clients("walk-text", xs, ys, cfg, streams, task="classification", output_dim=80,
                                   client_graph=chain, client_names=[f"role{i}" for i in range(6)],
                                   alphabet="".join(chr(32 + k) for k in range(80)))


def _series(cfg, streams):  # type: ignore[no-untyped-def]
    """6 sensors on a chain, windows of 12 readings -> the next 3 (METR-LA's shape, in small)."""
    steps = np.arange(200)
    windows = np.lib.stride_tricks.sliding_window_view(steps, 15)
    xs, ys = [], []
    for sensor in range(6):
        series = np.sin(windows / 9.0 + sensor).astype(np.float32)
        xs.append(series[:, :12])
        ys.append(series[:, 12:])
    chain = torch.zeros(6, 6)
    chain[torch.arange(5), torch.arange(1, 6)] = chain[torch.arange(1, 6), torch.arange(5)] = 1.0
    return federation_from_clients("walk-series", xs, ys, cfg, streams, task="regression", output_dim=3,
                                   client_graph=chain, client_names=[f"sensor{i}" for i in range(6)])


@pytest.fixture(scope="module")
def datasets() -> Iterator[dict[str, Kind]]:
    """Tabular (FL-N), image (a sliver of MNIST) and sequence (6 sensors, METR-LA's window shape; registered for
    the module only, so the registries other tests read stay the shipped ones)."""
    register_dataset("walk-series", _series, task="regression", description="the walk's 6-sensor series")
    register_dataset("walk-text", _text, task="classification", description="the walk's 6 speakers")
    kinds = {"tabular": ["dataset.name=fln", "dataset.num_clients=6", "dataset.novel_fraction=0.2"],
             "image": ["dataset.name=mnist", "dataset.num_clients=6", "dataset.client_fraction=0.005",
                       "dataset.novel_fraction=0.2"],
             "sequence": ["dataset.name=walk-series", "dataset.novel_fraction=0.2"],
             "text": ["dataset.name=walk-text", "dataset.novel_fraction=0.2"]}
    yield {kind: Kind(overrides, build_federation(load_config(None, overrides).dataset, 0))
           for kind, overrides in kinds.items()}
    DATASETS.pop("walk-series")
    DATASETS.pop("walk-text")


def outcome(overrides: list[str], kind: Kind) -> str:
    """"ran", "refused: <the one line>" (a GraphfedError, exit 2, one line), or "BUG: ..." for anything else."""
    try:
        result = run_config(load_config(None, overrides), progress=False, federation=kind.federation)
    except GraphfedError as err:
        message = str(err)
        if not message or "\n" in message or err.exit_code != 2:
            return f"BUG: exit {err.exit_code}, not one line: {message!r}"
        return f"refused: {message}"
    except Exception as err:
        return f"BUG: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return "ran" if result.rounds == 1 else f"BUG: ran {result.rounds} rounds"


def bugs(outcomes: dict[tuple[str, str], str]) -> list[str]:
    return [f"{model} on {kind}: {text}" for (model, kind), text in outcomes.items() if text.startswith("BUG")]


#: the walk's small server-side settings beside conftest's (FLHA-distillation's 500 distillation steps)
WALK_METHOD_OPTIONS = {**TINY_METHOD_OPTIONS, "flha-distill": "method.options={distill_steps: 5}"}


def combination(method: str, model: str, dataset: Kind) -> list[str]:
    options = [WALK_METHOD_OPTIONS[method]] if method in WALK_METHOD_OPTIONS else []
    architectures = (["model.architectures=[arch0, small]"] if method in ARCHITECTURE_METHODS else [])
    return [*dataset.overrides, f"model.name={model}", f"model.options={SMALL_MODELS[model]}", *architectures,
            f"method.name={method}", *options, *ONE_ROUND]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_with_every_model_runs_a_round_or_says_why_in_one_line(
        method: str, datasets: dict[str, Kind]) -> None:
    """Each model on the kind of data it is for, and the MLP on all three; whatever does not fit is one line."""
    outcomes = {}
    for model in MODELS:
        kinds = ("tabular", "image", "sequence") if model == "mlp" else (
            ("sequence",) if model == "gru" else ("text",) if model in TEXT_MODELS else ("image",))
        for kind in kinds:
            outcomes[(model, kind)] = outcome(combination(method, model, datasets[kind]), datasets[kind])
    assert not bugs(outcomes), bugs(outcomes)
    assert any(value == "ran" for value in outcomes.values()), f"{method} ran on nothing: {outcomes}"


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_model_on_data_it_is_not_for_is_one_line(model: str, datasets: dict[str, Kind]) -> None:
    """FedAvg with each model on each kind of data: runs, or exit 2 in one line (a CNN on tabular rows, a GRU on
    images...)."""
    outcomes = {(model, kind): outcome(combination("fedavg", model, dataset), dataset)
                for kind, dataset in datasets.items()}
    assert not bugs(outcomes), bugs(outcomes)


#: options each model must refuse in one line (the walk's invalid values)
INVALID_OPTIONS = {
    "mlp": ["{hidden: 0}", "{hidden: -3}", "{num_layers: 0}", "{hidden: 2.5}", "{width: 4}"],
    "cnn": ["{channels: 0}", "{hidden: -1}", "{kernel: 3}"],
    "pfl-cnn": ["{channels: 8}"],
    "resnet-like": ["{width: 0}", "{arch: arch9}", "{width: -2}"],
    "cnn-bn": ["{channels: 0}", "{kernel_size: 0}", "{kernel_size: 40}", "{hidden: 0}"],
    "lenet": ["{channels: 0}", "{channels2: -1}", "{hidden2: 0}"],
    "gru": ["{hidden: 0}", "{hidden: true}"],
    "char-transformer": ["{width: 0}", "{width: 6, heads: 4}", "{adapter: {kind: prefix}}", "{adapter: {rank: 0}}"],
    "leaf-lstm": ["{hidden: 0}", "{embedding: -1}"],
}


def test_every_model_is_walked_for_invalid_options() -> None:
    assert sorted(INVALID_OPTIONS) == sorted(MODELS)


@pytest.mark.parametrize(("model", "options"), [(m, o) for m, values in INVALID_OPTIONS.items() for o in values])
def test_an_invalid_model_option_is_one_line(model: str, options: str, datasets: dict[str, Kind]) -> None:
    kind = datasets["sequence" if model == "gru" else ("tabular" if model == "mlp" else "image")]
    overrides = [*combination("fedavg", model, kind), f"model.options={options}"]
    with pytest.raises(ConfigError) as raised:
        run_config(load_config(None, overrides), progress=False, federation=kind.federation)
    assert "\n" not in str(raised.value) and "model" in str(raised.value), str(raised.value)


def test_fedbn_on_the_demos_mlp_names_batchnorm(tmp_path: Path) -> None:
    """The issue's example: FedBN needs BatchNorm; the demo's model is an MLP."""
    from typer.testing import CliRunner

    from graphfed import cli

    result = CliRunner().invoke(cli.app, ["run", "demo", "--set", "method.name=fedbn", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "BatchNorm" in lines[0] and "bug" not in lines[0], lines
