"""Convergence plots from ``rounds.jsonl`` records."""

from __future__ import annotations

import gc
import io
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt


def shown(value: float | None, metric: str) -> float:
    """A metric value as tables and plots show it: accuracy in %, anything else as is; None as NaN (a gap)."""
    if value is None:
        return float("nan")
    return 100 * value if metric == "accuracy" else value


def _metric_axis(ax: Any, metric: str, values: list[float], what: str) -> None:
    """Name the metric, its unit and direction; MSE on a log scale, accuracy with its lower limit set by the bulk
    of the points, so one method's first rounds cannot squash the rest of the figure."""
    from graphfed.report.tables import metric_label

    ax.set_ylabel(f"{what} {metric_label(metric)}")
    finite = [v for v in values if v == v and abs(v) != float("inf")]
    if not finite:
        return
    if metric != "accuracy":
        if min(finite) > 0:
            ax.set_yscale("log")
        return
    ordered = sorted(finite)
    low = ordered[int(0.05 * (len(ordered) - 1))]  # 5th percentile
    high = max(finite)
    margin = max(0.05 * (high - low), 0.5)
    ax.set_ylim(max(0.0, low - margin), min(100.0, high + margin))


#: what a curve's x axis can be: a record's key and its label
X_AXES = {"round": "round", "sim_seconds": "simulated seconds (train.clock)"}


def plot_curves(history: list[dict[str, Any]], path: Path, metric: str, title: str = "", x: str = "round") -> None:
    """Validation/test/novel metric and training loss against rounds (``x="sim_seconds"``: the simulated clock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_metric, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
    history = [r for r in history if r.get(x) is not None]
    rounds = [r[x] for r in history]
    plotted: list[float] = []
    for key, label in (("val_mean", "validation"), ("test_mean", "test"), ("novel_mean", "novel clients")):
        values = [r.get(key) for r in history]
        if any(v is not None for v in values):
            points = [shown(v, metric) for v in values]
            plotted += points
            ax_metric.plot(rounds, points, label=label)
    ax_metric.set_xlabel(X_AXES[x])
    _metric_axis(ax_metric, metric, plotted, "mean over clients,")
    if plotted:
        ax_metric.legend()
    ax_metric.grid(alpha=0.3)
    # None: not reported (a private run releases no training loss)
    losses = [r.get("train_loss") if r.get("train_loss") is not None else float("nan") for r in history]
    ax_loss.set_xlabel(X_AXES[x])
    ax_loss.set_ylabel("client training loss (last step)")
    if any(loss == loss and 0 < loss < float("inf") for loss in losses):
        ax_loss.plot(rounds, losses, color="tab:red")
        ax_loss.set_yscale("log")
    else:
        ax_loss.text(0.5, 0.5, "not reported\n(a private run releases no training loss)", ha="center",
                     va="center", transform=ax_loss.transAxes, color="0.4")
    ax_loss.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    # The log axis's tick labels go through mathtext, whose parser (pyparsing) keeps the exceptions it uses for
    # control flow in reference cycles; their tracebacks reach back through the caller's frames, so the engine
    # that called us (a run's whole federation) would wait for Python's next full collection. Collect now: a
    # bench of CIFAR-10 cells in one process otherwise grew by about 700 MiB a cell.
    gc.collect()


def plot_comparison(histories: dict[str, list[dict[str, Any]]], path: Path, metric: str,
                    title: str = "", x: str = "round") -> None:
    """Test metric against rounds (or ``x="sim_seconds"``: the simulated clock), one line per method (first
    seed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    plotted: list[float] = []
    for name, history in histories.items():
        timed = [r for r in history if r.get(x) is not None]
        points = [shown(r["test_mean"], metric) for r in timed]
        plotted += points
        ax.plot([r[x] for r in timed], points, label=name)
    ax.set_xlabel(X_AXES[x])
    _metric_axis(ax, metric, plotted, "test,")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(textwrap.fill(title, 60), fontsize=10)  # a section's title can be longer than the axes are wide
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_graphs(run_dir: Path, out_dir: Path | None = None, max_rounds: int = 6) -> list[Path]:
    """Heatmaps of a run's collaboration graphs (``graphs/round_*.npz``).

    Writes ``graphs_layers.png`` (the last saved round, one panel per layer) and
    ``graphs_over_rounds.png`` (the layer-mean graph at up to ``max_rounds`` rounds spread over the run).
    Row i holds the weights client i gives every client, as in FedAGHN Fig. 4-5 and pFedGAT Fig. 3.
    """
    from graphfed.errors import UntrustedInputError
    from graphfed.runs import load_graph_clients, load_graphs

    saved = load_graphs(run_dir)
    if not saved:
        raise UntrustedInputError(f"{run_dir / 'graphs'}: no collaboration graphs saved (the method has none, "
                                  "or the run evaluated no round)")
    out_dir = out_dir or run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    last_round, layers, matrices = saved[-1]
    clients = load_graph_clients(run_dir)
    paths = [_heatmap_grid([(name, matrices[i]) for i, name in enumerate(layers)],
                           f"collaboration graph per layer, round {last_round}", out_dir / "graphs_layers.png",
                           clients)]
    step = max(1, len(saved) // max_rounds)
    picked = saved[::step][-max_rounds:]
    if picked[-1][0] != last_round:
        picked = [*picked[1:], saved[-1]]
    over_rounds = [(f"round {r}", m.mean(0)) for r, _, m in picked]
    paths.append(_heatmap_grid(over_rounds, "collaboration graph (mean over layers) over rounds",
                               out_dir / "graphs_over_rounds.png", clients))
    return paths


#: clients labelled by name on a heatmap's axes up to this many (beyond, integer positions only)
NAMED_TICKS = 40


def _client_axes(ax: Any, count: int, clients: tuple[list[str], Any] | None) -> None:
    """Integer ticks; with the clients' names (novel ones marked * in red) when there are few enough."""
    from matplotlib.ticker import MaxNLocator

    if clients is None or count > NAMED_TICKS or len(clients[0]) != count:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        return
    names, novel = clients
    labels = [f"{name}*" if is_novel else name for name, is_novel in zip(names, novel, strict=True)]
    for axis, rotate in ((ax.xaxis, 90), (ax.yaxis, 0)):
        axis.set_ticks(range(count))
        axis.set_ticklabels(labels, fontsize=6, rotation=rotate)
        for label, is_novel in zip(axis.get_ticklabels(), novel, strict=True):
            if is_novel:
                label.set_color("tab:red")


def graph_heatmap_png(graph: Any, title: str = "") -> bytes:
    """A collaboration graph ``[N, N]`` (or ``[L, N, N]``: its first layer) as a PNG heatmap, for trackers."""
    matrix = graph[0] if graph.ndim == 3 else graph
    buffer = io.BytesIO()
    _heatmap_grid([("collaboration graph", matrix.detach().cpu().numpy())], title, buffer)
    return buffer.getvalue()


def _heatmap_grid(panels: list[tuple[str, Any]], title: str, path: Path | io.BytesIO,
                  clients: tuple[list[str], Any] | None = None) -> Path | io.BytesIO:
    columns = min(4, len(panels))
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 3.0 * rows), squeeze=False, layout="constrained")
    vmax = max(float(matrix.max()) for _, matrix in panels)
    image = None
    for ax, (name, matrix) in zip(axes.flat, panels, strict=False):
        image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=vmax)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("client j (its weight in row i)", fontsize=8)
        ax.set_ylabel("client i", fontsize=8)
        _client_axes(ax, matrix.shape[-1], clients)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="weight")
    novel_note = "; * novel client (never trained)" if clients is not None and clients[1].any() else ""
    fig.suptitle(title + novel_note)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_arch_graph(graph: Any, path: Path, title: str = "") -> Path:
    """Draw an ``ArchGraph``: nodes top to bottom by depth (longest path from the input), coloured by type."""
    depth = [0] * graph.num_nodes
    for source, target in sorted(graph.edges.T.tolist(), key=lambda edge: edge[1]):  # sources precede targets
        depth[target] = max(depth[target], depth[source] + 1)
    columns: dict[int, int] = {}
    position = []
    for level in depth:
        position.append((columns.get(level, 0), -level))
        columns[level] = columns.get(level, 0) + 1
    colours = {"input": "grey", "conv": "tab:blue", "bn": "tab:cyan", "linear": "tab:purple", "add": "tab:red",
               "concat": "tab:orange", "pool": "tab:green"}
    fig, ax = plt.subplots(figsize=(4 + max(columns.values()), 0.35 * (max(depth) + 2)), layout="constrained")
    for source, target in graph.edges.T.tolist():
        (x0, y0), (x1, y1) = position[source], position[target]
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops={"arrowstyle": "->", "color": "0.5", "lw": 0.8})
    for kind, colour in colours.items():
        points = [position[i] for i in range(graph.num_nodes) if graph.kinds[i] == kind]
        if points:
            ax.scatter(*zip(*points, strict=True), s=60, color=colour, label=kind, zorder=3)
    ax.legend(loc="upper right", fontsize=7)
    ax.set_axis_off()
    ax.set_title(title or "architecture graph", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(series: dict[str, list[tuple[float, float | None, float | None]]], path: Path, xlabel: str,
               ylabel: str, title: str = "") -> None:
    """A metric against a swept setting (e.g. the share of malicious clients), one line per method: each point is
    ``(x, mean, std)`` over seeds, drawn with its std as an error bar; missing means leave a gap."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, points in series.items():
        xs = [x for x, _, _ in points]
        means = [float("nan") if mean is None else mean for _, mean, _ in points]
        stds = [0.0 if std is None else std for _, _, std in points]
        ax.errorbar(xs, means, yerr=stds, label=name, marker="o", markersize=3, capsize=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncols=2)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
