"""The simulator's checkpoint: its whole state behind a checksum, written atomically, never unpickled beyond
tensors and plain containers; what the state holds (:func:`state_of`) and how a run resumes from it
(:func:`restore`)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from graphfed import runs
from graphfed.client.privacy import PrivacyLedger
from graphfed.config import ConfigError, dump_config, read_yaml, same_run, validate_config
from graphfed.errors import CheckpointError, UntrustedInputError
from graphfed.runs import CHECKPOINT, atomic_write_bytes

if TYPE_CHECKING:
    from graphfed.sim.engine import Simulator

__all__ = ["CHECKPOINT", "CHECKPOINT_MAGIC", "CheckpointError", "load_checkpoint", "restore", "save_checkpoint",
           "state_of"]


#: First line of a checkpoint: format version and the SHA-256 of the payload that follows it.
CHECKPOINT_MAGIC = b"GRAPHFED-CHECKPOINT 1 sha256="


def save_checkpoint(out_dir: Path, state: dict[str, Any]) -> None:
    """``state`` (tensors, numbers, strings, lists and dicts only) behind a checksummed header."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    header = CHECKPOINT_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n"
    atomic_write_bytes(out_dir / CHECKPOINT, header + payload)


def load_checkpoint(out_dir: Path, map_location: torch.device | str | None = None) -> dict[str, Any]:
    """The state saved by :func:`save_checkpoint`, checked before use.

    A checkpoint may come from anywhere (a shared run folder, a downloaded suite), so it is never unpickled
    beyond tensors and plain containers (``weights_only=True``: no code runs), and its payload must match the
    checksum written with it (bit flips, truncation). Checkpoints of older graphfed versions have no header;
    they are still read with ``weights_only=True``.
    """
    path = out_dir / CHECKPOINT
    if not path.exists():
        raise CheckpointError(f"--resume: no checkpoint at {path}; start the run without --resume")
    data = path.read_bytes()
    payload = data
    if data.startswith(CHECKPOINT_MAGIC):
        header, _, payload = data.partition(b"\n")
        expected = header[len(CHECKPOINT_MAGIC):].decode("ascii", errors="replace")
        if hashlib.sha256(payload).hexdigest() != expected:
            raise CheckpointError(f"--resume: checkpoint {path} is corrupt (its checksum does not match its "
                                  f"contents); start a new run or restore the file")
    try:
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location=map_location)
    except Exception as err:  # torch raises several types for truncated, corrupt or code-carrying pickles
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"--resume: checkpoint {path} is not a readable graphfed checkpoint "
                              f"({type(err).__name__}: {reason[:200]})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"--resume: checkpoint {path} holds a {type(state).__name__}, not a graphfed "
                              f"checkpoint")
    return state


# ---- a simulator's state --------------------------------------------------------------------------------------
def state_of(sim: Simulator, completed_rounds: int) -> dict[str, Any]:
    """Everything a resumed run needs to continue bit-identically after ``completed_rounds``."""
    return {"completed_rounds": completed_rounds, "config": dump_config(sim.config),
            "method": sim.setup.method.state_dict(), "clients": sim.executor.state_dict(),
            "tracker": vars(sim.tracker).copy(), "privacy_ledger": sim.ledger.state(),
            "torch_rng": torch.get_rng_state(),
            **({"in_flight": sim.arrivals.state()} if len(sim.participation.straggler_ids) else {}),
            **({"asynchronous": sim.async_server.state()} if sim.async_server is not None else {})}


def novel_state_of(sim: Simulator, trained_method: dict[str, Any], steps: int) -> dict[str, Any]:
    """A checkpoint between two steps of a private run's novel-client adaptation: the run after its last round
    (``trained_method``: the method's state before the adaptation began, what the run reports) and the adaptation
    after ``steps`` steps (the adapted method and its scratch state), so a resume continues it."""
    method = sim.setup.method
    return {**state_of(sim, sim.config.train.rounds), "method": trained_method,
            "novel_adaptation": {"steps": steps, "method": method.state_dict(),
                                 "scratch": method.novel_adaptation_state()}}


def restore(sim: Simulator, state: dict[str, Any]) -> int:
    """Load ``state`` (a checkpoint's) into ``sim``; the rounds it completed. CheckpointError (one line) when the
    state is not this run's or does not fit it."""
    expected = {"completed_rounds": int, "config": str, "method": dict, "tracker": dict, "torch_rng": torch.Tensor}
    for key, kind in expected.items():
        if not isinstance(state.get(key), kind):
            raise CheckpointError(f"--resume: the checkpoint has no valid '{key}' ({kind.__name__} expected); it was "
                                  f"not written by this graphfed run")
    if not _same_config(state["config"], sim):
        raise CheckpointError("--resume: the checkpoint was written by a different config; use the run's own "
                              "config.yaml or start a new --out directory")
    completed = state["completed_rounds"]
    if not 0 <= completed <= sim.config.train.rounds:
        raise CheckpointError(f"--resume: the checkpoint claims {completed} completed rounds of "
                              f"{sim.config.train.rounds}")
    clients = state.get("clients")
    if (clients == {} or (isinstance(clients, dict) and "flower" in clients)) and not sim.on_flower:
        # the Flower ServerApp checkpoints the server only: its clients' state stays on the nodes
        if completed == sim.config.train.rounds:
            raise CheckpointError(f"--resume: this checkpoint is a Flower run's that finished all {completed} rounds; "
                                  f"there is nothing to resume (graphfed show prints its result)")
        raise CheckpointError(f"--resume: this checkpoint was written by a Flower run after round {completed}; its "
                              f"clients' state is on its nodes, so only Flower can continue it: start the same Flower "
                              f"App again (flwr run), its ServerApp resumes from this checkpoint")
    state["tracker"].pop("uploads_per_client", None)  # older checkpoints counted local-DP uploads there
    unknown = set(state["tracker"]) - set(vars(sim.tracker))
    if unknown:
        raise CheckpointError(f"--resume: the checkpoint's tracker has unknown fields {sorted(unknown)}")
    try:
        sim.setup.method.load_state_dict(state["method"])
        sim.executor.load_state_dict(state.get("clients", {}))
        torch.set_rng_state(state["torch_rng"].cpu())
        sim.arrivals.load(state.get("in_flight", []))
        if sim.async_server is not None:
            sim.async_server.load(state["asynchronous"])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise CheckpointError(f"--resume: the checkpoint's state does not fit this run's method, model or clients "
                              f"({type(err).__name__}: {reason})") from None
    for key, value in state["tracker"].items():
        setattr(sim.tracker, key, value)
    sim.tracker.select_last = sim.privacy.active and sim.privacy.model_selection == "last"
    sim.ledger = _resumed_ledger(sim, state.get("privacy_ledger"))
    progress = state.get("novel_adaptation")
    if progress is not None:
        if not (isinstance(progress, dict) and isinstance(progress.get("steps"), int)
                and isinstance(progress.get("method"), dict) and isinstance(progress.get("scratch"), dict)
                and completed == sim.config.train.rounds):
            raise CheckpointError("--resume: the checkpoint's novel-client adaptation is not readable; it was not "
                                  "written by this graphfed run")
        sim.novel_progress = progress
    return int(completed)


def resume(sim: Simulator, out_dir: Path) -> int:
    """Restore ``sim`` from the checkpoint in ``out_dir`` for ``--resume``; the rounds it completed. Refuses (a
    one-line :class:`CheckpointError`) what cannot be resumed: no or a corrupt checkpoint, another config's or
    another engine's, and a run that already finished (its summary says so: resuming it would only rewrite its
    result). Reads only: the run folder is unchanged by a refusal (the caller starts the run after this)."""
    finished = _finished(out_dir)
    start_round = restore(sim, load_checkpoint(out_dir, sim.setup.clients.device))
    if finished is not None:
        raise CheckpointError(f"--resume: {out_dir} holds a run that finished ({finished}); there is nothing to "
                              f"resume (graphfed show prints its result; --overwrite starts it again)")
    return start_round


def _finished(out_dir: Path) -> str | None:
    """How the run in ``out_dir`` finished (its rounds), or None when its summary is missing or says it stopped."""
    try:
        result = runs.read_result(out_dir)
    except (UntrustedInputError, OSError):
        return None
    return f"{result.rounds} rounds" if result.completed else None


def _resumed_ledger(sim: Simulator, saved: Any) -> PrivacyLedger:
    """The releases before a resume: the checkpoint's count, or the run folder's if it saw more (rounds run after
    the checkpoint by the interrupted process were released too, and are run again now)."""
    ledger = PrivacyLedger()
    for source, state in (("checkpoint", saved), (runs.PRIVACY_LEDGER, _ledger_file(sim))):
        if state is None:
            continue
        try:
            ledger = ledger.merged(PrivacyLedger.from_state(state))
        except ValueError as err:
            raise CheckpointError(f"--resume: the {source}'s privacy ledger is unreadable ({err}); its releases "
                                  f"cannot be accounted") from None
    return ledger


def _ledger_file(sim: Simulator) -> Any:
    path = None if sim.out_dir is None else sim.out_dir / runs.PRIVACY_LEDGER
    if path is None or not path.exists() or not sim.privacy.active:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"--resume: {path} is unreadable ({type(err).__name__}); its releases cannot be "
                              f"accounted") from None


def _same_config(text: str, sim: Simulator) -> bool:
    """Whether a checkpoint's config is this run's. Compared after validation, so a checkpoint written before a new
    field with a default existed still resumes (its text lacks the field), and data that moved still resumes
    (``same_run``)."""
    if text == dump_config(sim.config):
        return True
    try:
        return same_run(validate_config(read_yaml(text)), sim.config)
    except (ConfigError, yaml.YAMLError, RecursionError):
        return False
