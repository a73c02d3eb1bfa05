"""The federation data model: per-client splits padded onto a leading client axis.

Every client's samples live in one padded tensor ``x[N, M, *features]`` with a ``counts[N]`` vector, so
the simulator can train and evaluate all clients at once. Padding rows are never read: mini-batches draw
indices below ``counts[i]`` and evaluation masks rows ``>= counts[i]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

Task = Literal["classification", "regression"]


def available_memory_bytes() -> int | None:
    """Memory the kernel says a new allocation can use (``MemAvailable``), or None where it does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_padding_fits(clients: int, width: int, bytes_per_row: int, real_rows: int) -> None:
    """Stop before padding a split that cannot fit in memory, and say what to change.

    Splits are padded to the largest client, so memory grows with clients x largest client: an imbalanced
    federation (one huge client beside small ones) needs far more than its data."""
    needed = clients * width * bytes_per_row
    available = available_memory_bytes()
    if available is None or needed <= 0.8 * available:
        return
    from graphfed.config import ConfigError

    raise ConfigError(
        f"dataset: padding {clients} clients to the largest client's {width:,} rows needs {needed / 2**30:.1f} GiB "
        f"for one split ({real_rows:,} real rows, {real_rows * bytes_per_row / 2**30:.2f} GiB); "
        f"{available / 2**30:.1f} GiB is available. Use fewer clients (dataset.num_clients), a less imbalanced "
        f"partition (dataset.dirichlet_beta, dataset.min_samples_per_client), split the largest client, or a "
        f"machine with more memory")


@dataclass
class ClientSplit:
    """One split (train, val or test) of every client, padded to the largest client."""

    x: torch.Tensor  # [N, M, *feature_shape] float32
    y: torch.Tensor  # [N, M] int64 for classification, [N, M, *target_shape] float32 for regression
    counts: torch.Tensor  # [N] int64, number of real rows per client

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])

    def mask(self) -> torch.Tensor:
        """[N, M] bool, True on real rows."""
        rows = torch.arange(self.x.shape[1])
        return rows.unsqueeze(0) < self.counts.unsqueeze(1)

    def select(self, client_ids: torch.Tensor) -> ClientSplit:
        return ClientSplit(self.x[client_ids], self.y[client_ids], self.counts[client_ids])

    def client(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The real (unpadded) rows of client ``i``."""
        n = int(self.counts[i])
        return self.x[i, :n], self.y[i, :n]

    @staticmethod
    def from_lists(xs: Sequence[np.ndarray | torch.Tensor], ys: Sequence[np.ndarray | torch.Tensor],
                   task: Task) -> ClientSplit:
        """Pad per-client arrays onto a client axis. Clients may hold zero rows."""
        if len(xs) != len(ys):
            raise ValueError(f"got {len(xs)} feature arrays but {len(ys)} target arrays")
        xs_t = [torch.as_tensor(np.asarray(x), dtype=torch.float32) for x in xs]
        y_dtype = torch.int64 if task == "classification" else torch.float32
        ys_t = [torch.as_tensor(np.asarray(y), dtype=y_dtype) for y in ys]
        counts = torch.tensor([len(x) for x in xs_t], dtype=torch.int64)
        for i, (x, y) in enumerate(zip(xs_t, ys_t, strict=True)):
            if len(x) != len(y):
                raise ValueError(f"client {i}: {len(x)} feature rows but {len(y)} targets")
        width = max(int(counts.max()), 1)
        feat_shape = next((tuple(x.shape[1:]) for x in xs_t if x.ndim > 1), ())
        tgt_shape = next((tuple(y.shape[1:]) for y in ys_t if y.ndim > 1), ())
        check_padding_fits(len(xs_t), width, math.prod(feat_shape) * 4 + math.prod(tgt_shape) * y_dtype.itemsize,
                           int(counts.sum()))
        x_pad = torch.zeros((len(xs_t), width, *feat_shape), dtype=torch.float32)
        y_pad = torch.zeros((len(ys_t), width, *tgt_shape), dtype=y_dtype)
        for i, (x, y) in enumerate(zip(xs_t, ys_t, strict=True)):
            x_pad[i, : len(x)] = x.reshape(len(x), *feat_shape)
            y_pad[i, : len(y)] = y.reshape(len(y), *tgt_shape)
        return ClientSplit(x_pad, y_pad, counts)


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

    def __post_init__(self) -> None:
        n = self.train.num_clients
        if self.novel_mask.numel() == 0:
            self.novel_mask = torch.zeros(n, dtype=torch.bool)
        if not self.client_names:
            self.client_names = [str(i) for i in range(n)]
        for split_name in ("val", "test"):
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
    def train_client_ids(self) -> torch.Tensor:
        """Clients that take part in training (everything but the novel ones)."""
        return torch.nonzero(~self.novel_mask).flatten()

    @property
    def novel_client_ids(self) -> torch.Tensor:
        return torch.nonzero(self.novel_mask).flatten()
