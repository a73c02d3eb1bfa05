"""Reproduce Panacea's Table II (personalised) and Table III (novel clients) on FL-60 and TPT-48.

Runs a grid of methods x seeds per dataset through :func:`graphfed.sim.engine.run_config`, writes every
run's directory (config.yaml, rounds.jsonl, summary.json, plots) under ``<out>/paper_runs/``, then
``<out>/paper_tables.json`` (all summaries + aggregated rows) and ``<out>/paper_tables.md`` (one table per
dataset, the paper's numbers beside ours).

    .venv/bin/python benchmarks/paper_tables.py                       # the full grid, 3 seeds
    .venv/bin/python benchmarks/paper_tables.py --rounds 20 --seeds 1  # smoke run
    .venv/bin/python benchmarks/paper_tables.py --datasets tpt48 --set train.lr=0.01  # tuning
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from graphfed.config import ConfigError, RunConfig, dump_config, load_config, validate_config
from graphfed.report.tables import HEADERS, compare_rows, row_cells
from graphfed.sim.engine import run_config

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class Benchmark:
    """One dataset of the grid: its config file and the methods run on it by default."""

    config: Path
    methods: tuple[str, ...]


BENCHMARKS: dict[str, Benchmark] = {
    "fl60": Benchmark(REPO / "configs" / "bench_fl60.yaml", ("panacea", "pfedhn", "fedavg", "local")),
    "tpt48": Benchmark(REPO / "configs" / "bench_tpt48.yaml", ("panacea", "pfedhn", "fedavg", "fedavg-ft", "local")),
}

# Panacea (arXiv 2024) Table II (all clients) and Table III (20 % novel clients): mean ± std over clients,
# from five runs of 800 rounds. Methods missing here have no paper entry.
PAPER: dict[str, dict[str, tuple[str, str]]] = {
    "fl60": {"fedavg": ("97.9 ± 9.7", "99.2 ± 2.9"), "fedavg-ft": ("100.0 ± 0.0", "100.0 ± 0.0"),
             "pfedhn": ("84.4 ± 24.8", "80.0 ± 25.6"), "panacea": ("100.0 ± 0.0", "100.0 ± 0.0")},
    "tpt48": {"fedavg": ("2.6 ± 0.9", "2.8 ± 1.0"), "fedavg-ft": ("2.6 ± 1.0", "2.8 ± 0.8"),
              "pfedhn": ("2.7 ± 1.1", "3.0 ± 1.0"), "panacea": ("2.6 ± 0.7", "2.8 ± 0.9")},
}

PROTOCOL = (
    "Evaluation protocol: 20 % of the clients are novel (never sampled for training). For each run, the "
    "personalised model of every training client is evaluated on its own test split at the round with the "
    "best mean validation metric (evaluated every `train.eval_every` rounds); a run's score is the mean over "
    "clients, and the tables give mean ± std of that score over seeds, plus the std over clients averaged "
    "over seeds. Novel clients are evaluated at the same round on their test split without any fine-tuning "
    "or adaptation (hypernetwork methods generate them from the novel client's embedding, which never "
    "receives an update of its own), except FedAvg-FT, "
    "whose evaluation fine-tunes every client locally by design. 'novel (adapted)' is the separate "
    "embedding-only adaptation of novel clients (`train.novel_adapt_rounds` rounds, pFedHN Sec. 5.3)."
)

PAPER_NOTE = (
    "Paper columns: Panacea paper Table II (all clients) and Table III (novel clients), {unit}. The paper's ± "
    "is the spread **across clients** (its Sec. IV-B), from five independent runs of 800 rounds: compare it "
    "with our 'std over clients' column, not with our ± over seeds. — : no paper entry."
)
OUR_UNITS = {"accuracy": "accuracy in % like ours",
             "mse": "MSE in units of 10⁻³ (ours: plain MSE of the min-max scaled targets; the paper does not "
                    "state its target scaling)"}


# ---- the grid --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(BENCHMARKS), help="comma-separated: "
                        + ", ".join(BENCHMARKS))
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods for every dataset (default: each dataset's own list)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per method: seed, seed+1, ... (default 3)")
    parser.add_argument("--rounds", type=int, default=None, help="override train.rounds")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override passed to every run, e.g. train.lr=0.01 (repeatable)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory (default benchmarks/results)")
    parser.add_argument("--reuse", action="store_true",
                        help="skip runs whose directory already holds a completed summary of the same config")
    args = parser.parse_args(argv)
    args.datasets = _split_names(args.datasets)
    unknown = [name for name in args.datasets if name not in BENCHMARKS]
    if unknown:
        parser.error(f"--datasets: unknown {', '.join(unknown)}; allowed: {', '.join(BENCHMARKS)}")
    args.methods = _split_names(args.methods) if args.methods else None
    if args.seeds < 1 or (args.rounds is not None and args.rounds < 1):
        parser.error("--seeds and --rounds must be at least 1")
    return args


def _split_names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _anchor_data_dir(data: dict[str, Any]) -> None:
    """Resolve a relative ``dataset.data_dir`` against the repository root, so any working directory works."""
    data_dir = data["dataset"].get("data_dir")
    if data_dir and not Path(data_dir).expanduser().is_absolute():
        data["dataset"]["data_dir"] = str((REPO / data_dir).resolve())


def grid_configs(bench: Benchmark, methods: list[str], seeds: int, rounds: int | None,
                 overrides: list[str]) -> dict[str, list[RunConfig]]:
    """One validated config per (method, seed); method options in the file apply to its own method only."""
    extra = [*overrides, f"train.rounds={rounds}"] if rounds is not None else list(overrides)
    base = load_config(bench.config, extra)
    configs: dict[str, list[RunConfig]] = {}
    for method in methods:
        data = base.model_dump(mode="json")
        _anchor_data_dir(data)
        data["method"] = {"name": method, "options": base.method.options if method == base.method.name else {}}
        configs[method] = []
        for k in range(seeds):
            data["seed"] = base.seed + k
            configs[method].append(validate_config(data))
    return configs


def run_one(config: RunConfig, out_dir: Path, reuse: bool) -> dict[str, Any]:
    """Run one config (or reuse its completed summary); adds ``total_seconds`` (setup + run + novel eval)."""
    summary_path = out_dir / "summary.json"
    if reuse and summary_path.exists() and (out_dir / "config.yaml").read_text() == dump_config(config):
        summary = json.loads(summary_path.read_text())
        if summary.get("status") == "completed" and "total_seconds" in summary:
            return summary
    begin = time.perf_counter()
    summary = run_config(config, out_dir, progress=False)
    summary["total_seconds"] = round(time.perf_counter() - begin, 3)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _short(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def run_grid(dataset: str, configs: dict[str, list[RunConfig]], runs_dir: Path,
             reuse: bool) -> dict[str, list[dict[str, Any]]]:
    summaries: dict[str, list[dict[str, Any]]] = {}
    for method, runs in configs.items():
        summaries[method] = []
        for config in runs:
            summary = run_one(config, runs_dir / dataset / method / f"seed{config.seed}", reuse)
            summaries[method].append(summary)
            print(f"{dataset:6s} {method:10s} seed {config.seed}: {summary['status']}, test {summary['metric']} "
                  f"{_short(summary['test_mean'])} (best round {summary['best_round']}), novel "
                  f"{_short(summary['novel_mean'])}, {summary['total_seconds']:.1f} s", flush=True)
    return summaries


# ---- the report ------------------------------------------------------------------------------------
MD_HEADERS = [*HEADERS, "run s (total)", "paper", "paper novel"]


def table_rows(dataset: str, summaries: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """``compare_rows`` plus the mean total seconds per run and the paper's numbers."""
    rows = compare_rows(summaries)
    for row in rows:
        runs = summaries[row["method"]]
        row["total_seconds"] = sum(r["total_seconds"] for r in runs) / len(runs)
        row["paper"], row["paper_novel"] = PAPER.get(dataset, {}).get(row["method"], (None, None))
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(MD_HEADERS) + " |", "|" + "---|" * len(MD_HEADERS)]
    for row in rows:
        cells = [*row_cells(row), f"{row['total_seconds']:.1f}", row["paper"] or "—", row["paper_novel"] or "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def config_metric(rows: list[dict[str, Any]]) -> str:
    return rows[0]["metric"] if rows else "accuracy"


def dataset_section(dataset: str, config: RunConfig, seeds: int, rows: list[dict[str, Any]]) -> str:
    bench = BENCHMARKS[dataset]
    train = config.train
    setup = (f"config `{bench.config.relative_to(REPO)}`; {train.rounds} rounds, {train.clients_per_round} clients "
             f"per round, {train.local_steps} local steps, batch {train.batch_size}, client lr {train.lr}, "
             f"evaluation every {train.eval_every} rounds; {seeds} seed(s) from {config.seed}.")
    return "\n".join([f"## {dataset}", "", setup, "", markdown_table(rows),
                      PAPER_NOTE.format(unit=OUR_UNITS[config_metric(rows)]), ""])


def command_line(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return shlex.join([".venv/bin/python", "benchmarks/paper_tables.py", *args])


def environment() -> dict[str, Any]:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "platform": platform.platform(),
            "python": platform.python_version(), "cpu_count": os.cpu_count()}


def write_reports(out: Path, command: str, sections: list[str], results: dict[str, Any]) -> None:
    env = results["environment"]
    header = ["# Panacea Tables II/III with graphfed", "", "```", command, "```", "",
              f"torch {env['torch']}, {env['threads']} thread(s), {env['cpu_count']} CPU(s), {env['platform']}; "
              f"total {results['total_seconds']:.0f} s.", "", PROTOCOL, ""]
    (out / "paper_tables.md").write_text("\n".join(header + sections))
    (out / "paper_tables.json").write_text(json.dumps(results, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    begin = time.perf_counter()
    try:
        grids = {name: grid_configs(BENCHMARKS[name], args.methods or list(BENCHMARKS[name].methods), args.seeds,
                                    args.rounds, args.overrides) for name in args.datasets}
    except ConfigError as err:  # every config is validated before the first run starts
        print(f"error: {err}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"command": command_line(argv), "protocol": PROTOCOL, "datasets": {}}
    sections = []
    for name, configs in grids.items():
        summaries = run_grid(name, configs, args.out / "paper_runs", args.reuse)
        rows = table_rows(name, summaries)
        first = next(iter(configs.values()))[0]
        results["datasets"][name] = {"config": str(BENCHMARKS[name].config.relative_to(REPO)),
                                     "resolved_config": first.model_dump(mode="json"), "rows": rows,
                                     "runs": summaries}
        sections.append(dataset_section(name, first, args.seeds, rows))
    results["environment"] = environment()
    results["paper"] = {"numbers": PAPER, "units": OUR_UNITS}
    results["total_seconds"] = round(time.perf_counter() - begin, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    write_reports(args.out, results["command"], sections, results)
    print(f"paper_tables: {args.out / 'paper_tables.md'}, {args.out / 'paper_tables.json'} "
          f"({results['total_seconds']:.0f} s)")
    failed = [s for d in results["datasets"].values() for runs in d["runs"].values() for s in runs
              if s["status"] != "completed"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
