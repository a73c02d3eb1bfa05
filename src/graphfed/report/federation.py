"""What ``graphfed inspect`` reports about a federation: per-client sizes and targets, and client-graph statistics.

The numbers are computed here (plain data, testable) and only drawn with rich in ``render_federation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from graphfed.data.federation import Federation
from graphfed.report.tables import plain, print_table

_TOP_CLASSES = 4  # a per-client label histogram shows this many classes before "+k more"
_LISTED = 8  # isolated clients named before "..."


@dataclass(frozen=True)
class GraphStats:
    nodes: int
    edges: int  # undirected, self-loops excluded
    density: float  # edges / (nodes choose 2)
    isolated: list[str]  # names of clients with no edge
    components: int
    largest_component: int
    degree_min: int
    degree_mean: float
    degree_max: int
    weight_min: float  # over edges; 0 when there are none
    weight_max: float


def graph_stats(adjacency: torch.Tensor | np.ndarray, names: Sequence[str]) -> GraphStats:
    """Statistics of a symmetric [N, N] adjacency (nonzero off-diagonal entries are edges)."""
    adj = np.asarray(adjacency, dtype=np.float64).copy()
    np.fill_diagonal(adj, 0.0)
    n = adj.shape[0]
    linked = adj != 0
    degree = linked.sum(axis=1)
    upper = adj[np.triu_indices(n, k=1)]
    weights = upper[upper != 0]
    count, labels = connected_components(csr_matrix(linked), directed=False)
    return GraphStats(
        nodes=n, edges=len(weights), density=len(weights) / (n * (n - 1) / 2) if n > 1 else 0.0,
        isolated=[names[i] for i in np.flatnonzero(degree == 0)], components=int(count),
        largest_component=int(np.bincount(labels).max()) if n else 0,
        degree_min=int(degree.min()) if n else 0, degree_mean=float(degree.mean()) if n else 0.0,
        degree_max=int(degree.max()) if n else 0,
        weight_min=float(weights.min()) if len(weights) else 0.0,
        weight_max=float(weights.max()) if len(weights) else 0.0)


#: a client holding more than this share of all training rows, and more than twice its fair share (1/N), gets a
#: warning (a third of a balanced 3-client federation is no warning)
DOMINANT_SHARE = 0.25
DOMINANT_OVER_FAIR = 2.0
#: ... or more than this many times the median client's rows
DOMINANT_RATIO = 10.0


@dataclass(frozen=True)
class SizeStats:
    """How unequal the clients' training splits are."""

    rows_min: int
    rows_median: float
    rows_max: int
    largest: str  # the client with the most training rows
    largest_share: float  # its share of all training rows
    max_over_median: float
    dominant: list[tuple[str, int, float]]  # (client, rows, share) of clients past DOMINANT_SHARE or DOMINANT_RATIO


def size_stats(counts: torch.Tensor, names: Sequence[str]) -> SizeStats:
    """Imbalance of per-client training row ``counts``."""
    rows = counts.to(torch.float64)
    total, median = float(rows.sum()), float(np.median(rows.numpy())) if len(rows) else 0.0
    largest = int(rows.argmax()) if len(rows) else 0
    shares = rows / max(total, 1.0)
    dominant = [(names[i], int(rows[i]), float(shares[i])) for i in range(len(rows))
                if shares[i] > max(DOMINANT_SHARE, DOMINANT_OVER_FAIR / len(rows))
                or (median > 0 and rows[i] > DOMINANT_RATIO * median)]
    return SizeStats(int(rows.min()) if len(rows) else 0, median, int(rows.max()) if len(rows) else 0,
                     names[largest] if len(rows) else "-", float(shares[largest]) if len(rows) else 0.0,
                     float(rows.max()) / median if median > 0 else float("inf"), dominant)


def label_histogram(labels: np.ndarray, num_classes: int, top: int = _TOP_CLASSES) -> str:
    """Compact ``class:count`` list, e.g. ``0:12 1:30 2:5``; with many classes the ``top`` most frequent
    (``7:40 3:22 1:10 0:5 +6 more``), so a 62-class client still fits one table cell."""
    counts = np.bincount(labels.astype(np.int64), minlength=num_classes)
    present = np.flatnonzero(counts)
    if len(present) <= top:
        return " ".join(f"{c}:{counts[c]}" for c in present)
    by_count = sorted(present, key=lambda c: (-counts[c], c))
    return " ".join(f"{c}:{counts[c]}" for c in by_count[:top]) + f" +{len(present) - top} more"


#: features whose spreads differ by more than this factor get a warning: a model's first layer then sees one feature
#: and hardly the others (raw cholesterol about 250 beside a 0/1 flag), and a trivial predictor can beat it
SCALE_RATIO = 100.0
_FEATURES_LISTED = 64  # a per-feature table for tabular data; image pixels get one summary line


@dataclass(frozen=True)
class FeatureStats:
    """Each input feature over every training row (all clients): its name, range, mean and spread."""

    names: list[str]
    low: np.ndarray
    high: np.ndarray
    mean: np.ndarray
    std: np.ndarray

    def scale_warning(self) -> str | None:
        """One line when the features' spreads differ by more than :data:`SCALE_RATIO`, naming the widest and
        the narrowest and what fixes it; None otherwise."""
        varying = np.flatnonzero(self.std > 0)
        if len(varying) < 2:
            return None
        wide, narrow = varying[self.std[varying].argmax()], varying[self.std[varying].argmin()]
        ratio = float(self.std[wide] / self.std[narrow])
        if ratio <= SCALE_RATIO:
            return None
        return (f"the features' scales differ by {ratio:.3g}x ({self.names[wide]}: std {self.std[wide]:.4g}, "
                f"{self.names[narrow]}: std {self.std[narrow]:.4g}): a model then learns from the widest and "
                f"hardly the others, and may score below the trivial predictor; standardise them "
                f"(dataset.standardize: pooled, or client under DP)")


def feature_stats(fed: Federation) -> FeatureStats:
    """:class:`FeatureStats` of ``fed``'s flattened input features over its training rows."""
    _, rows = fed.train.row_owners()
    x = fed.train.x[rows].flatten(1).to(torch.float64).numpy() if len(rows) else np.zeros((0, 0))
    width = x.shape[1] if len(rows) else int(np.prod(fed.input_shape))
    names = fed.feature_names if fed.feature_names and len(fed.feature_names) == width else \
        [f"x{j}" for j in range(width)]
    if not len(rows):
        empty = np.zeros(width)
        return FeatureStats(names, empty, empty, empty, empty)
    return FeatureStats(names, x.min(0), x.max(0), x.mean(0), x.std(0))


def _client_targets(fed: Federation, i: int) -> np.ndarray:
    return torch.cat([split.client(i)[1].reshape(-1) for split in (fed.train, fed.val, fed.test)]).numpy()


def _target_scale(fed: Federation) -> tuple[float, str]:
    """(factor, label) that turn stored regression targets into the units the federation declares."""
    if fed.target_scale is not None and fed.target_units is not None:
        return fed.target_scale, f" ({fed.target_units})"
    return 1.0, " (as stored)" if fed.target_scale is not None else ""


def _target_cell(fed: Federation, targets: np.ndarray) -> str:
    if fed.task == "classification":
        return label_histogram(targets, fed.output_dim)
    if targets.size == 0:
        return "-"
    factor, _ = _target_scale(fed)
    return f"{plain(factor * targets.mean())} ± {plain(factor * targets.std())}"


def render_federation(fed: Federation, console: Console, max_clients: int = 50) -> None:
    """Print the overview, the per-client table (first ``max_clients`` rows plus totals) and the graph."""
    counts = {name: getattr(fed, name).counts for name in ("train", "val", "test")}
    overview = Table(title=f"{fed.name}", show_header=False)
    overview.add_row("description", fed.description or "-")
    overview.add_row("task / metric", f"{fed.task} / {fed.metric}")
    if fed.task_reason and not fed.task_reason.startswith("warning: "):  # a warning is printed below the table
        overview.add_row("why this task", fed.task_reason)
    novel = int(fed.novel_mask.sum())
    overview.add_row("clients", f"{fed.num_clients}" + (f" ({novel} novel)" if novel else ""))
    overview.add_row("feature shape", str(tuple(fed.input_shape)))
    classes = f"{fed.output_dim}" + (f" ({', '.join(fed.class_names)})" if fed.class_names else "")
    overview.add_row("classes" if fed.task == "classification" else "target size", classes)
    overview.add_row("samples train / val / test",
                     " / ".join(str(int(c.sum())) for c in counts.values()))
    sizes = size_stats(counts["train"], fed.client_names)
    overview.add_row("train rows per client min / median / max",
                     f"{sizes.rows_min} / {sizes.rows_median:g} / {sizes.rows_max} (largest: {sizes.largest}, "
                     f"{sizes.largest_share:.0%} of all rows, {sizes.max_over_median:.1f}x the median)")
    print_table(console, overview)
    if fed.task_reason and fed.task_reason.startswith("warning: "):
        console.print(f"[yellow]warning:[/yellow] {fed.task_reason.removeprefix('warning: ')}")
    for name, rows, share in sizes.dominant:
        console.print(f"[yellow]warning:[/yellow] client {name} holds {rows} training rows ({share:.0%} of all, "
                      f"{rows / max(sizes.rows_median, 1):.0f}x the median client): it dominates every sample-weighted "
                      f"average (FedAvg and its family) and its evaluation takes the most time and memory")

    features = feature_stats(fed)
    if len(features.names) <= _FEATURES_LISTED:
        table = Table(title="features (training rows, all clients)")
        for header in ("feature", "min", "max", "mean", "std"):
            table.add_column(header, justify="left" if header == "feature" else "right")
        for j, name in enumerate(features.names):
            table.add_row(name, *(plain(float(values[j])) for values in (features.low, features.high,
                                                                          features.mean, features.std)))
        print_table(console, table)
    elif len(features.low):
        console.print(f"features: {len(features.names)} inputs, from {plain(float(features.low.min()))} to "
                      f"{plain(float(features.high.max()))} (std {plain(float(features.std.min()))} to "
                      f"{plain(float(features.std.max()))})")
    if (warning := features.scale_warning()) is not None:
        console.print(f"[yellow]warning:[/yellow] {warning}")

    target_header = ("labels (all splits)" if fed.task == "classification"
                     else f"target mean ± std{_target_scale(fed)[1]}")
    clients = Table(title="clients")
    for header in ("client", "train", "val", "test", target_header):
        clients.add_column(header, justify="right" if header in ("train", "val", "test") else "left")
    everything: list[np.ndarray] = []
    for i in range(fed.num_clients):
        targets = _client_targets(fed, i)
        everything.append(targets)
        if i < max_clients:
            name = fed.client_names[i] + (" (novel)" if bool(fed.novel_mask[i]) else "")
            clients.add_row(name, *(str(int(c[i])) for c in counts.values()), _target_cell(fed, targets))
    if fed.num_clients > max_clients:
        clients.add_row(f"... {fed.num_clients - max_clients} more", "", "", "", "")
    clients.add_section()
    clients.add_row("total", *(str(int(c.sum())) for c in counts.values()),
                    _target_cell(fed, np.concatenate(everything)))
    print_table(console, clients)

    if fed.client_graph is None:
        console.print("client graph: none given (methods that need one infer it from the clients' updates)")
        return
    stats = graph_stats(fed.client_graph, fed.client_names)
    graph = Table(title="client graph", show_header=False)
    graph.add_row("nodes / edges", f"{stats.nodes} / {stats.edges}")
    graph.add_row("density", f"{stats.density:.3f}")
    graph.add_row("connected components", f"{stats.components} (largest {stats.largest_component} clients)")
    isolated = ", ".join(stats.isolated[:_LISTED]) + (", ..." if len(stats.isolated) > _LISTED else "")
    graph.add_row("isolated clients", f"{len(stats.isolated)}" + (f": {isolated}" if stats.isolated else ""))
    graph.add_row("degree min / mean / max", f"{stats.degree_min} / {stats.degree_mean:.2f} / {stats.degree_max}")
    if stats.edges and (stats.weight_min != 1.0 or stats.weight_max != 1.0):
        graph.add_row("edge weight min / max", f"{stats.weight_min:.4g} / {stats.weight_max:.4g}")
    print_table(console, graph)
