"""The simulator: the one round loop of graphfed.

Per round: sample clients from a seeded stream, ask the method for their personalised weights, train
all sampled clients at once (vectorised), check the updates, hand ``delta = sent - trained`` back to the
method, and every ``eval_every`` rounds evaluate every client's personalised model. Checkpoints are
written atomically at round boundaries; ``resume=True`` continues bit-identically because every random
draw comes from a (seed, round, purpose) stream and the method's state is saved whole.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm.auto import tqdm

from graphfed import runs
from graphfed.client.evaluation import ClientScores, trivial_scores
from graphfed.client.executor import ArchitectureRuntime, ClientExecutor, ClientRuntime, TrainResult, check_update
from graphfed.client.metrics import (
    BINARY_ONLY,
    CLASSIFICATION_METRICS,
    HIGHER_IS_BETTER,
    REGRESSION_METRICS,
    client_metrics,
)
from graphfed.client.placement import deterministic_algorithms
from graphfed.client.privacy import (
    REPRODUCIBLE_WARNING,
    PrivacyLedger,
    ServerGradientPrivacy,
    next_clip,
    noised_mean,
    poisson_sample,
)
from graphfed.config import ConfigError, RunConfig, dump_config, read_yaml, same_run, validate_config
from graphfed.core import rng
from graphfed.data.federation import Federation
from graphfed.errors import CheckpointError, NonFiniteUpdateError, RunStoppedError
from graphfed.provenance import code_provenance
from graphfed.runs import RunResult
from graphfed.setup import Setup, build_setup
from graphfed.sim import checkpoint
from graphfed.sim.tracking import build_trackers

log = logging.getLogger("graphfed")

__all__ = ["Simulator", "run_config"]

BYTES_PER_VALUE = 4  # float32 on the wire
#: what an evaluation records under attack (when there are attackers / a backdoor), carried into summary.json
ROBUSTNESS_FIELDS = ("honest_test_mean", "honest_test_std", "malicious_test_mean", "asr_mean", "asr_honest",
                     "asr_malicious")
#: below this many clients, holding clients out by a fraction gets a warning
SMALL_FEDERATION = 10
#: the most memory the best models of a run may take (every client's weights, float32): above, none are saved
MODELS_BYTES = 1 << 30
#: collaboration-graph rows saved per evaluation; larger federations save a fixed sample of this many clients
GRAPH_ROWS = 512


@dataclass
class Tracker:
    """Best-validation model selection and byte accounting, saved in checkpoints."""

    higher_is_better: bool
    key: str = "val_mean"  #: the record's validation score that selects the round (``train.select_by``)
    best: dict[str, Any] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0
    elapsed: float = 0.0
    #: evaluations since the validation score last improved by more than ``min_delta`` (early stopping)
    since_improvement: int = 0
    lost_uploads: int = 0  #: client updates lost to ``train.dropout`` (and late ones a method cannot use)
    late_uploads: int = 0  #: straggler updates that reached the method rounds late (``train.stragglers``)
    clip_norm: float | None = None  #: adaptive clipping (central DP): the clip the next round uses
    #: a private run's ``privacy.model_selection: last``: the newest evaluation is the run's result, whatever the
    #: clients' validation scores say (choosing by them would read private data outside the mechanism)
    select_last: bool = False

    def offer(self, record: dict[str, Any], min_delta: float = 0.0) -> None:
        """Keep ``record`` if its validation score is the best so far (every record, with ``select_last``); count
        evaluations without an improvement beyond ``min_delta``."""
        value = record[self.key]
        if not self.best or self.select_last:
            self.best = record
            return
        gain = value - self.best[self.key] if self.higher_is_better else self.best[self.key] - value
        self.since_improvement = 0 if gain > min_delta else self.since_improvement + 1
        if gain > 0:
            self.best = record


def _subset(result: TrainResult, keep: torch.Tensor) -> TrainResult:
    """The uploads of ``result`` where the host mask ``keep`` is true."""
    return TrainResult(result.rows[keep], result.client_ids[keep], result.delta[keep.to(result.delta.device)],
                       {name: value[keep.to(value.device)] for name, value in result.metrics.items()})


def _row_standard_error(scores: ClientScores) -> float | None:
    """Standard error of the mean-over-clients accuracy from the sampling of test rows alone: each client's accuracy
    is a binomial proportion over its rows (variance p(1-p)/n), the mean over N clients has variance
    sum_i p_i(1-p_i)/n_i / N^2. The spread a resampling of test rows would show, when the seed does not change the
    split (a federation folder)."""
    scored = torch.isfinite(scores.metric) & (scores.counts > 0)
    if not bool(scored.any()):
        return None
    p, n = scores.metric[scored].double(), scores.counts[scored].double()
    return float((p * (1 - p) / n).sum().sqrt() / scored.sum())


def _finite(value: torch.Tensor) -> float | None:
    """A score for JSON: None where it is NaN/Inf (no rows, a reply that never came, a broken model)."""
    number = float(value)
    return number if math.isfinite(number) else None


def _mean_std(values: torch.Tensor) -> tuple[float | None, float | None]:
    """Mean and std over clients; clients without a score (NaN: their reply never came) are left out."""
    values = values[torch.isfinite(values)]
    if values.numel() == 0:
        return None, None
    return float(values.mean()), float(values.std(unbiased=False))


class Simulator:
    """Runs one config to completion, writing to ``out_dir`` (``None``: in memory only)."""

    def __init__(self, config: RunConfig, out_dir: str | Path | None = None,
                 federation: Federation | None = None, progress: bool = True,
                 executor: Callable[[Setup], ClientExecutor] | None = None,
                 checkpoint_every: int | None = None) -> None:
        if config.torch_threads is None:
            # Float sums depend on the intra-op thread count: record the count this machine uses, so the run's
            # own config.yaml reproduces its numbers bit for bit elsewhere.
            config = config.model_copy(update={"torch_threads": torch.get_num_threads()})
        self.config = config
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.progress = progress
        #: rounds between checkpoints (the Flower engine passes ``flower.checkpoint_every``)
        self.checkpoint_every = checkpoint_every or config.train.checkpoint_every
        self.setup = build_setup(config, federation)
        fed = self.setup.federation
        # `executor` builds where clients run (e.g. Flower nodes); default: in this process, vectorised.
        self.executor = executor(self.setup) if executor else self.setup.client_executor(config.seed)
        self.metrics = self._check_metrics()
        select_by = self.select_by = config.train.select_by or fed.default_select_by or fed.metric
        if select_by not in (fed.metric, *self.metrics):
            raise ConfigError(f"select_by: {select_by!r} (the folder's meta.yaml) is not scored; use {fed.metric} or "
                              f"one of its metrics: {', '.join(self.metrics) or 'none given'}")
        self.privacy = self.setup.clients.privacy
        self.tracker = Tracker(higher_is_better=HIGHER_IS_BETTER[select_by],
                               key="val_mean" if select_by == fed.metric else f"val_{select_by}_mean",
                               select_last=self.privacy.active and self.privacy.model_selection == "last")
        self.num_train_clients = len(fed.train_client_ids)
        if self.num_train_clients == 0:
            raise ConfigError("dataset.novel_fraction: every client is novel, none would train; lower it")
        self.clients_per_round = min(config.train.clients_per_round, self.num_train_clients)
        if self.clients_per_round < config.train.clients_per_round:
            log.warning("train.clients_per_round is %d but only %d clients train; each round samples all %d",
                        config.train.clients_per_round, self.num_train_clients, self.clients_per_round)
        self._check_privacy()
        #: the mechanisms' randomness: the secure generator, or the seed's streams under reproducible_noise
        self.noise = self.privacy.noise_source(config.seed)
        #: every release the run made (the epsilon it reports composes these)
        self.ledger = PrivacyLedger()
        if self.privacy.mechanism == "central" and type(self.setup.method).private_server_gradient:
            self.setup.method.server_privacy = ServerGradientPrivacy(
                self.privacy, self.clients_per_round, self.noise, self.setup.method.server_steps_per_round())
        self.late_ids = self._draw_late_clients()
        self.straggler_ids = self._draw_stragglers()
        #: straggler uploads on their way: (round index they arrive in, the weights the clients were sent, result)
        self.in_flight: list[tuple[int, torch.Tensor, TrainResult]] = []
        self.trackers = build_trackers(config, self.out_dir)  # a missing tracker package stops us here
        self.stopped_early: int | None = None  # the round an early stop ended the run at
        self.best_models: torch.Tensor | None = None  # every client's scored weights at a new best, until written
        self.models_note = self._models_note()
        # each client's trivial predictor (majority class / mean target of its training rows) on its test rows
        self.trivial = trivial_scores(fed.train, fed.test, fed.task, fed.output_dim)
        # how many clients train at once on this machine (measured once per shape, cached): before round 1
        self.execution = self.setup.clients.plan_execution(self.clients_per_round)

    def _draw_late_clients(self) -> torch.Tensor:
        """The training clients that join at ``train.join_round`` (pFedGAT's new-client study), drawn from the seed."""
        train_ids, count = self.setup.federation.train_client_ids, self.config.train.late_clients
        if count >= len(train_ids):
            raise ConfigError(f"train.late_clients: {count} of {len(train_ids)} training clients would join late; "
                              f"at least one must train from round 1")
        order = torch.randperm(len(train_ids), generator=rng.generator(self.config.seed, 0, "late_clients"),
                               device="cpu")
        return train_ids[order[:count]].sort().values

    def _check_privacy(self) -> None:
        """``privacy:``: every upload the method's server reads is privatised, or the run stops here (one line)."""
        mechanism, method = self.privacy.mechanism, type(self.setup.method)
        if mechanism == "none":
            return
        prefix = f"privacy.mechanism={mechanism}: {method.name}"
        if self.config.dataset.graph == "knn" and self.setup.method.reads_client_graph():
            raise ConfigError(f"{prefix} reads the client graph, and dataset.graph=knn builds it from each client's "
                              f"data (mean inputs, label shares) outside the mechanism; use the dataset's given "
                              f"graph or dataset.graph=none")
        if mechanism == "local":
            for rule in self.setup.clients.rules:
                uploads = [*rule.upload_shapes(), *(["feedback"] if rule.setting.training.feedback != "none" else [])]
                if uploads:
                    raise ConfigError(f"{prefix} uploads {', '.join(uploads)} beside its update; only the update is "
                                      f"clipped and noised, so these would leave the client unprotected")
            return
        problem = self.setup.method.central_privacy_problem()
        if problem is not None:
            raise ConfigError(f"{prefix}: {problem}")
        if method.private_server_gradient and self.privacy.adaptive_quantile is not None:
            raise ConfigError(f"{prefix}: adaptive clipping follows the norms of updates; this method's central DP "
                              f"clips each client's gradient on the server's parameters: set privacy.clip_norm and "
                              f"leave privacy.adaptive_quantile unset")
        aggregation = getattr(self.setup.method.options, "aggregation", "fedavg")
        if aggregation != "fedavg":
            raise ConfigError(f"{prefix}: aggregation {aggregation} needs the individual updates; central DP releases "
                              f"only their noised sum")
        if self.config.train.late_clients or self.config.train.stragglers or self.config.train.dropout:
            raise ConfigError(f"{prefix}: the accounting assumes Poisson sampling of every training client each "
                              f"round; train.late_clients, train.stragglers and train.dropout change who takes part "
                              f"(and their counts would reveal the private sample)")

    def _draw_stragglers(self) -> torch.Tensor:
        """``train.stragglers``: the training clients whose uploads arrive late, drawn once from the seed."""
        train_ids = self.setup.federation.train_client_ids
        count = round(self.config.train.stragglers * len(train_ids))
        order = torch.randperm(len(train_ids), generator=rng.generator(self.config.seed, 0, "stragglers"),
                               device="cpu")
        return train_ids[order[:count]].sort().values

    # ---- pieces of a round ----------------------------------------------------------------------------
    def sample_clients(self, round_index: int) -> torch.Tensor:
        train_ids = self.setup.federation.train_client_ids
        if self.privacy.sampling_rate is not None:
            # central DP: Poisson sampling, the coins as secret as the noise (the sampling the accounting covers)
            return poisson_sample(train_ids, self.privacy, self.noise, round_index)
        per_round = self.clients_per_round
        if round_index + 1 < self.config.train.join_round:  # late clients are not there yet
            train_ids = train_ids[~torch.isin(train_ids, self.late_ids)]
            per_round = min(per_round, len(train_ids))
        order = torch.randperm(len(train_ids), generator=rng.generator(self.config.seed, round_index, "sampling"),
                               device="cpu")
        return train_ids[order[:per_round]].sort().values

    def run_round(self, round_index: int) -> dict[str, float | None]:
        method, spec = self.setup.method, self.setup.spec
        central = self.privacy.mechanism == "central"
        client_ids = self.sample_clients(round_index)
        sent = method.personalize(client_ids).detach()
        broadcast = {name: value.detach() for name, value in method.broadcast(client_ids).items()}
        if not torch.isfinite(sent).all() or not all(torch.isfinite(v).all() for v in broadcast.values()):
            raise NonFiniteUpdateError(f"round {round_index + 1}: the server produced non-finite weights")
        extra_down = sum(value[:1].numel() for value in broadcast.values())
        communicates = type(method).communicates
        if communicates:
            self.tracker.bytes_down += (self._wire_values(client_ids) + self._cohort(client_ids) * extra_down
                                        ) * BYTES_PER_VALUE
        result = (self.executor.train(client_ids, sent, round_index, "local_training", broadcast=broadcast)
                  if len(client_ids) else TrainResult.nothing(spec.dim, sent.device))
        if self.privacy.mechanism == "local":
            self.ledger.count_uploads(result.client_ids)
        if self.config.train.dropout > 0:
            result = self._lose_uploads(result, round_index)
        check_update(result.delta, result.client_ids, spec.dim, round_index, self.setup.federation.client_names)
        started = sent[result.rows]
        if len(self.straggler_ids):
            started, result = self._stragglers_arrive(started, result, round_index)
        if len(result.client_ids) == 0 and not central:
            log.warning("round %d: no client update arrived; the server model is unchanged", round_index + 1)
            return {"train_loss": float("nan"), "clients": 0}
        if method.server_privacy is not None:  # central DP inside the method's server step (DP-SGD)
            method.server_privacy.begin_round(round_index)
            method.update(result.client_ids, started, result.delta, result.metrics)
        elif central:  # the method learns from the one release; an empty cohort releases the noise alone
            method.central_update(self._central_release(result, round_index), self.clients_per_round)
        else:
            method.update(result.client_ids, started, result.delta, result.metrics)
        if central:
            self.ledger.central_releases += 1
        self._record_ledger()
        rule = self.setup.client_rule
        extras = [*rule.upload_shapes(), *(["feedback"] if "feedback" in result.metrics else [])]
        extra_up = sum(result.metrics[name][0].numel() for name in extras)
        if self.setup.family is None:  # a rule may upload less than the model (FedRep: its body)
            extra_up += rule.upload_dim - spec.dim
        if communicates:
            self.tracker.bytes_up += (self._wire_values(result.client_ids)
                                      + self._cohort(result.client_ids) * extra_up) * BYTES_PER_VALUE
        if central:  # the cohort and its losses are private: neither is released
            return {"train_loss": None, "clients": None}
        if self.privacy.mechanism == "local":  # clients do not send their losses under local DP
            return {"train_loss": None, "clients": len(result.client_ids)}
        loss = float(result.metrics["loss_last"].mean())
        if not math.isfinite(loss):
            raise NonFiniteUpdateError(f"round {round_index + 1}: non-finite training loss")
        return {"train_loss": loss, "clients": len(result.client_ids)}

    def _cohort(self, client_ids: torch.Tensor) -> int:
        """How many clients a round's traffic is counted for: under central DP the expected cohort (the actual one
        is as private as the noise), else the clients themselves."""
        return self.clients_per_round if self.privacy.mechanism == "central" else len(client_ids)

    def _wire_values(self, client_ids: torch.Tensor) -> int:
        if self.privacy.mechanism == "central":
            return self.clients_per_round * self.setup.spec.dim
        return self.setup.wire_values(client_ids)

    def _central_release(self, result: TrainResult, round_index: int) -> torch.Tensor:
        """``central``: the noised mean of the clipped updates (``[dim]``), DP-FedAvg's release; no individual
        update (and not the cohort's size) reaches the method."""
        clip = self.tracker.clip_norm if self.tracker.clip_norm is not None else self.privacy.clip_norm
        released = noised_mean(result.delta, self.privacy, self.clients_per_round, self.noise, round_index, clip)
        if self.privacy.adaptive_quantile is not None:  # the clip the next round uses (a released, noised count)
            self.tracker.clip_norm = next_clip(result.delta, clip, self.privacy, self.clients_per_round,
                                               self.noise, round_index)
        return released

    def _record_ledger(self) -> None:
        """A private run's releases, in the run folder after every round (a run interrupted between checkpoints
        still counts what it released)."""
        if self.privacy.active and self.out_dir is not None:
            runs.atomic_write_text(self.out_dir / runs.PRIVACY_LEDGER, self.ledger.to_json())

    def _lose_uploads(self, result: TrainResult, round_index: int) -> TrainResult:
        """``train.dropout``: each upload is lost with that probability (one seeded stream per round), the way a
        Flower node's reply can fail to arrive; the method sees only the updates that arrived."""
        draws = torch.rand(len(result.client_ids), generator=rng.generator(self.config.seed, round_index, "dropout"),
                           device="cpu")
        kept = draws >= self.config.train.dropout
        self.tracker.lost_uploads += int((~kept).sum())
        return _subset(result, kept)

    def _stragglers_arrive(self, started: torch.Tensor, result: TrainResult,
                           round_index: int) -> tuple[torch.Tensor, TrainResult]:
        """``train.stragglers``: hold the stragglers' uploads of this round for ``straggler_delay`` rounds (lost
        at delay 0, or when the method cannot use a late upload); release those due now beside the fresh ones,
        each with the weights its client was sent back then. Returns what reaches the method this round."""
        late = torch.isin(result.client_ids, self.straggler_ids)
        delay = self.config.train.straggler_delay
        if late.any():
            if delay == 0 or not type(self.setup.method).accepts_late_uploads:
                self.tracker.lost_uploads += int(late.sum())
            else:
                self.in_flight.append((round_index + delay, started[late.to(started.device)],
                                       _subset(result, late)))
        on_time = ~late
        arrived = [(started[on_time.to(started.device)], _subset(result, on_time))]
        arrived += [(weights, held) for due, weights, held in self.in_flight if due == round_index]
        self.tracker.late_uploads += sum(len(held.client_ids) for due, _, held in self.in_flight if due == round_index)
        self.in_flight = [entry for entry in self.in_flight if entry[0] != round_index]
        client_ids = torch.cat([held.client_ids for _, held in arrived])
        order = client_ids.argsort()  # methods see their clients in id order, as sampling gives them
        merged = TrainResult(torch.cat([held.rows for _, held in arrived])[order], client_ids[order],
                             torch.cat([held.delta for _, held in arrived])[order.to(result.delta.device)],
                             {name: torch.cat([held.metrics[name] for _, held in arrived])[order.to(value.device)]
                              for name, value in result.metrics.items()})
        return torch.cat([weights for weights, _ in arrived])[order.to(started.device)], merged

    def score_all(self, round_index: int) -> dict[str, ClientScores]:
        """Every client's personalised model on its val and test split (its client rule decides what that is)."""
        all_ids = torch.arange(self.setup.federation.num_clients, device="cpu")
        return self.executor.evaluate(all_ids, self.setup.method.eval_weights(all_ids), round_index)

    def evaluate(self, round_index: int) -> dict[str, Any]:
        fed = self.setup.federation
        train_ids, novel_ids = fed.train_client_ids, fed.novel_client_ids
        scores = self.score_all(round_index)
        val, test = scores["val"].select(train_ids), scores["test"].select(train_ids)
        record: dict[str, Any] = {"round": round_index + 1}
        record["val_mean"], record["val_std"] = _mean_std(val.metric)
        record["test_mean"], record["test_std"] = _mean_std(test.metric)
        # how many training clients the test mean covers (fewer when Flower replies were lost)
        record["scored_clients"] = int(torch.isfinite(test.metric).sum())
        if record["scored_clients"] < len(train_ids):
            log.warning("round %d: the test %s covers %d of %d training clients (the others' evaluations did not "
                        "arrive)", round_index + 1, fed.metric, record["scored_clients"], len(train_ids))
        record["test_pooled"] = test.pooled
        record["test_row_se"] = _row_standard_error(test) if fed.task == "classification" else None
        if fed.task == "regression":
            # MAE beside the (scaled) MSE; ``target_scale`` turns it into the data's own units (e.g. mph)
            record["test_mae"] = float(test.mae.mean())
            record["test_mae_original_units"] = (None if fed.target_scale is None
                                                 else record["test_mae"] * fed.target_scale)
        for split, scores_of_split in (("val", val), ("test", test)):
            # NaN without rows is a reply that never came (Flower); NaN/Inf with rows is a broken model.
            broken = train_ids[~torch.isfinite(scores_of_split.metric) & (scores_of_split.counts > 0)]
            record[f"{split}_nonfinite_clients"] = [fed.client_names[int(i)] for i in broken]
            if len(broken):
                log.warning("round %d: the %s %s of %d client(s) is NaN/Inf (%s); left out of the mean",
                            round_index + 1, split, fed.metric, len(broken),
                            ", ".join(record[f"{split}_nonfinite_clients"][:10]))
        attack = self.setup.clients.attack
        if attack.active:  # how the honest clients fare, and the attackers (scored on their clean test rows)
            malicious = attack.malicious[train_ids]
            record["honest_test_mean"], record["honest_test_std"] = _mean_std(test.metric[~malicious])
            record["malicious_test_mean"] = _mean_std(test.metric[malicious])[0]
        if "backdoor_test" in scores:  # attack success rate: triggered rows classified as the target
            asr = scores["backdoor_test"].select(train_ids).metric
            record["asr_mean"] = _mean_std(asr)[0]
            if attack.active:
                record["asr_honest"] = _mean_std(asr[~malicious])[0]
                record["asr_malicious"] = _mean_std(asr[malicious])[0]
        family = self.setup.family
        if family is not None:  # mixed architectures: how each architecture's (training) clients fare
            record["test_by_architecture"] = {
                name: _mean_std(test.metric[family.assignment[train_ids] == arch])[0]
                for arch, name in enumerate(family.names)}
        if len(self.late_ids):  # clients that joined late, on the training clients' protocol
            record["late_test_mean"] = _mean_std(scores["test"].select(self.late_ids).metric)[0]
        record["novel_mean"] = record["novel_std"] = None
        scored_novel = type(self.setup.method).no_novel_model is None
        if len(novel_ids) and scored_novel:
            novel = scores["test"].select(novel_ids)
            record["novel_mean"], record["novel_std"] = _mean_std(novel.metric)
        # every client by name: who gains and who loses (a novel client without a model of its own has no score)
        per_split = {split: {"": scores[split].metric.cpu(), **self._chosen_metrics(split)}
                     for split in ("val", "test")}
        for split, values in per_split.items():
            for metric in self.metrics:
                record[f"{split}_{metric}_mean"] = _mean_std(values[metric][train_ids])[0]
        record["per_client"] = {
            name: {f"{split}{'_' + metric if metric else ''}": _finite(value[i])
                   if scored_novel or not fed.novel_mask[i] else None
                   for split, values in per_split.items() for metric, value in values.items()}
            for i, name in enumerate(fed.client_names)}
        return record

    def _check_metrics(self) -> tuple[str, ...]:
        """``train.metrics`` (else the folder meta.yaml's ``metrics``), checked against the task and the clients'
        models (ConfigError, one line)."""
        fed = self.setup.federation
        # the task's own metric is always scored: naming it among the others is allowed and changes nothing
        wanted = tuple(m for m in self.config.train.metrics or fed.default_metrics if m != fed.metric)
        source = "train.metrics" if self.config.train.metrics else f"metrics in {fed.name}'s meta.yaml"
        allowed = CLASSIFICATION_METRICS if fed.task == "classification" else REGRESSION_METRICS
        wrong = [metric for metric in wanted if metric not in allowed]
        if wrong:
            raise ConfigError(f"{source}: {', '.join(wrong)} do not apply to {fed.task} ({fed.name}); "
                              f"allowed: {', '.join(allowed)}")
        binary = [metric for metric in wanted if metric in BINARY_ONLY]
        if binary and fed.output_dim != 2:
            raise ConfigError(f"{source}: {', '.join(binary)} need a binary task; {fed.name} has "
                              f"{fed.output_dim} classes (use auroc, auprc, macro_f1 or balanced_accuracy)")
        if wanted and (not isinstance(self.executor, ClientRuntime) or not self.executor.exports_plain_models):
            raise ConfigError(f"{source}: {self.setup.method.name} clients evaluate a network or forward of "
                              f"their own (or run elsewhere); only accuracy / MSE are scored for it")
        return wanted

    def _chosen_metrics(self, split: str) -> dict[str, torch.Tensor]:
        """``train.metrics`` of every client on ``split``, from the weights the clients just scored with."""
        if not self.metrics:
            return {}
        train = self.config.train
        return client_metrics(self.setup.model, self.setup.spec, self.executor.evaluated_weights,
                              getattr(self.setup.federation, split), self.setup.federation.task, self.metrics,
                              train.threshold, train.precision)

    def evaluate_novel_adapted(self) -> tuple[float | None, float | None]:
        """Embedding-only adaptation of novel clients (pFedHN Sec. 5.3) on a copy of the method state."""
        method, fed = self.setup.method, self.setup.federation
        novel_ids = fed.novel_client_ids
        rounds = self.config.train.novel_adapt_rounds
        if not len(novel_ids) or not rounds or not method.supports_novel_adaptation():
            return None, None
        if self.privacy.mechanism == "central":
            # the server adapts each novel client from that client's own raw update: no noised sum covers it
            log.info("novel-client adaptation is not run under privacy.mechanism=central: it reads each novel "
                     "client's raw update, outside the noised sum")
            return None, None
        saved = copy.deepcopy(method.state_dict())
        try:
            method.begin_novel_adaptation(novel_ids)
            for step in range(rounds):
                sent = method.personalize(novel_ids).detach()
                result = self.executor.train(novel_ids, sent, step, "novel")
                if self.privacy.mechanism == "local":  # noised where they are made, as training uploads are
                    self.ledger.count_uploads(result.client_ids)
                check_update(result.delta, result.client_ids, self.setup.spec.dim, step, fed.client_names)
                if len(result.client_ids):
                    method.adapt_novel(result.client_ids, sent[result.rows], result.delta)
            scores = self.executor.evaluate(novel_ids, method.eval_weights(novel_ids), rounds)["test"]
            return _mean_std(scores.metric)
        finally:
            method.load_state_dict(saved)

    def _save_graphs(self, completed_rounds: int) -> torch.Tensor | None:
        """Collaboration graphs are a result: save them at every evaluation (methods that have them); returned for
        the trackers."""
        if self.out_dir is None:
            return None
        rows = self.graph_rows()
        graphs = self.setup.method.collaboration_graph(rows)
        if graphs is None:
            return None
        names = list(self.setup.spec.layers) if graphs.ndim == 3 else ["client graph"]
        fed = self.setup.federation
        runs.save_graphs(self.out_dir, completed_rounds, graphs, names, rows, fed.client_names, fed.novel_mask)
        return graphs

    def graph_rows(self) -> torch.Tensor | None:
        """Whose rows of the collaboration graph are saved: every client's up to ``GRAPH_ROWS`` clients; above,
        a fixed seeded sample of ``GRAPH_ROWS`` clients (a 10,000-client ``[L, N, N]`` graph would be gigabytes
        per evaluation, and computing every row costs N x N)."""
        num_clients = self.setup.federation.num_clients
        if num_clients <= GRAPH_ROWS:
            return None
        order = torch.randperm(num_clients, generator=rng.generator(self.config.seed, 0, "graph_rows"), device="cpu")
        return order[:GRAPH_ROWS].sort().values

    # ---- checkpoints --------------------------------------------------------------------------------
    def _checkpoint_state(self, completed_rounds: int) -> dict[str, Any]:
        return {"completed_rounds": completed_rounds, "config": dump_config(self.config),
                "method": self.setup.method.state_dict(), "clients": self.executor.state_dict(),
                "tracker": vars(self.tracker).copy(), "privacy_ledger": self.ledger.state(),
                "torch_rng": torch.get_rng_state(),
                **({"in_flight": [{"due": due, "sent": weights, "rows": held.rows, "client_ids": held.client_ids,
                                   "delta": held.delta, "metrics": held.metrics}
                                  for due, weights, held in self.in_flight]} if len(self.straggler_ids) else {})}

    def _restore(self, state: dict[str, Any]) -> int:
        expected = {"completed_rounds": int, "config": str, "method": dict, "tracker": dict,
                    "torch_rng": torch.Tensor}
        for key, kind in expected.items():
            if not isinstance(state.get(key), kind):
                raise CheckpointError(f"--resume: the checkpoint has no valid '{key}' ({kind.__name__} expected); "
                                         f"it was not written by this graphfed run")
        if not self._same_config(state["config"]):
            raise CheckpointError("--resume: the checkpoint was written by a different config; "
                                     "use the run's own config.yaml or start a new --out directory")
        completed = state["completed_rounds"]
        if not 0 <= completed <= self.config.train.rounds:
            raise CheckpointError(f"--resume: the checkpoint claims {completed} completed rounds of "
                                     f"{self.config.train.rounds}")
        clients = state.get("clients")
        if (clients == {} or (isinstance(clients, dict) and "flower" in clients)) and not self._on_flower():
            # the Flower ServerApp checkpoints the server only: its clients' state stays on the nodes
            raise CheckpointError(f"--resume: this checkpoint was written by a Flower run after round "
                                  f"{state['completed_rounds']}; its clients' state is on its nodes, so only Flower "
                                  f"can continue it: start the same Flower App again (flwr run), its ServerApp "
                                  f"resumes from this checkpoint")
        state["tracker"].pop("uploads_per_client", None)  # older checkpoints counted local-DP uploads there
        unknown = set(state["tracker"]) - set(vars(self.tracker))
        if unknown:
            raise CheckpointError(f"--resume: the checkpoint's tracker has unknown fields {sorted(unknown)}")
        try:
            self.setup.method.load_state_dict(state["method"])
            self.executor.load_state_dict(state.get("clients", {}))
            torch.set_rng_state(state["torch_rng"].cpu())
            self.in_flight = [(int(entry["due"]), entry["sent"], TrainResult(entry["rows"], entry["client_ids"],
                                                                             entry["delta"], dict(entry["metrics"])))
                              for entry in state.get("in_flight", [])]
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise CheckpointError(f"--resume: the checkpoint's state does not fit this run's method, model or "
                                     f"clients ({type(err).__name__}: {reason})") from None
        for key, value in state["tracker"].items():
            setattr(self.tracker, key, value)
        self.tracker.select_last = self.privacy.active and self.privacy.model_selection == "last"
        self.ledger = self._resumed_ledger(state.get("privacy_ledger"))
        return int(completed)

    def _resumed_ledger(self, saved: Any) -> PrivacyLedger:
        """The releases before a resume: the checkpoint's count, or the run folder's if it saw more (rounds run
        after the checkpoint by the interrupted process were released too, and are run again now)."""
        ledger = PrivacyLedger()
        for source, state in (("checkpoint", saved), (runs.PRIVACY_LEDGER, self._ledger_file())):
            if state is None:
                continue
            try:
                ledger = ledger.merged(PrivacyLedger.from_state(state))
            except ValueError as err:
                raise CheckpointError(f"--resume: the {source}'s privacy ledger is unreadable ({err}); its "
                                      f"releases cannot be accounted") from None
        return ledger

    def _ledger_file(self) -> Any:
        path = None if self.out_dir is None else self.out_dir / runs.PRIVACY_LEDGER
        if path is None or not path.exists() or not self.privacy.active:
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"--resume: {path} is unreadable ({type(err).__name__}); its releases cannot be "
                                  f"accounted") from None

    def _on_flower(self) -> bool:
        return not isinstance(self.executor, ClientRuntime | ArchitectureRuntime)

    def _same_config(self, text: str) -> bool:
        """Whether a checkpoint's config is this run's. Compared after validation, so a checkpoint written before a
        new field with a default existed still resumes (its text lacks the field), and data that moved still
        resumes (``same_run``)."""
        if text == dump_config(self.config):
            return True
        try:
            return same_run(validate_config(read_yaml(text)), self.config)
        except (ConfigError, yaml.YAMLError, RecursionError):
            return False

    # ---- the loop ----------------------------------------------------------------------------------
    def run(self, resume: bool = False) -> RunResult:
        """Run the rounds (from the checkpoint with ``resume``), write the run directory, return the result."""
        with deterministic_algorithms(self.config.train.deterministic):
            return self._run(resume)

    def _run(self, resume: bool) -> RunResult:
        cfg, fed, method = self.config, self.setup.federation, self.setup.method
        rounds_log = runs.RoundLog(self.out_dir) if self.out_dir else None
        start_round = 0
        if self.out_dir:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            for stale in runs.remove_stale_temporaries(self.out_dir):
                log.info("removed %s, left by an interrupted write", stale)
            if resume:
                # onto this run's device, whichever device wrote it (GPU -> CPU and back)
                start_round = self._restore(checkpoint.load_checkpoint(self.out_dir, self.setup.clients.device))
                rounds_log.truncate_after(start_round)
                log.info("resuming %s from round %d", self.out_dir, start_round)
            else:
                rounds_log.reset()
            runs.atomic_write_text(self.out_dir / runs.CONFIG, dump_config(cfg))
        for note in method.notes:
            log.info(note)
        if self.privacy.active and self.privacy.reproducible:
            log.warning(REPRODUCIBLE_WARNING)
        self._announce_novel_clients()
        if len(self.late_ids):
            log.info("late clients (sampled from round %d): %s", cfg.train.join_round,
                     ", ".join(fed.client_names[int(i)] for i in self.late_ids))
        attack = self.setup.clients.attack
        if attack.active:
            names = attack.describe(fed.client_names)["malicious_clients"]
            log.info("attack %s: %d malicious client(s): %s%s", cfg.attack.kind, len(names), ", ".join(names[:10]),
                     ", ..." if len(names) > 10 else "")
        if self.setup.family is not None:
            log.info("client architectures: %s", ", ".join(f"{name} x {count}" for name, count
                                                          in self.setup.family.counts().items()))
        history: list[dict[str, Any]] = rounds_log.read() if rounds_log else []
        for tracker in self.trackers:
            tracker.start(cfg, history)
        status = "completed"
        segment_start = time.perf_counter()
        # a bar in a terminal; in a log (stdout/stderr not a terminal) one line per evaluation instead
        interactive = self.progress and sys.stderr.isatty()
        bar = tqdm(range(start_round, cfg.train.rounds), initial=start_round, total=cfg.train.rounds,
                   desc=f"{method.name} on {fed.name}", disable=not interactive, unit="round",
                   dynamic_ncols=True)
        scale, unit = (100.0, " %") if fed.metric == "accuracy" else (1.0, "")
        round_stats: dict[str, float] = {}
        try:
            for round_index in bar:
                round_stats = self.run_round(round_index)
                completed = round_index + 1
                if completed % cfg.train.eval_every == 0 or completed == cfg.train.rounds:
                    record = self.evaluate(round_index)
                    record.update(round_stats, bytes_up=self.tracker.bytes_up, bytes_down=self.tracker.bytes_down,
                                  wall_seconds=self.tracker.elapsed + time.perf_counter() - segment_start)
                    if record[self.tracker.key] is None:
                        log.warning("round %d: no client's evaluation arrived; round not used for model selection",
                                    completed)
                    else:
                        self.tracker.offer(record, cfg.train.min_delta)
                        if self.tracker.best is record:
                            self._keep_best_models()
                    history.append(record)
                    graphs = self._save_graphs(completed)
                    if rounds_log:
                        rounds_log.append(record)
                    for tracker in self.trackers:
                        tracker.evaluation(record, graphs)
                    shown = {f"{split} {fed.metric}": "—" if record[f"{split}_mean"] is None
                             else f"{scale * record[f'{split}_mean']:.4g}{unit}" for split in ("val", "test")}
                    if interactive:
                        bar.set_postfix(shown)
                    elif self.progress:
                        log.info("%s on %s, round %d/%d: %s", method.name, fed.name, completed, cfg.train.rounds,
                                 ", ".join(f"{key} {value}" for key, value in shown.items()))
                patience = cfg.train.patience
                stop_early = patience is not None and self.tracker.since_improvement >= patience
                if self.out_dir and (completed % self.checkpoint_every == 0 or completed == cfg.train.rounds
                                     or stop_early):
                    self.tracker.elapsed += time.perf_counter() - segment_start
                    segment_start = time.perf_counter()
                    checkpoint.save_checkpoint(self.out_dir, self._checkpoint_state(completed))
                    self._save_models()
                if stop_early:
                    self.stopped_early = completed
                    log.info("early stop after round %d: %d evaluations without a validation gain above %g "
                             "(best: round %s)", completed, patience, cfg.train.min_delta,
                             self.tracker.best.get("round"))
                    break
        except RunStoppedError as err:  # non-finite or wrong-shaped updates, a solver short of its tolerance
            status = f"stopped: {err}"
            log.error("%s; last good checkpoint kept in %s", err, self.out_dir or "(no output directory)")
        finally:
            bar.close()
        self.tracker.elapsed += time.perf_counter() - segment_start
        novel_adapted = (None, None)
        if status == "completed":
            novel_adapted = self.evaluate_novel_adapted()
        result = self._result(history, status, novel_adapted)
        for flag in result.flags:
            log.warning(flag)
        for tracker in self.trackers:
            tracker.end(result)
        if self.out_dir:
            self._save_models()
            runs.write_result(self.out_dir, result)
            from graphfed.report.plots import plot_curves

            plot_curves(history, self.out_dir / "plots" / "curves.png", fed.metric,
                        title=f"{method.name} on {fed.name}")
        return result

    def _announce_novel_clients(self) -> None:
        """Say which clients are held out of training, and warn when a small federation loses clients to a
        fraction (a demo default of 20 % takes 1 of 5 hospitals, a different one under every seed)."""
        fed, dataset = self.setup.federation, self.config.dataset
        novel = [fed.client_names[int(i)] for i in fed.novel_client_ids]
        if not novel:
            return
        log.info("novel clients (held out of training): %s%s", ", ".join(novel[:20]),
                 ", ..." if len(novel) > 20 else "")
        if dataset.novel_clients is None and fed.num_clients < SMALL_FEDERATION:
            log.warning("dataset.novel_fraction=%g holds out %d of only %d clients (%s), chosen by the seed: name them "
                        "with dataset.novel_clients to hold out the same ones under every seed, or set "
                        "dataset.novel_fraction=0 to train all", dataset.novel_fraction, len(novel), fed.num_clients,
                        ", ".join(novel))

    def _models_note(self) -> str | None:
        """Why this run cannot save its clients' models (None: it saves them in models/best.pt)."""
        executor, spec, n = self.executor, self.setup.spec, self.setup.federation.num_clients
        if not isinstance(executor, ClientRuntime):
            return "clients ran elsewhere (Flower nodes or mixed architectures): their models stay with them"
        if not executor.exports_plain_models:
            return (f"{self.setup.method.name}'s clients evaluate a network or forward of their own, not the target "
                    f"network with personal weights; nothing to export as a plain module")
        if n * spec.dim * 4 > MODELS_BYTES:
            return (f"{n:,} clients x {spec.dim:,} parameters is above the {MODELS_BYTES / 2**30:.0f} GiB kept for "
                    f"saved models")
        return None

    def _keep_best_models(self) -> None:
        """A copy of what every client just scored with: the models behind the selected round's numbers (written
        with the next checkpoint, so a resumed run finds the models of the best round before it)."""
        if self.models_note is None and self.executor.evaluated_weights is not None:
            self.best_models = self.executor.evaluated_weights.detach().to("cpu", copy=True)

    def _save_models(self) -> None:
        fed, spec, cfg = self.setup.federation, self.setup.spec, self.config
        if self.out_dir is None or self.best_models is None:
            return  # nothing new since the last write
        model = {"name": cfg.model.name, "options": dict(cfg.model.options), "input_shape": list(fed.input_shape),
                 "output_dim": fed.output_dim, "task": fed.task, "dataset": fed.name, "method": cfg.method.name,
                 "param_names": spec.names, "param_shapes": [list(tensor.shape) for tensor in spec.tensors]}
        runs.save_models(self.out_dir, self.best_models, fed.client_names, self.tracker.best["round"], model)
        self.best_models = None

    def _per_client(self, best: dict[str, Any]) -> dict[str, Any]:
        """Each client's scores at the selected round beside its trivial predictor's, its role, and the early stop."""
        fed = self.setup.federation
        malicious = self.setup.clients.attack.malicious
        trivial = self.trivial[fed.train_client_ids]
        scored = best.get("per_client", {})
        isolated = self._isolated_novel_clients()
        per_client = {name: {**scored.get(name, {"val": None, "test": None}),
                             "trivial_test": _finite(self.trivial[i]), "novel": bool(fed.novel_mask[i]),
                             **({"no_graph_neighbours": True} if i in isolated else {}),
                             **({"malicious": bool(malicious[i])} if self.setup.clients.attack.active else {})}
                      for i, name in enumerate(fed.client_names)}
        early = ({"round": self.stopped_early, "patience": self.config.train.patience,
                  "min_delta": self.config.train.min_delta} if self.stopped_early is not None else None)
        chosen = {metric: {"val_mean": best.get(f"val_{metric}_mean"), "test_mean": best.get(f"test_{metric}_mean")}
                  for metric in self.metrics}
        return {"per_client": per_client, "flags": self._flags(per_client),
                "trivial_test_mean": _mean_std(trivial)[0], "stopped_early": early,
                "models_note": self.models_note, "metrics": chosen or None,
                "select_by": self.select_by}

    def _isolated_novel_clients(self) -> set[int]:
        """Novel clients the method's client graph links to no training client (their model is a guess from nothing
        the federation learned about them: Panacea's inferred graph never links a client that never uploaded)."""
        fed = self.setup.federation
        if not len(fed.novel_client_ids):
            return set()
        graph = self.setup.method.collaboration_graph()
        if graph is None or graph.ndim != 2:
            return set()
        links = graph[fed.novel_client_ids][:, fed.train_client_ids].abs().sum(1).cpu()
        return {int(client) for client, total in zip(fed.novel_client_ids, links, strict=True) if float(total) == 0}

    def _flags(self, per_client: dict[str, dict[str, Any]]) -> list[str]:
        """One sentence per thing a reader of this run's numbers must know (logged at the end of the run)."""
        metric, higher = self.setup.federation.metric, HIGHER_IS_BETTER[self.setup.federation.metric]
        novel = {name: scores for name, scores in per_client.items() if scores.get("novel")}
        isolated = [name for name, scores in novel.items() if scores.get("no_graph_neighbours")]
        below = [f"{name} ({scores['test']:.4g} against {scores['trivial_test']:.4g})"
                 for name, scores in novel.items()
                 if scores.get("test") is not None and scores.get("trivial_test") is not None
                 and (scores["test"] < scores["trivial_test"] if higher else scores["test"] > scores["trivial_test"])]

        def listed(names: list[str]) -> str:
            return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")

        flags = []
        if isolated:
            flags.append(f"novel client(s) with no neighbour among the training clients in the method's client "
                         f"graph: {listed(isolated)}; their model is the method's guess for clients it knows nothing "
                         f"of (give the dataset's graph, or check dataset.graph)")
        if below:
            flags.append(f"novel client(s) scoring below their trivial predictor ({metric} against predicting their "
                         f"training {'majority class' if higher else 'mean'}): {listed(below)}")
        return flags

    def _privacy_record(self) -> dict[str, Any]:
        """What the run spent, from the accounting library over every release it made (its ledger, not the rounds
        it evaluated): central, epsilon over the noised sums released; local, each client's epsilon over the
        noised uploads it made (novel clients' adaptation included)."""
        record = self.privacy.record()
        if self.privacy.mechanism == "central":
            record["rounds_released"] = self.ledger.central_releases
            record["epsilon"] = self.privacy.epsilon_of_rounds(self.ledger.central_releases)
            if self.tracker.clip_norm is not None:
                record["final_clip_norm"] = self.tracker.clip_norm
            return record
        fed = self.setup.federation
        uploaded = [i for i in range(fed.num_clients) if not fed.novel_mask[i] or self.ledger.uploads.get(i)]
        per_client = {fed.client_names[i]: self.privacy.epsilon_of_rounds(self.ledger.uploads.get(i, 0))
                      for i in uploaded}
        values = sorted(per_client.values())
        record.update(epsilon_max=values[-1], epsilon_median=values[len(values) // 2], per_client_epsilon=per_client,
                      uploads_released=sum(self.ledger.uploads.values()))
        return record

    def _graph_record(self) -> dict[str, Any]:
        """Which client graph the run read (``dataset.graph``; "none" also when the dataset has none) and its size."""
        graph = self.setup.federation.client_graph
        if graph is None:
            return {"source": "none", "edges": 0}
        return {"source": self.config.dataset.graph, "edges": int(torch.count_nonzero(graph)) // 2}

    def _result(self, history: list[dict[str, Any]], status: str,
                novel_adapted: tuple[float | None, float | None]) -> RunResult:
        cfg, fed = self.config, self.setup.federation
        best = self.tracker.best or {}
        last = history[-1] if history else {}
        return RunResult(**{
            "schema_version": runs.SCHEMA_VERSION,
            "method": cfg.method.name, "dataset": fed.name, "metric": fed.metric, "seed": cfg.seed,
            # every option the method ran with, defaults included (config.yaml keeps only what was set)
            "method_options": self.setup.method.options.model_dump(mode="json"),
            "status": status,
            "test_mean": best.get("test_mean"), "test_std": best.get("test_std"),
            "test_pooled": best.get("test_pooled"), "val_mean": best.get("val_mean"),
            "test_row_se": best.get("test_row_se"),
            "test_nonfinite_clients": best.get("test_nonfinite_clients", []),
            "test_mae": best.get("test_mae"), "test_mae_original_units": best.get("test_mae_original_units"),
            "novel_mean": best.get("novel_mean"), "novel_std": best.get("novel_std"),
            **({"test_by_architecture": best.get("test_by_architecture"),
                "architectures": dict(zip(fed.client_names, (self.setup.family.names[int(a)]
                                                             for a in self.setup.family.assignment), strict=True))}
               if self.setup.family is not None else {}),
            "novel_adapted_mean": novel_adapted[0], "novel_adapted_std": novel_adapted[1],
            # no novel score: the method has no model for a client that never trained (None: it has one)
            "novel_none_reason": type(self.setup.method).no_novel_model if len(fed.novel_client_ids) else None,
            "attack": self.setup.clients.attack.describe(fed.client_names),
            **{key: best.get(key) for key in ROBUSTNESS_FIELDS},
            "defense": cfg.defense.model_dump(mode="json"),
            "best_round": best.get("round"), "final_test_mean": last.get("test_mean"),
            **self._per_client(best),
            "rounds": last.get("round", 0), "num_clients": fed.num_clients,
            "clients_per_round": self.clients_per_round,
            "num_novel_clients": len(fed.novel_client_ids), "num_params": self.setup.spec.dim,
            "novel_clients": [fed.client_names[int(i)] for i in fed.novel_client_ids],
            **({"late_clients": [fed.client_names[int(i)] for i in self.late_ids], "join_round": cfg.train.join_round,
                "late_test_mean": best.get("late_test_mean"), "late_test_final": last.get("late_test_mean")}
               if len(self.late_ids) else {}),
            "client_graph": self._graph_record(),
            **({"dropout": cfg.train.dropout, "lost_uploads": self.tracker.lost_uploads}
               if cfg.train.dropout > 0 or len(self.straggler_ids) else {}),
            **({"stragglers": [fed.client_names[int(i)] for i in self.straggler_ids],
                "straggler_delay": cfg.train.straggler_delay, "late_uploads": self.tracker.late_uploads}
               if len(self.straggler_ids) else {}),
            "scored_clients": best.get("scored_clients"), "training_clients": self.num_train_clients,
            **({"privacy": self._privacy_record()} if self.privacy.active else {}),
            "wall_seconds": round(self.tracker.elapsed, 3),
            "bytes_up": self.tracker.bytes_up, "bytes_down": self.tracker.bytes_down,
            "peak_rss_mb": peak_rss_mb(), "torch_threads": cfg.torch_threads,
            "device": str(self.setup.clients.device), "execution": self.execution,
            "notes": list(self.setup.method.notes),
            # the code that produced these numbers: bench reruns (or marks stale) a run from other code
            "code": code_provenance(),
            # what only the engine that ran the clients knows (Flower: dropped clients, refused nodes)
            **self.executor.result_fields(),
        })


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (what a run needed, counting the data it loaded)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)  # bytes on macOS, KiB on Linux


def run_config(config: RunConfig, out_dir: str | Path | None = None, resume: bool = False,
               progress: bool = True, federation: Federation | None = None) -> RunResult:
    """Library entry point: build and run one config, return its result (what ``summary.json`` holds)."""
    return Simulator(config, out_dir, federation=federation, progress=progress).run(resume=resume)
