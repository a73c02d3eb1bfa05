"""Typed run configuration, validated once at the edge (YAML file + ``--set`` overrides)."""

from __future__ import annotations

import importlib.resources
import math
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator

from graphfed.errors import ConfigError  # defined with the other user-facing errors; importable from here too


def printable(text: str) -> str:
    """``text`` with control characters (newlines, terminal escapes, ...) shown as escapes: what users' files
    and names contain is echoed as one printable line, never interpreted by a terminal."""
    return "".join(c if unicodedata.category(c)[0] != "C" else c.encode("unicode_escape").decode() for c in text)


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: ``1e-5`` is a number (YAML 1.1 asks for ``1.0e-5`` and PyYAML
    reads ``1e-5`` as text, which the strict config would then refuse)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+][0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def read_yaml(text: str) -> Any:
    """YAML text as Python values, safely (no tags that build objects), with YAML 1.2 floats."""
    return yaml.load(text, Loader=_YamlLoader)


class _Strict(BaseModel):
    # Strict types: lax coercion would read YAML's `true` as the integer 1 (train.rounds=true ran one round) and the
    # quoted text "0.7" as a number; a number field takes a number (an integer where a float belongs is fine), a
    # boolean a boolean, text text.
    # no protected namespace: pydantic before 2.10 warns of fields named model_* (privacy.model_selection)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, protected_namespaces=())


#: a float inside a container that YAML gives as a list (the container is lax, its items strict)
StrictNumber = Annotated[float, Strict()]


def _names_as_text(names: Any) -> Any:
    """Client names given as YAML numbers (``[3, 17]``: FL-60's clients are named 0..59) are their text; an empty
    list names no client (the same as leaving the field unset)."""
    if isinstance(names, list) and not names:
        return None
    if isinstance(names, list):
        return [str(name) if isinstance(name, int) and not isinstance(name, bool) else name for name in names]
    return names


class DatasetConfig(_Strict):
    name: str = Field(default="fl60", description="a registered dataset (graphfed list), or folder for your own")
    num_clients: int | None = Field(default=None, ge=2, description="for generated/partitioned datasets")
    partition: Literal["iid", "pathological", "dirichlet"] = Field(
        default="dirichlet", description="partitioned datasets: how rows are dealt to clients")
    dirichlet_beta: float = Field(default=0.5, gt=0, description="partition=dirichlet: label-share concentration "
                                  "(smaller: more skewed clients)")
    classes_per_client: int = Field(default=2, ge=1, description="partition=pathological: labels each client holds")
    labels: Literal["fine", "coarse"] = Field(default="fine", description="cifar100: its 100 fine classes or its 20 "
                                              "coarse superclasses")
    window: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}\.\.\d{4}-\d{2}-\d{2}$",
                               description="metr-la / pems-bay: the days used, FIRST..END (END excluded), e.g. "
                               "2012-03-01..2012-03-08 (default: the whole recording)")
    min_samples_per_client: int = Field(default=10, ge=1, description="digits, partition=dirichlet: the fewest "
                                        "rows a client gets (moved to it from the largest client)")
    client_fraction: float | None = Field(default=None, gt=0.0, le=1.0, description="partitioned datasets: each "
                                          "client keeps this share of all rows (FLHA-GHN's 'local data %'; the "
                                          "partition decides which labels, this how many); default: all rows dealt")
    split: tuple[StrictNumber, StrictNumber, StrictNumber] = Field(default=(0.7, 0.1, 0.2), strict=False,
                                                                   description="train/val/test shares of each client")
    split_mode: Literal["random", "chronological"] = Field(
        default="random", description="how each client's rows are split: shuffled, or in time order (time series)")
    novel_fraction: float = Field(default=0.0, ge=0.0, lt=1.0, description="share of clients held out of training "
                                  "(novel clients), drawn from the seed")
    novel_clients: list[str] | None = Field(default=None, description="the novel clients by name "
                                            "(instead of novel_fraction): the same clients under every seed")
    graph: Literal["given", "none", "knn"] = Field(default="given", description="the client graph methods read: "
                                                   "the dataset's own (given), none (graph methods infer one from "
                                                   "updates), or knn over the clients' data summaries")
    graph_k: int = Field(default=5, ge=1, description="graph=knn: neighbours per client")
    data_dir: str | None = Field(default=None, description="default: $GRAPHFED_DATA, else the per-user data folder "
                                 "(platformdirs; ~/.local/share/graphfed on Linux), where graphfed data fetch puts "
                                 "datasets")
    graph_knn: int = Field(default=0, ge=0, description="fl60/fln: link each client to its k nearest clients by "
                           "angle, a sparse graph for large N (0 = the paper's dense Bernoulli graph)")
    graph_threshold: float = Field(default=0.1, ge=0.0, le=1.0, description="weighted client graphs (metr-la-week):"
                                   " drop edges whose kernel weight is below this (DCRNN's normalized_k)")
    plays: list[str] | None = Field(default=None, description="shakespeare: the plays whose roles are clients "
                                    "(default: every play; names as graphfed inspect lists them, e.g. hamlet)")
    novel_plays: list[str] | None = Field(default=None, description="shakespeare: plays whose roles are all held "
                                          "out of training (novel clients: new speakers in an unseen play)")
    text_stride: int = Field(default=1, ge=1, description="shakespeare: take every s-th 80-character window of a "
                             "role (LEAF takes every one: 1; larger thins the samples for a small budget)")
    standardize: Literal["none", "client", "pooled"] = Field(
        default="none", description="scale each input feature to mean 0 and std 1, for raw features of very "
        "different scales (graphfed inspect flags them): pooled (by every training client's rows together: the "
        "better choice for a shared model, which then still sees how clients differ; refused under DP) or client "
        "(each client by its own training rows: nothing leaves it, so it holds under DP, but a column constant within "
        "a client becomes 0 and what differs between clients is scaled away)")

    _novel_names = field_validator("novel_clients", mode="before")(_names_as_text)

    @model_validator(mode="after")
    def _one_way_to_hold_out(self) -> DatasetConfig:
        if self.novel_clients is not None and self.novel_fraction > 0:
            raise ValueError("dataset.novel_clients and dataset.novel_fraction both choose novel clients; set one "
                             "(e.g. dataset.novel_fraction=0 beside the names)")
        if self.novel_clients is not None and len(set(self.novel_clients)) != len(self.novel_clients):
            raise ValueError("dataset.novel_clients names a client twice")
        return self

    @field_validator("split")
    @classmethod
    def _split_sums_to_one(cls, split: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(part < 0 for part in split) or abs(sum(split) - 1.0) > 1e-6 or split[0] <= 0 or split[2] <= 0:
            raise ValueError("train/val/test fractions must be non-negative, train and test > 0, summing to 1")
        return split

    def resolved_data_dir(self) -> Path:
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        from graphfed.paths import user_data_dir

        return user_data_dir()


class ModelConfig(_Strict):
    name: str = Field(default="mlp", description="a registered model (graphfed list)")
    options: dict[str, Any] = Field(default_factory=dict, description="the model factory's keyword options")
    architectures: list[str] | None = Field(
        default=None, min_length=1, description="heterogeneous clients: values of the model's 'arch' option, "
        "assigned to clients round-robin (client i gets architectures[i % len]) unless architecture_of is given")
    architecture_of: list[str] | None = Field(
        default=None, min_length=1, description="each client's architecture, one entry per client (each one of "
        "architectures)")
    base: str | None = Field(default=None, description="a pretrained base (graphfed pretrain writes one): its "
                             "weights are the frozen base every client shares under model.options.adapter, else "
                             "every client's starting weights")

    @model_validator(mode="after")
    def _assignment_is_among_architectures(self) -> ModelConfig:
        if self.architecture_of is not None:
            if self.architectures is None:
                raise ValueError("model.architecture_of needs model.architectures (the architectures it names)")
            unknown = sorted(set(self.architecture_of) - set(self.architectures))
            if unknown:
                raise ValueError(f"model.architecture_of names {unknown}, which model.architectures does not list")
        if self.architectures is not None and len(set(self.architectures)) != len(self.architectures):
            raise ValueError("model.architectures lists an architecture twice")
        if self.base is not None and self.architectures is not None:
            raise ValueError("model.base is one network's pretrained weights; it does not apply to model.architectures")
        return self


class MethodConfig(_Strict):
    name: str = Field(default="panacea", description="a registered method (graphfed list)")
    options: dict[str, Any] = Field(default_factory=dict, description="the method's options (its reference "
                                    "page, graphfed describe METHOD)")


class ClockConfig(_Strict):
    """The simulated clock (``train.clock``): how long each client's local training takes, and when it can train."""

    step_seconds: float = Field(default=1.0, gt=0, description="seconds one local SGD step takes on a client of "
                                "speed 1 (a dispatch's work is train.local_steps steps)")
    speed_spread: float = Field(default=1.0, ge=1.0, description="how far client speeds spread: speeds are "
                                "lognormal (seeded), and this is the ratio of the 95th to the 5th percentile (1: "
                                "every client as fast; 10: the slowest twentieth ten times slower than the fastest)")
    availability: float = Field(default=1.0, gt=0.0, le=1.0, description="the share of time each client is "
                                "online: on for that share of every period_seconds, at a seeded phase per client; a "
                                "client offline pauses its training and is not dispatched (1: always online)")
    period_seconds: float = Field(default=600.0, gt=0, description="availability: the length of one on/off cycle")
    server_seconds: float = Field(default=0.0, ge=0, description="seconds each server step takes")


class TrainConfig(_Strict):
    rounds: int = Field(default=200, ge=1, description="communication rounds")
    clients_per_round: int = Field(default=5, ge=1, description="S, clients sampled per round")
    local_steps: int = Field(default=50, ge=1, description="K_c, client SGD steps per round")
    batch_size: int = Field(default=64, ge=1, le=65536, description="rows per mini-batch (drawn with replacement; "
                            "above 65,536 the per-round index draws alone take gigabytes)")
    lr: float = Field(default=0.05, gt=0, description="client SGD learning rate")
    eval_every: int = Field(default=10, ge=1, description="rounds between evaluations (and the last round)")
    checkpoint_every: int = Field(default=50, ge=1, description="rounds between checkpoints (--resume continues "
                                  "from the last)")
    novel_adapt_rounds: int = Field(default=20, ge=0, description="embedding-only adaptation rounds")
    late_clients: int = Field(default=0, ge=0, description="clients that join late (pFedGAT Sec. 5.3): this many "
                              "training clients, drawn from the seed, are sampled only from round join_round on")
    join_round: int = Field(default=1, ge=1, description="late_clients: the first round (1-based) that samples them")
    device: str = Field(default="auto", pattern=r"^(auto|cpu|mps|cuda(:[0-9]+)?)$",
                        description="where data, models and server state live: auto (CUDA, then MPS, else the CPU), "
                                    "cpu, cuda, cuda:N or mps; a device this machine lacks is an error, never a "
                                    "silent fallback")
    client_data: Literal["auto", "device", "host"] = Field(
        default="auto", description="where the clients' rows live on an accelerator: device (all on it; a "
        "federation that does not fit is an error), host (in host memory, each mini-batch and evaluation block "
        "staged in pinned memory and copied over as it is read: for data larger than the device, at the cost of "
        "the copies), or auto (device when the rows fit in 80% of its free memory, else host); the numbers are "
        "the same either way")
    precision: Literal["fp32", "tf32", "bf16"] = Field(
        default="fp32", description="fp32 (full fp32 everywhere: a GPU agrees with the CPU to float rounding), tf32 "
        "(CUDA convolutions and matmuls on TF32 tensor cores, their inputs rounded to 10-bit mantissas: faster on "
        "Ampere and later GPUs; the same as fp32 on a CPU), or bf16 (the clients' forward and backward under "
        "autocast); weights, updates and server state stay fp32")
    deterministic: bool = Field(default=False, description="deterministic algorithms only "
                                "(torch.use_deterministic_algorithms): the same numbers on the same GPU, at some "
                                "speed; CPU runs are deterministic either way")
    metrics: list[Literal["balanced_accuracy", "macro_f1", "auroc", "auprc", "sensitivity", "specificity", "rmse",
                          "mae", "accuracy", "mse"]] = Field(default_factory=list, description="metrics scored per "
                                          "client beside accuracy / MSE (always scored; naming them is allowed), by "
                                          "scikit-learn from each client's predictions: "
                                          "balanced_accuracy, macro_f1, auroc, auprc (binary, or one-vs-rest "
                                          "macro), sensitivity, specificity (binary, at train.threshold); rmse, mae")
    threshold: float = Field(default=0.5, gt=0.0, lt=1.0, description="binary tasks: the probability of class 1 "
                             "above which a row counts as positive (sensitivity, specificity)")
    select_by: str | None = Field(default=None, description="the validation metric that picks the reported round: "
                                  "accuracy / mse (default) or one of train.metrics")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="simulated faults: the probability that a "
                           "selected client's upload is lost in a round (seeded; the client still trained and keeps "
                           "its state, the server never sees its update); summary.json counts lost_uploads")
    stragglers: float = Field(default=0.0, ge=0.0, lt=1.0, description="simulated faults: the share of training "
                              "clients (drawn from the seed) whose uploads arrive straggler_delay rounds late; a "
                              "method that cannot use a late upload loses it; summary.json counts late_uploads")
    straggler_delay: int = Field(default=1, ge=0, description="stragglers: rounds an upload arrives late (0: it never "
                                 "arrives)")
    patience: int | None = Field(default=None, ge=1, description="early stopping: stop after this many evaluations "
                                 "in a row without a validation score better than the best by more than min_delta "
                                 "(default: never stop early)")
    min_delta: float = Field(default=0.0, ge=0.0, description="early stopping: the least validation improvement that "
                             "counts (in the metric's units: 0.01 = one accuracy point)")
    autotune: bool = Field(default=True, description="measure at run start how many clients train at once fastest "
                           "on this machine (convolutional models; cached per shape and device, recorded in the "
                           "summary's execution); false: each model's declared chunk size")
    clients_per_chunk: int | None = Field(default=None, ge=1, description="pin how many clients train at once "
                                          "(overrides autotune; e.g. to reproduce another machine's run exactly)")
    server_mode: Literal["sync", "fedbuff", "fedasync"] = Field(
        default="sync", description="sync (each round waits for its slowest client), fedbuff (Nguyen et al. 2022: "
        "concurrency clients train at once; the server steps each time buffer_size updates have arrived, each "
        "weighted by the staleness function of how many server steps old its model is) or fedasync (Xie et al. "
        "2019: the global model mixes with every arriving client model, at mixing times the staleness weight); "
        "asynchronous modes count a round as one server step")
    concurrency: int | None = Field(default=None, ge=1, description="fedbuff / fedasync: clients training at once "
                                    "(default: twice the buffer, at most every training client)")
    buffer_size: int | None = Field(default=None, ge=1, description="fedbuff: updates per server step, K (default: "
                                    "clients_per_round)")
    staleness: Literal["polynomial", "constant"] = Field(
        default="polynomial", description="fedbuff / fedasync: an update tau server steps old weighs (1 + tau) ** "
        "-staleness_exponent (polynomial; FedBuff's 1 / sqrt(1 + tau) at 0.5) or 1 (constant)")
    staleness_exponent: float = Field(default=0.5, ge=0, description="staleness=polynomial: the exponent")
    mixing: float = Field(default=0.6, gt=0, le=1, description="fedasync: alpha, the weight of an arriving model "
                          "of staleness 0 (Xie et al.'s mixing hyperparameter)")
    clock: ClockConfig = Field(default_factory=ClockConfig, description="the simulated clock: client speeds and "
                               "availability; rounds.jsonl records sim_seconds")
    target_score: float | None = Field(default=None, description="a test score (accuracy as a fraction, or MSE) "
                                       "whose first reach summary.json times: time_to_target, in simulated seconds "
                                       "and rounds (at evaluated rounds, so within train.eval_every)")
    time_budget: float | None = Field(default=None, gt=0, description="stop once the simulated clock reaches this "
                                      "many seconds (after the round that reaches it, which is evaluated): "
                                      "accuracy at a fixed time")
    conv_kernel: Literal["auto", "loop", "vmap", "grouped", "unfold"] = Field(
        default="auto", description="how convolutional models run many clients' convolutions: loop (one client "
        "after another), vmap (torch.func.vmap), grouped (one grouped convolution, channels-last) or unfold (im2col "
        "and one batched matrix product per layer: tensor-core GEMMs at tf32/bf16); auto: the model's default on a "
        "CPU, measured with autotune on an accelerator (cached, recorded in the summary's execution). All give the "
        "same numbers up to float rounding; a model offers only some (an error names them)")

    @model_validator(mode="after")
    def _select_by_a_scored_metric(self) -> TrainConfig:
        if self.select_by is not None and self.select_by not in ("accuracy", "mse", *self.metrics):
            raise ValueError(f"train.select_by: {self.select_by!r} is not scored; use accuracy, mse or one of "
                             f"train.metrics ({', '.join(self.metrics) or 'none given'})")
        return self

    @model_validator(mode="after")
    def _asynchronous_settings_need_an_asynchronous_mode(self) -> TrainConfig:
        if self.server_mode == "sync":
            given = [name for name in ("concurrency", "buffer_size") if getattr(self, name) is not None]
            if given:
                raise ValueError(f"train.{given[0]}: only asynchronous rounds use it; set train.server_mode to fedbuff "
                                 f"or fedasync, or leave it unset")
            return self
        if self.server_mode == "fedasync" and self.buffer_size not in (None, 1):
            raise ValueError("train.buffer_size: fedasync steps on every arrival (a buffer of 1); use "
                             "server_mode=fedbuff for a buffer")
        faults = [name for name in ("dropout", "stragglers", "late_clients") if getattr(self, name)]
        if faults:
            raise ValueError(f"train.{faults[0]}: asynchronous rounds model slow and absent clients with "
                             f"train.clock (speed_spread, availability); the per-round faults apply to sync rounds")
        return self

    @model_validator(mode="after")
    def _late_clients_join_during_the_run(self) -> TrainConfig:
        if self.late_clients and not 1 < self.join_round <= self.rounds:
            raise ValueError(f"train.join_round: late clients must join after round 1 and by the last round "
                             f"({self.rounds}); got {self.join_round}")
        return self


class FlowerConfig(_Strict):
    """Settings of the Flower engine (ignored by the simulator)."""

    round_timeout: float = Field(default=600.0, gt=0, description="seconds to wait for a round's replies")
    query_timeout: float = Field(default=60.0, gt=0, description="seconds to wait for nodes' client ids")
    min_nodes: int | None = Field(default=None, ge=1, description="nodes to wait for before round 1 "
                                  "(default: one per client)")
    node_wait_timeout: float = Field(default=300.0, ge=0, description="seconds to wait for min_nodes")
    client_cpus: float = Field(default=1.0, gt=0, description="Flower's simulation engine: CPU cores each virtual "
                               "node's ClientApp reserves (client-resources-num-cpus)")
    client_gpus: float = Field(default=0.0, ge=0, description="Flower's simulation engine: the share of a GPU each "
                               "virtual node reserves (client-resources-num-gpus; 0.25 = four nodes per GPU)")
    min_replies: int | None = Field(default=None, ge=1, description="partial cohorts: a training round whose "
                                    "replies are fewer than this (or than the clients it asked, if fewer) stops the "
                                    "run with status 'stopped: ...' and its last checkpoint kept, to resume; default: "
                                    "a round completes with whatever arrived before round_timeout")
    async_evaluation_wait: float = Field(default=3.0, ge=1.0, description="asynchronous rounds (train.server_mode "
                                         "fedbuff / fedasync): an evaluation stops waiting for a node silent (no "
                                         "reply to its training in flight or to the evaluation) for this multiple "
                                         "of the nodes' median training reply time, and scores without it, so a "
                                         "stopped node holds no evaluation up")
    checkpoint_every: int = Field(default=1, ge=1, description="rounds between the ServerApp's checkpoints (a "
                                  "deployment resumes from the last one; train.checkpoint_every is the simulator's)")
    secure_aggregation: bool = Field(default=False, description="SecAgg+ (Flower's legacy workflow): the server "
                                     "sees only the weighted mean of the updates; FedAvg-family methods with every "
                                     "client in every round (graphfed flower-app writes the secure app)")
    secagg_clipping_range: float = Field(default=8.0, gt=0, description="SecAgg+: update values are clipped to "
                                         "[-range, range] before quantisation")
    secagg_quantization_range: int = Field(default=2**22, ge=2, le=2**30, description="SecAgg+: levels each value "
                                           "is quantised to (the mean is exact to 2 * clipping_range / this)")
    writer_wait: float = Field(default=30.0, ge=0, description="seconds a ServerApp waits for another ServerApp "
                               "of the same run to end before it refuses (one writer per run; a ServerApp ending "
                               "with its SuperLink takes a moment to let go)")
    resume: Literal["auto", "never"] = Field(default="auto", description="auto: a ServerApp started on a results "
                                             "folder that holds an unfinished run of this config continues it from "
                                             "its checkpoint; never: it starts again at round 1")


class PrivacyConfig(_Strict):
    """Client-level differential privacy (``graphfed.client.privacy``); off by default."""

    mechanism: Literal["none", "local", "central"] = Field(default="none", description="local: each client clips and "
                                                           "noises its upload; central: a trusted server clips each "
                                                           "upload and noises their sum (Poisson client sampling)")
    clip_norm: float = Field(default=1.0, gt=0, description="L2 bound of one client's update per round (.inf: none)")
    noise_multiplier: float | None = Field(default=None, ge=0, description="noise std / clip_norm (or give "
                                           "target_epsilon)")
    target_epsilon: float | None = Field(default=None, gt=0, description="the epsilon the run may spend: the noise "
                                         "multiplier is calibrated for the planned rounds")
    delta: float | None = Field(default=None, gt=0, lt=1, description="default: 0.1 / number of training clients")
    accountant: Literal["pld", "rdp"] = Field(default="pld", description="dp-accounting's privacy loss "
                                              "distributions (tight) or Renyi DP (an upper bound)")
    adaptive_quantile: float | None = Field(default=None, gt=0, lt=1, description="central: adapt the clip each "
                                            "round towards this quantile of the update norms (Andrew et al., 2021), "
                                            "clip_norm being the first round's clip; the noised count it needs is "
                                            "accounted for")
    clip_learning_rate: float = Field(default=0.2, gt=0, description="adaptive clipping: the geometric step, "
                                      "clip <- clip * exp(-rate * (share under the clip - quantile))")
    quantile_noise: float | None = Field(default=None, gt=0, description="adaptive clipping: std of the noise on "
                                         "the count of clients under the clip (default: expected clients / 20, at "
                                         "least what keeps the count to a tenth of the noise budget)")
    neighbours: Literal["zero_out", "replace_one", "add_remove"] | None = Field(
        default=None, description="which federations the guarantee tells apart. local: zero_out (default; a "
        "client's upload against the same client holding no data, sensitivity clip_norm) or replace_one (any two "
        "uploads of a client, sensitivity 2 x clip_norm: twice the noise for the same epsilon); central: "
        "add_remove (the federation with and without one client)")
    reproducible_noise: bool = Field(default=False, description="draw the noise and the Poisson sampling from the "
                                     "run's seed (the numbers repeat): anyone who reads the seed removes the noise, "
                                     "so the run protects nobody; simulation research only, refused on Flower")
    model_selection: Literal["last", "validation"] = Field(
        default="last", description="which round's models a private run reports and saves: last (inside the "
        "guarantee) or validation (the best validation round, which early stopping needs; that choice reads the "
        "clients' validation scores outside the mechanism, and the summary says so)")

    @model_validator(mode="after")
    def _one_noise_source(self) -> PrivacyConfig:
        if self.mechanism != "none" and (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError(f"privacy.mechanism={self.mechanism}: give exactly one of privacy.noise_multiplier and "
                             f"privacy.target_epsilon")
        if self.adaptive_quantile is not None and self.mechanism != "central":
            raise ValueError("privacy.adaptive_quantile: adaptive clipping needs mechanism central (the server "
                             "counts the clients under the clip)")
        if self.adaptive_quantile is not None and math.isinf(self.clip_norm):
            raise ValueError("privacy.adaptive_quantile: give a finite clip_norm to start from")
        allowed = {"local": ("zero_out", "replace_one"), "central": ("add_remove",)}.get(self.mechanism, ())
        if self.neighbours is not None and self.neighbours not in allowed:
            raise ValueError(f"privacy.neighbours: {self.neighbours} does not apply to mechanism {self.mechanism}; "
                             f"allowed: {', '.join(allowed) or 'none (privacy is off)'}")
        return self


#: attacks that rewrite what a malicious client uploads (``attacks.poisoning``); the others rewrite its training data
UPDATE_ATTACKS = ("model_poisoning", "sign_flip", "scaling", "gaussian_noise")
DATA_ATTACKS = ("label_flip", "backdoor")


class AttackConfig(_Strict):
    """Malicious clients (``graphfed.attacks``): which behaviour, and which training clients behave so."""

    kind: Literal["none", "label_flip", "model_poisoning", "sign_flip", "scaling", "gaussian_noise",
                  "backdoor"] = Field(default="none", description="what a malicious client does (none: no attack)")
    fraction: float = Field(default=0.0, ge=0.0, le=0.5, description="share of the training clients that are "
                            "malicious (rounded to the nearest count; drawn from the run seed)")
    count: int | None = Field(default=None, ge=0, description="exact number of malicious clients (instead of "
                              "fraction; the backdoor study uses 1)")
    clients: list[str] | None = Field(default=None, description="the malicious clients by name (instead of "
                                      "fraction and count)")
    flip: Literal["reverse", "permutation"] = Field(default="reverse", description="label_flip: y -> C-1-y, or a "
                                                    "fixed seeded permutation of the classes without fixed points")
    poison_lambda: float = Field(default=0.5, gt=0, description="model_poisoning: upload g' = -lambda * g")
    scale: float = Field(default=10.0, gt=0, description="scaling: upload g' = scale * g")
    noise_std: float = Field(default=0.1, gt=0, description="gaussian_noise: upload g' ~ N(0, noise_std^2 I)")
    target: int = Field(default=1, ge=0, description="backdoor: the label triggered inputs are relabelled to")
    blend: float = Field(default=0.2, gt=0, lt=1, description="backdoor: x' = (1 - blend) * x + blend * trigger")
    poison_rate: float = Field(default=0.5, gt=0, le=1, description="backdoor: share of an attacker's training "
                               "rows that carry the trigger")

    _client_names = field_validator("clients", mode="before")(_names_as_text)

    @model_validator(mode="after")
    def _one_way_to_choose(self) -> AttackConfig:
        if self.clients is not None and self.count is not None:
            raise ValueError("attack.clients and attack.count both choose the malicious clients; set one")
        if self.clients is not None and len(set(self.clients)) != len(self.clients):
            raise ValueError("attack.clients names a client twice")
        return self


class DefenseConfig(_Strict):
    """Client-side defences (robust server aggregation is an option of the FedAvg family: method.options)."""

    simple_tuning: bool = Field(default=False, description="Simple-Tuning (Qin et al. 2023): before evaluation, "
                                "each trained client re-initialises its classifier layer and retrains it alone on "
                                "its training rows")
    tuning_steps: int | None = Field(default=None, ge=1, description="Simple-Tuning steps (default: the local "
                                     "step count)")
    tuning_lr: float | None = Field(default=None, gt=0, description="Simple-Tuning lr (default: the client lr)")


class TrackingConfig(_Strict):
    """Experiment trackers the round loop reports to (``graphfed.sim.tracking``)."""

    backends: list[Literal["csv", "tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=lambda: ["csv"], description="csv (metrics.csv in the run directory), tensorboard "
        "(<run>/tensorboard), mlflow (tracking.mlflow_uri, default a SQLite store, <run>/mlflow.db), wandb "
        "(Weights & Biases, <run>/wandb)")
    mlflow_uri: str | None = Field(default=None, description="an MLflow tracking server or store URI")
    experiment: str = Field(default="graphfed", min_length=1, description="the MLflow experiment's / W&B project's "
                            "name")
    wandb_mode: Literal["offline", "online"] = Field(default="offline", description="W&B: offline (no account; "
                                                     "`wandb sync <run>/wandb/...` uploads later) or online")


class RunConfig(_Strict):
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="seeds data, models and sampling end to end "
                      "(never the privacy noise)")
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    method: MethodConfig = Field(default_factory=MethodConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    flower: FlowerConfig = Field(default_factory=FlowerConfig)
    attack: AttackConfig = Field(default_factory=AttackConfig)
    defense: DefenseConfig = Field(default_factory=DefenseConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    torch_threads: int | None = Field(default=None, ge=1, description="CPU threads torch uses (default: "
                                      "torch's own choice, or 1 where a start-of-run measurement finds that "
                                      "faster; the run's config.yaml records the count); at 1, clients of a "
                                      "network that runs its clients one by one (BatchNorm) train side by side "
                                      "on every core, with the same numbers")

    @model_validator(mode="after")
    def _names_exist(self) -> RunConfig:
        # The registries (datasets, models, methods) import this module, so it imports none of them: they add
        # their checks with register_name_check (graphfed/__init__.py does, for graphfed.registries).
        for check in NAME_CHECKS:
            check(self)
        if (self.privacy.mechanism != "none" and self.privacy.model_selection == "last"
                and self.train.patience is not None):
            raise ValueError("train.patience: early stopping reads the clients' validation scores, outside the "
                             "privacy mechanism; unset it, or set privacy.model_selection=validation (the summary "
                             "then says the choice of round is outside the guarantee)")
        if self.privacy.mechanism != "none" and self.dataset.standardize == "pooled":
            raise ValueError("dataset.standardize=pooled: pooling every client's feature means and spreads reads "
                             "their raw rows outside the privacy mechanism; use dataset.standardize=client (each "
                             "client scales by its own training rows, nothing leaves it)")
        if self.model.architectures is not None and self.defense.simple_tuning:
            raise ValueError("defense.simple_tuning: clients of different architectures have no shared "
                             "classifier layer to re-initialise (FLHA-GHN's inference already refines the head)")
        return self


def runs_on_a_clock(config: RunConfig) -> bool:
    """Whether simulated time is what the run is about (asynchronous rounds, a clock set, a time budget or target):
    its curves are then drawn against ``sim_seconds`` too."""
    train = config.train
    return (train.server_mode != "sync" or train.clock != ClockConfig() or train.time_budget is not None
            or train.target_score is not None)


#: checks of a config's names against the registries, run on every validated config (see register_name_check)
NAME_CHECKS: list[Callable[[RunConfig], None]] = []


def register_name_check(check: Callable[[RunConfig], None]) -> None:
    """Run ``check(config)`` on every validated config; it raises ValueError naming the field (one line)."""
    if check not in NAME_CHECKS:
        NAME_CHECKS.append(check)


def shown_default(info: Any) -> str:
    """A pydantic field's default as ``graphfed list``, ``describe`` and the docs print it ("—" for none; a default
    factory's value, not pydantic's placeholder)."""
    value = info.get_default(call_default_factory=True)
    return "—" if value is None else repr(value)


def given(value: Any) -> str:
    """What a wrong-typed value was, for an error message: "the boolean true", "the text '0.5'"..."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the text {printable(value)[:60]!r}"
    if value is None:
        return "nothing (null)"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{type(value).__name__} {printable(repr(value))[:60]}"


def error_message(error: Any) -> str:
    """One pydantic error as a sentence; a wrong type also says what was given."""
    message = error["msg"].removeprefix("Value error, ")
    if error["type"].endswith("_type") and "input" in error:
        message = f"{message}, got {given(error['input'])}"
    return message


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    message = error_message(first)
    if first["type"] == "extra_forbidden":
        parent = first["loc"][:-1]
        model: type[BaseModel] = RunConfig
        for part in parent:
            annotation = model.model_fields[str(part)].annotation
            model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else model
        message = f"unknown field; allowed: {', '.join(model.model_fields)}"
    if first["type"] == "literal_error":
        message = f"{message} (got {first['input']!r})"
    return f"{field}: {message}" if field else message


def parse_override(text: str, flag: str = "--set", example: str = "train.rounds=100") -> tuple[list[str], Any]:
    """``a.b=v`` -> (["a", "b"], v) with ``v`` parsed as YAML (numbers, booleans, lists)."""
    if "=" not in text:
        raise ConfigError(f"{flag} {text!r}: expected KEY=VALUE, e.g. {example}")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    if not all(part.strip() for part in keys):
        raise ConfigError(f"{flag} {printable(text)!r}: the key has an empty part, e.g. {example}")
    try:
        value = read_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as error:
        reason = printable(str(error).splitlines()[0]) if str(error) else type(error).__name__
        raise ConfigError(f"{flag} {printable(text)!r}: the value is not valid YAML ({reason}); quote it or fix "
                          f"its brackets, e.g. {example}") from None
    except RecursionError:
        raise ConfigError(f"{flag} {printable(text)[:80]!r}: the value is nested too deeply") from None
    return keys, value


#: short names of the configs shipped inside the package (``graphfed run demo``)
CONFIG_ALIASES = {"demo": "demo_fl60.yaml", "flha": "flha_cifar10.yaml"}


def packaged_configs() -> dict[str, Path]:
    """The configs shipped inside the package: file name -> path (they work from an installed wheel anywhere)."""
    folder = Path(str(importlib.resources.files("graphfed") / "configs"))
    return {path.name: path for path in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}


def packaged_config(name: str | Path) -> Path | None:
    """The packaged config ``name`` means (``demo``, ``demo_fl60``, ``demo_fl60.yaml``, ``configs/demo_fl60.yaml``),
    or None."""
    given = Path(name)
    if given.parent not in (Path("."), Path("configs")):
        return None
    file = CONFIG_ALIASES.get(str(name), given.name if given.suffix else f"{given.name}.yaml")
    return packaged_configs().get(file)


def resolve_config_path(path: str | Path) -> Path:
    """``path`` when it is a file; else the packaged config it names, so the docs' commands work from an
    installed wheel in an empty folder."""
    given = Path(path)
    return given if given.is_file() else (packaged_config(path) or given)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config (a file, or a packaged config by name: :func:`resolve_config_path`; or start from
    defaults), apply ``--set`` overrides, validate once."""
    data = read_yaml_mapping(resolve_config_path(path), "config file") if path is not None else {}
    return validate_config(apply_overrides(data, overrides or []))


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """The mapping in a YAML file (empty file: ``{}``); ConfigError naming the file if missing or malformed."""
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    try:
        loaded = read_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}); save the {what} as UTF-8") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML (nested too deeply)") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of fields")
    return loaded or {}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each ``a.b=v`` of ``overrides`` in the nested mapping ``data`` (in place; returned for chaining)."""
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: '{key}' is not a section")
        node[keys[-1]] = value
    return data


def validate_config(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_first_error(err)) from None


def without_adapter(options: dict[str, Any]) -> dict[str, Any]:
    """A model's options as its pretrained base is built (``model.options.adapter`` left out: a base has none)."""
    return {key: value for key, value in options.items() if key != "adapter"}


def same_run(recorded: RunConfig, config: RunConfig) -> bool:
    """Whether a run recorded with ``recorded`` (a checkpoint's or a run directory's config) is a run of ``config``.

    The data's location is not part of a run: a checkout or data folder moved to another machine (CI clones under
    another root) keeps its runs and checkpoints. A federation folder (``dataset.name: folder``) must keep its name."""
    return _location_free(recorded) == _location_free(config)


def _location_free(config: RunConfig) -> RunConfig:
    data_dir = config.dataset.data_dir
    kept = Path(data_dir).name if config.dataset.name == "folder" and data_dir else None
    # where a run reports to (trackers) is not part of the run either; a pretrained base is known by its file name
    # (the run records its SHA-256), wherever the folder holding it lies
    base = Path(config.model.base).name if config.model.base else None
    return config.model_copy(update={"dataset": config.dataset.model_copy(update={"data_dir": kept}),
                                     "model": config.model.model_copy(update={"base": base}),
                                     "tracking": TrackingConfig()})


#: sections written out only when they differ from their defaults: a run without an attack reads (and compares, on
#: resume) exactly as it did before these sections existed
OPTIONAL_SECTIONS = ("attack", "defense", "tracking", "privacy")


def dump_config(config: RunConfig) -> str:
    data = config.model_dump(mode="json")
    for section in OPTIONAL_SECTIONS:
        if getattr(config, section) == type(getattr(config, section))():
            del data[section]
    return yaml.safe_dump(data, sort_keys=False)
