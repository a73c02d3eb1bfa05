"""How a model runs many clients' convolutions (``train.conv_kernel``): every kernel computes the loop's numbers, each
client's BatchNorm keeps to its own rows, padded scoring blocks score each client alone, and the choice is pinned,
defaulted, measured and cached as the chunk size is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from conftest import model_and_rule, model_client_data
from graphfed.client import autotune
from graphfed.client.autotune import choose_conv_kernel, measured_conv_kernel
from graphfed.client.contract import ClientRule
from graphfed.client.evaluation import evaluate_clients, padded_client_blocks
from graphfed.client.placement import autocast
from graphfed.client.training import train_clients
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.errors import ConfigError
from graphfed.models import MODELS, build_model
from graphfed.models.base import CONV_KERNELS, ClientGroups, TargetModel
from graphfed.models.cnn_bn import CNNBN
from graphfed.sim.engine import Simulator
from rounding import assert_equal_up_to_summation_order

COUNTS = (7, 3, 12, 5, 9)
#: the models that offer a choice of kernels, with each kernel they offer
KERNEL_CASES = [(name, kernel) for name in sorted(MODELS)
                for kernel in getattr(build_model(name, model_client_data(name, [2], seed=1)[0], {}),
                                      "conv_kernels", ())]


def _model_and_rule(name: str) -> tuple[TargetModel, ParamSpec, ClientSplit, ClientRule, torch.Tensor]:
    return model_and_rule(name, COUNTS)


def test_the_convolutional_models_offer_their_kernels() -> None:
    offered = {name: kernel for name, kernel in KERNEL_CASES}
    assert {"lenet", "cnn", "cnn-bn", "pfl-cnn"} <= set(offered)
    assert all(kernel in CONV_KERNELS for _, kernel in KERNEL_CASES)
    assert ("cnn-bn", "unfold") in KERNEL_CASES and ("lenet", "unfold") in KERNEL_CASES


@pytest.mark.kernel_paths
@pytest.mark.parametrize(("name", "kernel"), KERNEL_CASES)
def test_every_conv_kernel_trains_each_client_to_the_loops_weights(name: str, kernel: str) -> None:
    """Three SGD steps of five unequal clients by ``kernel`` against each client trained alone by the model's own
    network (``functional_call``, the plain module's kernels): the same weights up to float rounding."""
    model, spec, split, rule, start = _model_and_rule(name)
    model.conv_kernel = kernel
    trained = train_clients(model, spec, start, split, rule, [11, 12, 13, 14, 15]).trained
    model.conv_kernel = None
    alone = torch.cat([train_clients(model, spec, start[[s]], split.select(torch.tensor([s])), rule,
                                     [11 + s]).trained for s in range(len(COUNTS))])
    assert (alone - start).abs().max() > 1e-3  # the clients did train
    torch.testing.assert_close(trained, alone, rtol=1e-4, atol=1e-5)


@pytest.mark.kernel_paths
@pytest.mark.parametrize("kernel", ["grouped", "unfold"])
def test_client_groups_convolution_is_each_clients_own(kernel: str) -> None:
    """One layer with padding, stride and dilation: client s's slice of the batched output is ``F.conv2d`` of its
    own images and weights, within summation order."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 2, 9, 9, generator=generator)
    weight, bias = torch.randn(3, 5, 2, 3, 3, generator=generator), torch.randn(3, 5, generator=generator)
    groups = ClientGroups(x, kernel)
    options = {"stride": 2, "padding": 1, "dilation": 2}
    out = groups.conv2d(groups.images, weight, bias, **options)
    for s in range(3):
        own = F.conv2d(x[s], weight[s], bias[s], **options)
        magnitude = F.conv2d(x[s].abs().double(), weight[s].abs().double(), bias[s].abs().double(), **options)
        assert_equal_up_to_summation_order(out[:, 5 * s:5 * (s + 1)].contiguous(), own, magnitude.float(), 2 * 9 + 1)


def test_client_groups_refuse_a_kernel_they_do_not_run() -> None:
    with pytest.raises(ValueError, match="grouped or unfold"):
        ClientGroups(torch.zeros(1, 1, 1, 4, 4), "vmap")


def _cnn_bn_and_client_weights(image: tuple[int, int, int], channels: int, hidden: int, spread: float, seed: int,
                               ) -> tuple[CNNBN, dict[str, torch.Tensor], torch.Generator]:
    """A small CNN-BN and three clients' weights: its own, each perturbed by ``spread`` x a normal draw."""
    torch.manual_seed(0)
    model = CNNBN(image, 4, channels=channels, hidden=hidden)
    generator = torch.Generator().manual_seed(seed)
    params = {name: value.detach() + spread * torch.randn(3, *value.shape, generator=generator)
              for name, value in model.named_parameters()}
    return model, params, generator


@pytest.mark.parametrize("kernel", ["grouped", "unfold"])
def test_grouped_batch_norm_keeps_each_clients_statistics_to_its_own_rows(kernel: str) -> None:
    """Clients with padding rows in different places: each client's real rows get the outputs of its own network
    on those rows alone (the statistics of its rows, not another client's, not the padding's)."""
    model, params, generator = _cnn_bn_and_client_weights((1, 16, 16), channels=3, hidden=8, spread=0.1, seed=1)
    x = torch.rand(3, 6, 1, 16, 16, generator=generator)
    x[0, 4:] = 0  # padding at the end of client 0, none in client 1, at the start of client 2
    x[2, :3] = 0
    real = {0: slice(0, 4), 1: slice(0, 6), 2: slice(3, 6)}
    outputs = model.grouped_forward(params, x, kernel=kernel)
    for s, rows in real.items():
        own = functional_call(model, {name: value[s] for name, value in params.items()}, (x[s, rows],))
        torch.testing.assert_close(outputs[s, rows], own, atol=1e-5, rtol=1e-5)


def _unequal_split(counts: list[int], shape: tuple[int, ...] = (1, 16, 16)) -> ClientSplit:
    generator = torch.Generator().manual_seed(5)
    xs = [torch.rand(n, *shape, generator=generator) + 0.1 for n in counts]
    ys = [torch.randint(0, 4, (n,), generator=generator) for n in counts]
    return ClientSplit.from_lists(xs, ys, "classification")


def test_padded_blocks_hold_each_clients_whole_split_once_longest_first() -> None:
    counts = [9, 3, 0, 14, 5]
    data = _unequal_split(counts)
    row_values = 16 * 16
    blocks = list(padded_client_blocks(data, max_elements=2 * 14 * row_values))
    owners = [int(owner) for block in blocks for owner in block.owner]
    assert sorted(owners) == [0, 1, 3, 4]  # every client with rows, once; the empty one in none
    assert owners == [3, 0, 4, 1]  # longest first: neighbours pad little
    for block in blocks:
        assert block.x.numel() <= 2 * 14 * row_values or len(block.owner) == 1
        for position, owner in enumerate(block.owner.tolist()):
            start, count = int(data.starts[owner]), counts[owner]
            assert int(block.mask[position].sum()) == count and bool(block.mask[position, :count].all())
            torch.testing.assert_close(block.x[position, :count], data.x[start:start + count], rtol=0, atol=0)
            assert bool((block.x[position, count:] == 0).all())  # padding: all-zero rows, out of BN's statistics


@pytest.mark.parametrize("kernel", ["grouped", "unfold"])
def test_scoring_many_clients_per_call_gives_each_client_its_own_score(kernel: str) -> None:
    """A network scoring padded blocks of several clients (``pads_scoring_blocks``) gives each client the score its
    network gives its split alone, blocks of one client or many alike."""
    torch.manual_seed(0)
    model = CNNBN((1, 16, 16), 4, channels=3, hidden=8)
    data = _unequal_split([9, 3, 14, 5])
    spec = ParamSpec.from_module(model)
    weights = spec.flatten_module(model).detach().unsqueeze(0).repeat(4, 1)
    weights += 0.05 * torch.randn(weights.shape, generator=torch.Generator().manual_seed(2))
    looped = evaluate_clients(model, spec, weights, data, "classification")
    model.conv_kernel = kernel
    assert model.pads_scoring_blocks(torch.device("cpu"))
    for max_elements in (16 * 16, 2 * 14 * 16 * 16, 10 ** 6):  # one client a block, two, all
        together = evaluate_clients(model, spec, weights, data, "classification", max_elements=max_elements)
        torch.testing.assert_close(together.loss, looped.loss, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(together.metric, looped.metric)
        torch.testing.assert_close(together.counts, looped.counts)


# --- the choice ------------------------------------------------------------------------------------------------


def test_a_pinned_kernel_wins_and_one_the_model_lacks_is_refused_by_name(tmp_path: Path) -> None:
    model, spec, split, rule, _ = _model_and_rule("cnn-bn")
    choice = choose_conv_kernel(model, spec, split, rule, 5, pinned="unfold", cache_file=tmp_path / "a.json")
    assert (choice.conv_kernel, choice.source) == ("unfold", "pinned")
    lenet = _model_and_rule("lenet")
    with pytest.raises(ConfigError, match=r"LeNet cannot run 'vmap'; its kernels: grouped, unfold$"):
        choose_conv_kernel(*lenet[:4], 5, pinned="vmap")
    mlp = _model_and_rule("mlp")
    with pytest.raises(ConfigError, match="no convolutions to batch"):
        choose_conv_kernel(*mlp[:4], 5, pinned="grouped")


def test_a_cpu_keeps_each_models_default_without_measuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_measuring(*args: object, **kwargs: object) -> None:
        raise AssertionError("a CPU run must not measure its convolution kernel")

    monkeypatch.setattr(autotune, "measure", no_measuring)
    for name, default in (("cnn-bn", "loop"), ("lenet", "grouped"), ("pfl-cnn", "loop"), ("mlp", None)):
        model, spec, split, rule, _ = _model_and_rule(name)
        choice = choose_conv_kernel(model, spec, split, rule, 5, cache_file=tmp_path / "a.json")
        assert (choice.conv_kernel, choice.source) == (default, "model")
    assert not (tmp_path / "a.json").exists()


def test_the_measured_kernel_is_the_fastest_beyond_noise_ties_to_the_models_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted timings: a kernel clearly faster than the default wins; two within tolerance of each other go to the
    earlier in the model's order; a kernel faster only within the spread leaves the default."""
    model, spec, split, rule, _ = _model_and_rule("cnn-bn")
    planted: dict[str, list[float]] = {}
    monkeypatch.setattr(autotune, "measure", lambda *args, **kwargs: {k: list(v) for k, v in planted.items()})
    candidates = ["vmap", "grouped", "unfold"]
    cases = [({"vmap": [1.0] * 5, "grouped": [0.60] * 5, "unfold": [0.50] * 5}, "unfold"),
             ({"vmap": [1.0] * 5, "grouped": [0.51] * 5, "unfold": [0.50] * 5}, "grouped"),
             ({"vmap": [1.0, 0.9, 1.1, 1.0, 0.95], "grouped": [0.92, 0.97, 0.93, 0.99, 1.05], "unfold": [2.0] * 5},
              "vmap")]
    for index, (timings, expected) in enumerate(cases):
        planted.clear()
        planted.update(timings)
        choice = measured_conv_kernel(model, spec, split, rule, candidates, "vmap", tmp_path / f"{index}.json")
        assert (choice.conv_kernel, choice.source) == (expected, "measured"), timings
        assert set(choice.seconds_per_client) == set(candidates)


def test_measuring_times_every_kernel_restores_the_model_and_caches(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The real calibration on this CPU (what an accelerator runs): every candidate timed, the model's kernel and
    chunk size as they were, the choice cached under the run's key and read back; a corrupt cache measures again.
    The suite's own load must not make the measurement suspect (uncached), as in ``tests/test_autotune.py``."""
    monkeypatch.setattr(autotune, "machine_load", lambda: 0.2)
    monkeypatch.setattr(autotune, "SUSPECT_SPREAD", float("inf"))
    model, spec, split, rule, _ = _model_and_rule("cnn-bn")
    cache = tmp_path / "autotune.json"
    first = measured_conv_kernel(model, spec, split, rule, ["vmap", "grouped", "unfold"], "vmap", cache)
    assert first.source == "measured" and first.conv_kernel in ("vmap", "grouped", "unfold")
    assert set(first.seconds_per_client) == {"vmap", "grouped", "unfold"}
    assert all(seconds > 0 for seconds in first.seconds_per_client.values())
    assert model.conv_kernel is None and model.clients_per_chunk == 8
    assert first.certainty["suspect"] is False
    again = measured_conv_kernel(model, spec, split, rule, ["vmap", "grouped", "unfold"], "vmap", cache)
    assert (again.conv_kernel, again.source) == (first.conv_kernel, "cached")
    entries = json.loads(cache.read_text())
    (key,) = entries
    assert "conv kernels=vmap,grouped,unfold" in key and "CNNBN" in key
    entries[key]["conv_kernel"] = "no-such-kernel"
    cache.write_text(json.dumps(entries))
    assert measured_conv_kernel(model, spec, split, rule, ["vmap", "grouped", "unfold"], "vmap",
                                cache).source == "measured"


def test_a_run_records_its_kernel_and_a_pinned_one_gives_the_loops_numbers(make_config, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``train.conv_kernel: grouped`` on a CPU trains and scores CNN-BN's clients all at once: the summary says so,
    and the scores are the client loop's up to float rounding."""
    monkeypatch.setenv("GRAPHFED_CACHE", str(tmp_path / "cache"))
    images = ["dataset.name=mnist", "dataset.num_clients=4", "dataset.client_fraction=0.01", "model.name=cnn-bn",
              "model.options={channels: 4, hidden: 16}", "train.rounds=2", "train.eval_every=1",
              "train.clients_per_round=3", "torch_threads=1"]
    looped = Simulator(make_config("fedavg", *images), progress=False).run()
    assert looped.execution["cnn-bn"]["conv_kernel"] == {"conv_kernel": "loop", "source": "model",
                                                          "seconds_per_client": {}}
    grouped = Simulator(make_config("fedavg", *images, "train.conv_kernel=grouped"), progress=False).run()
    assert grouped.execution["cnn-bn"]["conv_kernel"]["source"] == "pinned"
    assert grouped.execution["cnn-bn"]["clients_per_chunk"] != 1  # no longer one client at a time
    assert grouped.test_mean == pytest.approx(looped.test_mean, abs=1e-6)
    assert grouped.val_mean == pytest.approx(looped.val_mean, abs=1e-6)


def test_a_kernel_the_model_lacks_is_refused_before_the_data_are_read(make_config) -> None:
    from graphfed.setup import build_setup

    with pytest.raises(ConfigError, match=r"train.conv_kernel: MLP cannot run 'grouped'"):
        build_setup(make_config("fedavg", "train.conv_kernel=grouped"))


@pytest.mark.parametrize("kernel", ["grouped", "unfold"])
def test_bf16_runs_each_batched_kernel_within_bf16_rounding_of_fp32(kernel: str) -> None:
    """Under ``train.precision: bf16`` a batched kernel's products really run in bf16 (its outputs are not fp32's),
    yet each client's logits stay within bf16's rounding of the fp32 loop's."""
    model, params, generator = _cnn_bn_and_client_weights((3, 16, 16), channels=4, hidden=16, spread=0.05, seed=3)
    x = torch.rand(3, 8, 3, 16, 16, generator=generator)
    looped = model.client_loop_forward(params, x)
    model.conv_kernel = kernel
    with autocast("bf16", torch.device("cpu")):
        low = model.batched_forward(params, x).float()
    scale = looped.abs().max()
    assert not torch.equal(low, looped)
    assert float((low - looped).abs().max() / scale) < 0.05  # bf16 keeps 8 bits: a few 2^-8 through four layers
