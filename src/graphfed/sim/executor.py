"""Where client work runs. The round loop talks to a ``ClientExecutor``; it never knows whether clients
are rows of a tensor in this process (``ClientRuntime``) or Flower nodes on other machines."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

import torch

from graphfed.core import rng
from graphfed.core.params import ParamSpec
from graphfed.data.federation import Federation
from graphfed.models.base import TargetModel
from graphfed.sim.client import ClientScores, LocalTraining, evaluate_clients, train_clients, validation_feedback

SPLITS = ("val", "test")


class NonFiniteUpdateError(RuntimeError):
    """A client update or the server's weights became NaN/Inf; the run stops, checkpoint kept."""


class InvalidUpdateError(ValueError):
    """A client update has the wrong shape."""


def check_update(update: torch.Tensor, client_ids: torch.Tensor, dim: int, round_index: int) -> None:
    """Reject wrong-shaped or non-finite client weights/updates, naming the offending clients.

    ``round_index`` is 0-based; messages number rounds from 1, as ``rounds.jsonl`` does.
    """
    if update.ndim != 2 or update.shape != (len(client_ids), dim):
        raise InvalidUpdateError(f"round {round_index + 1}: client update shape {tuple(update.shape)}, "
                                 f"({len(client_ids)}, {dim}) expected")
    bad = ~torch.isfinite(update).all(dim=1)
    if bad.any():
        raise NonFiniteUpdateError(f"round {round_index + 1}: non-finite (NaN/Inf) update from client(s) "
                                   f"{client_ids[bad].tolist()}")


@dataclass
class TrainResult:
    """The updates that arrived: ``rows`` indexes the asked-for clients, in order."""

    rows: torch.Tensor  # [K] positions into the requested client_ids
    client_ids: torch.Tensor  # [K]
    delta: torch.Tensor  # [K, dim], sent - trained, computed where the client trained
    metrics: dict[str, torch.Tensor]  # each [K]


class ClientExecutor(ABC):
    """Runs clients' local training and evaluation for the round loop."""

    @abstractmethod
    def train(self, client_ids: torch.Tensor, start: torch.Tensor, round_index: int, purpose: str,
              steps: int | None = None) -> TrainResult:
        """Train ``client_ids`` from ``start`` (``[S, dim]``); may return fewer clients than asked."""

    @abstractmethod
    def evaluate(self, client_ids: torch.Tensor, weights: torch.Tensor, round_index: int,
                 finetune_steps: int = 0) -> dict[str, ClientScores]:
        """Scores of ``weights`` on each client's val and test split (after optional local fine-tuning)."""


class ClientRuntime(ClientExecutor):
    """Clients in this process, all trained at once. A Flower client is the same runtime with S = 1."""

    def __init__(self, model: TargetModel, spec: ParamSpec, federation: Federation, training: LocalTraining,
                 seed: int) -> None:
        self.model, self.spec, self.federation = model, spec, federation
        self.training, self.seed = training, seed

    def train(self, client_ids: torch.Tensor, start: torch.Tensor, round_index: int, purpose: str,
              steps: int | None = None) -> TrainResult:
        training = self.training if steps is None else replace(self.training, steps=steps)
        # One stream per (round, purpose, client): a client draws the same batches wherever it runs.
        seeds = rng.client_seeds(self.seed, round_index, purpose, client_ids)
        trained, metrics = train_clients(self.model, self.spec, start, self.federation.train.select(client_ids),
                                         training, self.federation.task, seeds)
        check_update(trained, client_ids, self.spec.dim, round_index)  # before any arithmetic broadcasts it
        if training.feedback != "none" and purpose == "local_training":
            feedback_seeds = rng.client_seeds(self.seed, round_index, "feedback", client_ids)
            validation = self.federation.val.select(client_ids)
            metrics["feedback"] = validation_feedback(self.model, self.spec, start, validation, self.federation.task,
                                                      training, feedback_seeds)
            metrics["feedback_seed"] = torch.tensor(feedback_seeds, dtype=torch.int64)
        return TrainResult(torch.arange(len(client_ids)), client_ids, start - trained, metrics)

    def evaluate(self, client_ids: torch.Tensor, weights: torch.Tensor, round_index: int,
                 finetune_steps: int = 0) -> dict[str, ClientScores]:
        if finetune_steps:
            weights = weights - self.train(client_ids, weights, round_index, "evaluation", finetune_steps).delta
        return {split: evaluate_clients(self.model, self.spec, weights,
                                        getattr(self.federation, split).select(client_ids), self.federation.task)
                for split in SPLITS}
