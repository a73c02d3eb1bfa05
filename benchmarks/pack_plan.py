"""The paper suite re-planned with packing: which of its cells a pack would share calls for, and their hours.

For every (section, method) of a suite, the seeds' configs form one pack key (they differ in the seed only). This
script asks the pack's own calibration (``graphfed.client.autotune.choose_packing``, as ``graphfed bench`` does
for a pack's first run, cached per machine) whether their clients' calls would be shared, and adds up the training
hours the committed runs of those cells recorded (``wall_seconds``). Cells packing declines run one after another at
their recorded speed, so their hours are what packing cannot save; the shared cells' hours bound what it can.
``pack.py`` measures the speed-up of shared cells; ``graphfed bench --pack 1`` against the default measures a whole
section (see docs/how-to/benchmarks.md).

    .venv/bin/python benchmarks/pack_plan.py    # -> benchmarks/results/pack_plan.json (a few minutes: data loads)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from graphfed.client.autotune import choose_packing
from graphfed.provenance import code_provenance
from graphfed.runs import atomic_write_text
from graphfed.sim.engine import Simulator
from graphfed.sim.pack import pack_refusal
from graphfed.suites import load_suite, packaged_suites, suite_cells

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "pack_plan.json"


def recorded_seconds(directory: Path) -> float:
    path = directory / "summary.json"
    return float(json.loads(path.read_text()).get("wall_seconds") or 0.0) if path.exists() else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=packaged_suites()["paper"])
    parser.add_argument("--runs", type=Path, default=ROOT / "results" / "paper", help="the suite's --out")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    cells = suite_cells(load_suite(args.suite))
    groups: dict[tuple[str, str], list[Any]] = {}
    for cell in cells:
        groups.setdefault((cell.dataset, cell.method), []).append(cell)
    sections: dict[str, dict[str, Any]] = {}
    for (dataset, method), members in groups.items():
        section = sections.setdefault(dataset, {"hours": 0.0, "shared_hours": 0.0, "shared": [], "declined": [],
                                                "refused": []})
        hours = sum(recorded_seconds(cell.directory(args.runs)) for cell in members) / 3600
        section["hours"] += hours
        config = members[0].config
        refusal = pack_refusal(config)
        if refusal is not None or len(members) < 2:
            section["refused"].append(f"{method}: {refusal or 'one seed'}")
            continue
        first = Simulator(config, None, progress=False)
        choice = choose_packing(first.setup.model, first.setup.spec, first.setup.federation.train,
                                first.setup.client_rule, first.clients_per_round, len(members)).record()
        if choice["batched"]:
            section["shared"].append(method)
            section["shared_hours"] += hours
        else:
            section["declined"].append(method)
        print(f"{dataset} {method}: {'shares' if choice['batched'] else 'declines'} ({hours:.2f} h recorded)",
              flush=True)
    for section in sections.values():
        section["hours"], section["shared_hours"] = round(section["hours"], 3), round(section["shared_hours"], 3)
    total = sum(section["hours"] for section in sections.values())
    shared = sum(section["shared_hours"] for section in sections.values())
    result = {"benchmark": "pack_plan", "code": code_provenance(), "suite": str(args.suite.name),
              "hours": round(total, 2), "shared_hours": round(shared, 2), "sections": sections}
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"{total:.1f} h recorded; cells whose calls a pack shares: {shared:.1f} h (what packing can save at most)")


if __name__ == "__main__":
    main()
