"""What travels between the graphfed ServerApp and ClientApp, in Flower records.

Server -> client: ``ArrayRecord "arrays"`` (the client's own personalised weights, one flat float32 array)
and ``ConfigRecord "config"`` (round, purpose, client id, how to train or evaluate).
Client -> server (train): ``ArrayRecord "delta"`` (sent - trained) + ``MetricRecord "metrics"``.
Client -> server (evaluate): ``MetricRecord "metrics"`` with each split's per-client numerators.
Client -> server (query): ``ConfigRecord "identity"`` with the node's ``partition-id`` (= graphfed client id).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from graphfed.sim.client import SCORE_FIELDS, ClientScores, LocalTraining

RUN_CONFIG_KEY = "graphfed-config"  # the resolved graphfed YAML, in the Flower run config
OUT_DIR_KEY = "out-dir"  # where the ServerApp writes summary.json etc. ("" = nowhere)
PARTITION_KEY = "partition-id"


def weights_record(weights: torch.Tensor) -> ArrayRecord:
    return ArrayRecord([weights.detach().to(torch.float32).numpy()])


def record_weights(record: ArrayRecord) -> torch.Tensor:
    arrays = record.to_numpy_ndarrays()
    if len(arrays) != 1:
        raise ValueError(f"expected one flat weight array, got {len(arrays)}")
    return torch.from_numpy(np.array(arrays[0], dtype=np.float32, copy=True))


def train_content(weights: torch.Tensor, client_id: int, round_index: int, purpose: str, seed: int,
                  training: LocalTraining) -> RecordDict:
    config = ConfigRecord({"client-id": client_id, "round": round_index, "purpose": purpose, "seed": seed,
                           "steps": training.steps, "batch-size": training.batch_size, "lr": training.lr,
                           "feedback": training.feedback,
                           "feedback-mu": training.feedback_mu})
    return RecordDict({"arrays": weights_record(weights), "config": config})


def training_from(config: ConfigRecord) -> LocalTraining:
    return LocalTraining(int(config["steps"]), int(config["batch-size"]), float(config["lr"]),
                         str(config.get("feedback", "none")),
                         float(config.get("feedback-mu", 1e-3)))


def train_reply(delta: torch.Tensor, metrics: dict[str, torch.Tensor], client_id: int,
                upload_names: list[str]) -> RecordDict:
    values = {"client-id": client_id, "num-examples": int(metrics["num_examples"][0]),
              "loss-first": float(metrics["loss_first"][0]), "loss-last": float(metrics["loss_last"][0])}
    content = RecordDict({"delta": weights_record(delta[0]), "metrics": MetricRecord(values)})
    if "feedback" in metrics:
        content["feedback"] = weights_record(metrics["feedback"][0])
    if upload_names:
        content["uploads"] = named_arrays({name: metrics[name][0] for name in upload_names})
    return content


def named_arrays(arrays: dict[str, torch.Tensor]) -> ArrayRecord:
    """One client's named arrays (a method's broadcast, a client rule's uploads) as an ArrayRecord."""
    return ArrayRecord(torch_state_dict={name: value.detach().to(torch.float32).contiguous()
                                         for name, value in arrays.items()})


def record_named_arrays(record: ArrayRecord, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The arrays of ``record``, exactly the names and shapes expected (``[1, *shape]`` each), finite."""
    arrays = record.to_torch_state_dict()
    if set(arrays) != set(shapes):
        raise ValueError(f"arrays {sorted(arrays)} where {sorted(shapes)} were expected")
    for name, value in arrays.items():
        if tuple(value.shape) != tuple(shapes[name]):
            raise ValueError(f"array {name!r} of shape {tuple(value.shape)}, expected {tuple(shapes[name])}")
        if not torch.isfinite(value).all():
            raise ValueError(f"array {name!r} holds NaN/Inf")
    return {name: value.to(torch.float32).unsqueeze(0) for name, value in arrays.items()}


def reply_feedback(content: RecordDict, seed: int, round_index: int, client_id: int) -> dict[str, torch.Tensor]:
    """The client's feedback array, and the seed of its direction (the server derives it as the client did)."""
    from graphfed.core import rng

    feedback_seed = rng.stream_seed(seed, round_index, "feedback", client_id)
    return {"feedback": record_weights(content["feedback"]).unsqueeze(0),
            "feedback_seed": torch.tensor([feedback_seed], dtype=torch.int64)}


def reply_metrics(metrics: MetricRecord) -> dict[str, torch.Tensor]:
    return {"num_examples": torch.tensor([float(metrics["num-examples"])]),
            "loss_first": torch.tensor([float(metrics["loss-first"])]),
            "loss_last": torch.tensor([float(metrics["loss-last"])])}


def scores_record(scores: dict[str, ClientScores]) -> MetricRecord:
    return MetricRecord({f"{split}-{name}": float(getattr(score, name)[0])
                         for split, score in scores.items() for name in SCORE_FIELDS})


def record_scores(record: MetricRecord, split: str) -> ClientScores:
    values = {name: torch.tensor([float(record[f"{split}-{name}"])]) for name in SCORE_FIELDS}
    values["counts"] = values["counts"].long()
    return ClientScores(**values)


def missing_scores() -> ClientScores:
    """Placeholder for a client whose evaluation reply never came: NaN metric, no pooled weight."""
    nan, zero = torch.tensor([float("nan")]), torch.zeros(1)
    return ClientScores(nan, nan, torch.zeros(1, dtype=torch.long), zero, zero, zero)


CLIENT_STATE_KEY = "graphfed-client-state"  # a node's client-rule state, in its context.state


def state_record(state: dict[str, Any]) -> ArrayRecord:
    """A :class:`~graphfed.sim.executor.ClientStateStore` state as one ArrayRecord (``trained`` + tensors)."""
    arrays = {"trained": state["trained"].to(torch.int8)}
    arrays.update({f"state.{name}": value for name, value in state["tensors"].items()})
    return ArrayRecord(torch_state_dict=arrays)


def record_state(record: ArrayRecord) -> dict[str, Any]:
    arrays = record.to_torch_state_dict()
    return {"trained": arrays.pop("trained").to(torch.bool),
            "tensors": {name.removeprefix("state."): value for name, value in arrays.items()}}
