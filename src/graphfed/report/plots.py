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
