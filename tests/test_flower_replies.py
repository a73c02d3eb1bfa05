"""A node cannot lie its way in: every field of a Flower reply is validated like a config.

Each case tampers with one node's replies in the in-process grid; the run must complete, that node dropped for the
round (counted in summary.json), and nothing it sent may reach the method or model selection. Attacks run on Flower
nodes exactly as in the simulator (a node's behaviour comes from the run config and its partition id).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from conftest import without_wall_time
from graphfed.flower.app import run_on_grid
from graphfed.flower.server import FLOWER_FIELDS
from graphfed.runs import RunResult
from graphfed.setup import build_setup
from graphfed.sim.engine import run_config
from test_flower import NUM_CLIENTS, flower_config, grid_for

LIAR = 2  # the partition id of the node that lies


def tampered_run(config_overrides: list[str], tamper: Callable[[RecordDict, Message], RecordDict],
                 method: str = "fedavg") -> dict[str, Any]:
    config = flower_config(method, "dataset.novel_fraction=0", f"train.clients_per_round={NUM_CLIENTS}",
                           *config_overrides)
    grid = grid_for(config)
    grid.tamper[grid.node_of_partition(LIAR)] = tamper
    summary = run_on_grid(grid, config, None)
    assert summary.status == "completed"
    return summary


def with_metric(content: RecordDict, key: str, value: Any) -> RecordDict:
    metrics = MetricRecord({**dict(content["metrics"]), key: value})
    return RecordDict({**{k: v for k, v in content.items() if k != "metrics"}, "metrics": metrics})


def with_delta(content: RecordDict, rewrite: Callable[[np.ndarray], np.ndarray]) -> RecordDict:
    delta = content["delta"].to_numpy_ndarrays()[0]
    return RecordDict({**content, "delta": ArrayRecord([rewrite(delta)])})


def on(kind: str, rewrite: Callable[[RecordDict], RecordDict]) -> Callable[[RecordDict, Message], RecordDict]:
    """Rewrite only replies to ``kind`` messages ("train" or "evaluate")."""
    return lambda content, message: rewrite(content) if message.metadata.message_type == kind else content


def drops_of(summary: RunResult, client: int = LIAR) -> list[str]:
    return [d["reason"] for d in summary.dropped_clients if d["client"] == client]


@pytest.mark.parametrize(("name", "forge", "message"), [
    ("huge num-examples", lambda c: with_metric(c, "num-examples", 10**9), "claims num-examples 1000000000"),
    ("float num-examples", lambda c: with_metric(c, "num-examples", 13.0), "claims num-examples 13.0"),
    ("NaN loss", lambda c: with_metric(c, "loss-last", float("nan")), "'loss-last' is nan"),
    ("negative loss", lambda c: with_metric(c, "loss-first", -1.0), "'loss-first' is negative"),
    ("another client's id", lambda c: with_metric(c, "client-id", 0), "speaks for client 0"),
    ("extra metric", lambda c: with_metric(c, "accuracy", 1.0), "unexpected ['accuracy']"),
    ("float64 update", lambda c: with_delta(c, lambda d: d.astype(np.float64)), "dtype float64"),
    ("Inf update", lambda c: with_delta(c, lambda d: np.full_like(d, np.inf)), "non-finite"),
    ("short update", lambda c: with_delta(c, lambda d: d[:-1].copy()), "update of shape"),
    ("extra record", lambda c: RecordDict({**c, "config": ConfigRecord({"x": 1})}), "records ['config'"),
    ("missing metrics", lambda c: RecordDict({"delta": c["delta"]}), "records ['delta']"),
])
def test_a_forged_training_reply_is_dropped_and_never_aggregated(name: str, forge: Callable[[RecordDict], RecordDict],
                                                                 message: str) -> None:
    summary = tampered_run(["train.rounds=2"], on("train", forge))
    reasons = drops_of(summary)
    assert len(reasons) == 2 and all(message in reason for reason in reasons), (name, reasons)
    assert summary.drop_counts["invalid_reply"] == 2
    # every other client's update arrived: bytes up count the 5 honest clients of each round only
    dim = build_setup(flower_config("fedavg")).spec.dim
    assert summary.bytes_up == 2 * (NUM_CLIENTS - 1) * dim * 4


def test_a_forged_evaluation_metric_is_dropped_and_never_enters_model_selection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node claiming an accuracy its own numerator contradicts is scored as missing (NaN, left out of every mean,
    so out of model selection) in each evaluation."""

    def forge(content: RecordDict) -> RecordDict:
        metrics = dict(content["metrics"])
        metrics.update({"val-metric": 0.999, "test-metric": 0.999})
        return RecordDict({"metrics": MetricRecord(metrics)})

    from graphfed.flower import server

    scored: list[Any] = []
    original = server.FlowerExecutor.evaluate

    def spy(self: server.FlowerExecutor, *args: Any, **kwargs: Any) -> Any:
        scored.append(original(self, *args, **kwargs))
        return scored[-1]

    monkeypatch.setattr(server.FlowerExecutor, "evaluate", spy)
    summary = tampered_run(["train.rounds=2", "train.eval_every=1"], on("evaluate", forge))
    reasons = drops_of(summary)
    assert len(reasons) == 2 and all("is not its numerator over its rows" in reason for reason in reasons)
    assert summary.drop_counts["invalid_reply"] == 2  # one evaluation per round
    assert len(scored) == 2
    for scores in scored:
        for split in ("val", "test"):
            metric = scores[split].metric
            assert metric[LIAR].isnan() and not metric[torch.arange(NUM_CLIENTS) != LIAR].isnan().any()
    assert summary.val_mean is not None


@pytest.mark.parametrize(("name", "forge", "message"), [
    ("more rows than it holds", lambda m: {**m, "test-counts": m["test-counts"] + 100}, "rows claimed"),
    ("accuracy above every row", lambda m: {**m, "test-metric_sum": m["test-metric_elements"] + 1,
                                            "test-metric": (m["test-metric_elements"] + 1) / m["test-metric_elements"]},
     "metric numerator"),
    ("NaN loss", lambda m: {**m, "val-loss": float("nan")}, "'val-loss' is nan"),
    ("missing split", lambda m: {k: v for k, v in m.items() if not k.startswith("val-")}, "missing"),
])
def test_forged_evaluation_fields_are_dropped(name: str, forge: Callable[[dict[str, Any]], dict[str, Any]],
                                              message: str) -> None:
    summary = tampered_run(["train.rounds=1"], on("evaluate", lambda c: RecordDict(
        {"metrics": MetricRecord(forge(dict(c["metrics"])))})))
    reasons = drops_of(summary)
    assert len(reasons) == 1 and message in reasons[0], (name, reasons)


def test_wrong_shape_pfedgat_feedback_is_dropped() -> None:
    def forge(content: RecordDict) -> RecordDict:
        feedback = content["feedback"].to_numpy_ndarrays()[0]
        return RecordDict({**content, "feedback": ArrayRecord([feedback[:-1].copy()])})

    summary = tampered_run(["train.rounds=1"], on("train", forge), method="pfedgat")
    reasons = drops_of(summary)
    dim = build_setup(flower_config("pfedgat")).spec.dim
    assert len(reasons) == 1 and f"feedback of shape ({dim - 1},), expected ({dim},)" in reasons[0]


def test_a_node_claiming_a_partition_id_already_served_is_refused() -> None:
    """A second node claiming client 1's partition id is refused while client 1's own node serves it (the whole
    run here), and the federation's numbers are those of an honest run."""
    config = flower_config("fedavg", "dataset.novel_fraction=0", f"train.clients_per_round={NUM_CLIENTS}",
                           "train.rounds=2")
    grid = grid_for(config)
    impostor = grid.node_of_partition(4)
    grid.contexts[impostor].node_config["partition-id"] = 1
    summary = run_on_grid(grid, config, None)
    assert summary.status == "completed"
    refused = summary.refused_nodes
    first_claim = min(grid.node_of_partition(1), impostor)  # nodes are asked in id order; the first claim holds
    second_claim = max(grid.node_of_partition(1), impostor)
    assert refused == [{"node": second_claim, "claimed": 1,
                        "reason": f"partition id 1 is already served by node {first_claim} in this run (it takes "
                                  f"the client over if that node leaves)"}]
    # the impostor's own partition (4) has no node: dropped every round, counted once per round although it misses
    # both the round's training and its evaluation
    assert summary.drop_counts["no_node"] == 2 == sum(summary.drop_counts.values())
    assert [(drop["round"], drop["client"]) for drop in summary.dropped_clients or []] == [(1, 4), (2, 4)]
    assert summary.missed_rounds == {"4": [1, 2]}


def test_an_identity_reply_that_is_not_an_integer_is_refused() -> None:
    summary = tampered_run(["train.rounds=1"], lambda content, message: RecordDict(
        {"identity": ConfigRecord({"partition-id": "2"})}) if message.metadata.message_type == "query" else content)
    assert summary.refused_nodes[0]["reason"] == "invalid identity reply (partition id '2' is not an integer)"
    assert summary.drop_counts["no_node"] >= 1


def _numbers(result: RunResult) -> dict[str, Any]:
    """A result minus what only its engine knows: Flower's drop counts, and the models (they stay on the nodes)."""
    return {k: v for k, v in without_wall_time(result).items() if k not in (*FLOWER_FIELDS, "models_note")}


@pytest.mark.parametrize("attack", [["attack.kind=model_poisoning", "attack.count=2"],
                                    ["attack.kind=gaussian_noise", "attack.count=1"],
                                    ["attack.kind=label_flip", "attack.count=2"]])
def test_attacks_on_flower_nodes_give_the_simulators_numbers(attack: list[str]) -> None:
    config = flower_config("fedavg", "dataset.novel_fraction=0", *attack)
    simulated = run_config(config, progress=False)
    on_flower = run_on_grid(grid_for(config), config, None)
    assert on_flower.dropped_clients == []
    assert _numbers(on_flower) == _numbers(simulated)
    assert simulated.attack["malicious_clients"] and simulated.honest_test_mean is not None


def test_a_backdoor_and_simple_tuning_on_flower_give_the_simulators_numbers() -> None:
    overrides = ["dataset.name=digits", "dataset.num_clients=6", "model.options={hidden: 16}",
                 "attack.kind=backdoor", "attack.count=1", "defense.simple_tuning=true", "defense.tuning_steps=3"]
    config = flower_config("ditto", "dataset.novel_fraction=0", *overrides)
    simulated = run_config(config, progress=False)
    on_flower = run_on_grid(grid_for(config), config, None)
    assert _numbers(on_flower) == _numbers(simulated)
    assert simulated.asr_mean is not None and simulated.asr_malicious is not None
