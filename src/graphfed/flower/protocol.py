"""What travels between the graphfed ServerApp and ClientApp, in Flower records.

Server -> client: ``ArrayRecord "arrays"`` (the client's own personalised weights, one flat float32 array)
and ``ConfigRecord "config"`` (round, purpose, client id, how to train or evaluate).
Client -> server (train): ``ArrayRecord "delta"`` (sent - trained) + ``MetricRecord "metrics"``.
Client -> server (evaluate): ``MetricRecord "metrics"`` with each split's per-client numerators.
Client -> server (query): ``ConfigRecord "identity"`` with the node's ``partition-id`` (= graphfed client id).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from graphfed.client.evaluation import SCORE_FIELDS, ClientScores
from graphfed.config import RunConfig
from graphfed.errors import UntrustedInputError

RUN_CONFIG_KEY = "graphfed-config"  # the resolved graphfed YAML, in the Flower run config
OUT_DIR_KEY = "out-dir"  # where the ServerApp writes summary.json etc. ("" = nowhere)
PARTITION_KEY = "partition-id"
#: a SuperNode's own ``train.device`` (node config ``device=cuda:1``), over the run config's
DEVICE_KEY = "device"
STATE_DIR_KEY = "state-dir"  # node config: where a node keeps its clients' state between rounds and restarts
RUN_TOKEN_KEY = "run-token"  # in every message: the run whose client state the node reads and writes
RESUMES_KEY = "resumes"  # in every message: where each resume of the run started again ("4,6"; "" never resumed)


def deployment_refusal(config: RunConfig) -> str | None:
    """Why no Flower engine (graphfed's app, the SecAgg+ app, a node) runs ``config`` whatever its method (one
    line), or None."""
    if config.privacy.mechanism != "none" and config.privacy.reproducible_noise:
        return ("privacy.reproducible_noise: a deployment's noise must be secret, and this draws it from the run's "
                "seed, which every node is sent; remove it (each node then draws its noise from its own secure "
                "generator)")
    return None


def weights_record(weights: torch.Tensor) -> ArrayRecord:
    return ArrayRecord([weights.detach().to(device="cpu", dtype=torch.float32).numpy()])


def record_weights(record: ArrayRecord) -> torch.Tensor:
    arrays = record.to_numpy_ndarrays()
    if len(arrays) != 1:
        raise ValueError(f"expected one flat weight array, got {len(arrays)}")
    return torch.from_numpy(np.array(arrays[0], dtype=np.float32, copy=True))


class InvalidReply(ValueError):
    """A node's reply that does not hold what the server asked for; the node is dropped for that round."""


def _record(content: RecordDict, key: str, kind: type) -> Any:
    if key not in content:
        raise InvalidReply(f"no {key!r} record")
    record = content[key]
    if not isinstance(record, kind):
        raise InvalidReply(f"{key!r} is a {type(record).__name__}, not a {kind.__name__}")
    return record


def _checked(array: Any, what: str, shape: tuple[int, ...]) -> torch.Tensor:
    """One array of a reply as a tensor: float32, exactly ``shape``, finite."""
    if str(array.dtype) != "float32":
        raise InvalidReply(f"{what}: dtype {array.dtype}, float32 expected")
    if tuple(array.shape) != tuple(shape):
        raise InvalidReply(f"{what} of shape {tuple(array.shape)}, expected {tuple(shape)}")
    values = torch.from_numpy(np.array(array.numpy(), dtype=np.float32, copy=True))
    if not torch.isfinite(values).all():
        raise InvalidReply(f"{what}: non-finite (NaN/Inf) values")
    return values


def checked_array(record: ArrayRecord, what: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The one float32 array of ``record``: exactly ``shape``, finite."""
    if len(record) != 1:
        raise InvalidReply(f"{what}: {len(record)} arrays where one is expected")
    return _checked(next(iter(record.values())), what, shape)


def _number(metrics: MetricRecord, key: str) -> float:
    value = metrics[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidReply(f"metric {key!r} is {type(value).__name__}, not a number")
    if not np.isfinite(value):
        raise InvalidReply(f"metric {key!r} is {value}")
    return float(value)


def _exact_keys(metrics: MetricRecord, what: str, expected: set[str]) -> None:
    keys = set(metrics)
    if keys != expected:
        missing, extra = sorted(expected - keys), sorted(keys - expected)
        raise InvalidReply(f"{what}: " + "; ".join(part for part in (f"missing {missing}" if missing else "",
                                                                      f"unexpected {extra}" if extra else "") if part))


@dataclass(frozen=True)
class TrainExpectation:
    """What the server knows a training reply of one client must hold."""

    client_id: int
    dim: int
    num_examples: int  # the client's training rows (the server builds the same federation from the run config)
    feedback_shape: tuple[int, ...] | None  # pFedGAT's feedback array, None when the method asks for none
    upload_shapes: dict[str, tuple[int, ...]]  # the client rule's extra arrays


def check_train_reply(content: RecordDict, expect: TrainExpectation) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(delta [dim], metrics)`` of a training reply, every field checked: the records present are exactly those
    asked for; arrays float32, of the expected shape, finite; ``client-id`` the one asked; ``num-examples`` the
    client's row count; losses finite and non-negative. Anything else raises :class:`InvalidReply`."""
    expected = {"delta", "metrics"} | ({"feedback"} if expect.feedback_shape else set()) | (
        {"uploads"} if expect.upload_shapes else set())
    if set(content.keys()) != expected:
        raise InvalidReply(f"records {sorted(content.keys())} where {sorted(expected)} were expected")
    delta = checked_array(_record(content, "delta", ArrayRecord), "update", (expect.dim,))
    metrics = _record(content, "metrics", MetricRecord)
    _exact_keys(metrics, "metrics", {"client-id", "num-examples", "loss-first", "loss-last"})
    if metrics["client-id"] != expect.client_id or isinstance(metrics["client-id"], bool):
        raise InvalidReply(f"reply speaks for client {metrics['client-id']!r}, not {expect.client_id}")
    examples = metrics["num-examples"]
    if not isinstance(examples, int) or isinstance(examples, bool) or examples != expect.num_examples:
        raise InvalidReply(f"claims num-examples {examples!r}; the client holds {expect.num_examples} training rows")
    values = {"num_examples": torch.tensor([float(examples)])}
    for key in ("loss-first", "loss-last"):
        loss = _number(metrics, key)
        if loss < 0:
            raise InvalidReply(f"metric {key!r} is negative ({loss})")
        values[key.replace("-", "_")] = torch.tensor([loss])
    if expect.feedback_shape:
        values["feedback"] = checked_array(_record(content, "feedback", ArrayRecord), "feedback",
                                           expect.feedback_shape).unsqueeze(0)
    if expect.upload_shapes:
        values.update(record_named_arrays(_record(content, "uploads", ArrayRecord), expect.upload_shapes))
    return delta, values


def train_content(weights: torch.Tensor, client_id: int, round_index: int, purpose: str, seed: int,
                  steps: int | None = None, run_token: str = "", resumes: tuple[int, ...] = ()) -> RecordDict:
    """What a node receives: its weights and the round's facts. How it trains (batch, lr, feedback) it knows from the
    run config; ``steps`` only when the server asks for other than the run's local steps (novel-client
    adaptation); ``run_token`` names the run's client state on the node (kept across restarts); ``resumes``: the
    round index each resume of the run started again at (state written at or after one by an earlier attempt is
    stale)."""
    values: dict[str, int | str] = {"client-id": client_id, "round": round_index, "purpose": purpose, "seed": seed,
                                    RUN_TOKEN_KEY: run_token, RESUMES_KEY: ",".join(map(str, resumes))}
    if steps is not None:
        values["steps"] = steps
    return RecordDict({"arrays": weights_record(weights), "config": ConfigRecord(values)})


def run_token_of(config_text: str) -> str:
    """A run token named by the run's config (the SecAgg+ path, whose legacy messages carry no token of ours)."""
    return hashlib.sha256(config_text.encode()).hexdigest()[:32]


def resume_points(config: ConfigRecord) -> tuple[int, ...]:
    """The round indices a message's run was resumed at (checked: it comes from the network)."""
    text = str(config.get(RESUMES_KEY, ""))
    if not re.fullmatch(r"(\d{1,9}(,\d{1,9})*)?", text):
        raise UntrustedInputError(f"resume points {text[:40]!r} are not comma-separated round numbers")
    return tuple(int(part) for part in text.split(",")) if text else ()


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
    return ArrayRecord(torch_state_dict={name: value.detach().to(device="cpu", dtype=torch.float32).contiguous()
                                         for name, value in arrays.items()})


def record_named_arrays(record: ArrayRecord, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The arrays of ``record``, exactly the names and shapes expected (``[1, *shape]`` each), float32, finite."""
    if set(record.keys()) != set(shapes):
        raise InvalidReply(f"arrays {sorted(record.keys())} where {sorted(shapes)} were expected")
    return {name: _checked(array, f"array {name!r}", shapes[name]).unsqueeze(0) for name, array in record.items()}


def feedback_seed(seed: int, round_index: int, client_id: int) -> dict[str, torch.Tensor]:
    """The seed of a client's feedback direction: the server derives it as the client did."""
    from graphfed.core import rng

    return {"feedback_seed": torch.tensor([rng.stream_seed(seed, round_index, "feedback", client_id)],
                                          dtype=torch.int64)}


def check_identity(content: RecordDict, num_clients: int) -> int:
    """The partition id a node's query reply claims: an integer in ``0..num_clients - 1``."""
    identity = _record(content, "identity", ConfigRecord)
    claimed = identity.get(PARTITION_KEY) if hasattr(identity, "get") else None
    if isinstance(claimed, bool) or not isinstance(claimed, int):
        raise InvalidReply(f"partition id {claimed!r} is not an integer")
    if not 0 <= claimed < num_clients:
        raise InvalidReply(f"partition id {claimed} is outside 0..{num_clients - 1}")
    return claimed


def scores_record(scores: dict[str, ClientScores]) -> MetricRecord:
    return MetricRecord({f"{split}-{name}": float(getattr(score, name)[0])
                         for split, score in scores.items() for name in SCORE_FIELDS})


@dataclass(frozen=True)
class ScoreExpectation:
    """What the server knows about one client's evaluation split: its rows, values per row, the task."""

    counts: int
    elements_per_row: int  # 1 for classification; target values per row for regression
    task: str


def check_scores(metrics: MetricRecord, split: str, expect: ScoreExpectation) -> ClientScores:
    """One split's scores from an evaluation reply, checked: counts and elements the server knows, sums within
    their range (an accuracy counts at most every row), the metric equal to its own numerator over denominator,
    losses non-negative. A forged score that passes these is indistinguishable from a true one."""
    values = {name: _number(metrics, f"{split}-{name}") for name in SCORE_FIELDS}
    if values["counts"] != expect.counts:
        raise InvalidReply(f"{split}: {values['counts']:g} rows claimed; the client holds {expect.counts}")
    elements = expect.counts * expect.elements_per_row
    if values["metric_elements"] != elements:
        raise InvalidReply(f"{split}: {values['metric_elements']:g} scored values claimed, {elements} expected")
    total = values["metric_sum"]
    if total < 0 or (expect.task == "classification" and total > elements):
        upper = elements if expect.task == "classification" else "inf"
        raise InvalidReply(f"{split}: metric numerator {total:g} outside 0..{upper}")
    metric = total / elements if elements else 0.0
    if abs(values["metric"] - metric) > 1e-5 * max(1.0, abs(metric)):
        raise InvalidReply(f"{split}: metric {values['metric']:g} is not its numerator over its rows ({metric:g})")
    if values["loss"] < 0 or values["abs_error_sum"] < 0 or (expect.task == "classification"
                                                              and values["abs_error_sum"] != 0):
        raise InvalidReply(f"{split}: loss {values['loss']:g} or absolute error {values['abs_error_sum']:g} "
                           f"out of range")
    scores = {name: torch.tensor([value]) for name, value in values.items()}
    scores["counts"] = scores["counts"].long()
    return ClientScores(**scores)


def check_evaluation_reply(content: RecordDict, expect: dict[str, ScoreExpectation]) -> dict[str, ClientScores]:
    """Every split's scores of an evaluation reply (see :func:`check_scores`); exactly the fields asked for."""
    if set(content.keys()) != {"metrics"}:
        raise InvalidReply(f"records {sorted(content.keys())} where ['metrics'] was expected")
    metrics = _record(content, "metrics", MetricRecord)
    _exact_keys(metrics, "scores", {f"{split}-{name}" for split in expect for name in SCORE_FIELDS})
    return {split: check_scores(metrics, split, expectation) for split, expectation in expect.items()}


def missing_scores() -> ClientScores:
    """Placeholder for a client whose evaluation reply never came: NaN metric, no pooled weight."""
    nan, zero = torch.tensor([float("nan")]), torch.zeros(1)
    return ClientScores(nan, nan, torch.zeros(1, dtype=torch.long), zero, zero, zero)


def state_record(state: dict[str, Any]) -> ArrayRecord:
    """A :class:`~graphfed.client.executor.ClientStateStore` state as one ArrayRecord (``trained`` + tensors)."""
    arrays = {"trained": state["trained"].to(torch.int8)}
    arrays.update({f"state.{name}": value.cpu() for name, value in state["tensors"].items()})
    return ArrayRecord(torch_state_dict=arrays)


def record_state(record: ArrayRecord) -> dict[str, Any]:
    arrays = record.to_torch_state_dict()
    return {"trained": arrays.pop("trained").to(torch.bool),
            "tensors": {name.removeprefix("state."): value for name, value in arrays.items()}}
