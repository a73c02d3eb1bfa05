"""Device time in slots: ``graphfed bench SUITE --time-budget SECONDS`` fills one slot with finished runs, and
``graphfed bench SUITE --import ARCHIVE`` merges what a slot made into the committed results.

A slot (a lent GPU's 15 minutes, a night on a workstation) is spent on whole runs only: a run starts when its
projected time fits what is left of the budget, so none is cut short. The projection of a run is its own recorded
time when it ran before (a stale run), else the mean of the same method's finished runs in its section, else the
section's, else the time the first run of its cell in this slot took. Runs go in the order of the claims they
decide: the cells a claim names first (a verdict needs their seeds), the others after, each seed index across
every cell before the next, so an interrupted slot leaves every cell with seeds.

The finished runs go into one archive (``tar.gz``, at most :data:`ARCHIVE_LIMIT`): each run's ``summary.json``,
``config.yaml``, ``rounds.jsonl`` and ``privacy.json``, with a manifest of their SHA-256 and the code that made
them. Importing refuses, in one line, an archive whose files do not match its manifest (tampered or truncated), a
member outside its run folders, and a run whose code is not today's (stale: made by other code) or whose config is
not its cell's.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphfed import runs
from graphfed.config import read_yaml, same_run, validate_config
from graphfed.errors import ConfigError, UntrustedInputError
from graphfed.provenance import code_provenance, stale_reason
from graphfed.runs import RunResult
from graphfed.setup import run_roots
from graphfed.suites import Cell, Suite

#: the largest archive a slot may write (what a device machine may hand back)
ARCHIVE_LIMIT = 16 * 2**20
#: the files of a run an archive carries (checkpoints and models stay where they were made)
ARCHIVED = (runs.SUMMARY, runs.CONFIG, runs.ROUNDS_LOG, runs.PRIVACY_LEDGER)
MANIFEST = "manifest.json"


def claim_order(suite: Suite, cells: list[Cell]) -> list[Cell]:
    """``cells`` in the order a slot runs them: those of the cells a claim names (its dataset and methods) first,
    then the rest; within each, seed index by seed index across the cells."""
    named = {(claim.dataset, method) for claim in suite.claims if claim.dataset
             for method in (claim.better, *claim.than) if method}
    first_seed: dict[tuple[str, str], int] = {}
    for cell in cells:
        key = (cell.dataset, cell.method)
        first_seed[key] = min(first_seed.get(key, cell.config.seed), cell.config.seed)
    return sorted(cells, key=lambda cell: ((cell.dataset, cell.method) not in named,
                                           cell.config.seed - first_seed[(cell.dataset, cell.method)]))


def projection(cell: Cell, recorded: RunResult | None,
               times: dict[tuple[str, str | None], list[float]]) -> float | None:
    """The seconds ``cell`` is projected to take (see the module docstring); None when nothing says."""
    if recorded is not None and recorded.wall_seconds is not None:
        return float(recorded.wall_seconds)
    known = times.get((cell.dataset, cell.method)) or times.get((cell.dataset, None))
    return sum(known) / len(known) if known else None


def fill_slot(cells: list[Cell], budget: float, run: Callable[[Cell], RunResult],
              recorded: Callable[[Cell], RunResult | None], echo: Callable[[str], Any],
              clock: Callable[[], float] = time.monotonic) -> list[tuple[Cell, RunResult]]:
    """Run ``cells`` in order while each one's projected time fits what is left of ``budget`` seconds (a cell with
    no projection runs while any time is left, and its time then projects its cell's other seeds). Returns the
    runs it made."""
    begin = clock()
    times: dict[tuple[str, str | None], list[float]] = {}
    for cell in cells:
        finished = recorded(cell)
        if finished is not None and finished.wall_seconds is not None and finished.completed:
            for key in ((cell.dataset, cell.method), (cell.dataset, None)):
                times.setdefault(key, []).append(float(finished.wall_seconds))
    made: list[tuple[Cell, RunResult]] = []
    for cell in cells:
        left = budget - (clock() - begin)
        projected = projection(cell, recorded(cell), times)
        label = f"{cell.dataset} {cell.method} seed {cell.config.seed}"
        if left <= 0 or (projected is not None and projected > left):
            echo(f"{label}: not started (projected {projected or 0:.0f} s, {max(left, 0):.0f} s left)")
            continue
        started = clock()
        summary = run(cell)
        for key in ((cell.dataset, cell.method), (cell.dataset, None)):
            times.setdefault(key, []).append(clock() - started)
        made.append((cell, summary))
    return made


def write_archive(path: Path, out: Path, cells: list[Cell]) -> Path:
    """The finished runs of ``cells`` under ``out`` as one archive at ``path`` (ConfigError when it would exceed
    :data:`ARCHIVE_LIMIT`)."""
    files: dict[str, bytes] = {}
    for cell in cells:
        directory = cell.directory(out)
        if not (directory / runs.SUMMARY).is_file() or not runs.read_result(directory).completed:
            continue
        for name in ARCHIVED:
            if (directory / name).is_file():
                files[(directory / name).relative_to(out).as_posix()] = (directory / name).read_bytes()
    manifest = {"code": code_provenance(), "files": {name: hashlib.sha256(data).hexdigest()
                                                      for name, data in sorted(files.items())}}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in [(MANIFEST, json.dumps(manifest, indent=1).encode()), *sorted(files.items())]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            archive.addfile(info, io.BytesIO(data))
    if buffer.tell() > ARCHIVE_LIMIT:
        raise ConfigError(f"--archive: {buffer.tell() / 2**20:.1f} MiB of finished runs, more than the "
                          f"{ARCHIVE_LIMIT / 2**20:.0f} MiB a slot may hand back; give a smaller --time-budget")
    runs.atomic_write_bytes(path, buffer.getvalue())
    return path


def _read_archive(path: Path) -> dict[str, bytes]:
    """Every file of the archive, checked: regular files at relative paths only, their bytes matching the
    manifest; UntrustedInputError (one line) otherwise."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(path, mode="r:gz") as archive:
            for member in archive.getmembers():
                name = member.name
                if not member.isfile() or name.startswith("/") or ".." in Path(name).parts:
                    raise UntrustedInputError(f"{path}: member {name!r} is not a plain file inside the archive")
                if member.size > ARCHIVE_LIMIT:
                    raise UntrustedInputError(f"{path}: member {name!r} is larger than an archive may be")
                handle = archive.extractfile(member)
                files[name] = handle.read() if handle is not None else b""
    except (tarfile.TarError, OSError, EOFError) as err:
        raise UntrustedInputError(f"{path}: not a readable graphfed archive ({type(err).__name__})") from None
    try:
        manifest = json.loads(files.pop(MANIFEST))
        expected = dict(manifest["files"])
    except (KeyError, ValueError, TypeError):
        raise UntrustedInputError(f"{path}: no valid {MANIFEST}; not an archive graphfed bench wrote") from None
    if set(files) != set(expected) or any(hashlib.sha256(data).hexdigest() != expected[name]
                                          for name, data in files.items()):
        raise UntrustedInputError(f"{path}: its files do not match its manifest (tampered or truncated); "
                                  f"refused, nothing imported")
    return files


def import_archive(path: Path, out: Path, cells: list[Cell]) -> list[Cell]:
    """Merge the runs of the archive at ``path`` into ``out``: each must be a run of one of ``cells`` (its config)
    made by today's code; ConfigError or UntrustedInputError (one line, nothing written) otherwise. Returns the
    cells imported."""
    files = _read_archive(path)
    by_folder = {cell.directory(out).relative_to(out).as_posix(): cell for cell in cells}
    folders = sorted({name.rsplit("/", 1)[0] for name in files})
    imported = []
    for folder in folders:
        cell = by_folder.get(folder)
        if cell is None:
            raise ConfigError(f"{path}: {folder} is no cell of this suite; refused, nothing imported")
        try:
            summary = RunResult.model_validate(json.loads(files[f"{folder}/{runs.SUMMARY}"]))
            recorded = validate_config(read_yaml(files[f"{folder}/{runs.CONFIG}"].decode()))
        except (KeyError, ValueError) as err:
            raise UntrustedInputError(f"{path}: {folder} holds no valid summary and config "
                                      f"({type(err).__name__}); refused, nothing imported") from None
        if not same_run(recorded, cell.config):
            raise ConfigError(f"{path}: {folder} was made by another config than its cell's; refused, nothing "
                              f"imported")
        why = stale_reason(summary.code, run_roots(cell.config), private=cell.config.privacy.mechanism != "none")
        if why is not None:
            raise ConfigError(f"{path}: {folder} is stale ({why}); refused, nothing imported: run it again with "
                              f"today's code")
        imported.append(cell)
    for name, data in files.items():
        runs.atomic_write_bytes(out / name, data)
    return imported


__all__ = ["ARCHIVE_LIMIT", "claim_order", "fill_slot", "import_archive", "projection", "write_archive"]
