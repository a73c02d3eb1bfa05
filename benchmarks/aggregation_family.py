"""FedAGHN, pFedGAT and the personalised-aggregation family on Fashion-MNIST, plus their collaboration graphs.

Runs ``src/graphfed/configs/suites/aggregation.yaml`` through ``graphfed bench`` (resumable: finished runs are reused),
then reads the saved collaboration graphs of the case-study runs and appends to the report:

* FedAGHN on FedAGHN's case-study split: average Self / Similar (same group) / Other weight (its Table 4);
* pFedGAT under an IID split: every entry of R within 0.5/N of 1/N;
* pFedGAT on the case-study split (pathological by groups): more weight inside groups than across;
* heatmaps per layer and over rounds for each of these runs, linked from the report.

    .venv/bin/python benchmarks/aggregation_family.py            # writes benchmarks/results/aggregation/
    .venv/bin/python benchmarks/aggregation_family.py --report-only  # rewrites the report from finished runs
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np

from graphfed import runs
from graphfed.bench import run_suite
from graphfed.config import RunConfig
from graphfed.data import build_federation
from graphfed.report.collaboration import group_weights, max_deviation_from_uniform
from graphfed.report.plots import plot_graphs
from graphfed.suites import Cell, load_suite, packaged_suites, suite_cells

REPO = Path(__file__).resolve().parent.parent
SUITE = packaged_suites()["aggregation"]
RESULTS = REPO / "benchmarks" / "results" / "aggregation"
GROUPED = "casestudy"  # suite key of the case-study split (clients in groups of shared classes)
IID = "iid"  # suite key of the IID split
CHECKED = ("fedaghn", "pfedgat")  # the checks; other rows (e.g. the paper's GAT layer) are for contrast


def _last_graph(run_dir: Path) -> tuple[int, list[str], np.ndarray]:
    saved = runs.load_graphs(run_dir)
    if not saved:
        raise FileNotFoundError(f"{run_dir}: no collaboration graphs saved")
    return saved[-1]


def _heatmaps(run_dir: Path, out: Path, name: str) -> list[str]:
    """Draw the run's heatmaps into ``out/heatmaps/<name>/``; markdown image links relative to ``out``."""
    target = out / "heatmaps" / name
    return [f"![{name}: {path.stem}]({path.relative_to(out).as_posix()})" for path in plot_graphs(run_dir, target)]


def _row_spread(matrices: np.ndarray) -> float:
    """How much the rows of each layer's matrix differ (0: every client gets the same weighted average)."""
    return float(np.abs(matrices - matrices[:, :1, :]).max())


def _client_groups(config: RunConfig) -> np.ndarray:
    groups = build_federation(config.dataset, config.seed).client_groups
    if groups is None:
        raise ValueError(f"dataset {config.dataset.name} defines no client groups")
    return groups.numpy()


def grouped_section(cells: list[Cell], out: Path, groups_by_seed: dict[int, np.ndarray]
                    ) -> tuple[list[str], list[str]]:
    """Self / Similar / Other table of every method on the grouped split; (markdown lines, failed checks)."""
    lines = ["| method | seed | round | Self | Similar (same group) | Other (other groups) | Similar > Other | "
             "rows alike: max abs(W_i - W_1) |", "|---|---|---|---|---|---|---|---|"]
    failures, pictures = [], []
    for cell in cells:
        run_dir = cell.directory(out)
        last_round, _, matrices = _last_graph(run_dir)
        seed = cell.config.seed
        weights = group_weights(matrices, groups_by_seed[seed])
        # beyond the table's 4 decimals: the paper's static GAT layer gives equal weights up to float rounding
        ok = weights.similar - weights.other > 1e-4
        if not ok and cell.method in CHECKED:
            failures.append(f"{cell.method} seed {seed}: Similar {weights.similar:.4f} <= Other {weights.other:.4f}")
        lines.append(f"| {cell.method} | {seed} | {last_round} | {weights.self_weight:.4f} | {weights.similar:.4f} | "
                     f"{weights.other:.4f} | {'yes' if ok else '**no**'} | {_row_spread(matrices):.4f} |")
        name = f"{GROUPED}-{cell.method}-seed{seed}"
        pictures += [f"**{cell.method}, seed {seed}**", "", *_heatmaps(run_dir, out, name), ""]
    return [*lines, "", *pictures], failures


#: layers of a collaboration graph that FedAGHN's Table 4 calls shallow and deep: here the first and the last
DEPTHS = {"all layers": slice(None), "shallow (first layer)": slice(0, 1), "deep (last layer)": slice(-1, None)}


def depth_section(cells: list[Cell], out: Path, groups_by_seed: dict[int, np.ndarray]) -> list[str]:
    """FedAGHN's Table 4 layout: Self / Similar / Other for all, shallow and deep layers at four stages of training
    (the first saved round, one third, two thirds, the last), from each run's saved graphs."""
    lines: list[str] = []
    for cell in cells:
        saved = runs.load_graphs(cell.directory(out))
        stages = [saved[i] for i in sorted({0, len(saved) // 3, 2 * len(saved) // 3, len(saved) - 1})]
        groups = groups_by_seed[cell.config.seed]
        lines += [f"**{cell.method}, seed {cell.config.seed}**", "",
                  "| layers | weight | " + " | ".join(f"round {round_}" for round_, _, _ in stages) + " |",
                  "|---|---|" + "---|" * len(stages)]
        for depth, layers in DEPTHS.items():
            weights = [group_weights(matrices[layers], groups) for _, _, matrices in stages]
            for name, field in (("Self", "self_weight"), ("Similar", "similar"), ("Other", "other")):
                lines.append(f"| {depth} | {name} | " + " | ".join(f"{getattr(w, field):.4f}" for w in weights) + " |")
        lines.append("")
    return lines


def iid_section(cells: list[Cell], out: Path) -> tuple[list[str], list[str]]:
    """How far pFedGAT's R is from uniform under IID data; (markdown lines, failed checks)."""
    lines = ["| method | seed | round | N | max abs(R_ij - 1/N), in units of 1/N | within 0.5/N | "
             "rows alike: max abs(R_i - R_1) |", "|---|---|---|---|---|---|---|"]
    failures, pictures = [], []
    for cell in cells:
        run_dir = cell.directory(out)
        last_round, _, matrices = _last_graph(run_dir)
        deviation = max_deviation_from_uniform(matrices)
        ok = deviation <= 0.5
        if not ok and cell.method in CHECKED:
            failures.append(f"{cell.method} seed {cell.config.seed}: max deviation {deviation:.3f}/N > 0.5/N")
        lines.append(f"| {cell.method} | {cell.config.seed} | {last_round} | {matrices.shape[-1]} | {deviation:.3f} | "
                     f"{'yes' if ok else '**no**'} | {_row_spread(matrices):.4f} |")
        pictures += [f"**{cell.method}, seed {cell.config.seed}**", "",
                     *_heatmaps(run_dir, out, f"{IID}-{cell.method}-seed{cell.config.seed}"), ""]
    return [*lines, "", *pictures], failures


def collaboration_section(suite_path: Path, out: Path) -> tuple[list[str], list[str]]:
    """The report's collaboration-graph appendix from the finished runs in ``out`` (heatmaps drawn into
    ``out/heatmaps/``); (markdown lines, failed checks)."""
    cells = suite_cells(load_suite(suite_path))
    grouped_cells = [c for c in cells if c.dataset == GROUPED]
    # the case-study federation is built once per seed (it loads Fashion-MNIST) and read by both sections
    groups_by_seed = {seed: _client_groups(next(c.config for c in grouped_cells if c.config.seed == seed))
                      for seed in sorted({c.config.seed for c in grouped_cells})}
    grouped, grouped_failures = grouped_section(grouped_cells, out, groups_by_seed)
    iid, iid_failures = iid_section([c for c in cells if c.dataset == IID], out)
    depth = depth_section([c for c in grouped_cells if c.method == "fedaghn"], out, groups_by_seed)
    failures = grouped_failures + iid_failures
    section = ["## Collaboration graphs", "",
               "Read from each run's last saved `graphs/round_XXXX.npz` (row i: the weights client i's personalised "
               "model gives every client), averaged over layers; Self is W_ii, Similar the mean weight per other "
               "client of the same group, Other the mean weight per client of another group (FedAGHN Table 4).", "",
               f"### Case-study split (`{GROUPED}`): 5 groups of 4 clients sharing classes", "", *grouped,
               "### By layer depth over training (FedAGHN Table 4 layout)", "",
               "FedAGHN keeps one graph per layer; the paper reports its weights for the whole model, the shallow "
               "and the deep layers at four stages of training (CIFAR-100: Self 0.0291 -> 0.0126, deep layers' "
               "Similar about twice Other at the end). Here shallow is the first layer and deep the last. The self "
               "weight barely moves: benchmarks/results/fedaghn_self_weight/report.md measures why.", "", *depth,
               f"### IID split (`{IID}`)", "", *iid,
               f"**Checks** (on {', '.join(CHECKED)}): " + ("all passed." if not failures
                                                           else "FAILED: " + "; ".join(failures)), "",
               "A row spread of 0 means every client receives the same weighted average of the client models. "
               "`pfedgat-gat` is the paper's literal layer: GAT scores e_ij = LeakyReLU(a_dst.W h_i + a_src.W h_j) "
               "on h_i = LayerNorm(theta_i). The a_dst term is the same along row i and cancels in the softmax "
               "wherever the LeakyReLU stays on one side of its kink. This static attention gives every client the "
               "same distribution over clients, so it cannot prefer a client's own group. `pfedgat` (the default) "
               "scores pairs with GATv2 on centred models, LayerNorm(theta_i - mean_j theta_j), and learns the "
               "groups from the validation feedback alone. FedAGHN's weights depend on the pair (i, j) through "
               "cos(delta_i, delta_j).", ""]
    return section, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--suite", type=Path, default=SUITE)
    parser.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data")
    # `graphfed bench --report-only` would rewrite the suite report without the collaboration graphs
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: rewrite the report, graphs included, from the finished runs")
    args = parser.parse_args(argv)
    command = shlex.join([".venv/bin/python", "benchmarks/aggregation_family.py", *(sys.argv[1:] if argv is None
                                                                                      else argv)])
    report, all_done = run_suite(args.suite, args.out, data_dir=args.data_dir, command=command,
                                 report_only=args.report_only)
    if not all_done:
        print(f"some runs did not complete; see {report}", file=sys.stderr)
        return 1
    section, failures = collaboration_section(args.suite, args.out)
    with report.open("a") as handle:  # the suite report is complete; the graph section goes after it
        handle.write("\n" + "\n".join(section))
    print(f"report: {report}" + (f"; failed checks: {failures}" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
