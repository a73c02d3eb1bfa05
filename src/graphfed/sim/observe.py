"""Observing a run: an evaluation's record, the round it selects, and the callbacks that act on what was observed.

The round loop evaluates every ``train.eval_every`` rounds and hands the record to :class:`RunCallback` objects, each
one concern behind one seam (pfl-research's ``TrainingProcessCallback`` is the anchor): the round log, the
experiment trackers, the best-round models, progress output and checkpoints. Early stopping reads the
:class:`Tracker`'s count of evaluations without improvement.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from graphfed import runs
from graphfed.client.evaluation import ClientScores
from graphfed.client.executor import ClientExecutor
from graphfed.client.metrics import BINARY_ONLY, CLASSIFICATION_METRICS, REGRESSION_METRICS
from graphfed.client.metrics import client_metrics as score_metrics
from graphfed.client.privacy import REPRODUCIBLE_WARNING
from graphfed.config import ConfigError, RunConfig
from graphfed.data.federation import Federation
from graphfed.setup import Setup
from graphfed.sim import checkpoint
from graphfed.sim.tracking import RunTracker

log = logging.getLogger("graphfed")

#: below this many clients, holding clients out by a fraction gets a warning
SMALL_FEDERATION = 10
#: the most memory the best models of a run may take (every client's weights, float32): above, none are saved
MODELS_BYTES = 1 << 30


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
    #: [round, client name, reason] of each lost upload (reason: dropout, straggler)
    dropped: list[list[int | str]] = field(default_factory=list)
    late_uploads: int = 0  #: straggler updates that reached the method rounds late (``train.stragglers``)
    clip_norm: float | None = None  #: adaptive clipping (central DP): the clip the next round uses
    #: the simulated clock (``train.clock``): seconds since the run began (None under central DP: a round's duration
    #: would tell its secret cohort)
    sim_seconds: float | None = 0.0
    #: a private run's ``privacy.model_selection: last``: the newest evaluation is the run's result, whatever the
    #: clients' validation scores say (choosing by them would read private data outside the mechanism)
    select_last: bool = False

    def lose(self, round_number: int, clients: list[str], reason: str) -> None:
        self.lost_uploads += len(clients)
        self.dropped += [[round_number, client, reason] for client in clients]

    def offer(self, record: dict[str, Any], min_delta: float = 0.0) -> None:
        """Keep ``record`` if its validation score is the best so far (every record, with ``select_last``); count
        evaluations without an improvement beyond ``min_delta``.

        Scores are compared only over the same clients: a round scored on fewer training clients (replies that
        did not arrive on Flower) never replaces one scored on more, and one scored on more replaces it whatever its
        score; a round over a different set of the same size is not compared (and is no evaluation without a gain
        for early stopping). A mean over 3 clients is not better than a mean over 4 because it is higher."""
        value = record[self.key]
        if not self.best or self.select_last:
            self.best = record
            return
        unscored, best_unscored = record.get("unscored_clients", []), self.best.get("unscored_clients", [])
        if len(unscored) < len(best_unscored):
            self.best, self.since_improvement = record, 0
            return
        if sorted(unscored) != sorted(best_unscored):
            return
        gain = value - self.best[self.key] if self.higher_is_better else self.best[self.key] - value
        self.since_improvement = 0 if gain > min_delta else self.since_improvement + 1
        if gain > 0:
            self.best = record


# ---- an evaluation's record --------------------------------------------------------------------------------------
def finite(value: torch.Tensor) -> float | None:
    """A score for JSON: None where it is NaN/Inf (no rows, a reply that never came, a broken model)."""
    number = float(value)
    return number if math.isfinite(number) else None


def mean_std(values: torch.Tensor) -> tuple[float | None, float | None]:
    """Mean and std over clients; clients without a score (NaN: their reply never came) are left out."""
    values = values[torch.isfinite(values)]
    if values.numel() == 0:
        return None, None
    return float(values.mean()), float(values.std(unbiased=False))


def row_standard_error(scores: ClientScores) -> float | None:
    """Standard error of the mean-over-clients accuracy from the sampling of test rows alone: each client's accuracy
    is a binomial proportion over its rows (variance p(1-p)/n), the mean over N clients has variance
    sum_i p_i(1-p_i)/n_i / N^2. The spread a resampling of test rows would show, when the seed does not change the
    split (a federation folder)."""
    scored = torch.isfinite(scores.metric) & (scores.counts > 0)
    if not bool(scored.any()):
        return None
    p, n = scores.metric[scored].double(), scores.counts[scored].double()
    return float((p * (1 - p) / n).sum().sqrt() / scored.sum())


def chosen_metrics(sim: Any, split: str) -> dict[str, torch.Tensor]:
    """``train.metrics`` of every client on ``split``, from the weights the clients just scored with."""
    if not sim.metrics:
        return {}
    train, fed = sim.config.train, sim.setup.federation
    return score_metrics(sim.setup.model, sim.setup.spec, sim.executor.evaluated_weights, getattr(fed, split),
                         fed.task, sim.metrics, train.threshold, train.precision)


def evaluation_record(sim: Any, scores: dict[str, ClientScores], round_index: int) -> dict[str, Any]:
    """What an evaluation of every client (``scores``: each split's, from the executor) records: the training
    clients' means and spreads, the novel and late clients', the attack's, ``train.metrics``' and every client's
    own scores by name."""
    fed = sim.setup.federation
    train_ids, novel_ids, late_ids = fed.train_client_ids, fed.novel_client_ids, sim.participation.late_ids
    val, test = scores["val"].select(train_ids), scores["test"].select(train_ids)
    record: dict[str, Any] = {"round": round_index + 1}
    record["val_mean"], record["val_std"] = mean_std(val.metric)
    record["test_mean"], record["test_std"] = mean_std(test.metric)
    # how many training clients the test mean covers (fewer when Flower replies were lost), and who has no
    # validation score (model selection compares rounds over the same clients: Tracker.offer)
    record["scored_clients"] = int(torch.isfinite(test.metric).sum())
    unscored = train_ids[~torch.isfinite(val.metric).cpu()]
    if len(unscored):
        record["unscored_clients"] = [fed.client_names[int(i)] for i in unscored]
    if record["scored_clients"] < len(train_ids):
        log.warning("round %d: the test %s covers %d of %d training clients (the others' evaluations did not "
                    "arrive)", round_index + 1, fed.metric, record["scored_clients"], len(train_ids))
    record["test_pooled"] = test.pooled
    record["test_row_se"] = row_standard_error(test) if fed.task == "classification" else None
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
            log.warning("round %d: the %s %s of %d client(s) is NaN/Inf (%s); left out of the mean", round_index + 1,
                        split, fed.metric, len(broken), ", ".join(record[f"{split}_nonfinite_clients"][:10]))
    attack = sim.setup.clients.attack
    if attack.active:  # how the honest clients fare, and the attackers (scored on their clean test rows)
        malicious = attack.malicious[train_ids]
        record["honest_test_mean"], record["honest_test_std"] = mean_std(test.metric[~malicious])
        record["malicious_test_mean"] = mean_std(test.metric[malicious])[0]
    if "backdoor_test" in scores:  # attack success rate: triggered rows classified as the target
        asr = scores["backdoor_test"].select(train_ids).metric
        record["asr_mean"] = mean_std(asr)[0]
        if attack.active:
            record["asr_honest"] = mean_std(asr[~malicious])[0]
            record["asr_malicious"] = mean_std(asr[malicious])[0]
    family = sim.setup.family
    if family is not None:  # mixed architectures: how each architecture's (training) clients fare
        record["test_by_architecture"] = {name: mean_std(test.metric[family.assignment[train_ids] == arch])[0]
                                          for arch, name in enumerate(family.names)}
    if len(late_ids):  # clients that joined late, on the training clients' protocol
        record["late_test_mean"] = mean_std(scores["test"].select(late_ids).metric)[0]
    record["novel_mean"] = record["novel_std"] = None
    scored_novel = type(sim.setup.method).no_novel_model is None
    if len(novel_ids) and scored_novel:
        record["novel_mean"], record["novel_std"] = mean_std(scores["test"].select(novel_ids).metric)
    # every client by name: who gains and who loses (a novel client without a model of its own has no score)
    per_split = {split: {"": scores[split].metric.cpu(), **chosen_metrics(sim, split)} for split in ("val", "test")}
    for split, values in per_split.items():
        for metric in sim.metrics:
            record[f"{split}_{metric}_mean"] = mean_std(values[metric][train_ids])[0]
    record["per_client"] = {
        name: {f"{split}{'_' + metric if metric else ''}": finite(value[i])
               if scored_novel or not fed.novel_mask[i] else None
               for split, values in per_split.items() for metric, value in values.items()}
        for i, name in enumerate(fed.client_names)}
    return record


# ---- callbacks ---------------------------------------------------------------------------------------------------
def check_metrics(config: RunConfig, setup: Setup, executor: ClientExecutor) -> tuple[str, ...]:
    """``train.metrics`` (else the folder meta.yaml's ``metrics``), checked against the task and the clients'
    models (ConfigError, one line)."""
    fed = setup.federation
    # the task's own metric is always scored: naming it among the others is allowed and changes nothing
    wanted = tuple(m for m in config.train.metrics or fed.default_metrics if m != fed.metric)
    source = "train.metrics" if config.train.metrics else f"metrics in {fed.name}'s meta.yaml"
    allowed = CLASSIFICATION_METRICS if fed.task == "classification" else REGRESSION_METRICS
    wrong = [metric for metric in wanted if metric not in allowed]
    if wrong:
        raise ConfigError(f"{source}: {', '.join(wrong)} do not apply to {fed.task} ({fed.name}); "
                          f"allowed: {', '.join(allowed)}")
    binary = [metric for metric in wanted if metric in BINARY_ONLY]
    if binary and fed.output_dim != 2:
        raise ConfigError(f"{source}: {', '.join(binary)} need a binary task; {fed.name} has "
                          f"{fed.output_dim} classes (use auroc, auprc, macro_f1 or balanced_accuracy)")
    if wanted and not getattr(executor, "exports_plain_models", False):
        raise ConfigError(f"{source}: {setup.method.name} clients evaluate a network or forward of "
                          f"their own (or run elsewhere); only accuracy / MSE are scored for it")
    return wanted


def announce(sim: Any) -> None:
    """Say once what the run is: the method's notes, novel, late and malicious clients, architectures."""
    cfg, fed = sim.config, sim.setup.federation
    if fed.task_reason:  # a folder's targets read as labels or as numbers, and how to declare the other
        reason = f"{fed.name} is read as {fed.task_reason.removeprefix('warning: ')}"
        (log.warning if fed.task_reason.startswith("warning: ") else log.info)(reason)
    for note in sim.setup.method.notes:
        log.info(note)
    if sim.privacy.active and sim.privacy.reproducible:
        log.warning(REPRODUCIBLE_WARNING)
    if sim.noise_check.statement:
        log.info(sim.noise_check.statement)
    if sim.noise_check.warning:
        log.warning(sim.noise_check.warning)
    if not sim.noise_check.measured:  # central DP: the measurement of raw updates goes where no reader looks
        log.info("the first cohort's median update norm against the noise is written to %s only: a statistic of a "
                 "secret cohort's raw updates, outside the guarantee (do not share that file)",
                 runs.PRIVATE_DIAGNOSTICS)
    novel = [fed.client_names[int(i)] for i in fed.novel_client_ids]
    if novel:
        log.info("novel clients (held out of training): %s%s", ", ".join(novel[:20]),
                 ", ..." if len(novel) > 20 else "")
        if cfg.dataset.novel_clients is None and fed.num_clients < SMALL_FEDERATION:
            # a demo default of 20 % takes 1 of 5 hospitals, a different one under every seed
            log.warning("dataset.novel_fraction=%g holds out %d of only %d clients (%s), chosen by the seed: name "
                        "them with dataset.novel_clients to hold out the same ones under every seed, or set "
                        "dataset.novel_fraction=0 to train all", cfg.dataset.novel_fraction, len(novel),
                        fed.num_clients, ", ".join(novel))
    if len(sim.late_ids):
        log.info("late clients (sampled from round %d): %s", cfg.train.join_round,
                 ", ".join(fed.client_names[int(i)] for i in sim.late_ids))
    attack = sim.setup.clients.attack
    if attack.active:
        names = attack.describe(fed.client_names)["malicious_clients"]
        log.info("attack %s: %d malicious client(s): %s%s", cfg.attack.kind, len(names), ", ".join(names[:10]),
                 ", ..." if len(names) > 10 else "")
    if sim.setup.family is not None:
        log.info("client architectures: %s", ", ".join(f"{name} x {count}" for name, count
                                                      in sim.setup.family.counts().items()))

def models_note(sim: Any) -> str | None:
    """Why this run cannot save its clients' models (None: it saves them in models/best.pt)."""
    executor, spec, n = sim.executor, sim.setup.spec, sim.setup.federation.num_clients
    plain = getattr(executor, "exports_plain_models", None)
    if plain is None:
        return "clients ran elsewhere (Flower nodes or mixed architectures): their models stay with them"
    if not plain:
        return (f"{sim.setup.method.name}'s clients evaluate a network or forward of their own, not the target "
                f"network with personal weights; nothing to export as a plain module")
    if n * spec.dim * 4 > MODELS_BYTES:
        return (f"{n:,} clients x {spec.dim:,} parameters is above the {MODELS_BYTES / 2**30:.0f} GiB kept for "
                f"saved models")
    return None


class RunCallback:
    """One concern of a run's observation. The loop calls :meth:`begin` once (``history``: a resumed run's earlier
    evaluations), :meth:`evaluated` after each evaluation (with the collaboration graphs where the method has them),
    :meth:`round_done` after each round (``stopping``: the run ends after it) and :meth:`end` with the result."""

    def begin(self, history: list[dict[str, Any]]) -> None:
        """The run begins (or resumes)."""

    def evaluated(self, record: dict[str, Any], graphs: torch.Tensor | None) -> None:
        """An evaluation was recorded."""

    def round_done(self, completed: int, stopping: bool) -> None:
        """Round ``completed`` (1-based) finished."""

    def end(self, result: runs.RunResult) -> None:
        """The run finished (completed, stopped, or stopped early)."""


class RoundLogWriter(RunCallback):
    """``rounds.jsonl``: each evaluation's record, appended as it happens."""

    def __init__(self, log_file: runs.RoundLog) -> None:
        self.log_file = log_file

    def evaluated(self, record: dict[str, Any], graphs: torch.Tensor | None) -> None:
        self.log_file.append(record)


class Trackers(RunCallback):
    """The experiment trackers of ``tracking.backends`` (:mod:`graphfed.sim.tracking`)."""

    def __init__(self, backends: list[RunTracker], config: Any) -> None:
        self.backends, self.config = backends, config

    def begin(self, history: list[dict[str, Any]]) -> None:
        for backend in self.backends:
            backend.start(self.config, history)

    def evaluated(self, record: dict[str, Any], graphs: torch.Tensor | None) -> None:
        for backend in self.backends:
            backend.evaluation(record, graphs)

    def end(self, result: runs.RunResult) -> None:
        for backend in self.backends:
            backend.end(result)


class Progress(RunCallback):
    """A bar in a terminal; in a log (stderr not a terminal) one line per evaluation instead."""

    def __init__(self, enabled: bool, start_round: int, rounds: int, label: str, metric: str) -> None:
        self.interactive = enabled and sys.stderr.isatty()
        self.enabled, self.rounds, self.label = enabled, rounds, label
        self.metric = metric
        self.scale, self.unit = (100.0, " %") if metric == "accuracy" else (1.0, "")
        self.bar = tqdm(total=rounds, initial=start_round, desc=label, disable=not self.interactive, unit="round",
                        dynamic_ncols=True)

    def evaluated(self, record: dict[str, Any], graphs: torch.Tensor | None) -> None:
        shown = {f"{split} {self.metric}": "—" if record[f"{split}_mean"] is None
                 else f"{self.scale * record[f'{split}_mean']:.4g}{self.unit}" for split in ("val", "test")}
        if self.interactive:
            self.bar.set_postfix(shown)
        elif self.enabled:
            log.info("%s, round %d/%d: %s", self.label, record["round"], self.rounds,
                     ", ".join(f"{key} {value}" for key, value in shown.items()))

    def round_done(self, completed: int, stopping: bool) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class BestModels(RunCallback):
    """The models behind the selected round's numbers: every client's scored weights, copied at a new best and
    written with the next checkpoint (so a resumed run finds the models of the best round before it) and at the end
    (``models/best.pt``). ``note``: why the run saves none (None: it saves them)."""

    def __init__(self, simulator: Any, note: str | None) -> None:
        self.simulator, self.note = simulator, note
        self.pending: torch.Tensor | None = None

    def evaluated(self, record: dict[str, Any], graphs: torch.Tensor | None) -> None:
        if self.note is not None or self.simulator.tracker.best is not record:
            return
        weights = self.simulator.executor.evaluated_weights
        if weights is not None:
            self.pending = weights.detach().to("cpu", copy=True)

    def save(self) -> None:
        sim = self.simulator
        if sim.out_dir is None or self.pending is None:
            return  # nothing new since the last write
        fed, spec, cfg = sim.setup.federation, sim.setup.spec, sim.config
        model = {"name": cfg.model.name, "options": dict(cfg.model.options), "input_shape": list(fed.input_shape),
                 "output_dim": fed.output_dim, "task": fed.task, "dataset": fed.name, "method": cfg.method.name,
                 "param_names": spec.names, "param_shapes": [list(tensor.shape) for tensor in spec.tensors],
                 "inputs": deployment_inputs(fed), "outputs": deployment_outputs(fed),
                 **base_record(sim.setup.clients.model)}
        runs.save_models(sim.out_dir, self.pending, fed.client_names, sim.tracker.best["round"], model)
        self.pending = None

    def end(self, result: runs.RunResult) -> None:
        self.save()


def base_record(model: torch.nn.Module) -> dict[str, Any]:
    """An adapter model's frozen base (``base_state``: every buffer the clients share, saved once) and where it came
    from (``base``: the ``model.base`` file's record); nothing for a model without one."""
    names = getattr(model, "base_names", ())
    if not names:
        return {}
    return {"base_state": {name: model.get_buffer(name).detach().to("cpu", copy=True) for name in names},
            **({"base": model.base_record} if hasattr(model, "base_record") else {})}


def deployment_inputs(fed: Federation) -> dict[str, Any]:
    """What lies between a raw row and a client's network: ``dataset.standardize``'s statistics (``[N, F]`` float64,
    every client's row) and the features' names."""
    scaling = fed.input_scaling
    inputs: dict[str, Any] = {"standardize": "none" if scaling is None else scaling.how,
                              "feature_names": list(fed.feature_names) if fed.feature_names else None}
    if scaling is not None:
        inputs.update(mean=scaling.mean.to("cpu", torch.float64), spread=scaling.spread.to("cpu", torch.float64))
    return inputs


def deployment_outputs(fed: Federation) -> dict[str, Any]:
    """What lies between a client's network and its answer: the task, the class names, and the declared target
    units (data units per stored unit and their name; both or neither, as every table converts)."""
    declared = fed.target_scale is not None and fed.target_units is not None
    return {"task": fed.task, "class_names": list(fed.class_names) if fed.class_names else None,
            **({"alphabet": fed.alphabet} if fed.alphabet else {}),
            "target_scale": fed.target_scale if declared else None,
            "target_units": fed.target_units if declared else None}


class Checkpointer(RunCallback):
    """The checkpoint policy: every ``every`` rounds, after the last round and at an early stop; the best models
    are written with it."""

    def __init__(self, simulator: Any, out_dir: Path, every: int, best_models: BestModels) -> None:
        self.simulator, self.out_dir, self.every, self.best_models = simulator, out_dir, every, best_models

    def round_done(self, completed: int, stopping: bool) -> None:
        if completed % self.every == 0 or completed == self.simulator.config.train.rounds or stopping:
            self.simulator.account_time()
            checkpoint.save_checkpoint(self.out_dir, checkpoint.state_of(self.simulator, completed))
            self.best_models.save()


__all__ = ["BestModels", "Checkpointer", "Progress", "RoundLogWriter", "RunCallback", "Tracker", "Trackers",
           "evaluation_record", "finite", "mean_std", "row_standard_error"]
