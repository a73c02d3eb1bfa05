"""The run directory: what a run writes and what reports read (``config.yaml``, ``rounds.jsonl``,
``summary.json``, ``graphs/``), every write atomic. The checkpoint is the simulator's (``sim/checkpoint.py``)."""

from __future__ import annotations

import inspect
import io
import json
import logging
import math
import os
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from graphfed.errors import CheckpointError, RunInUseError, UntrustedInputError

log = logging.getLogger("graphfed")

ROUNDS_LOG = "rounds.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.yaml"
CHECKPOINT = "checkpoint.pt"  #: the simulator's (``sim/checkpoint.py`` writes it)
METRICS_CSV = "metrics.csv"  #: the csv tracker's (``sim/tracking.py``)
PRIVACY_LEDGER = "privacy.json"  #: a private run's releases (``client/privacy.py``)
#: what a private run measured from raw updates for the researcher alone (central DP's noise check): outside the
#: guarantee, never shared (``privacy.outside_the_guarantee`` says so)
PRIVATE_DIAGNOSTICS = "private_diagnostics.json"
STATUS = "status.json"  #: the run's fate as its writer last said it (:func:`run_writer`, ``graphfed status``)
WRITER_LOCK = ".writer.lock"  #: held by the one process writing the run (never removed: a lock file outlives it)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


class RoundLog:
    """``rounds.jsonl``: one JSON object per evaluated round, appended and flushed as it happens."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / ROUNDS_LOG

    def truncate_after(self, last_round: int) -> None:
        """Drop lines written after the checkpoint we resume from, so no round appears twice (and a last line
        torn by a crash mid-write)."""
        if not self.path.exists():
            return
        kept = [json.dumps(record) for record in self.read() if record["round"] <= last_round]
        atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))

    def reset(self) -> None:
        self.path.unlink(missing_ok=True)

    def append(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(finite_or_none(record), allow_nan=False) + "\n")
            handle.flush()

    def read(self) -> list[dict[str, Any]]:
        """The records in order. A last line without its newline is a write a crash interrupted: it is dropped.
        Anything else unreadable is an error naming the file and line."""
        if not self.path.exists():
            return []
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"{self.path}: not UTF-8 text; it was not written by graphfed") from None
        lines = text.split("\n")
        torn = lines.pop()  # "" after a final newline; otherwise a partial last record
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise CheckpointError(f"{self.path}: line {number} is not JSON ({err.msg}); fix or delete the "
                                      f"line, or start a new --out directory") from None
            if not isinstance(record, dict) or not isinstance(record.get("round"), int):
                raise CheckpointError(f"{self.path}: line {number} is not a round record")
            records.append(record)
        if torn.strip():
            log.warning("%s: dropped a torn last line (a write interrupted by a crash)", self.path)
        return records


MODELS_DIR = "models"
BEST_MODELS = "best.pt"


def save_models(out_dir: Path, weights: torch.Tensor, client_names: list[str], selected_round: int,
                model: dict[str, Any]) -> Path:
    """``models/best.pt``: every client's personalised weights ``[N, dim]`` (flat, in the model's parameter order)
    as the run scored them at ``selected_round``, with what rebuilds the network (``model``: name, options, input
    shape, output size, task, parameter names and shapes) and what deploys it (``model["inputs"]``: the feature
    scaling, ``[N, F]`` per client, and names; ``model["outputs"]``: classes, target units). Plain tensors,
    strings and numbers only, so it loads with ``torch.load(weights_only=True)``."""
    buffer = io.BytesIO()
    torch.save({"weights": weights.detach().to("cpu", torch.float32).contiguous(), "client_names": list(client_names),
                "round": int(selected_round), "model": model}, buffer)
    path = out_dir / MODELS_DIR / BEST_MODELS
    atomic_write_bytes(path, buffer.getvalue())
    return path


def load_models(run_dir: Path) -> tuple[torch.Tensor, list[str], int, dict[str, Any]]:
    """``(weights [N, dim], client names, selected round, model record)`` of ``models/best.pt``, never unpickled;
    UntrustedInputError (one line naming the file) for anything else."""
    path = run_dir / MODELS_DIR / BEST_MODELS
    if not path.is_file():
        if not (run_dir / SUMMARY).is_file():
            raise UntrustedInputError(f"{run_dir}: not a graphfed run folder (no {SUMMARY}); give the --out folder "
                                      f"of a finished run")
        note = read_result(run_dir).models_note
        raise UntrustedInputError(f"{run_dir}: the run saved no models: " + (note or "a run from an older graphfed"))
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UntrustedInputError(f"{path}: not a graphfed models file ({type(error).__name__})") from None
    weights, names, selected, model = (saved.get(key) if isinstance(saved, dict) else None
                                       for key in ("weights", "client_names", "round", "model"))
    if not (isinstance(weights, torch.Tensor) and weights.ndim == 2 and isinstance(names, list)
            and len(names) == weights.shape[0] and all(isinstance(name, str) for name in names)
            and isinstance(selected, int) and isinstance(model, dict)):
        raise UntrustedInputError(f"{path}: not a graphfed models file (weights, client_names, round, model)")
    shapes = model.get("param_shapes")
    if not isinstance(shapes, list) or sum(math.prod(shape) for shape in shapes) != weights.shape[1]:
        raise UntrustedInputError(f"{path}: the parameter shapes do not add up to the {weights.shape[1]} weights")
    if not torch.isfinite(weights).all():
        raise UntrustedInputError(f"{path}: non-finite weights")
    inputs = model.get("inputs")
    if isinstance(inputs, dict) and any(key in inputs for key in ("mean", "spread")):
        width = math.prod(int(d) for d in model.get("input_shape", []))
        if not all(isinstance(inputs.get(key), torch.Tensor) and tuple(inputs[key].shape) == (len(names), width)
                   for key in ("mean", "spread")):
            raise UntrustedInputError(f"{path}: its feature scaling is not one row of {width} values per client")
    return weights, names, selected, model


GRAPHS_DIR = "graphs"


def save_graphs(out_dir: Path, completed_rounds: int, graphs: torch.Tensor, layer_names: list[str],
                clients: torch.Tensor | None = None, client_names: list[str] | None = None,
                novel: torch.Tensor | None = None) -> Path:
    """``graphs/round_XXXX.npz``: the method's collaboration graph(s) after ``completed_rounds`` rounds.

    ``matrices`` is ``[L, N, N]`` (one per layer; L = 1 for a single client graph), ``layers`` their names.
    With ``clients`` (large federations), only those clients' rows are saved: ``matrices`` is ``[L, R, N]`` and
    ``clients [R]`` says whose rows they are. ``client_names [N]`` and the ``novel [N]`` mask label the plots.
    """
    matrices = graphs.detach().cpu().numpy()
    if matrices.ndim == 2:
        matrices = matrices[None]
    buffer = io.BytesIO()
    extra = {} if clients is None else {"clients": clients.numpy()}
    if client_names is not None:
        extra["client_names"] = np.array(client_names, dtype=str)
    if novel is not None:
        extra["novel"] = novel.numpy()
    np.savez_compressed(buffer, matrices=matrices, layers=np.array(layer_names), round=completed_rounds, **extra)
    path = out_dir / GRAPHS_DIR / f"round_{completed_rounds:04d}.npz"
    atomic_write_bytes(path, buffer.getvalue())
    return path


def load_graphs(run_dir: Path) -> list[tuple[int, list[str], np.ndarray]]:
    """All saved collaboration graphs of a run, by round: ``(round, layer names, [L, N, N])``. Where only sampled
    clients' rows were saved, the square ``[L, R, R]`` graph among those clients."""
    found = []
    for path in sorted((run_dir / GRAPHS_DIR).glob("round_*.npz")):
        try:
            with np.load(path, allow_pickle=False) as data:
                matrices = data["matrices"]
                if "clients" in data:
                    matrices = matrices[:, :, data["clients"]]
                found.append((int(data["round"]), [str(n) for n in data["layers"]], matrices))
        except (OSError, ValueError, KeyError) as err:
            raise UntrustedInputError(f"{path}: not a readable graph file ({err})") from None
    return found


def load_graph_clients(run_dir: Path) -> tuple[list[str], np.ndarray] | None:
    """The names and novel mask of the clients in a run's last saved graph (as :func:`load_graphs` orders them),
    or None for graphs saved without them."""
    paths = sorted((run_dir / GRAPHS_DIR).glob("round_*.npz"))
    if not paths:
        return None
    try:
        with np.load(paths[-1], allow_pickle=False) as data:
            if "client_names" not in data or "novel" not in data:
                return None
            names, novel = data["client_names"], data["novel"].astype(bool)
            if "clients" in data:
                names, novel = names[data["clients"]], novel[data["clients"]]
            return [str(name) for name in names], novel
    except (OSError, ValueError, KeyError) as err:
        raise UntrustedInputError(f"{paths[-1]}: not a readable graph file ({err})") from None


#: what a run writes into its folder: :func:`clear_run` removes these and nothing else the folder holds
RUN_FILES = (CONFIG, ROUNDS_LOG, SUMMARY, CHECKPOINT, METRICS_CSV, PRIVACY_LEDGER, PRIVATE_DIAGNOSTICS, STATUS)
RUN_FOLDERS = (MODELS_DIR, GRAPHS_DIR, "plots")


def describe_run(out_dir: Path) -> str | None:
    """What run ``out_dir`` holds, in words ("a finished run (fedavg, 100 rounds)"), or None when it holds none."""
    if (out_dir / SUMMARY).is_file():
        try:
            result = read_result(out_dir)
        except UntrustedInputError:
            return "a run whose summary.json cannot be read"
        state = "a finished run" if result.completed else f"a run that {result.status}"
        return f"{state} ({result.method}, {result.rounds} rounds)"
    if (out_dir / CHECKPOINT).is_file():
        return "an unfinished run (a checkpoint)"
    return None


def clear_run(out_dir: Path) -> None:
    """Remove the run in ``out_dir`` (``--overwrite``): the files and folders a run writes, nothing else; refused
    while another process writes it."""
    import shutil

    holder = writer_holding(out_dir)
    if holder is not None:
        raise RunInUseError(in_use_message(out_dir, holder))

    for name in RUN_FILES:
        (out_dir / name).unlink(missing_ok=True)
    for name in RUN_FOLDERS:
        shutil.rmtree(out_dir / name, ignore_errors=True)


# ---- one writer per run, and its fate ------------------------------------------------------------------------------
def read_status(out_dir: Path) -> dict[str, Any] | None:
    """The run's status file (None: none, or unreadable: a writer that died mid-write leaves the old one)."""
    try:
        status = json.loads((out_dir / STATUS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def write_status(out_dir: Path, state: str, **fields: Any) -> None:
    """``state``: running, completed, stopped, failed or interrupted; with what a supervisor needs beside it."""
    previous = read_status(out_dir) or {}
    starting = state == "running"
    # the folder the run was started in: a relative data_dir in its config.yaml is relative to it
    status = {"state": state, "pid": os.getpid(), "host": socket.gethostname(),
              "started": _now() if starting else previous.get("started"),
              "started_in": os.getcwd() if starting else previous.get("started_in"), "updated": _now(), **fields}
    atomic_write_text(out_dir / STATUS, json.dumps(status, indent=1) + "\n")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _writer_lock(out_dir: Path) -> FileLock:
    """The run's writer lock: the OS's (fcntl / msvcrt), never waited for. Its file is kept on release where
    filelock lets us say so: a lock file unlinked on release lets a third process lock a fresh file while a second
    still holds the old one."""
    keep = {"preserve_lock_file": True} if "preserve_lock_file" in inspect.signature(FileLock).parameters else {}
    return FileLock(str(out_dir / WRITER_LOCK), timeout=0, thread_local=False, is_singleton=False, **keep)


def writer_holding(out_dir: Path) -> dict[str, Any] | None:
    """The status of the process writing ``out_dir`` now, or None when no process holds its writer lock (a writer
    killed outright holds nothing: the operating system releases its lock)."""
    if not (out_dir / WRITER_LOCK).exists():
        return None
    probe = _writer_lock(out_dir)
    try:
        probe.acquire()
    except Timeout:
        return read_status(out_dir) or {}
    probe.release()
    return None


def in_use_message(out_dir: Path, holder: dict[str, Any]) -> str:
    who = f"pid {holder['pid']} on {holder['host']}, since {holder['started']}" if holder.get("pid") else "a process"
    return (f"{out_dir}: another process is writing this run ({who}); refused so that no round is trained twice. "
            f"Wait for it (graphfed status {out_dir} --wait) or stop it first")


class RunClaim:
    """A run folder held by its one writer (:func:`run_writer`). The run's fate is recorded from :meth:`start` on:
    what can refuse the run (a checkpoint of another config or engine, a finished run, a corrupt file) is checked
    between the claim and the start, so a refusal leaves every file of the folder as it was."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.started = False

    def start(self) -> None:
        """The run begins: ``status.json`` says ``running``, and from now on its end is recorded."""
        write_status(self.out_dir, "running")
        self.started = True


@contextmanager
def run_writer(out_dir: Path) -> Iterator[RunClaim]:
    """Hold ``out_dir`` as its one writer for the block: a second process (a second ServerApp for the same run
    after a SuperLink restart, a second ``graphfed run``) gets :class:`RunInUseError` before it reads or writes
    anything. The lock is the operating system's (``filelock``): a writer killed outright releases it. On a
    filesystem without working locks (some network mounts) it cannot protect; keep run folders local.

    The block gets the :class:`RunClaim`; once it calls :meth:`RunClaim.start` the status file says ``running``,
    the block's owner writes the final state (completed, stopped), and an exception that escapes it is written as
    ``failed`` (an interrupt as ``interrupted``). An exception before the start (a refusal) writes nothing."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = _writer_lock(out_dir)
    try:
        lock.acquire()
    except Timeout:
        raise RunInUseError(in_use_message(out_dir, read_status(out_dir) or {})) from None
    claim = RunClaim(out_dir)
    try:
        yield claim
    except KeyboardInterrupt:
        if claim.started:
            write_status(out_dir, "interrupted", reason="interrupted (Ctrl-C or SIGTERM); resume from the checkpoint")
        raise
    except GeneratorExit:  # the run's steps abandoned by whoever drove them: nothing to say about its fate
        raise
    except BaseException as err:
        if claim.started:
            first = (str(err).strip().splitlines() or [""])[0][:300]
            write_status(out_dir, "failed", reason=f"{type(err).__name__}: {first}")
        raise
    finally:
        lock.release()


def run_fate(out_dir: Path) -> tuple[str, str]:
    """(state, one line) of the run in ``out_dir``, for a supervisor: ``running`` (a process holds its writer lock),
    ``completed``, ``stopped`` (with its reason; a writer that vanished without a word counts here: its checkpoint
    resumes it), ``failed`` (an internal error), ``interrupted``, ``over_budget`` (completed with a client's epsilon
    above ``privacy.target_epsilon``), or ``none`` (no run there)."""
    holder = writer_holding(out_dir)
    if holder is not None:
        last = RoundLog(out_dir).read()[-1:] if (out_dir / ROUNDS_LOG).exists() else []
        where = f", last evaluated round {last[0]['round']}" if last else ""
        return "running", (f"running: pid {holder.get('pid', '?')} on {holder.get('host', '?')} since "
                           f"{holder.get('started', '?')}{where}{silent_note(last[0] if last else {})}")
    status = read_status(out_dir)
    state = status.get("state") if status else None
    if state == "running":  # written by a writer that holds no lock now: killed, or its machine went down
        resumable = "its checkpoint resumes it" if (out_dir / CHECKPOINT).exists() else "no checkpoint yet"
        return "stopped", (f"stopped: its writer (pid {status.get('pid')} on {status.get('host')}) ended without "
                           f"finishing; {resumable}")
    if state in ("failed", "interrupted", "stopped"):
        reason = str(status.get("reason", ""))
        return state, reason if reason.startswith(state) else f"{state}: {reason}".rstrip(": ")
    if (out_dir / SUMMARY).is_file():  # completed, or a folder written before the status file existed
        result = read_result(out_dir)
        if not result.completed:
            return "stopped", result.status
        scale, unit = (100.0, " %") if result.metric == "accuracy" else (1.0, "")
        headline = "—" if result.test_mean is None else f"{scale * result.test_mean:.4g}{unit}"
        clients = (f", scored on {result.scored_clients} of {result.training_clients} training clients"
                   if result.scored_clients is not None else "")
        line = (f"test {result.metric} {headline} at round {result.best_round} of {result.rounds}{clients}"
                f"{asynchronous_note(result)}")
        above = (result.privacy or {}).get("above_target")
        if above:
            return "over_budget", (f"completed above its privacy target: {len(above)} client(s) above ε "
                                   f"{result.privacy['target_epsilon']:g} (privacy.above_target); {line}")
        return "completed", f"completed: {line}"
    if (out_dir / CHECKPOINT).exists():
        return "stopped", "stopped: an unfinished run (a checkpoint, no summary); resume it"
    return "none", f"{out_dir}: no run here"


def silent_note(record: dict[str, Any]) -> str:
    """An asynchronous Flower run's evaluation record: whose node has not answered, since which server step."""
    silent = record.get("silent_clients") or {}
    if not silent:
        return ""
    named = ", ".join(f"{client} (since step {step})" for client, step in list(silent.items())[:8])
    return f"; the others train on, no answer from {named}{' and more' if len(silent) > 8 else ''}"


def asynchronous_note(result: RunResult) -> str:
    """An asynchronous Flower run's summary: how the training messages went to the nodes, and what timed out."""
    sent = result.trainings_sent
    if not sent or not result.asynchronous:
        return ""
    timeouts = (result.drop_counts or {}).get("timeout", 0)
    spread = f"{min(sent.values())}-{max(sent.values())}" if len(set(sent.values())) > 1 else str(min(sent.values()))
    return (f"; {result.asynchronous['server_mode']}: {result.asynchronous['server_steps']} server steps, "
            f"{spread} training messages per node, {timeouts} drop(s) for a node that did not answer in time")


def missed_rounds(drops: Iterable[tuple[int, str]]) -> dict[str, list[int]]:
    """Client name -> the rounds it missed, each once, from (round, client name) of every lost upload or dropped
    reply (the simulator's and the Flower engine's summaries say it the same way)."""
    missed: dict[str, list[int]] = {}
    for round_number, client in drops:
        rounds = missed.setdefault(client, [])
        if round_number not in rounds:
            rounds.append(round_number)
    return missed


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN/Inf float replaced by None, recursively (strict JSON has no NaN/Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    return value


def remove_stale_temporaries(out_dir: Path) -> list[Path]:
    """Delete temp files of atomic writes that a crash interrupted (``.NAME.XXXX.tmp``); return them."""
    stale = [path for path in out_dir.rglob(".*.tmp") if path.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


#: ``schema_version`` of the summaries this code writes (1: summaries written before the field existed)
SCHEMA_VERSION = 2


class RunResult(BaseModel):
    """What one run produced: the loop fills it, ``summary.json`` is it serialised, readers use its attributes.

    Scores are those of the best-validation evaluation round (``best_round``); ``*_mean`` are means over the
    training clients of each client's metric on its own split, ``*_std`` the std over those clients. ``None``
    where a value does not apply (no novel clients, no attack) or the run stopped before any evaluation. Fields
    added by a newer graphfed load as extra attributes; summaries of older ones (``schema_version`` 1) load with
    their missing fields at None.
    """

    model_config = ConfigDict(extra="allow", frozen=False)

    schema_version: int = SCHEMA_VERSION
    status: str  #: "completed", "stopped: <why>" (the last good checkpoint kept), or a bench cell's "failed: ..."
    method: str | None = None
    dataset: str | None = None  #: the federation's own name (a folder's meta.yaml name, not "folder")
    metric: str | None = None  #: "accuracy" or "mse"
    seed: int | None = None
    #: every option the method ran with, defaults included (config.yaml keeps only what was set)
    method_options: dict[str, Any] | None = None
    # -- scores at the best-validation round
    test_mean: float | None = None
    test_std: float | None = None
    test_pooled: float | None = None  #: the metric over all training clients' test rows pooled
    val_mean: float | None = None
    test_row_se: float | None = None  #: standard error of test_mean from the sampling of test rows alone
    test_nonfinite_clients: list[str] = []
    test_mae: float | None = None
    test_mae_original_units: float | None = None
    #: regression: data units per stored unit of the targets, and their name (a folder's meta.yaml), so every
    #: number a user reads can be given in the units the federation declares; None where the data do not say
    target_scale: float | None = None
    target_units: str | None = None
    novel_mean: float | None = None
    novel_std: float | None = None
    novel_adapted_mean: float | None = None
    novel_adapted_std: float | None = None
    #: why there is no novel-client score (the method has no model for a client that never trained), or None
    novel_none_reason: str | None = None
    test_by_architecture: dict[str, float | None] | None = None
    architectures: dict[str, str] | None = None  #: client name -> its architecture (mixed architectures)
    # -- robustness (under ``attack:``)
    attack: dict[str, Any] = {}
    honest_test_mean: float | None = None
    honest_test_std: float | None = None
    malicious_test_mean: float | None = None
    asr_mean: float | None = None
    asr_honest: float | None = None
    asr_malicious: float | None = None
    defense: dict[str, Any] = {}
    # -- the run
    best_round: int | None = None
    #: every client by name at ``best_round``: ``val``, ``test``, ``trivial_test`` (its majority-class / mean-target
    #: predictor fitted on its training rows), ``novel`` and, under attack, ``malicious``
    per_client: dict[str, dict[str, Any]] | None = None
    trivial_test_mean: float | None = None  #: the trivial predictors' test mean over the training clients
    #: ``train.metrics`` at ``best_round``: ``{metric: {"val_mean", "test_mean"}}`` (means over the training clients
    #: that define it; each client's value is in ``per_client``)
    metrics: dict[str, dict[str, float | None]] | None = None
    select_by: str | None = None  #: the validation metric that chose ``best_round``
    dropout: float | None = None  #: ``train.dropout`` when uploads were lost on purpose (simulated faults)
    #: client updates lost to ``train.dropout`` (and stragglers' a method cannot use late) over the run
    lost_uploads: int | None = None
    stragglers: list[str] | None = None  #: ``train.stragglers``: the clients whose uploads arrive late
    straggler_delay: int | None = None
    late_uploads: int | None = None  #: straggler updates the method received late
    #: how many training clients the reported test mean covers, of ``training_clients`` (fewer: replies were lost)
    scored_clients: int | None = None
    #: the training clients without a validation score at the reported round (their replies were lost); the
    #: reported round was compared only with rounds scored over the same clients
    unscored_clients: list[str] = []
    #: ``privacy:`` as run (mechanism, clip, noise multiplier, delta, accountant, sampling) and the epsilon spent:
    #: ``epsilon`` (central) or ``epsilon_max``, ``epsilon_median`` and ``per_client_epsilon`` (local)
    privacy: dict[str, Any] | None = None
    #: ``flower.secure_aggregation``: the SecAgg+ settings and the largest error its quantisation adds per value
    secure_aggregation: dict[str, Any] | None = None
    training_clients: int | None = None
    #: why ``models/best.pt`` was not written (None: it holds every client's model at ``best_round``)
    models_note: str | None = None
    #: what a reader must know about these numbers, one sentence each (a novel client with no graph neighbour, one
    #: scoring below its trivial predictor); the run's log and the tables say the same
    flags: list[str] = []
    #: ``{"round", "patience", "min_delta"}`` when early stopping ended the run before ``train.rounds``
    stopped_early: dict[str, Any] | None = None
    final_test_mean: float | None = None
    rounds: int = 0
    #: the simulated clock at the end (``train.clock``; None under central DP, where a round's duration is secret)
    sim_seconds: float | None = None
    #: ``train.server_mode`` fedbuff / fedasync: the mode, buffer, concurrency and staleness function as run
    asynchronous: dict[str, Any] | None = None
    #: ``train.target_score``: ``{"target", "round", "sim_seconds"}`` of the first evaluation whose test mean reached
    #: it (round and seconds None when none did)
    time_to_target: dict[str, Any] | None = None
    #: ``{"round", "time_budget", "sim_seconds"}`` when ``train.time_budget`` ended the run
    stopped_at_time: dict[str, Any] | None = None
    num_clients: int | None = None
    clients_per_round: int | None = None
    num_novel_clients: int | None = None
    num_params: int | None = None
    novel_clients: list[str] = []
    late_clients: list[str] | None = None
    join_round: int | None = None
    late_test_mean: float | None = None
    late_test_final: float | None = None
    client_graph: dict[str, Any] = {}
    wall_seconds: float | None = None
    bytes_up: int | None = None
    bytes_down: int | None = None
    peak_rss_mb: float | None = None
    torch_threads: int | None = None
    device: str | None = None  #: where the run computed (``train.device`` resolved, e.g. "cpu", "cuda:0")
    #: per architecture: how many clients trained at once and why (``graphfed.client.autotune``)
    execution: dict[str, Any] | None = None
    notes: list[str] = []
    #: the code that produced these numbers (``graphfed.provenance``); None in summaries older than provenance
    code: dict[str, Any] | None = None
    # -- what an engine adds (Flower: clients dropped from rounds, nodes refused; the simulator's train.dropout and
    # stragglers: the uploads lost, as dropped_clients with the reason and missed_rounds)
    dropped_clients: list[dict[str, Any]] | None = None
    drop_counts: dict[str, int] | None = None
    refused_nodes: list[dict[str, Any]] | None = None
    missed_rounds: dict[str, list[int]] | None = None  #: client name -> the rounds its reply did not arrive in
    readmitted: list[dict[str, Any]] | None = None  #: clients taken over by a new node after theirs left
    resumed_at: list[int] | None = None  #: the completed rounds each restart of the ServerApp continued after
    trainings_sent: dict[str, int] | None = None  #: asynchronous rounds on Flower: TRAIN messages per client's node
    #: set by ``graphfed bench`` when it ran the cell: seconds including the process start
    cell_seconds: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _versioned(cls, data: Any) -> Any:
        if isinstance(data, dict) and "schema_version" not in data:
            return {**data, "schema_version": 1}  # written before summaries carried a version
        return data

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    def to_json(self) -> dict[str, Any]:
        """The fields this result was given (a run's summary keeps only what applies to it), JSON-ready."""
        return finite_or_none(self.model_dump(mode="json", exclude_unset=True))


def write_result(out_dir: Path, result: RunResult) -> None:
    """``summary.json``: strict JSON (a non-finite number is written as null), written atomically."""
    atomic_write_text(out_dir / SUMMARY, json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n")


def read_result(out_dir: Path) -> RunResult:
    """The run's ``summary.json`` (any schema version); UntrustedInputError naming the file when it is not one."""
    path = out_dir / SUMMARY
    try:
        data = json.loads(path.read_text())
        return RunResult.model_validate(data)
    except (UnicodeDecodeError, json.JSONDecodeError, ValidationError, RecursionError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UntrustedInputError(f"{path}: not a graphfed run summary ({reason})") from None
