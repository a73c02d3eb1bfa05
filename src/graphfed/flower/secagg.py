"""Secure aggregation on Flower (SecAgg+) for methods whose server needs only the weighted mean of the updates.

graphfed's own Flower loop (:mod:`graphfed.flower.server`) sends each client its own message and reads each reply;
SecAgg+ cannot sit inside it, because the point of SecAgg+ is that no single reply is ever read. Flower 1.41 runs
SecAgg+ only through its legacy workflow (``DefaultWorkflow`` with a ``SecAggPlusWorkflow`` fit stage and a
``Strategy``), so methods that qualify run through that workflow instead, with this module's strategy driving the
graphfed method (its server step, evaluation and run directory) and this module's client training with graphfed's
``ClientRuntime``:

    [tool.flwr.app.components]
    serverapp = "graphfed.flower.secagg:server_app"
    clientapp = "graphfed.flower.secagg:client_app"

(``graphfed flower-app CONFIG`` writes these when ``flower.secure_aggregation: true``).

What SecAgg+ does to the numbers: each client clips every value of its update to ``[-clipping_range,
clipping_range]`` and quantises it to ``quantization_range`` levels before masking, so the server's mean differs
from the exact one by at most ``2 * clipping_range / quantization_range`` per value (plus any clipping: an update
value beyond the range is cut; graphfed's updates are weight differences of one round, far inside the default
range of 8). Weights are the clients' row counts (at most ``max_weight`` = 1000 before Flower warns of overflow),
which the server sees, as FedAvg's weighting needs. What the server never sees is any single client's update: it
cannot be validated either (only the mean: its shape and finiteness).

Qualifying: a method whose server step is FedAvg's mean (``central_privacy_refusal is None``), FedAvg's
aggregation (median, trimmed mean and Krum need the individual updates), clients that upload nothing besides their
update, one architecture, every training client in every round (the legacy workflow cannot tell which node is
which client when it samples) and no novel or late clients.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Context
from flwr.client import ClientApp, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from graphfed import runs
from graphfed.config import ConfigError, RunConfig, dump_config, read_yaml, validate_config
from graphfed.flower import protocol
from graphfed.flower.client import client_runtime, keep_state, node_client
from graphfed.provenance import code_provenance
from graphfed.runs import RunResult
from graphfed.setup import Setup, build_setup

log = logging.getLogger("graphfed.flower")
#: SecAgg+'s share settings: every client holds a share of every other's secret; two thirds reconstruct a dropout
NUM_SHARES = 1.0
RECONSTRUCTION_THRESHOLD = 0.67


def secure_aggregation_refusal(config: RunConfig, setup: Setup) -> str | None:
    """Why ``flower.secure_aggregation`` cannot run this config (one line), or None."""
    method = type(setup.method)
    prefix = f"flower.secure_aggregation: {method.name}"
    if protocol.deployment_refusal(config):
        return protocol.deployment_refusal(config)
    if method.private_server_gradient:
        return f"{prefix}: its server learns from each client's own update (a hypernetwork), not from their mean"
    if method.central_privacy_refusal is not None:
        return f"{prefix}: {method.central_privacy_refusal.split(';')[0]}; SecAgg+ reveals only the mean"
    aggregation = getattr(setup.method.options, "aggregation", "fedavg")
    if aggregation != "fedavg":
        return f"{prefix}: aggregation {aggregation} needs the individual updates; SecAgg+ reveals only their mean"
    if setup.family is not None:
        return f"{prefix}: clients of different architectures upload different parameters; one architecture only"
    if setup.client_rule.upload_shapes() or setup.training.feedback != "none":
        return f"{prefix}: its clients upload more than their update"
    fed = setup.federation
    if len(fed.novel_client_ids) or config.train.late_clients:
        return f"{prefix}: needs every client training from round 1 (dataset.novel_fraction=0, no late clients)"
    if config.train.clients_per_round < fed.num_clients:
        return (f"{prefix}: needs every client in every round (train.clients_per_round >= {fed.num_clients}): the "
                f"legacy workflow cannot tell which node is which client when it samples")
    if config.privacy.mechanism == "central":
        return f"{prefix}: central DP clips individual updates on the server, which SecAgg+ hides; use local"
    if config.train.server_mode != "sync":
        return (f"{prefix}: SecAgg+ masks one cohort's updates together in each round; train.server_mode="
                f"{config.train.server_mode} steps on updates as they arrive: use train.server_mode=sync")
    return None


class SecureMean(Strategy):
    """The graphfed method's server side behind SecAgg+: sends the global weights, receives only their mean
    update, evaluates on the clients, keeps the best-validation round, writes the usual run directory."""

    def __init__(self, config: RunConfig, setup: Setup, out_dir: Path | None) -> None:
        self.config, self.setup, self.out_dir = config, setup, out_dir
        fed = setup.federation
        self.all_ids = torch.arange(fed.num_clients)
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {}
        self.started = time.perf_counter()
        self.rounds_log = runs.RoundLog(out_dir) if out_dir else None
        if self.rounds_log:
            out_dir.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
            self.rounds_log.reset()
        self.status = "completed"
        self.higher_is_better = fed.metric == "accuracy"
        self.bytes_up = self.bytes_down = 0

    def _global(self) -> np.ndarray:
        weights = self.setup.method.personalize(self.all_ids[:1]).detach()[0]
        return weights.to("cpu", torch.float32).numpy()

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        count = self.setup.federation.num_clients
        client_manager.wait_for(count, timeout=int(self.config.flower.node_wait_timeout))
        clients = client_manager.sample(num_clients=count, min_num_clients=count)
        content = FitIns(ndarrays_to_parameters([self._global()]),
                         {"round": server_round - 1, "seed": self.config.seed})
        self.bytes_down += len(clients) * self.setup.spec.dim * 4
        return [(client, content) for client in clients]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results:
            log.warning("round %d: no update arrived; the server model is unchanged", server_round)
            return None, {}
        arrays = parameters_to_ndarrays(results[0][1].parameters)  # SecAgg+ gave every result the same mean
        mean = torch.from_numpy(np.array(arrays[0], dtype=np.float32)) if len(arrays) == 1 else None
        if mean is None or mean.shape != (self.setup.spec.dim,) or not torch.isfinite(mean).all():
            raise ValueError(f"round {server_round}: the securely aggregated update is not {self.setup.spec.dim} "
                             f"finite values")
        rows = len(results)
        sent = torch.from_numpy(self._global()).unsqueeze(0).expand(rows, -1)
        delta = mean.unsqueeze(0).expand(rows, -1)
        metrics = {"num_examples": torch.ones(rows), "loss_first": torch.zeros(rows), "loss_last": torch.zeros(rows)}
        self.setup.method.update(self.all_ids[:rows], sent, delta, metrics)  # the method's own server step
        self.bytes_up += rows * self.setup.spec.dim * 4
        return ndarrays_to_parameters([self._global()]), {}

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        rounds = self.config.train.rounds
        if server_round % self.config.train.eval_every and server_round != rounds:
            return []
        count = self.setup.federation.num_clients
        clients = client_manager.sample(num_clients=count, min_num_clients=count)
        content = EvaluateIns(ndarrays_to_parameters([self._global()]),
                              {"round": server_round - 1, "seed": self.config.seed})
        return [(client, content) for client in clients]

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        scores: dict[int, tuple[float, float]] = {}
        top = 1.0 if self.higher_is_better else math.inf  # accuracy lies in [0, 1], an MSE in [0, inf)
        for _, reply in results:  # a node's reply is input: one client id in range, scores in range, once each
            client, val, test = (reply.metrics.get(key) for key in ("client", "val", "test"))
            if (isinstance(client, int) and 0 <= client < self.setup.federation.num_clients and client not in scores
                    and all(isinstance(v, float) and math.isfinite(v) and 0 <= v <= top for v in (val, test))):
                scores[client] = (float(val), float(test))  # type: ignore[arg-type]
            else:
                log.warning("round %d: an evaluation reply was rejected (%s)", server_round, dict(reply.metrics))
        if not scores:
            return None, {}
        val = torch.tensor([v for v, _ in scores.values()])
        test = torch.tensor([t for _, t in scores.values()])
        record = {"round": server_round, "val_mean": float(val.mean()), "val_std": float(val.std(unbiased=False)),
                  "test_mean": float(test.mean()), "test_std": float(test.std(unbiased=False)),
                  "scored_clients": len(scores), "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                  "wall_seconds": time.perf_counter() - self.started}
        better = (record["val_mean"] > self.best.get("val_mean", -math.inf) if self.higher_is_better
                  else record["val_mean"] < self.best.get("val_mean", math.inf))
        if better:
            self.best = record
        self.history.append(record)
        if self.rounds_log:
            self.rounds_log.append(record)
        return None, {"val_mean": record["val_mean"], "test_mean": record["test_mean"]}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None

    def result(self) -> RunResult:
        fed, best = self.setup.federation, self.best
        return RunResult(
            status=self.status, method=self.config.method.name, dataset=fed.name, metric=fed.metric,
            seed=self.config.seed, test_mean=best.get("test_mean"), test_std=best.get("test_std"),
            val_mean=best.get("val_mean"), best_round=best.get("round"),
            final_test_mean=self.history[-1]["test_mean"] if self.history else None,
            rounds=self.config.train.rounds, num_clients=fed.num_clients, clients_per_round=fed.num_clients,
            num_params=self.setup.spec.dim, scored_clients=best.get("scored_clients"),
            training_clients=len(fed.train_client_ids), bytes_up=self.bytes_up, bytes_down=self.bytes_down,
            wall_seconds=round(time.perf_counter() - self.started, 3), code=code_provenance(),
            secure_aggregation={"protocol": "SecAgg+ (Flower's SecAggPlusWorkflow, legacy workflow)",
                                "clipping_range": self.config.flower.secagg_clipping_range,
                                "quantization_range": self.config.flower.secagg_quantization_range,
                                "max_error_per_value": 2 * self.config.flower.secagg_clipping_range
                                / self.config.flower.secagg_quantization_range,
                                "num_shares": NUM_SHARES, "reconstruction_threshold": RECONSTRUCTION_THRESHOLD})


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    config = validate_config(read_yaml(str(context.run_config[protocol.RUN_CONFIG_KEY])))
    out = str(context.run_config.get(protocol.OUT_DIR_KEY, "")) or None
    setup = build_setup(config)
    refusal = secure_aggregation_refusal(config, setup)
    if refusal:
        raise ConfigError(refusal)
    strategy = SecureMean(config, setup, Path(out) if out else None)
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=config.train.rounds), strategy=strategy)
    flower = config.flower
    workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(
        num_shares=NUM_SHARES, reconstruction_threshold=RECONSTRUCTION_THRESHOLD,
        clipping_range=flower.secagg_clipping_range, quantization_range=flower.secagg_quantization_range,
        timeout=flower.round_timeout))
    workflow(grid, legacy)
    result = strategy.result()
    if out:
        runs.atomic_write_text(Path(out) / runs.CONFIG, dump_config(config))
        runs.write_result(Path(out), result)
    log.info("graphfed run %s (SecAgg+): test %s %.4g (best round %s)", result.status, result.metric,
             result.test_mean or float("nan"), result.best_round)


class SecureClient(NumPyClient):
    """One graphfed client behind ``secaggplus_mod``: trains with the method's client rule and returns its update
    (masked by the mod before it leaves), evaluates the weights it receives on its own rows."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self.client_id, self.side = node_client(context)

    def _runtime(self, config: dict[str, Scalar], before: int) -> Any:
        return client_runtime(self.side, self.context, self._state_config(config), self.client_id, before)

    def _state_config(self, config: dict[str, Scalar]) -> dict[str, Any]:
        # the client's state folder is named by the run: one SecAgg+ run per app folder, so its config names it
        token = protocol.run_token_of(str(self.context.run_config[protocol.RUN_CONFIG_KEY]))
        return {**config, protocol.RUN_TOKEN_KEY: token, protocol.RESUMES_KEY: ""}

    def fit(self, parameters: list[np.ndarray], config: dict[str, Scalar]) -> tuple[list[np.ndarray], int,
                                                                                      dict[str, Scalar]]:
        weights = self._weights(parameters)
        round_index = int(config["round"])
        runtime = self._runtime(config, round_index)
        ids = torch.tensor([self.client_id])
        result = runtime.train(ids, weights.unsqueeze(0), round_index, "local_training")
        keep_state(runtime, self.client_id, self.context, self._state_config(config), self.side)  # type: ignore[arg-type]
        rows = int(self.side.federation.train.counts[self.client_id])
        return [result.delta[0].to("cpu", torch.float32).numpy()], rows, {}

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Scalar]) -> tuple[float, int,
                                                                                           dict[str, Scalar]]:
        weights = self._weights(parameters)
        round_index = int(config["round"])
        runtime = self._runtime(config, round_index + 1)
        scores = runtime.evaluate(torch.tensor([self.client_id]), weights.unsqueeze(0), round_index)
        val, test = float(scores["val"].metric[0]), float(scores["test"].metric[0])
        rows = int(self.side.federation.test.counts[self.client_id])
        return 0.0, rows, {"client": self.client_id, "val": val, "test": test}

    def _weights(self, parameters: list[np.ndarray]) -> torch.Tensor:
        if len(parameters) != 1 or parameters[0].shape != (self.side.spec.dim,):
            raise ValueError(f"expected one array of {self.side.spec.dim} weights")
        return torch.from_numpy(np.array(parameters[0], dtype=np.float32)).to(self.side.device)


def _client(context: Context) -> Any:
    return SecureClient(context).to_client()


client_app = ClientApp(client_fn=_client, mods=[secaggplus_mod])
