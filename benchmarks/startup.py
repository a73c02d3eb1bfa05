"""Start-up latency of the command line: how long a user waits for ``graphfed --help`` and ``graphfed list``.

Each command runs ``--repeats`` times in a fresh process (after one warm-up run that fills the OS file cache);
the median wall time counts. Also reports whether the process imported torch and torch_geometric at all
(``-X importtime``), since those two imports are nearly all of the latency.

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "startup.json")
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
