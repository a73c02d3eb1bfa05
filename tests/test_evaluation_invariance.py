"""A client's score does not depend on the order of its rows or on how evaluation blocks them, for every model.

Splits are stored class-sorted (the decoded pools are sorted by class and partitions keep that order), so a model
whose outputs depend on the other rows of its batch (BatchNorm with batch statistics) would score differently on
a shuffled split, or with another block size, if evaluation normalised per block. These tests evaluate each
registered model, and every member of the FLHA-GHN architecture family, on class-sorted rows, then on the same rows
shuffled and under a different chunking, and require the same per-client scores.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import TEXT_MODELS
from graphfed.client.evaluation import evaluate_clients
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.models import MODELS, build_model
from graphfed.models.resnet_like import ARCHITECTURES

#: rows per client: one above the old 256-row evaluation block, one mid-sized, one tiny
COUNTS = (300, 41, 7)
CASES = [(name, {}) for name in MODELS] + [("resnet-like", {"arch": arch}) for arch in ARCHITECTURES
                                             if arch != "arch0"]


def _federation(name: str) -> SimpleNamespace:
    if name in TEXT_MODELS:
        return SimpleNamespace(name="text", task="classification", input_shape=(16,), output_dim=80)
    if name == "gru":
        return SimpleNamespace(name="series", task="regression", input_shape=(12,), output_dim=3)
    if name == "mlp":
        return SimpleNamespace(name="tabular", task="classification", input_shape=(20,), output_dim=4)
    return SimpleNamespace(name="images", task="classification", input_shape=(3, 16, 16), output_dim=4)


def _split(fed: SimpleNamespace, generator: torch.Generator, shuffle: bool) -> ClientSplit:
    xs, ys = [], []
    for count in COUNTS:
        if fed.name == "text":  # character classes
            y = torch.arange(count) * fed.output_dim // count
            x = torch.randint(0, fed.output_dim, (count, *fed.input_shape), generator=generator).float()
        elif fed.task == "classification":
            y = torch.arange(count) * fed.output_dim // count  # class-sorted, as stored splits are
            x = torch.randn(count, *fed.input_shape, generator=generator) + y.view(-1, *[1] * len(fed.input_shape))
        else:
            x = torch.randn(count, *fed.input_shape, generator=generator).sort(dim=0).values
            y = x[:, -fed.output_dim:] * 0.5
        if shuffle:
            order = torch.randperm(count, generator=torch.Generator().manual_seed(count))
            x, y = x[order], y[order]
        xs.append(x)
        ys.append(y)
    return ClientSplit.from_lists(xs, ys, fed.task)


@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{o.get('arch', '')}" for n, o in CASES])
def test_scores_do_not_depend_on_row_order_or_blocking(name: str, options: dict) -> None:
    fed = _federation(name)
    torch.manual_seed(0)
    model = build_model(name, fed, options)  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    weights = []
    for client in range(len(COUNTS)):  # a different network per client, as personalised methods send
        torch.manual_seed(client)
        weights.append(spec.flatten_module(build_model(name, fed, options)))  # type: ignore[arg-type]
    weights_tensor = torch.stack(weights)
    sorted_rows = _split(fed, torch.Generator().manual_seed(1), shuffle=False)
    shuffled_rows = _split(fed, torch.Generator().manual_seed(1), shuffle=True)
    reference = evaluate_clients(model, spec, weights_tensor, sorted_rows, fed.task)
    for rows, max_elements in ((shuffled_rows, 4_000_000), (sorted_rows, 5_000), (shuffled_rows, 5_000)):
        other = evaluate_clients(model, spec, weights_tensor, rows, fed.task, max_elements=max_elements)
        torch.testing.assert_close(other.loss, reference.loss, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(other.metric, reference.metric, rtol=1e-4, atol=1e-6)


def test_a_batch_statistics_model_is_scored_on_the_whole_split_at_once() -> None:
    """The check above fails for a BN model scored in fixed blocks: normalising the 300-row class-sorted client in
    blocks changes its outputs, so the whole-split rule is what makes the scores order-free."""
    fed = _federation("cnn-bn")
    torch.manual_seed(0)
    model = build_model("cnn-bn", fed, {"channels": 4, "hidden": 8})  # type: ignore[arg-type]
    assert model.batch_statistics
    spec = ParamSpec.from_module(model)
    rows = _split(fed, torch.Generator().manual_seed(1), shuffle=False)
    x = rows.x[:COUNTS[0]]
    params = spec.unflatten(spec.flatten_module(model).unsqueeze(0))
    with torch.no_grad():
        whole = model.batched_forward(params, x.unsqueeze(0))
        in_blocks = torch.cat([model.batched_forward(params, block.unsqueeze(0)) for block in x.split(100)], dim=1)
    assert (whole - in_blocks).abs().max() > 1e-3
