"""Vouch that today's engine behaves as an earlier revision's, so that runs made by that revision stay current.

Runs ``tools/vouch_suite.py`` under the revision ``REV`` (a git worktree) and under this working tree, on this machine,
and compares every summary field for field (fields one side does not record, e.g. ones added since, are named but
do not decide). When every run agrees it writes ``src/graphfed/behaviour.json``:

* ``engines``: today's engine hash and REV's map to REV's behaviour id (REV's own entry if REV had one, else its
  engine hash), so a run recording that behaviour is a run of today's engine;
* ``modules``: each run-specific module the suite ran (a method's, model's, dataset's file) whose hash changed since
  REV: its REV hash and today's in one class, so a run of REV that reaches it stays current (an edit that only added
  a refusal, or a path the suite's runs do not take: the suite's coverage is what the vouch is worth);
* ``private_engines``: with ``--no-privacy`` (a change to the mechanisms: private runs would differ), today's engine
  hash maps to a private behaviour of its own, so private runs of earlier engines are stale while the others stay
  current; without it, today's follows REV's private behaviour;
* ``legacy``: REV's code id (one hash over all its sources, what runs recorded before they recorded their modules)
  with its behaviour and the hash of each of its run-specific modules, and the scope the suite covered
  (``--no-privacy``: the private runs were left out, so legacy private runs stay stale).

Both revisions run the suite once per kernel path of :data:`KERNEL_PATHS`: the CPU's own kernels and MKL held to its
AVX2 path (the one AMD CPUs take). An edit that swaps one computation for another of the same value (a product for
its transposed form) can give the same bits on one path and not on another, so the vouch compares both and records
under ``checked_on`` (today's engine hash -> REV and each path's :func:`~graphfed.provenance.cpu_kernels`) where its
promise was seen to hold; on other kernels it promises what the two paths show, not more.

When a run differs, nothing is written and the differences are printed (exit 1).

    python tools/vouch.py 03b09b4e --no-privacy     # then commit src/graphfed/behaviour.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from graphfed import provenance  # noqa: E402

#: the kernel paths both revisions are compared on (name -> environment): this CPU's own, and MKL's AVX2 path
KERNEL_PATHS: dict[str, dict[str, str]] = {"own": {}, "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}}


def kernels_of(path: dict[str, str]) -> str:
    """:func:`~graphfed.provenance.cpu_kernels` as a process started with ``path`` names its kernels."""
    code = "from graphfed.provenance import cpu_kernels; print(cpu_kernels())"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **path},
                          capture_output=True, text=True, check=True).stdout.strip()


def revision_hashes(source: Path) -> tuple[str, str, dict[str, str]]:
    """(engine hash, code id, run-specific module hashes) of the sources under ``source``, computed by their own
    ``graphfed.provenance``: a revision's behaviour table is keyed by the hashes its own rules computed."""
    code = ("import json; from graphfed import provenance as p; "
            "print(json.dumps([p.engine_hash(), p.source_hash()[:16], p.specific_hashes()]))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(source)},
                          capture_output=True, text=True, check=True)
    engine, legacy_id, modules = json.loads(done.stdout.splitlines()[-1])
    return engine, legacy_id, modules


def run_suite(source: Path, out: Path, no_privacy: bool, path: dict[str, str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(source), **path}
    command = [sys.executable, str(ROOT / "tools" / "vouch_suite.py"), "--out", str(out),
               *(["--no-privacy"] if no_privacy else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"the vouch suite failed under {source}:\n{done.stderr[-3000:]}")


def differences(old: dict, new: dict) -> tuple[list[str], list[str]]:
    """(fields that differ, fields only one side records), over every run. A field REV never filled in any run
    (None throughout: REV's summary had the field but nothing recorded it) counts as one REV does not record."""
    differ, unshared = [], []
    never_recorded = {field for field in {f for run in old.values() for f in run}
                      if all(run.get(field) is None for run in old.values())}
    for run in sorted(set(old) | set(new)):
        if run not in old or run not in new:
            differ.append(f"{run}: run by one side only")
            continue
        a, b = old[run], new[run]
        for field in sorted(set(a) | set(b)):
            if field not in a or field not in b or (field in never_recorded and b[field] is not None):
                unshared.append(f"{run}.{field}")
            elif field == "method_options" and isinstance(a[field], dict) and isinstance(b[field], dict):
                # an option added since (at its default) is named, not decisive: the numbers beside it decide
                unshared += [f"{run}.method_options.{key}" for key in sorted(set(a[field]) ^ set(b[field]))]
                if any(a[field][key] != b[field][key] for key in set(a[field]) & set(b[field])):
                    differ.append(f"{run}.method_options: {str(a[field])[:80]} -> {str(b[field])[:80]}")
            elif field == "per_client" and isinstance(a[field], dict) and isinstance(b[field], dict):
                for client in set(a[field]) | set(b[field]):
                    left, right = a[field].get(client, {}), b[field].get(client, {})
                    shared = set(left) & set(right)
                    if any(left[key] != right[key] for key in shared) or (set(left) ^ set(right)) - {
                            "no_graph_neighbours"}:
                        differ.append(f"{run}.per_client.{client}")
            elif a[field] != b[field]:
                differ.append(f"{run}.{field}: {str(a[field])[:80]} -> {str(b[field])[:80]}")
    return differ, unshared


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision")
    parser.add_argument("--no-privacy", action="store_true", help="leave the private runs out (REV predates them)")
    args = parser.parse_args()
    revision_id = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=8", args.revision], capture_output=True,
                                 text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), args.revision],
                       check=True)
        try:
            old_root = tree / "src" / "graphfed"
            differ, unshared, compared = [], [], 0
            for name, path in KERNEL_PATHS.items():
                run_suite(tree / "src", Path(scratch) / f"old-{name}.json", args.no_privacy, path)
                run_suite(ROOT / "src", Path(scratch) / f"new-{name}.json", args.no_privacy, path)
                old = json.loads((Path(scratch) / f"old-{name}.json").read_text())
                new = json.loads((Path(scratch) / f"new-{name}.json").read_text())
                on_path = differences(old, new)
                differ += [f"[{name}] {line}" for line in on_path[0]]
                unshared += on_path[1]
                compared += len(old)
            old_table = old_root / "behaviour.json"
            # REV's hashes as REV's own code computes them (its rules for what is engine may differ from today's)
            old_engine, legacy_id, modules = revision_hashes(tree / "src")
            old_vouches = json.loads(old_table.read_text()) if old_table.is_file() else {}
            old_behaviour = old_vouches.get("engines", {}).get(old_engine, old_engine[:16])
            old_module_classes = old_vouches.get("modules", {})
            records_modules = "def run_code(" in (old_root / "provenance.py").read_text()
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    print(f"{compared} runs compared on {len(KERNEL_PATHS)} kernel paths ({', '.join(KERNEL_PATHS)}); fields only one "
          f"side records: {len(set(unshared))} "
          f"({', '.join(sorted({name.split('.', 1)[1] for name in unshared})) or 'none'})")
    if differ:
        print("the engine does not behave as at " + args.revision + ":\n  " + "\n  ".join(differ[:40]))
        return 1
    table = json.loads(provenance.BEHAVIOUR.read_text()) if provenance.BEHAVIOUR.is_file() else {}
    engines, legacy = table.setdefault("engines", {}), table.setdefault("legacy", {})
    joined = join(engines, old_engine, old_behaviour, provenance.engine_hash())
    # private runs: without the private runs compared (a change to the mechanisms), today's engine is a private
    # behaviour of its own, and every private run before it is stale; compared, they follow REV's private class
    private = table.setdefault("private_engines", {})
    today = provenance.engine_hash()
    if args.no_privacy:
        private[today] = today[:16]
    elif old_engine in private:
        private[today] = private[old_engine]
    for entry in legacy.values():  # a legacy code of REV's class names the joined class
        entry["behaviour"] = engines.get(entry["behaviour"], joined if entry["behaviour"] == old_behaviour
                                         else entry["behaviour"])
    # each run-specific module the suite ran, changed since REV: its old hash and today's in one class
    modules_table = table.setdefault("modules", {})
    covered = ran_modules(args.no_privacy)
    changed = [path for path in covered if modules.get(path) not in (None, provenance.file_hash(path))]
    for path in changed:
        classes = modules_table.setdefault(path, {})
        join(classes, modules[path], old_module_classes.get(path, {}).get(modules[path], modules[path]),
             provenance.file_hash(path))
    if not records_modules:  # REV's runs recorded one code id over all its sources: say what it stands for
        legacy[legacy_id] = {"revision": args.revision, "behaviour": joined, "modules": modules,
                             "scope": {"privacy": not args.no_privacy}}
    table.setdefault("checked_on", {})[provenance.engine_hash()] = {
        "revision": revision_id, "kernels": sorted(kernels_of(path) for path in KERNEL_PATHS.values())}
    provenance.BEHAVIOUR.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"vouched: today's engine behaves as {args.revision}'s (behaviour {joined})"
          + ("" if records_modules else f"; its code id {legacy_id} is recorded with its {len(modules)} module hashes")
          + f"; the suite ran {len(covered)} run-specific modules, "
          f"{len(changed)} changed since ({', '.join(changed) or 'none'}): each now one class with its old self")
    return 0


def join(classes: dict[str, str], old_key: str, old_id: str, new_key: str) -> str:
    """Place ``old_key`` (whose class is ``old_id``) and ``new_key`` in one class of ``classes`` (key -> class id):
    the class ``new_key`` already has keeps its id, else ``old_id`` names both; every key of either class follows."""
    joined = classes.get(new_key, old_id)
    merged = {old_id, classes.get(new_key, joined)}
    for key, named in classes.items():
        if named in merged:
            classes[key] = joined
    classes[old_key] = classes[new_key] = joined
    return joined


def ran_modules(no_privacy: bool) -> list[str]:
    """The run-specific modules the vouch suite's runs reach (their method, model, dataset and attack sources)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from graphfed.setup import run_roots
    from vouch_suite import suite_configs

    return sorted({path for config in suite_configs(no_privacy).values()
                   for path in provenance.module_closure(run_roots(config))})  # type: ignore[arg-type]

if __name__ == "__main__":
    sys.exit(main())
