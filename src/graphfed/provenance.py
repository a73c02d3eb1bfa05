"""Which code produced a run: every ``summary.json`` records it, and ``graphfed bench`` compares it.

The *code id* is a SHA-256 over the installed ``graphfed`` sources that compute a run's numbers: every ``.py``
file of the package except those that only render or dispatch results (``report/``, ``cli.py``, ``bench.py``,
``suites.py``), whose edits cannot move a number. It is the identity benchmarks compare (two runs with the same
code id and config give the same numbers on the same CPU); the package version, the git commit of the checkout
(when the package is imported from one) and whether its sources differ from that commit (``dirty``) are recorded
beside it for a reader.
"""

from __future__ import annotations

import hashlib
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphfed.runs import RunResult

PACKAGE_ROOT = Path(__file__).resolve().parent
#: package paths whose edits cannot change a run's numbers (they read runs and render them)
RENDERING_ONLY = ("report/", "cli.py", "bench.py", "suites.py")
#: what a summary written before runs recorded their code says
UNRECORDED = "unrecorded"


def source_hash(root: Path = PACKAGE_ROOT) -> str:
    """SHA-256 over the computing sources under ``root``: each file's relative path and bytes, in path order."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(RENDERING_ONLY) or "__pycache__" in relative:
            continue
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _git(*args: str) -> str | None:
    try:
        completed = subprocess.run(["git", "-C", str(PACKAGE_ROOT), *args], capture_output=True, text=True,
                                   timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() if completed.returncode == 0 else None


@cache
def code_provenance() -> dict[str, Any]:
    """``{"code_id", "version", "git_commit", "dirty", "torch"}`` of the running code (computed once per process).

    ``code_id`` is the first 16 hex digits of :func:`source_hash`; ``git_commit`` and ``dirty`` are None when the
    package is not imported from a git checkout (an installed wheel)."""
    try:
        version = metadata.version("graphfed")
    except metadata.PackageNotFoundError:
        version = None
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", ".") if commit else None
    import torch  # the numbers also depend on torch's kernels: recorded beside the code id, not part of it

    return {"code_id": source_hash()[:16], "version": version, "git_commit": commit,
            "dirty": None if status is None else bool(status), "torch": torch.__version__}


def code_id_of(result: RunResult) -> str:
    """The code id a run's result recorded (:data:`UNRECORDED` for runs older than provenance)."""
    code = result.code
    return str(code.get("code_id", UNRECORDED)) if isinstance(code, dict) else UNRECORDED


__all__ = ["RENDERING_ONLY", "UNRECORDED", "code_id_of", "code_provenance", "source_hash"]
