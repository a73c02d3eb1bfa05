"""The one evaluation kernel: each client's metric with its own weights on its own rows, S clients at once.

:class:`ClientScores` is also what travels back from a Flower node (:data:`SCORE_FIELDS`, in order)."""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from graphfed.client.contract import Weights
from graphfed.client.losses import per_row_loss
from graphfed.client.placement import autocast
from graphfed.client.side_by_side import map_side_by_side, side_by_side_workers
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit, RowBlocks, Task
from graphfed.models.base import TargetModel


def block_plan(data: ClientSplit, dim: int, max_elements: int = 4_000_000) -> tuple[int, int]:
    """``(block_rows, blocks_per_chunk)`` for walking ``data`` in blocks: blocks about one mean client long (at most
    256 rows, so a client wastes at most one partly filled block), and as many blocks per chunk as fit in
    ``max_elements`` values of inputs plus one weight copy per block. The default (16 MB of inputs) bounds a CNN's
    activations to a few hundred MB: LeNet's first layer holds 4x its input."""
    mean_rows = -(-data.num_rows // max(data.num_clients, 1))
    block_rows = int(min(max(mean_rows, 1), 256))
    per_block = block_rows * math.prod(data.x.shape[1:]) + dim
    return block_rows, max(1, max_elements // per_block)


def scoring_blocks(model: TargetModel, data: ClientSplit, dim: int,
                   max_elements: int = 4_000_000) -> Iterator[RowBlocks]:
    """The rows a model is scored (or its features read) on, in blocks whose outputs do not depend on the blocking.

    Rows of a model without batch statistics are independent: fixed-size blocks (:func:`block_plan`). A model with
    batch statistics (BatchNorm) sees each client's whole split as one block with no padding row, so its statistics
    cover exactly the client's rows whatever their order (a split is stored class-sorted: blocks of it would each
    see a few classes); one that scores many clients per call (:meth:`TargetModel.pads_scoring_blocks`) sees
    several whole splits per block (:func:`padded_client_blocks`)."""
    if not model.batch_statistics:
        yield from data.blocks(*block_plan(data, dim, max_elements))
        return
    if model.pads_scoring_blocks(data.device):
        yield from padded_client_blocks(data, max_elements)
        return
    for client in range(data.num_clients):
        start, count = int(data.starts[client]), int(data.counts[client])
        if count == 0:
            continue  # nothing to score; its sums stay zero
        x, y = data.read(torch.arange(start, start + count, device=data.device))
        yield RowBlocks(torch.tensor([client], device=data.device), x.unsqueeze(0), y.unsqueeze(0),
                        torch.ones(1, count, dtype=torch.bool, device=data.device))


def padded_client_blocks(data: ClientSplit, max_elements: int = 4_000_000) -> Iterator[RowBlocks]:
    """Every client's whole split, several per block: clients longest first, each block as many as fit in
    ``max_elements`` input values (one at least), each split padded to its block's longest with all-zero rows (which
    BatchNorm's statistics leave out, :func:`graphfed.models.cnn_bn.padding_aware_batch_norm`; ``mask`` is False on
    them). Sorting by length keeps the padding to the difference between neighbours."""
    counts = data.counts.tolist()
    row_values = math.prod(data.x.shape[1:])
    order = sorted((client for client in range(data.num_clients) if counts[client] > 0),
                   key=lambda client: -counts[client])
    group: list[int] = []
    for client in order:
        if group and (len(group) + 1) * counts[group[0]] * row_values > max_elements:
            yield _padded_block(data, group)
            group = []
        group.append(client)
    if group:
        yield _padded_block(data, group)


def _padded_block(data: ClientSplit, clients: list[int]) -> RowBlocks:
    owner = torch.tensor(clients, device="cpu")
    counts, starts = data.counts.cpu()[owner], data.starts.cpu()[owner]
    offsets = torch.arange(int(counts.max()))
    mask = offsets < counts.unsqueeze(1)  # [P, L]
    rows = torch.where(mask, starts.unsqueeze(1) + offsets, starts.unsqueeze(1))  # padding reads a real row, zeroed
    x, y = data.read(rows.to(data.device))
    device_mask = mask.to(data.device)
    x = x.masked_fill(~device_mask.view(*mask.shape, *[1] * (x.ndim - 2)), 0)
    return RowBlocks(owner.to(data.device), x, y, device_mask)


def sum_by_client(values: torch.Tensor, block: RowBlocks, num_clients: int) -> torch.Tensor:
    """``[S]``: per client, the sum of ``values [P, B]`` over the real rows of its blocks (where, not multiply:
    a block's padding rows may hold anything, and NaN * 0 is NaN)."""
    per_block = torch.where(block.mask, values, 0.0).sum(1)
    return torch.zeros(num_clients, dtype=per_block.dtype, device=per_block.device).index_add(0, block.owner,
                                                                                               per_block)


#: The fields of ClientScores, in order (what travels between machines).
SCORE_FIELDS = ("metric", "loss", "counts", "metric_sum", "metric_elements", "abs_error_sum")


@dataclass
class ClientScores:
    """Per-client evaluation of personalised weights on one split.

    ``metric_sum`` / ``metric_elements`` are each client's numerator and denominator (correct predictions
    and rows, or squared errors and values), so scores computed on different machines can be merged and
    pooled exactly. Regression also keeps the absolute errors, for the MAE users read in their own units.
    """

    metric: torch.Tensor  # [N] accuracy or MSE of each client
    loss: torch.Tensor  # [N]
    counts: torch.Tensor  # [N] rows per client
    metric_sum: torch.Tensor  # [N]
    metric_elements: torch.Tensor  # [N]
    abs_error_sum: torch.Tensor  # [N] sum of |prediction - target| (regression; zero for classification)

    @property
    def mae(self) -> torch.Tensor:
        """[N] mean absolute error of each client (regression)."""
        return self.abs_error_sum / self.metric_elements.clamp_min(1.0)

    @property
    def pooled(self) -> float:
        """The metric over all samples of these clients pooled together."""
        return float(self.metric_sum.double().sum() / self.metric_elements.double().sum().clamp_min(1.0))

    def select(self, index: torch.Tensor) -> ClientScores:
        return ClientScores(*(getattr(self, name)[index] for name in SCORE_FIELDS))

    def to(self, device: torch.device | str) -> ClientScores:
        return ClientScores(*(getattr(self, name).to(device) for name in SCORE_FIELDS))

    @staticmethod
    def concat(parts: list[ClientScores]) -> ClientScores:
        return ClientScores(*(torch.cat([getattr(p, name) for p in parts]) for name in SCORE_FIELDS))


@torch.no_grad()
def evaluate_clients(model: TargetModel, spec: ParamSpec, weights: torch.Tensor, data: ClientSplit,
                     task: Task, max_elements: int = 4_000_000,
                     forward: Callable[[Weights, torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None,
                     precision: str = "fp32") -> ClientScores:
    """Each client's metric with its own weights on its own rows.

    Rows go in fixed-size blocks of one client each (:meth:`ClientSplit.blocks`), so the work per chunk does not
    depend on how unequal the clients are; a model with batch statistics sees each client's whole split at once
    (:func:`scoring_blocks`). ``forward``, if given, may replace the model's outputs for a chunk
    of blocks; it receives the blocks' weights, inputs and owners (positions of their clients in ``data``).
    """
    num_clients = data.num_clients
    metric_sum, loss_sum, abs_error_sum = (torch.zeros(num_clients, device=weights.device) for _ in range(3))
    # Every client holding the same weights (a global model): one network on all blocks' rows at once, the
    # cheapest forward there is. Not for models whose outputs depend on the batch.
    shared = (forward is None and not model.batch_statistics and len(weights) > 1
              and (weights.stride(0) == 0 or all(torch.equal(rows, weights[:1].expand_as(rows))
                                                 for rows in weights.split(256))))
    # A network that scores its clients one by one scores them side by side on one thread each where it may
    # (graphfed.client.side_by_side: the same bits), each worker on its own copy (functional_call swaps a module's
    # parameters in place); the sums below still add the clients in order
    side_by_side = model.batch_statistics and forward is None and model.loops_clients_on(weights.device)
    workers = side_by_side_workers(weights.device) if side_by_side else 1
    copies = threading.local()

    def worker_network() -> TargetModel:
        if workers == 1:
            return model
        network = getattr(copies, "network", None)
        if network is None:
            network = copies.network = copy.deepcopy(model)
        return network

    def block_outputs(block: RowBlocks) -> tuple[RowBlocks, torch.Tensor]:
        with torch.no_grad(), autocast(precision, weights.device):  # both are per thread
            return block, _block_outputs(worker_network(), spec, weights, block, shared, forward).float()  # fp32

    for block, outputs in map_side_by_side(block_outputs, scoring_blocks(model, data, spec.dim, max_elements),
                                           workers):
        loss_sum += sum_by_client(per_row_loss(outputs, block.y, task), block, num_clients)
        if task == "classification":
            correct = (outputs.argmax(-1) == block.y).to(torch.float32)
            metric_sum += sum_by_client(correct, block, num_clients)
        else:
            error = (outputs - block.y.reshape(outputs.shape)).flatten(2)
            metric_sum += sum_by_client(error.pow(2).sum(-1), block, num_clients)
            abs_error_sum += sum_by_client(error.abs().sum(-1), block, num_clients)
    rows = data.counts.to(torch.float32)
    metric_elements = rows if task == "classification" else rows * math.prod(data.y.shape[1:])
    return ClientScores(metric=metric_sum / metric_elements.clamp_min(1.0), loss=loss_sum / rows.clamp_min(1.0),
                        counts=data.counts, metric_sum=metric_sum, metric_elements=metric_elements,
                        abs_error_sum=abs_error_sum)


def _block_outputs(model: TargetModel, spec: ParamSpec, weights: torch.Tensor, block: RowBlocks, shared: bool,
                   forward: Callable[[Weights, torch.Tensor, torch.Tensor], torch.Tensor | None] | None,
                   ) -> torch.Tensor:
    """``[P, B, out]`` outputs of one chunk of blocks: the one shared network on every row, or each block's
    client's network (``forward`` first, when it gives outputs)."""
    if shared:
        rows = block.x.reshape(1, -1, *block.x.shape[2:])
        return model.batched_forward(spec.unflatten(weights[:1]), rows).view(*block.mask.shape, -1)
    block_weights = spec.unflatten(weights[block.owner])
    outputs = forward(block_weights, block.x, block.owner) if forward is not None else None
    return model.batched_forward(block_weights, block.x) if outputs is None else outputs


def trivial_scores(train: ClientSplit, test: ClientSplit, task: Task, num_classes: int) -> torch.Tensor:
    """``[N]`` each client's test metric of the trivial predictor fitted on its own training rows: its majority
    class (ties: the smaller label) for classification, its mean target for regression (MSE). The reference a
    personalised model must beat to be worth anything; NaN for a client without training or test rows."""
    n, device = train.num_clients, train.device
    owner, rows = train.row_owners()
    test_owner, test_rows = test.row_owners()
    if task == "classification":
        histogram = torch.zeros(n * num_classes, device=device)
        histogram.index_add_(0, owner * num_classes + train.read_targets(rows), torch.ones(len(rows), device=device))
        majority = histogram.view(n, num_classes).argmax(dim=1)  # the first maximum: the smaller label on ties
        per_row = (test.read_targets(test_rows) == majority[test_owner]).to(torch.float32)
    else:
        sums = torch.zeros(n, *train.y.shape[1:], device=device).index_add_(0, owner, train.read_targets(rows))
        mean = sums / train.counts.clamp_min(1).view(-1, *[1] * (train.y.ndim - 1))
        per_row = (test.read_targets(test_rows) - mean[test_owner]).pow(2).reshape(len(test_rows), -1).mean(dim=1)
    total = torch.zeros(n, device=device).index_add_(0, test_owner, per_row)
    scores = total / test.counts.clamp_min(1)
    return torch.where((train.counts > 0) & (test.counts > 0), scores, torch.nan).cpu()
