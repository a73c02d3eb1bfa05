"""The federation data model: each split stored once as every client's rows concatenated, with per-client
offsets and counts.

Nothing is padded to the largest client: mini-batches gather their rows from the concatenated storage, and
evaluation walks the rows in fixed-size blocks, so memory is the data plus what one chunk of work needs,
however imbalanced the clients are.

Every read of a split's rows goes through :meth:`ClientSplit.read`, so the rows may also stay in host memory while
the run computes on an accelerator (``train.client_data: host``, for data larger than the device): each read then
gathers its rows on the host into pinned memory and copies them over, and nothing else changes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import torch

Task = Literal["classification", "regression"]


def permute_rows_in_place(array: np.ndarray, order: np.ndarray) -> None:
    """``array[i] <- array[order[i]]`` for a permutation ``order``, following its cycles with one spare row (no
    second copy of the array)."""
    done = np.zeros(len(order), dtype=bool)
    for start in range(len(order)):
        if done[start]:
            continue
        done[start] = True
        if order[start] == start:
            continue
        spare = array[start].copy()
        position = start
        while order[position] != start:
            array[position] = array[order[position]]
            position = int(order[position])
            done[position] = True
        array[position] = spare


@dataclass
class PaddedRows:
    """Some clients' rows copied onto a client axis (for computations over a client's whole split)."""

    x: torch.Tensor  # [S, M, *feature_shape]
    y: torch.Tensor  # [S, M, *target_shape]
    mask: torch.Tensor  # [S, M] bool, True on real rows
    counts: torch.Tensor  # [S]


@dataclass
class RowBlocks:
    """Fixed-size blocks of rows, each from one client: ``x [P, B, *features]``, ``y [P, B, ...]``, ``mask [P, B]``
    (False on the padding at the end of a client's last block) and ``owner [P]``, the position (in the split's
    client order) of the client each block belongs to."""

    owner: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor


def _to_device(storage: torch.Tensor, host_rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``storage[host_rows]`` (host memory) on ``device``: gathered into pinned memory for a CUDA device, so the
    copy is asynchronous (each read has its own buffer: no later read overwrites one still being copied)."""
    if device.type != "cuda":
        return storage[host_rows].to(device)
    staging = torch.empty((len(host_rows), *storage.shape[1:]), dtype=storage.dtype, pin_memory=True)
    torch.index_select(storage, 0, host_rows, out=staging)
    return staging.to(device, non_blocking=True)


@dataclass
class ClientSplit:
    """One split (train, val or test) of some clients, stored once as concatenated rows.

    Client ``i`` owns rows ``starts[i] : starts[i] + counts[i]`` of ``x`` and ``y``. :meth:`select` picks clients
    without copying a row, so memory is the data itself, never clients x largest client; mini-batches and
    evaluation blocks gather rows straight from this storage.
    """

    x: torch.Tensor  # [R, *feature_shape] float32, every row of every client
    y: torch.Tensor  # [R] int64 for classification, [R, *target_shape] float32 for regression
    starts: torch.Tensor  # [N] int64, first row of each client
    counts: torch.Tensor  # [N] int64, rows of each client

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"{len(self.x)} feature rows but {len(self.y)} targets")
        if self.starts.shape != self.counts.shape or self.starts.ndim != 1:
            raise ValueError(f"starts {tuple(self.starts.shape)} and counts {tuple(self.counts.shape)} must be "
                             f"two vectors of one entry per client")
        if len(self.counts) and (bool((self.counts < 0).any()) or bool((self.starts < 0).any())
                                 or int((self.starts + self.counts).max()) > len(self.x)):
            raise ValueError(f"client rows must lie within the split's {len(self.x)} rows")

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])

    @property
    def device(self) -> torch.device:
        """Where this split's reads land: the run's device (the rows themselves may stay on the host)."""
        return self.counts.device

    @property
    def rows_on_host(self) -> bool:
        """The rows stay in host memory and each read copies its rows to :attr:`device`."""
        return self.x.device != self.counts.device

    def to(self, device: torch.device, rows_on_host: bool = False) -> ClientSplit:
        """This split computed on ``device``: its rows and row bookkeeping moved there, or with ``rows_on_host``
        only the bookkeeping (the rows stay in host memory; each read stages its own rows in pinned memory, so the
        whole split is never pinned)."""
        if not rows_on_host:
            if self.x.device == device and self.counts.device == device:
                return self
            return ClientSplit(self.x.to(device), self.y.to(device), self.starts.to(device), self.counts.to(device))
        return ClientSplit(self.x.to("cpu"), self.y.to("cpu"), self.starts.to(device), self.counts.to(device))

    def read(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``rows`` (indices into the storage, any shape ``[...]``) as ``x [..., *features]`` and ``y``, on
        :attr:`device`. Rows kept on the host are gathered there into (pinned) memory and copied over."""
        if not self.rows_on_host:
            return self.x[rows], self.y[rows]
        host_rows = rows.to("cpu")
        return _to_device(self.x, host_rows, self.device), _to_device(self.y, host_rows, self.device)

    def read_targets(self, rows: torch.Tensor) -> torch.Tensor:
        """``read(rows)[1]`` without reading the features."""
        if not self.rows_on_host:
            return self.y[rows]
        return _to_device(self.y, rows.to("cpu"), self.device)

    @property
    def num_rows(self) -> int:
        """Real rows of the selected clients."""
        return int(self.counts.sum())

    def select(self, client_ids: torch.Tensor) -> ClientSplit:
        """The split of ``client_ids`` (in that order), sharing this split's rows."""
        return ClientSplit(self.x, self.y, self.starts[client_ids], self.counts[client_ids])

    def client(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of client ``i``."""
        start, count = int(self.starts[i]), int(self.counts[i])
        return self.read(torch.arange(start, start + count, device=self.device))

    def row_owners(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(owner [R'], row [R'])``: every real row of the selected clients, with its client's position."""
        device = self.counts.device
        owner = torch.repeat_interleave(torch.arange(self.num_clients, device=device), self.counts)
        first = torch.repeat_interleave(self.starts - torch.cumsum(self.counts, 0) + self.counts, self.counts)
        return owner, first + torch.arange(len(owner), device=device)

    def gather(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``index [S, ...]`` (client-local, each below its client's count) of every client, as
        ``x [S, ..., *features]`` and ``y``. Clients without rows get zeros (their index is ignored)."""
        shape = index.shape
        has_rows = (self.counts > 0).view(-1, *[1] * (index.ndim - 1))
        rows = (self.starts.view(-1, *[1] * (index.ndim - 1)) + index).clamp(0, max(len(self.x) - 1, 0))
        if len(self.x) == 0:  # nothing to read anywhere
            return (torch.zeros(*shape, *self.x.shape[1:], dtype=self.x.dtype, device=self.device),
                    torch.zeros(*shape, *self.y.shape[1:], dtype=self.y.dtype, device=self.device))
        x, y = self.read(rows.flatten())
        x, y = x.view(*shape, *self.x.shape[1:]), y.view(*shape, *self.y.shape[1:])
        if bool(has_rows.all()):
            return x, y
        return (torch.where(has_rows.view(*has_rows.shape, *[1] * (x.ndim - index.ndim)), x, 0.0),
                torch.where(has_rows.view(*has_rows.shape, *[1] * (y.ndim - index.ndim)), y, 0).to(y.dtype))

    def padded(self) -> PaddedRows:
        """The selected clients' rows copied onto a client axis, padded to the largest (zeros). Costs clients x
        largest client: for whole-split computations over few clients (a KNN datastore, tests), not for training."""
        width = max(int(self.counts.max()), 1) if self.num_clients else 1
        local = torch.arange(width, device=self.counts.device).expand(self.num_clients, width)
        mask = local < self.counts.unsqueeze(1)
        x, y = self.gather(torch.where(mask, local, 0))
        x = torch.where(mask.view(*mask.shape, *[1] * (x.ndim - 2)), x, 0.0)
        y = torch.where(mask.view(*mask.shape, *[1] * (y.ndim - 2)), y, 0).to(y.dtype)
        return PaddedRows(x, y, mask, self.counts)

    def blocks(self, block_rows: int, blocks_per_chunk: int) -> Iterator[RowBlocks]:
        """The selected clients' rows in blocks of ``block_rows`` rows (a client's last block padded), yielded
        ``blocks_per_chunk`` blocks at a time: a fixed amount of work per chunk, however unequal the clients."""
        device = self.counts.device
        per_client = (self.counts + block_rows - 1) // block_rows
        owner = torch.repeat_interleave(torch.arange(self.num_clients, device=device), per_client)
        first = torch.repeat_interleave(torch.cumsum(per_client, 0) - per_client, per_client)
        offset = (torch.arange(len(owner), device=device) - first) * block_rows  # first client-local row of each block
        local = torch.arange(block_rows, device=device)
        for lo in range(0, len(owner), blocks_per_chunk):
            chunk_owner = owner[lo:lo + blocks_per_chunk]
            index = offset[lo:lo + blocks_per_chunk].unsqueeze(1) + local
            mask = index < self.counts[chunk_owner].unsqueeze(1)
            rows = (self.starts[chunk_owner].unsqueeze(1) + torch.where(mask, index, 0)).flatten()
            x, y = self.read(rows)
            x, y = x.view(*index.shape, *self.x.shape[1:]), y.view(*index.shape, *self.y.shape[1:])
            x[~mask] = 0.0  # padding rows are zeros (a fresh copy: the storage is untouched)
            y[~mask] = 0
            yield RowBlocks(chunk_owner, x, y, mask)

    @staticmethod
    def from_padded(x: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> ClientSplit:
        """From clients' rows on a client axis (``x [N, M, ...]``, first ``counts[i]`` rows real)."""
        return ClientSplit.from_lists([x[i, :int(c)] for i, c in enumerate(counts)],
                                      [y[i, :int(c)] for i, c in enumerate(counts)],
                                      "classification" if not y.is_floating_point() else "regression")

    @staticmethod
    def splits_from_pool(x_pool: np.ndarray, y_pool: np.ndarray, per_split: Sequence[Sequence[np.ndarray]],
                         task: Task) -> list[ClientSplit]:
        """Splits whose client ``i`` holds rows ``per_split[k][i]`` of one pool (each pool row used at most once).

        The pool's rows are reordered in place (split by split, client by client) and every split is a slice of
        it: no copy of the data at all, so building a federation of a large image set costs the images once."""
        counts = [torch.tensor([len(index) for index in indices], dtype=torch.int64) for indices in per_split]
        used = np.concatenate([index for indices in per_split for index in indices]).astype(np.int64)
        if len(np.unique(used)) != len(used):
            raise ValueError("splits_from_pool: a pool row is given to more than one client or split")
        unused = np.setdiff1d(np.arange(len(x_pool)), used)
        order = np.concatenate([used, unused])
        x_pool = np.ascontiguousarray(x_pool, dtype=np.float32)
        for array in (x_pool, y_pool):
            permute_rows_in_place(array, order)
        x_all = torch.from_numpy(x_pool)
        y_all = torch.as_tensor(y_pool, dtype=torch.int64 if task == "classification" else torch.float32)
        splits, first = [], 0
        for split_counts in counts:
            rows = int(split_counts.sum())
            splits.append(ClientSplit(x_all[first:first + rows], y_all[first:first + rows],
                                      torch.cumsum(split_counts, 0) - split_counts, split_counts))
            first += rows
        return splits

    @staticmethod
    def from_lists(xs: Sequence[np.ndarray | torch.Tensor], ys: Sequence[np.ndarray | torch.Tensor],
                   task: Task) -> ClientSplit:
        """Concatenate per-client arrays (one copy of the rows). Clients may hold zero rows."""
        if len(xs) != len(ys):
            raise ValueError(f"got {len(xs)} feature arrays but {len(ys)} target arrays")
        y_dtype = torch.int64 if task == "classification" else torch.float32
        counts = torch.tensor([len(x) for x in xs], dtype=torch.int64)
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            if len(x) != len(y):
                raise ValueError(f"client {i}: {len(x)} feature rows but {len(y)} targets")
        feat_shape = next((tuple(x.shape[1:]) for x in xs if x.ndim > 1), ())
        tgt_shape = next((tuple(y.shape[1:]) for y in ys if y.ndim > 1), ())
        x_all = torch.empty((int(counts.sum()), *feat_shape), dtype=torch.float32)
        y_all = torch.empty((int(counts.sum()), *tgt_shape), dtype=y_dtype)
        start = 0
        for x, y in zip(xs, ys, strict=True):  # copied client by client: no second full-size temporary
            x_all[start:start + len(x)] = torch.as_tensor(x).reshape(len(x), *feat_shape)
            y_all[start:start + len(y)] = torch.as_tensor(y).reshape(len(y), *tgt_shape)
            start += len(x)
        return ClientSplit(x_all, y_all, torch.cumsum(counts, 0) - counts, counts)


@dataclass(frozen=True)
class InputScaling:
    """How ``dataset.standardize`` scaled each client's flattened input features: ``(x - mean[i]) / spread[i]`` for
    client i (``mean``, ``spread``: ``[N, F]`` float64, on the host). ``how``: ``client`` (each client by its own
    training rows) or ``pooled`` (every training client's rows together: the same row for every client)."""

    how: str
    mean: torch.Tensor
    spread: torch.Tensor

    def client(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, spread)`` of client ``index``, each ``[F]`` float64."""
        return self.mean[index], self.spread[index]


@dataclass
class Federation:
    """Everything a run needs to know about the clients' data and how clients relate."""

    name: str
    task: Task
    train: ClientSplit
    val: ClientSplit
    test: ClientSplit
    input_shape: tuple[int, ...]
    output_dim: int  # number of classes, or flattened target size for regression
    client_graph: torch.Tensor | None = None  # [N, N] float, symmetric, zero diagonal; None = no graph given
    novel_mask: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))
    client_names: list[str] = field(default_factory=list)
    metric: Literal["accuracy", "mse"] = "accuracy"
    description: str = ""
    # [N] int64 group id of each client where the dataset defines groups (e.g. fashion-mnist-casestudy),
    # so benchmarks can compare same-group with other-group collaboration weights; None = no groups.
    client_groups: torch.Tensor | None = None
    # Regression targets in original units per scaled unit (e.g. mph for metr-la-week), so scaled MAE/RMSE can
    # be reported in those units; None = targets are not rescaled (or the dataset does not say).
    target_scale: float | None = None
    #: the name of those units (a folder's meta.yaml ``target_units``, e.g. "ug/m3"), for what a user reads
    target_units: str | None = None
    #: the input features' names where the data give them (a folder's meta.yaml ``features``), for what a user reads
    feature_names: list[str] | None = None
    #: the metrics the data's owner judges it by (a folder's meta.yaml ``metrics``), used when ``train.metrics`` is
    #: empty, and the one that picks the reported round (``select_by``) when ``train.select_by`` is unset
    default_metrics: tuple[str, ...] = ()
    default_select_by: str | None = None
    #: the class names, label k's at index k, where the data give them (a folder's meta.yaml ``classes``, CIFAR-10's
    #: and Fashion-MNIST's own), for what a user reads and what an exported model answers
    class_names: list[str] | None = None
    #: text federations (a window of characters, the next one predicted): the characters the classes stand for, class
    #: k's at index k, so a model can read a prompt and write text (``graphfed predict --prompt``)
    alphabet: str | None = None
    #: why the data are read as their task (a folder: meta.yaml, integer labels or float targets), for inspect and
    #: the run's log; it starts with "warning:" where the data could be read as either task
    task_reason: str | None = None
    #: ``dataset.standardize``'s statistics, what the stored rows were scaled by (None: the rows are as read): an
    #: output of training that prediction on raw rows needs, so it is saved with the models
    input_scaling: InputScaling | None = None
    #: a backdoor attack's evaluation split (``graphfed.attacks``): every client's triggered non-target test rows,
    #: labelled with the target, so accuracy on it is the attack success rate; None without a backdoor
    backdoor_test: ClientSplit | None = None

    def __post_init__(self) -> None:
        n = self.train.num_clients
        if self.novel_mask.numel() == 0:
            self.novel_mask = torch.zeros(n, dtype=torch.bool)
        if not self.client_names:
            self.client_names = [str(i) for i in range(n)]
        for split_name in self.evaluation_splits:
            if getattr(self, split_name).num_clients != n:
                raise ValueError(f"{split_name} split has {getattr(self, split_name).num_clients} clients, "
                                 f"train has {n}")
        if self.client_graph is not None and tuple(self.client_graph.shape) != (n, n):
            raise ValueError(f"client_graph must be [{n}, {n}], got {tuple(self.client_graph.shape)}")
        if self.novel_mask.shape != (n,):
            raise ValueError(f"novel_mask must have {n} entries, got {tuple(self.novel_mask.shape)}")
        if self.client_groups is not None and tuple(self.client_groups.shape) != (n,):
            raise ValueError(f"client_groups must have {n} entries, got {tuple(self.client_groups.shape)}")

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    @property
    def evaluation_splits(self) -> tuple[str, ...]:
        """The splits every client is scored on: val and test, and the backdoor split under a backdoor attack."""
        return ("val", "test") if self.backdoor_test is None else ("val", "test", "backdoor_test")

    @property
    def train_client_ids(self) -> torch.Tensor:
        """Clients that take part in training (everything but the novel ones)."""
        return torch.nonzero(~self.novel_mask).flatten()

    @property
    def novel_client_ids(self) -> torch.Tensor:
        return torch.nonzero(self.novel_mask).flatten()

    def to(self, device: torch.device, rows_on_host: bool = False) -> Federation:
        """Every split and the client graph computed on ``device`` (with ``rows_on_host`` the clients' rows stay
        in host memory: :meth:`ClientSplit.to`); ids, names and masks stay on the host, where the round loop keeps
        its bookkeeping."""
        splits = {name: getattr(self, name).to(device, rows_on_host) for name in ("train", "val", "test")}
        return replace(self, **splits,
                       client_graph=None if self.client_graph is None else self.client_graph.to(device),
                       backdoor_test=None if self.backdoor_test is None
                       else self.backdoor_test.to(device, rows_on_host))
