"""The vectorised client loop and evaluation against a plain one-module-per-client reference."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from graphfed.client.contract import ClientRule, ClientSetting, LocalTraining, plain_sgd
from graphfed.client.evaluation import evaluate_clients
from graphfed.client.training import draw_batch_indices, train_clients
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit, Task
from graphfed.models.base import TargetModel
from graphfed.models.cnn import SmallCNN
from graphfed.models.mlp import MLP

COUNTS = [3, 11, 7, 20]  # different sample counts per client; 20 rows after padding
SEED = 1234


@dataclass
class Case:
    """A tiny federation of 4 clients plus the model family that trains on it."""

    name: str
    task: Task
    make_model: Callable[[], TargetModel]
    data: ClientSplit


def _split(counts: list[int], feature_shape: tuple[int, ...], task: Task, out: int, seed: int) -> ClientSplit:
    g = torch.Generator().manual_seed(seed)
    width = max(counts)
    x = torch.randn(len(counts), width, *feature_shape, generator=g)
    if task == "classification":
        y = torch.randint(0, out, (len(counts), width), generator=g)
    else:
        y = torch.randn(len(counts), width, out, generator=g)
    return ClientSplit.from_padded(x, y, torch.tensor(counts))


def _mlp_classifier() -> TargetModel:
    torch.manual_seed(0)
    return MLP(5, 3, hidden=8)


def _mlp_regressor() -> TargetModel:
    torch.manual_seed(0)
    return MLP(4, 2, hidden=8)


def _cnn() -> TargetModel:
    torch.manual_seed(0)
    return SmallCNN((1, 8, 8), 3, channels=2, hidden=8)


def make_case(name: str, counts: list[int] | None = None) -> Case:
    counts = counts or COUNTS
    if name == "mlp":
        return Case(name, "classification", _mlp_classifier, _split(counts, (5,), "classification", 3, 7))
    if name == "mlp-regression":
        return Case(name, "regression", _mlp_regressor, _split(counts, (4,), "regression", 2, 8))
    return Case(name, "classification", _cnn, _split(counts, (1, 8, 8), "classification", 3, 9))


CASES = ["mlp", "mlp-regression", "cnn"]


def start_weights(model: TargetModel, spec: ParamSpec, num_clients: int) -> torch.Tensor:
    """Different starting weights per client: the model's init plus a client-specific perturbation."""
    g = torch.Generator().manual_seed(5)
    return spec.flatten_module(model) + 0.05 * torch.randn(num_clients, spec.dim, generator=g)


def load_row(model: TargetModel, spec: ParamSpec, row: torch.Tensor) -> None:
    with torch.no_grad():
        for name, value in spec.unflatten(row).items():
            model.get_parameter(name).copy_(value)


def direct_loss(output: torch.Tensor, target: torch.Tensor, task: Task) -> torch.Tensor:
    if task == "classification":
        return F.cross_entropy(output, target)
    return (output - target.reshape(output.shape)).pow(2).mean()


def reference_training(case: Case, start: torch.Tensor, training: LocalTraining, seed: int,
                       prox_mu: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One nn.Module + torch.optim.SGD per client, the same index draw, clients updated one by one.

    Returns (trained weights [S, dim], first-step loss [S], last-step loss [S]).
    """
    data = case.data
    spec = ParamSpec.from_module(case.make_model())
    modules, optimizers = [], []
    for s in range(data.num_clients):
        module = case.make_model()
        load_row(module, spec, start[s])
        modules.append(module)
        optimizers.append(torch.optim.SGD(module.parameters(), lr=training.lr))
    batch_index = draw_batch_indices(data.counts, training.steps, training.batch_size,
                                     client_seeds(seed, data.num_clients))
    first = torch.zeros(data.num_clients)
    last = torch.zeros(data.num_clients)
    for step in range(training.steps):
        index = batch_index[:, step]
        for s, (module, optimizer) in enumerate(zip(modules, optimizers, strict=True)):
            if int(data.counts[s]) == 0:
                continue
            client_x, client_y = data.client(s)
            loss = direct_loss(module(client_x[index[s]]), client_y[index[s]], case.task)
            objective = loss
            if prox_mu > 0:
                current = spec.flatten(dict(module.named_parameters()))
                objective = loss + 0.5 * prox_mu * (current - start[s]).pow(2).sum()
            optimizer.zero_grad()
            objective.backward()
            optimizer.step()
            if step == 0:
                first[s] = loss.detach()
            last[s] = loss.detach()
    trained = torch.stack([spec.flatten_module(module) for module in modules])
    return trained, first, last


def client_seeds(seed: int, num_clients: int) -> list[int]:
    """Distinct per-client batch seeds derived from one test seed."""
    return [1000 * seed + client for client in range(num_clients)]


def run_vectorised(case: Case, training: LocalTraining, seed: int = SEED, data: ClientSplit | None = None,
                   prox_mu: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    model = case.make_model()
    spec = ParamSpec.from_module(model)
    data = data if data is not None else case.data
    start = start_weights(model, spec, data.num_clients)
    rule = ClientRule(ClientSetting(spec, model.head_names, case.task, 3, training), prox_mu=prox_mu)
    trained, metrics, _ = train_clients(model, spec, start, data, rule, client_seeds(seed, data.num_clients))
    return trained, metrics, start


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("prox_mu", [0.0, 0.5])
def test_train_clients_matches_a_plain_per_client_loop(name: str, prox_mu: float) -> None:
    """Vectorised training == per-client SGD with the same mini-batch indices, to 1e-5 (weights and losses)."""
    case = make_case(name)
    training = LocalTraining(steps=6, batch_size=5, lr=0.1)
    trained, metrics, start = run_vectorised(case, training, prox_mu=prox_mu)
    expected, first, last = reference_training(case, start, training, SEED, prox_mu)
    assert not torch.allclose(trained, start)  # training moved the weights at all
    torch.testing.assert_close(trained, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(metrics["loss_first"], first, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(metrics["loss_last"], last, atol=1e-5, rtol=1e-5)
    assert metrics["num_examples"].tolist() == [float(c) for c in COUNTS]


def test_training_is_reproducible_from_the_generator_seed() -> None:
    """Same generator seed -> bit-identical weights; another seed -> different mini-batches, other weights."""
    case = make_case("mlp")
    training = LocalTraining(steps=4, batch_size=3, lr=0.1)
    a, _, _ = run_vectorised(case, training, seed=1)
    b, _, _ = run_vectorised(case, training, seed=1)
    c, _, _ = run_vectorised(case, training, seed=2)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_start_shape_is_checked() -> None:
    """Start weights that are not [clients, dim] are rejected with the expected shape in the message."""
    case = make_case("mlp")
    model = case.make_model()
    spec = ParamSpec.from_module(model)
    with pytest.raises(ValueError, match=rf"\[4, {spec.dim}\]"):
        train_clients(model, spec, torch.zeros(3, spec.dim), case.data,
                      plain_sgd(spec, case.task, LocalTraining(1, 2, 0.1)), client_seeds(SEED, 3))


def test_client_trained_alone_matches_its_row_when_trained_with_others() -> None:
    """A client's mini-batches come from its own seed: trained alone it matches its row trained with others.

    The Flower client runs S = 1; its result must equal the simulator's row for that client.
    """
    case = make_case("mlp")
    model = case.make_model()
    spec = ParamSpec.from_module(model)
    training = LocalTraining(steps=4, batch_size=5, lr=0.1)
    start = start_weights(model, spec, 4)
    seeds = client_seeds(SEED, 4)
    rule = plain_sgd(spec, case.task, training)
    together = train_clients(model, spec, start, case.data, rule, seeds).trained
    client = torch.tensor([2])
    alone = train_clients(model, spec, start[client], case.data.select(client), rule, [seeds[2]]).trained
    torch.testing.assert_close(alone[0], together[2], atol=1e-6, rtol=1e-6)


def test_prox_term_keeps_weights_closer_to_the_start() -> None:
    """With prox_mu > 0 every client ends nearer its starting weights than with prox_mu = 0."""
    case = make_case("mlp")
    free, _, start = run_vectorised(case, LocalTraining(steps=20, batch_size=5, lr=0.2), prox_mu=0.0)
    pulled, _, _ = run_vectorised(case, LocalTraining(steps=20, batch_size=5, lr=0.2), prox_mu=2.0)
    free_distance = (free - start).norm(dim=1)
    pulled_distance = (pulled - start).norm(dim=1)
    assert torch.all(pulled_distance < free_distance)


def test_client_without_training_rows_keeps_its_weights() -> None:
    """A client with zero rows is not trained: its row comes back exactly as sent; the others still train."""
    case = make_case("mlp", counts=[3, 0, 7, 20])
    trained, _, start = run_vectorised(case, LocalTraining(steps=5, batch_size=4, lr=0.1))
    assert torch.equal(trained[1], start[1])
    assert all(not torch.allclose(trained[s], start[s]) for s in (0, 2, 3))


def _between_poisoned_clients(data: ClientSplit, fill: Callable[[torch.Tensor], torch.Tensor]) -> ClientSplit:
    """The same clients stored between clients whose rows all hold ``fill`` values (e.g. NaN), then selected:
    rows of clients outside a selection share the storage but must never be read."""
    xs, ys = [], []
    for s in range(data.num_clients):
        x, y = data.client(s)
        xs += [fill(torch.zeros(4, *x.shape[1:])), x]
        ys += [torch.zeros(4, *y.shape[1:], dtype=y.dtype), y]
    task = "classification" if not data.y.is_floating_point() else "regression"
    return ClientSplit.from_lists(xs, ys, task).select(torch.arange(1, 2 * data.num_clients, 2))


def _random_fill(like: torch.Tensor) -> torch.Tensor:
    return 50.0 * torch.randn(like.shape, generator=torch.Generator().manual_seed(99))


def _nan_fill(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan"))


@pytest.mark.parametrize("name", CASES)
def test_rows_of_other_clients_never_influence_training(name: str) -> None:
    """Clients selected out of a split whose other rows hold arbitrary values train exactly as on their own."""
    case = make_case(name, counts=[3, 11, 0, 20])
    training = LocalTraining(steps=5, batch_size=6, lr=0.1)
    base, base_metrics, start = run_vectorised(case, training)
    selected, metrics, _ = run_vectorised(case, training, data=_between_poisoned_clients(case.data, _random_fill))
    assert torch.equal(selected, base)
    assert torch.equal(selected[2], start[2])
    for key in ("loss_first", "loss_last"):
        assert torch.equal(metrics[key], base_metrics[key])


def test_a_client_without_rows_never_reads_its_neighbours_nan_rows() -> None:
    """A client with no training rows comes back unchanged and finite even when the rows stored next to its
    (empty) range are NaN: its mini-batch is zeros, never a neighbour's rows."""
    case = make_case("mlp", counts=[3, 11, 0, 20])
    training = LocalTraining(steps=3, batch_size=4, lr=0.1)
    base, _, start = run_vectorised(case, training)
    trained, _, _ = run_vectorised(case, training, data=_between_poisoned_clients(case.data, _nan_fill))
    assert torch.equal(trained[2], start[2])
    assert torch.equal(trained, base)


def test_select_shares_the_rows_instead_of_copying_them() -> None:
    """Choosing a round's clients copies no rows (memory stays the data, not clients x largest client)."""
    data = make_case("mlp", counts=[3, 11, 0, 20]).data
    chosen = data.select(torch.tensor([3, 0]))
    assert chosen.x.data_ptr() == data.x.data_ptr() and chosen.y.data_ptr() == data.y.data_ptr()
    torch.testing.assert_close(chosen.client(0)[0], data.client(3)[0], rtol=0, atol=0)
    assert len(data.x) == 34  # 3 + 11 + 0 + 20 rows, no padding


def direct_scores(case: Case, weights: torch.Tensor) -> tuple[list[float], list[float], float]:
    """Per-client metric and loss from each client's unpadded rows, and the sample-pooled metric."""
    spec = ParamSpec.from_module(case.make_model())
    metrics, losses, total, elements = [], [], 0.0, 0.0
    for s in range(case.data.num_clients):
        x, y = case.data.client(s)
        module = case.make_model()
        load_row(module, spec, weights[s])
        with torch.no_grad():
            out = module(x)
        if case.task == "classification":
            hits = float((out.argmax(-1) == y).sum())
            metrics.append(hits / len(y))
            total += hits
            elements += len(y)
        else:
            sq = (out - y).pow(2)
            metrics.append(float(sq.mean()))
            total += float(sq.sum())
            elements += sq.numel()
        with torch.no_grad():
            losses.append(float(direct_loss(out, y, case.task)))
    return metrics, losses, total / elements


def direct_mae(case: Case, weights: torch.Tensor) -> list[float]:
    """Each client's mean absolute error on its own unpadded rows."""
    spec = ParamSpec.from_module(case.make_model())
    maes = []
    for s in range(case.data.num_clients):
        x, y = case.data.client(s)
        module = case.make_model()
        load_row(module, spec, weights[s])
        with torch.no_grad():
            maes.append(float((module(x) - y).abs().mean()))
    return maes


@pytest.mark.parametrize("name", CASES)
def test_evaluate_clients_matches_direct_computation(name: str) -> None:
    """Accuracy / MSE and loss of each client equal a direct computation on its own unpadded rows."""
    case = make_case(name)
    model = case.make_model()
    spec = ParamSpec.from_module(model)
    weights = start_weights(model, spec, 4) + 0.5 * torch.randn(4, spec.dim, generator=torch.Generator().manual_seed(3))
    scores = evaluate_clients(model, spec, weights, case.data, case.task)
    metrics, losses, pooled = direct_scores(case, weights)
    torch.testing.assert_close(scores.metric, torch.tensor(metrics), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scores.loss, torch.tensor(losses), atol=1e-5, rtol=1e-5)
    assert scores.pooled == pytest.approx(pooled, rel=1e-5)
    assert scores.counts.tolist() == COUNTS
    if case.task == "classification":
        assert len(set(metrics)) > 1  # the clients really are scored separately
        assert not scores.abs_error_sum.any()
    else:
        torch.testing.assert_close(scores.mae, torch.tensor(direct_mae(case, weights)), atol=1e-5, rtol=1e-5)


def test_evaluation_in_chunks_equals_evaluation_in_one_pass() -> None:
    """Chunking over clients (max_elements) does not change any score."""
    case = make_case("cnn")
    model = case.make_model()
    spec = ParamSpec.from_module(model)
    weights = start_weights(model, spec, 4)
    whole = evaluate_clients(model, spec, weights, case.data, case.task)
    chunked = evaluate_clients(model, spec, weights, case.data, case.task, max_elements=1)
    torch.testing.assert_close(chunked.metric, whole.metric)
    torch.testing.assert_close(chunked.loss, whole.loss)
    assert chunked.pooled == pytest.approx(whole.pooled)


@pytest.mark.parametrize(("name", "fill"), [*((name, "random") for name in CASES),
                                           ("mlp", "nan"), ("mlp-regression", "nan")])
def test_rows_of_other_clients_never_influence_evaluation(name: str, fill: str) -> None:
    """Rows outside the selected clients change no metric, loss or pooled figure: arbitrary finite values, and
    NaN too (the block mask must select, not multiply: NaN * 0 is NaN)."""
    case = make_case(name)
    model = case.make_model()
    spec = ParamSpec.from_module(model)
    weights = start_weights(model, spec, 4)
    base = evaluate_clients(model, spec, weights, case.data, case.task)
    filler = _random_fill if fill == "random" else _nan_fill
    selected = evaluate_clients(model, spec, weights, _between_poisoned_clients(case.data, filler), case.task)
    torch.testing.assert_close(selected.metric, base.metric)
    torch.testing.assert_close(selected.loss, base.loss)
    assert selected.pooled == pytest.approx(base.pooled)


def test_evaluation_blocks_cover_every_row_once_however_unequal_the_clients() -> None:
    """One client 200x larger than the others: blocks are fixed-size, each from one client, and together they
    hold every real row exactly once."""
    counts = torch.tensor([2000, 3, 0, 10, 1])
    data = ClientSplit.from_lists([torch.arange(int(c), dtype=torch.float32).unsqueeze(1) + 10_000 * i
                                   for i, c in enumerate(counts)],
                                  [torch.zeros(int(c), dtype=torch.int64) for c in counts], "classification")
    seen = []
    for block in data.blocks(block_rows=16, blocks_per_chunk=7):
        assert block.x.shape[:2] == (len(block.owner), 16) and len(block.owner) <= 7
        seen += [(int(owner), float(value)) for owner, value, keep in zip(
            block.owner.repeat_interleave(16), block.x.flatten(), block.mask.flatten(), strict=True) if keep]
    expected = [(i, float(10_000 * i + r)) for i, c in enumerate(counts) for r in range(int(c))]
    assert sorted(seen) == sorted(expected)


@pytest.mark.parametrize("name", CASES)
def test_evaluation_of_one_shared_model_equals_per_client_evaluation(name: str) -> None:
    """When every client holds the same weights (a global model), evaluation runs one network on all rows at
    once; the scores are those of evaluating each client with its own copy."""
    case = make_case(name, counts=[3, 11, 5, 20])
    model = case.make_model()
    spec = ParamSpec.from_module(model)
    weights = start_weights(model, spec, 1).expand(4, -1).clone()
    shared = evaluate_clients(model, spec, weights, case.data, case.task)
    per_client = evaluate_clients(model, spec, weights, case.data, case.task, forward=lambda w, x, owners: None)
    torch.testing.assert_close(shared.metric, per_client.metric)
    torch.testing.assert_close(shared.loss, per_client.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared.metric, torch.tensor(direct_scores(case, weights)[0]))


def test_splits_from_a_pool_reorder_it_in_place_and_hold_each_clients_rows() -> None:
    """Image federations are cut from one pool of images without copying it: the pool is reordered in place and
    every split is a slice of it, holding exactly the rows each client was given."""
    rng = np.random.default_rng(0)
    pool_x = rng.normal(size=(40, 2, 3)).astype(np.float32)
    pool_y = np.arange(40, dtype=np.int64)
    original = pool_x.copy()
    parts = np.array_split(rng.permutation(40)[:37], 3)  # 3 clients; 3 pool rows belong to nobody
    per_split = [[part[:4] for part in parts], [part[4:6] for part in parts], [part[6:] for part in parts]]
    splits = ClientSplit.splits_from_pool(pool_x, pool_y, per_split, "classification")
    assert all(split.x.untyped_storage().data_ptr() == splits[0].x.untyped_storage().data_ptr()
               for split in splits)  # one storage, no copy
    for split, indices in zip(splits, per_split, strict=True):
        for client, index in enumerate(indices):
            x, y = split.client(client)
            np.testing.assert_array_equal(x.numpy(), original[index])
            np.testing.assert_array_equal(y.numpy(), index)
    with pytest.raises(ValueError, match="more than one client"):
        ClientSplit.splits_from_pool(original.copy(), np.arange(40), [[np.array([1, 2])], [np.array([2])]],
                                     "classification")


@pytest.mark.parametrize("name", CASES)
def test_training_a_chunk_of_clients_at_a_time_changes_nothing(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large models train a chunk of clients at a time (cache-sized steps); weights, metrics and a stateful
    rule's state (Ditto's personal models) are those of training all clients at once."""
    from graphfed.client import training as client
    from graphfed.methods.ditto import DittoRule

    case = make_case(name, counts=[3, 11, 0, 20, 7])
    model = case.make_model()
    spec = ParamSpec.from_module(model)
    training = LocalTraining(steps=4, batch_size=5, lr=0.1)
    start = start_weights(model, spec, 5)
    rule = DittoRule(ClientSetting(spec, model.head_names, case.task, 3, training), 1.0, None)

    def train() -> client.LocalResult:
        return train_clients(model, spec, start, case.data, rule, client_seeds(SEED, 5), rule.init_state(start))

    whole = train()
    monkeypatch.setattr(client, "TRAINING_VALUES_PER_CHUNK", 2 * spec.dim)  # chunks of 2, 2 and 1 clients
    chunked = train()
    # equal up to float32 rounding (a grouped convolution over 2 clients sums in another order than over 5)
    torch.testing.assert_close(chunked.trained, whole.trained, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked.state["personal"], whole.state["personal"], atol=1e-5, rtol=1e-5)
    for key, value in whole.metrics.items():
        torch.testing.assert_close(chunked.metrics[key], value, atol=1e-5, rtol=1e-5)
