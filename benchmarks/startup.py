"""Start-up latency: how long a user waits for ``graphfed --help`` and ``graphfed list``, and what ``graphfed run``
pays before its first round for importing the engine (``import graphfed.sim.engine``).

Each command runs ``--repeats`` times in a fresh process (after one warm-up run that fills the OS file cache);
the median wall time counts. Also reports whether the process imported torch and torch_geometric at all
(``-X importtime``), since those two imports are nearly all of the latency. ``--before SRC`` measures the engine
import of another source tree too (e.g. a worktree of an older commit: ``SRC/src`` goes first on the path), so one
run shows a change's effect on the same machine.

    .venv/bin/python benchmarks/startup.py          # writes benchmarks/results/startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from graphfed.provenance import code_provenance

RESULTS = Path(__file__).resolve().parent / "results"
VENV_BIN = Path(sys.executable).parent
COMMANDS = {"graphfed --help": ["--help"], "graphfed list": ["list"]}


def wall_seconds(args: list[str]) -> float:
    begin = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - begin


def imported(module_args: list[str], package: str) -> bool:
    """Whether running the CLI with ``module_args`` imports ``package`` (from ``-X importtime``)."""
    code = (f"import sys; sys.argv = ['graphfed', *{module_args!r}]\n"
            "from graphfed.cli import main\ntry: main()\nexcept SystemExit: pass")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          timeout=120)
    return any(line.rsplit("|", 1)[-1].strip() == package for line in done.stderr.splitlines())


ENGINE_PROBE = ("import sys, time; begin = time.perf_counter(); import graphfed.sim.engine; "
                "print(time.perf_counter() - begin, 'torch_geometric' in sys.modules)")


def engine_import(repeats: int, source: Path | None = None) -> dict[str, object]:
    """Median seconds of ``import graphfed.sim.engine`` in fresh processes, and whether it loads PyG."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source / "src")
    runs = []
    for _ in range(repeats + 1):  # the first one warms the file cache
        done = subprocess.run([sys.executable, "-c", ENGINE_PROBE], capture_output=True, text=True, check=True,
                              timeout=120, env=env)
        seconds, pyg = done.stdout.split()
        runs.append((float(seconds), pyg == "True"))
    times = [seconds for seconds, _ in runs[1:]]
    return {"median_seconds": statistics.median(times), "all_seconds": times,
            "imports_torch_geometric": runs[-1][1], **({"source": str(source)} if source else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "startup.json")
    parser.add_argument("--before", type=Path, help="another source tree whose engine import to measure too")
    args = parser.parse_args(argv)
    result: dict[str, object] = {"load_average_before": list(os.getloadavg()), "repeats": args.repeats}
    for name, command in COMMANDS.items():
        full = [str(VENV_BIN / "graphfed"), *command]
        wall_seconds(full)  # warm-up
        times = [wall_seconds(full) for _ in range(args.repeats)]
        result[name] = {"median_seconds": statistics.median(times), "all_seconds": times,
                        "imports_torch": imported(command, "torch"),
                        "imports_torch_geometric": imported(command, "torch_geometric")}
        print(f"{name}: median {statistics.median(times):.2f} s; torch imported: {result[name]['imports_torch']}, "
              f"torch_geometric imported: {result[name]['imports_torch_geometric']}")
    result["import graphfed.sim.engine"] = engine_import(args.repeats)
    if args.before is not None:
        result["import graphfed.sim.engine (before)"] = engine_import(args.repeats, args.before)
    for name in ("import graphfed.sim.engine", "import graphfed.sim.engine (before)"):
        if name in result:
            entry = result[name]
            print(f"{name}: median {entry['median_seconds']:.2f} s; torch_geometric imported: "  # type: ignore[index]
                  f"{entry['imports_torch_geometric']}")  # type: ignore[index]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result["code"] = code_provenance()  # the numbers are tied to the code that made them
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
