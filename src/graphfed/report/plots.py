"""Convergence plots from ``rounds.jsonl`` records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt


def plot_curves(history: list[dict[str, Any]], path: Path, metric: str, title: str = "") -> None:
    """Validation/test/novel metric and training loss against rounds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_metric, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
    rounds = [r["round"] for r in history]
    for key, label in (("val_mean", "validation"), ("test_mean", "test"), ("novel_mean", "novel clients")):
        values = [r.get(key) for r in history]
        if any(v is not None for v in values):
            ax_metric.plot(rounds, [float("nan") if v is None else v for v in values], label=label)
    ax_metric.set_xlabel("round")
    ax_metric.set_ylabel(f"{metric} (mean over clients)")
    ax_metric.legend()
    ax_metric.grid(alpha=0.3)
    ax_loss.plot(rounds, [r.get("train_loss", float("nan")) for r in history], color="tab:red")
    ax_loss.set_xlabel("round")
    ax_loss.set_ylabel("client training loss (last step)")
    ax_loss.set_yscale("log")
    ax_loss.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_comparison(histories: dict[str, list[dict[str, Any]]], path: Path, metric: str,
                    title: str = "") -> None:
    """Test metric against rounds, one line per method (first seed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, history in histories.items():
        ax.plot([r["round"] for r in history], [r["test_mean"] for r in history], label=name)
    ax.set_xlabel("round")
    ax.set_ylabel(f"test {metric} (mean over clients)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_graphs(run_dir: Path, out_dir: Path | None = None, max_rounds: int = 6) -> list[Path]:
    """Heatmaps of a run's collaboration graphs (``graphs/round_*.npz``).

    Writes ``graphs_layers.png`` (the last saved round, one panel per layer) and
    ``graphs_over_rounds.png`` (the layer-mean graph at up to ``max_rounds`` rounds spread over the run).
    Row i holds the weights client i gives every client, as in FedAGHN Fig. 4-5 and pFedGAT Fig. 3.
    """
    from graphfed.sim.checkpoint import load_graphs

    saved = load_graphs(run_dir)
    if not saved:
        raise FileNotFoundError(f"{run_dir / 'graphs'}: no collaboration graphs saved (the method has none, "
                                "or the run evaluated no round)")
    out_dir = out_dir or run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    last_round, layers, matrices = saved[-1]
    paths = [_heatmap_grid([(name, matrices[i]) for i, name in enumerate(layers)],
                           f"collaboration graph per layer, round {last_round}", out_dir / "graphs_layers.png")]
    step = max(1, len(saved) // max_rounds)
    picked = saved[::step][-max_rounds:]
    if picked[-1][0] != last_round:
        picked = [*picked[1:], saved[-1]]
    over_rounds = [(f"round {r}", m.mean(0)) for r, _, m in picked]
    paths.append(_heatmap_grid(over_rounds, "collaboration graph (mean over layers) over rounds",
                               out_dir / "graphs_over_rounds.png"))
    return paths


def _heatmap_grid(panels: list[tuple[str, Any]], title: str, path: Path) -> Path:
    columns = min(4, len(panels))
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 3.0 * rows), squeeze=False, layout="constrained")
    vmax = max(float(matrix.max()) for _, matrix in panels)
    image = None
    for ax, (name, matrix) in zip(axes.flat, panels, strict=False):
        image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=vmax)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("client j", fontsize=8)
        ax.set_ylabel("client i", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="weight")
    fig.suptitle(title)
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
