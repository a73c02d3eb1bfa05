"""Which code produced a run: every ``summary.json`` records it, and ``graphfed bench`` compares it.

A run is tied to the code it ran, in two parts:

* its **modules**: the run-specific sources it imported (its method's class and the classes it derives from, its
  model, its dataset, an attack, and the networks they build: the files under ``methods/``, ``models/``, ``nn/``,
  ``attacks/`` and ``data/datasets/`` reached from them), each by the SHA-256 of its bytes;
* the **engine's behaviour**: every other computing source (the round loop, client training, evaluation, privacy,
  the data pipeline, the registries and base classes) identified by what it does, not by its bytes: the SHA-256 of
  those sources maps to a behaviour id in ``behaviour.json``, where ``tools/vouch.py`` records an engine whose vouch
  suite (the golden runs of every method and the engine's features: privacy, attacks, faults, late clients...) gives
  field-for-field the summaries of an engine already vouched for. An engine nobody vouched for is its own behaviour.
  The same vouch places the old and new hash of each run-specific module its suite ran in one class (a method file
  whose edit only added a refusal or a private-run path its golden run does not take).

A finished run is current while its behaviour id and its modules' hashes are today's (:func:`stale_reason`): a change
to the docs, the CLI or a report stales nothing, a change to one method stales that method's runs, and a refactor of
the engine that the vouch suite shows to be exact stales none. Runs made before runs recorded their modules carry one
code id over all sources; ``behaviour.json``'s ``legacy`` entries say which behaviour and module hashes such an id
stands for (and for which runs a vouch covered it: a vouch without private runs does not cover them). The package
version, the git commit (when imported from a checkout), whether its sources differ from it, torch's version and the
CPU's kernel family (:func:`cpu_kernels`: the same code and config compute other roundings on other kernels) are
recorded beside.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
from collections.abc import Iterable
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent
#: package paths whose edits cannot change a run's numbers (they read runs and render them)
RENDERING_ONLY = ("report/", "cli/", "bench.py", "slots.py", "suites.py")
#: folders of run-specific sources: a method's, a model's, a dataset's, an attack's and the networks they build
SPECIFIC = ("methods/", "models/", "nn/", "attacks/", "data/datasets/")
#: files in those folders every run goes through (registries, base classes): part of the engine
SHARED = ("methods/__init__.py", "methods/base.py", "models/__init__.py", "models/base.py", "nn/__init__.py",
          "attacks/__init__.py", "data/datasets/__init__.py")
BEHAVIOUR = PACKAGE_ROOT / "behaviour.json"
#: what a summary written before runs recorded their code says
UNRECORDED = "unrecorded"


def _computing(relative: str) -> bool:
    return not relative.startswith(RENDERING_ONLY) and "__pycache__" not in relative


def is_specific(relative: str) -> bool:
    """Whether a package path is run-specific (else, when it computes, it is the engine's)."""
    return relative.startswith(SPECIFIC) and relative not in SHARED


def _sources(root: Path) -> list[tuple[str, Path]]:
    return [(path.relative_to(root).as_posix(), path) for path in sorted(root.rglob("*.py"))
            if _computing(path.relative_to(root).as_posix())]


def source_hash(root: Path = PACKAGE_ROOT) -> str:
    """SHA-256 over the computing sources under ``root``: each file's relative path and bytes, in path order."""
    digest = hashlib.sha256()
    for relative, path in _sources(root):
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def engine_hash(root: Path = PACKAGE_ROOT) -> str:
    """SHA-256 over the engine's sources: every computing source that is not run-specific."""
    digest = hashlib.sha256()
    for relative, path in _sources(root):
        if not is_specific(relative):
            digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def file_hash(relative: str, root: Path = PACKAGE_ROOT) -> str:
    """The first 16 hex digits of the SHA-256 of one source's bytes."""
    return hashlib.sha256((root / relative).read_bytes()).hexdigest()[:16]


def specific_hashes(root: Path = PACKAGE_ROOT) -> dict[str, str]:
    """Every run-specific source under ``root`` and its hash (what ``tools/vouch.py`` records of a legacy code)."""
    return {relative: file_hash(relative, root) for relative, _ in _sources(root) if is_specific(relative)}


def _module_file(module: str, root: Path = PACKAGE_ROOT) -> str | None:
    """``graphfed.a.b`` -> ``a/b.py`` (or ``a/b/__init__.py``), relative to the package; None outside it."""
    if not module.startswith("graphfed."):
        return None
    relative = module.removeprefix("graphfed.").replace(".", "/")
    for candidate in (f"{relative}.py", f"{relative}/__init__.py"):
        if (root / candidate).is_file():
            return candidate
    return None


@cache
def _imports(relative: str) -> tuple[str, ...]:
    """The package files one source imports (``import graphfed.x``, ``from graphfed.x import y``: y may be a module)."""
    tree = ast.parse((PACKAGE_ROOT / relative).read_text(encoding="utf-8"))
    found: list[str] = []
    for node in ast.walk(tree):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                 [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
        found += [path for name in names if name and (path := _module_file(name)) is not None]
    return tuple(dict.fromkeys(found))


def module_closure(roots: Iterable[str]) -> list[str]:
    """The run-specific files ``roots`` (package paths) reach by their imports, ``roots`` included, in path order."""
    seen: set[str] = set()
    todo = [root for root in roots if is_specific(root)]
    while todo:
        relative = todo.pop()
        if relative in seen:
            continue
        seen.add(relative)
        todo += [other for other in _imports(relative) if is_specific(other) and other not in seen]
    return sorted(seen)


@cache
def _behaviour_table() -> dict[str, Any]:
    try:
        table = json.loads(BEHAVIOUR.read_text())
    except (OSError, ValueError):
        table = {}
    return {part: dict(table.get(part, {})) for part in ("engines", "private_engines", "legacy", "modules",
                                                         "checked_on")}


def vouches_checked_on() -> list[str]:
    """The CPU kernel families (:func:`cpu_kernels`) on which the vouch of today's engine compared its runs with
    its predecessor's (``tools/vouch.py`` runs its suite on the CPU's own kernels and MKL's AVX2 path): the promise
    that runs of the predecessor are runs of today's engine holds there; empty when no vouch recorded it."""
    return sorted(_behaviour_table()["checked_on"].get(engine_hash(), {}).get("kernels", []))


@cache
def behaviour(private: bool = False) -> str:
    """The engine's behaviour id: the one ``behaviour.json`` vouches for its sources, else its own hash.
    ``private``: for a run under client-level DP, whose behaviour a vouch that left the private runs out
    (``tools/vouch.py --no-privacy``, after a change to the mechanisms) set apart in ``private_engines``."""
    engine, table = engine_hash(), _behaviour_table()
    if private and engine in table["private_engines"]:
        return str(table["private_engines"][engine])
    return str(table["engines"].get(engine, engine[:16]))


def _canonical(recorded: str, private: bool = False) -> str:
    """A recorded behaviour id as today's table names its class: a run recorded its engine's own hash when no vouch
    named it yet, and a later vouch may have placed that engine in a class (a private run's in its own, where a
    vouch set private runs apart)."""
    table = _behaviour_table()
    for part in (("private_engines", "engines") if private else ("engines",)):
        for engine, named in table[part].items():
            if engine[:16] == recorded:
                return str(named)
    return recorded


def _module_class(relative: str, digest: str | None) -> str | None:
    """A module hash as the vouched classes name it: a vouch whose suite ran a changed module and found every run
    alike places its old and new hashes in one class."""
    return None if digest is None else str(_behaviour_table()["modules"].get(relative, {}).get(digest, digest))


def _git(*args: str) -> str | None:
    try:
        completed = subprocess.run(["git", "-C", str(PACKAGE_ROOT), *args], capture_output=True, text=True,
                                   timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() if completed.returncode == 0 else None


#: instruction-set extensions whose presence changes which fp32 kernels MKL, oneDNN and ATen run
KERNEL_EXTENSIONS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "sve", "asimd")
#: environment variables that hold MKL or oneDNN to another kernel path than the CPU's own (ATen's cap,
#: ``ATEN_CPU_CAPABILITY``, shows in torch's level): MKL's AVX2 path is the one AMD CPUs take
KERNEL_CAPS = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


@cache
def cpu_kernels(cpuinfo: str | None = None) -> str:
    """The CPU as far as it decides float rounding: the architecture, the vendor (MKL and oneDNN pick their paths by
    it), torch's vectorisation level, the extensions of :data:`KERNEL_EXTENSIONS` present (``cpuinfo``: the text
    of ``/proc/cpuinfo``, read when None), the :data:`KERNEL_CAPS` set, and ``oneDNN off`` when torch's oneDNN
    backend is disabled. The same code, config, torch and thread count give the same numbers bit for bit on one
    machine; another CPU may run other kernels, whose numbers agree to float rounding only, and a value that feeds
    rounding back (a novel client's adaptation) can move further (docs/explanation/evaluation.md).
    """
    import os
    import platform

    import torch

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux: architecture and torch's level only
            cpuinfo = ""
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    extensions = "+".join(name for name in KERNEL_EXTENSIONS if name in flags)
    parts = [platform.machine(), fields.get("vendor_id", ""), torch.backends.cpu.get_cpu_capability(), extensions,
             *(f"{name}={os.environ[name]}" for name in KERNEL_CAPS if os.environ.get(name)),
             "" if torch.backends.mkldnn.enabled else "oneDNN off"]
    return " ".join(part for part in parts if part)


@cache
def code_provenance() -> dict[str, Any]:
    """``{"code_id", "version", "git_commit", "dirty", "torch", "cpu"}`` of the running code as a whole (computed once
    per process): what a benchmark that is not one run records. ``code_id`` is the first 16 hex digits of
    :func:`source_hash`; ``git_commit`` and ``dirty`` are None when the package is not imported from a git checkout
    (an installed wheel); ``cpu`` is :func:`cpu_kernels` (the numbers depend on the kernels as on torch)."""
    try:
        version = metadata.version("graphfed")
    except metadata.PackageNotFoundError:
        version = None
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", ".") if commit else None
    import torch  # the numbers also depend on torch's kernels: recorded beside the code id, not part of it

    return {"code_id": source_hash()[:16], "version": version, "git_commit": commit,
            "dirty": None if status is None else bool(status), "torch": torch.__version__, "cpu": cpu_kernels()}


def run_code(roots: Iterable[str], private: bool = False) -> dict[str, Any]:
    """The code one run ran: its engine's behaviour id (a private run's: ``private``), its run-specific modules
    (reached from ``roots``) with their hashes, and a ``code_id`` over both; beside them :func:`code_provenance`'s
    version, commit and torch."""
    modules = {relative: file_hash(relative) for relative in module_closure(roots)}
    engine = behaviour(private)
    digest = hashlib.sha256(engine.encode() + b"".join(f"\0{path}:{sha}".encode() for path, sha in modules.items()))
    whole = code_provenance()
    return {"code_id": digest.hexdigest()[:16], "behaviour": engine, "modules": modules,
            **{key: value for key, value in whole.items() if key != "code_id"}, "source_id": whole["code_id"]}


def stale_reason(recorded: Any, roots: Iterable[str], private: bool = False) -> str | None:
    """Why a run that recorded ``recorded`` (its summary's ``code``) is not a run of today's code, or None when it
    is: today's engine behaviour and today's hash of every run-specific module it reaches from ``roots``.
    ``private``: the run used client-level DP (a legacy vouch may not cover such runs)."""
    if not isinstance(recorded, dict):
        return "made before runs recorded their code"
    if isinstance(recorded.get("modules"), dict):
        engine, modules = recorded.get("behaviour"), recorded["modules"]
    else:
        legacy = _behaviour_table()["legacy"].get(str(recorded.get("code_id")))
        if legacy is None:
            return f"made by code {recorded.get('code_id', UNRECORDED)}, which no vouch relates to today's"
        if private and not legacy.get("scope", {}).get("privacy", True):
            return f"made by code {recorded.get('code_id')}, vouched for runs without privacy only"
        engine, modules = legacy.get("behaviour"), legacy.get("modules", {})
    if _canonical(str(engine), private) != behaviour(private):
        return f"the engine behaves otherwise (behaviour {engine}, today {behaviour(private)})"
    changed = [path for path in module_closure(roots)
               if _module_class(path, modules.get(path)) != _module_class(path, file_hash(path))]
    return f"{', '.join(changed)} changed" if changed else None


__all__ = ["RENDERING_ONLY", "SPECIFIC", "UNRECORDED", "behaviour", "code_provenance", "engine_hash",
           "is_specific", "module_closure", "run_code", "source_hash", "specific_hashes", "stale_reason",
           "vouches_checked_on"]
