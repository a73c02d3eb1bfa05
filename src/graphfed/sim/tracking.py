"""Experiment trackers, called from the round loop (the one place that knows rounds) through one interface.

A :class:`RunTracker` hears the run start (its config), every evaluation (the round's record: scores, per-client
scores, bytes, wall time; and the collaboration graphs where the method has them) and the run's end (its result).
Backends (``tracking.backends``):

* ``csv`` (the default): ``metrics.csv`` in the run directory, one row per evaluation, ready for any plotting tool;
* ``tensorboard``: event files in ``<run>/tensorboard`` (scalars, per-client score histograms, graph heatmaps as
  images, the config as text); the ``tensorboard`` extra;
* ``mlflow``: a run in ``tracking.mlflow_uri`` (default: a local SQLite store, ``<run>/mlflow.db``) with the config
  as parameters, the scores as metrics by round, the heatmaps as images; the ``mlflow`` extra (mlflow-skinny);
* ``wandb``: a Weights & Biases run in ``<run>/wandb`` (``tracking.wandb_mode``: ``offline`` by default, which
  needs no account; ``wandb sync`` uploads it later; ``online`` logs to the project ``tracking.experiment``) with
  the config, the scalars by round, per-client score histograms and the heatmaps as images; the ``wandb`` extra.

Asking for a backend whose package is missing is a one-line ConfigError naming the extra, before round 1.
"""

from __future__ import annotations

import csv
import importlib.util
import io
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from graphfed.config import ConfigError, RunConfig
from graphfed.runs import METRICS_CSV, RunResult, atomic_write_text

#: backend -> (module it needs, the pip extra that installs it)
REQUIREMENTS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow"),
                "wandb": ("wandb", "wandb")}
#: the record's scalars every backend logs (when present), in this order
SCALARS = ("val_mean", "test_mean", "test_std", "test_pooled", "novel_mean", "honest_test_mean", "asr_mean",
           "train_loss", "bytes_up", "bytes_down", "wall_seconds")


class RunTracker(Protocol):
    def start(self, config: RunConfig, history: list[dict[str, Any]]) -> None:
        """The run begins (``history``: the evaluations a resumed run already has)."""

    def evaluation(self, record: dict[str, Any], graphs: torch.Tensor | None) -> None: ...

    def end(self, result: RunResult) -> None: ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers a tracker plots: the fixed scalars, then ``train.metrics``' means."""
    chosen = {key: value for key, value in record.items() if key.endswith("_mean") and key not in SCALARS}
    return {key: float(value) for key, value in ({k: record.get(k) for k in SCALARS} | chosen).items()
            if isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value)}


def flat_params(config: RunConfig) -> dict[str, str]:
    """The config as ``section.field`` -> text (trackers' parameters)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        else:
            out[prefix] = str(value)

    walk("", config.model_dump(mode="json"))
    return out


def heatmap_image(graphs: torch.Tensor) -> Any:
    """The collaboration graph's heatmap as a PIL image (matplotlib is imported only when one is drawn)."""
    from PIL import Image

    from graphfed.report.plots import graph_heatmap_png

    return Image.open(io.BytesIO(graph_heatmap_png(graphs)))


class CsvTracker:
    """``metrics.csv``: one row per evaluation (the columns of the first evaluation, in order)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / METRICS_CSV
        self.rows: list[dict[str, Any]] = []

    def start(self, config: RunConfig, history: list[dict[str, Any]]) -> None:
        self.rows = [{"round": record["round"], **scalars(record)} for record in history]  # a resumed run keeps them

    def evaluation(self, record: dict[str, Any], graphs: torch.Tensor | None) -> None:
        self.rows.append({"round": record["round"], **scalars(record)})
        columns = list(dict.fromkeys(key for row in self.rows for key in row))
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.path, buffer.getvalue())

    def end(self, result: RunResult) -> None:
        pass


class TensorBoardTracker:
    def __init__(self, out_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def start(self, config: RunConfig, history: list[dict[str, Any]]) -> None:
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in flat_params(config).items()))

    def evaluation(self, record: dict[str, Any], graphs: torch.Tensor | None) -> None:
        step = record["round"]
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, step)
        for split in ("val", "test"):
            values = [scores[split] for scores in record.get("per_client", {}).values() if scores[split] is not None]
            if values:
                self.writer.add_histogram(f"per_client/{split}", np.asarray(values), step)
        if graphs is not None:
            image = np.asarray(heatmap_image(graphs).convert("RGB"))
            self.writer.add_image("collaboration_graph", image, step, dataformats="HWC")
        self.writer.flush()

    def end(self, result: RunResult) -> None:
        self.writer.close()


class MlflowTracker:
    def __init__(self, out_dir: Path, uri: str | None, experiment: str) -> None:
        import mlflow

        self.mlflow = mlflow
        # MLflow 3 keeps local runs in SQLite (its file store is in maintenance mode)
        self.uri = uri or f"sqlite:///{(out_dir / 'mlflow.db').resolve()}"
        mlflow.set_tracking_uri(self.uri)
        mlflow.set_experiment(experiment)

    def start(self, config: RunConfig, history: list[dict[str, Any]]) -> None:
        self.run = self.mlflow.start_run(run_name=f"{config.method.name}-seed{config.seed}")
        self.mlflow.log_params(flat_params(config))

    def evaluation(self, record: dict[str, Any], graphs: torch.Tensor | None) -> None:
        self.mlflow.log_metrics(scalars(record), step=int(record["round"]))
        if graphs is not None:
            self.mlflow.log_image(heatmap_image(graphs),
                                  f"collaboration_graph/round_{record['round']:04d}.png")

    def end(self, result: RunResult) -> None:
        self.mlflow.end_run(status="FINISHED" if result.completed else "FAILED")


class WandbTracker:
    def __init__(self, out_dir: Path, project: str, mode: str) -> None:
        import wandb

        self.wandb, self.out_dir, self.project, self.mode = wandb, out_dir, project, mode

    def start(self, config: RunConfig, history: list[dict[str, Any]]) -> None:
        folder = self.out_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(project=self.project, dir=str(self.out_dir), mode=self.mode,
                                   name=f"{config.method.name}-seed{config.seed}", config=flat_params(config),
                                   settings=self.wandb.Settings(silent=True, console="off"))

    def evaluation(self, record: dict[str, Any], graphs: torch.Tensor | None) -> None:
        logged: dict[str, Any] = dict(scalars(record))
        for split in ("val", "test"):
            values = [scores[split] for scores in record.get("per_client", {}).values() if scores[split] is not None]
            if values:
                logged[f"per_client/{split}"] = self.wandb.Histogram(np.asarray(values))
        if graphs is not None:
            logged["collaboration_graph"] = self.wandb.Image(heatmap_image(graphs))
        self.run.log(logged, step=int(record["round"]))

    def end(self, result: RunResult) -> None:
        self.run.finish(exit_code=0 if result.completed else 1)


def build_trackers(config: RunConfig, out_dir: Path | None) -> list[RunTracker]:
    """The trackers ``tracking`` asks for (none without a run directory); ConfigError naming the extra of a backend
    whose package is not installed."""
    tracking = config.tracking
    for backend in tracking.backends:
        module, extra = REQUIREMENTS.get(backend, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            raise ConfigError(f"tracking.backends: {backend} needs the {module!r} package: "
                              f"pip install 'graphfed[{extra}]'")
    if out_dir is None:
        return []
    builders = {"csv": lambda: CsvTracker(out_dir), "tensorboard": lambda: TensorBoardTracker(out_dir),
                "mlflow": lambda: MlflowTracker(out_dir, tracking.mlflow_uri, tracking.experiment),
                "wandb": lambda: WandbTracker(out_dir, tracking.experiment, tracking.wandb_mode)}
    return [builders[backend]() for backend in tracking.backends]
