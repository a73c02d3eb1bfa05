"""``graphfed compare``: several methods (and variants) over seeds, one table; the statistics live in the report
layer."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from graphfed.config import RunConfig, validate_config
from graphfed.errors import GraphfedError

if TYPE_CHECKING:
    from graphfed.runs import RunResult

from graphfed.cli.common import (
    EXIT_CONFIG,
    EXIT_RUN,
    SetOption,
    app,
    check_out,
    claim_out,
    console,
    fail,
    fail_over_budget,
    load,
    names,
    run_many,
    run_one,
    setup_logging,
    show,
    table,
)


def _finished_run_of(cfg: RunConfig, out: Path) -> RunResult | None:
    """The finished run of exactly ``cfg`` in ``out`` (compare reuses it instead of running it again), or None."""
    from graphfed.config import read_yaml, same_run
    from graphfed.runs import CONFIG, read_result

    try:
        result = read_result(out)
        recorded = validate_config(read_yaml((out / CONFIG).read_text()))
    except (GraphfedError, OSError, ValueError):
        return None
    threads = recorded.torch_threads if cfg.torch_threads is None else cfg.torch_threads
    return result if result.completed and same_run(recorded, cfg.model_copy(update={"torch_threads": threads})) \
        else None


def _run_row(configs: list[RunConfig], outs: list[Path], pack: int, progress: bool) -> list[RunResult]:
    """The seeds of one row of ``compare``: packed (``--pack``: 0 = all of them where it measures faster, N = N at
    a time) when their runs can share calls, else one after another."""
    from graphfed.sim.pack import Pack, pack_refusal

    if pack == 1 or len(configs) < 2 or pack_refusal(configs[0]) is not None:
        return [run_one(cfg, out, False, progress, keep_stopped=True) for cfg, out in zip(configs, outs, strict=True)]
    size = pack or len(configs)
    results: list[RunResult] = []
    for lo in range(0, len(configs), size):
        chunk, dirs = configs[lo:lo + size], outs[lo:lo + size]
        ran = run_many(chunk, list(dirs), lambda chunk=chunk, dirs=dirs: Pack(chunk, list(dirs)).run(),
                        keep_stopped=True)
        shared = any((run.execution or {}).get("pack", {}).get("batched") for run in ran)
        console.print(f"{chunk[0].method.name}: seeds {', '.join(str(c.seed) for c in chunk)} "
                      + ("ran as one pack (their clients' calls shared)" if shared else
                         "ran one after another (sharing their calls measured no faster here)"))
        results += ran
    return results


@app.command()
def compare(config: Annotated[Path, typer.Argument(help="YAML run config (its method is replaced)")],
            methods: Annotated[str | None, typer.Option(help="comma-separated method names")] = None,
            variants: Annotated[list[str] | None, typer.Option(
                "--variant", help="a row of its own: LABEL:KEY=VALUE,KEY=VALUE (--set syntax; repeatable), e.g. "
                "knn:method.name=panacea,dataset.graph=knn")] = None,
            seeds: Annotated[int, typer.Option(min=1, help="seeds per method: seed, seed+1, ...")] = 1,
            overrides: SetOption = None,
            out: Annotated[Path, typer.Option(help="output directory")] = Path("runs/compare"),
            per_client: Annotated[bool, typer.Option("--per-client", help="also each row's per-client table: each "
                                                     "client's mean ± std over the seeds beside its trivial "
                                                     "predictor (console, compare.md, per_client.csv)")] = False,
            overwrite: Annotated[bool, typer.Option(help="run again the runs under OUT made by another config "
                                                    "(finished runs of the same config are reused)")] = False,
            pack: Annotated[int, typer.Option(min=0, help="a row's seeds trained together, one batched call per "
                                              "round for all of them: 0 = every seed of the row, where packing "
                                              "measures faster; N = N at a time; 1 = one run at a time")] = 0,
            test: Annotated[str, typer.Option(help="the test of each row against the best over seeds (Holm across "
                                              "them): welch, student or mann-whitney")] = "welch",
            x: Annotated[str, typer.Option("--x", help="the curves' x axis: round, or time (the simulated clock, "
                                           "train.clock: rounds.jsonl's sim_seconds)")] = "round",
            progress: bool = True, verbose: bool = False) -> None:
    """Run several methods (and variants) over several seeds; print one table of mean ± std over seeds."""
    from graphfed.config import apply_overrides
    from graphfed.report.plots import plot_comparison
    from graphfed.report.tables import (
        add_standings,
        compare_rows,
        comparison,
        comparison_csv,
        csv_text,
        markdown_table,
        metric_label,
        per_client_cells,
        per_client_csv_rows,
        per_client_over_seeds,
        privacy_lines,
        standings_json,
        time_to_target_line,
        verdict_lines,
    )
    from graphfed.runs import RoundLog, atomic_write_text
    from graphfed.setup import without_needless_privacy
    from graphfed.sim.stages import check_privacy_first

    setup_logging(verbose)
    if test not in ("welch", "student", "mann-whitney"):
        fail(f"--test {test!r}: choose welch (Welch's t-test, the default), student or mann-whitney", EXIT_CONFIG)
    if x not in ("round", "time"):
        fail(f"--x {x!r}: choose round or time (the simulated clock)", EXIT_CONFIG)
    base = load(config, overrides)
    method_names = names(methods) or []
    rows_asked = {name: [f"method.name={name}"] for name in method_names}
    for text in variants or []:
        label, overrides_of = _variant(text)
        if label in rows_asked:
            fail(f"--variant {text!r}: the label {label!r} is taken (a method or another variant)", EXIT_CONFIG)
        rows_asked[label] = overrides_of
    if not rows_asked:
        fail(f"--methods: name at least one method, comma-separated (e.g. fedavg,ditto), or give --variant; got "
              f"{methods!r}", EXIT_CONFIG)
    check_out(out)
    configs: dict[str, list[RunConfig]] = {}
    needless: dict[str, str] = {}
    for label, row_overrides in rows_asked.items():
        data = base.model_dump(mode="json")
        if label in method_names:  # a method by name: its own options default, the config's when it is its method
            data["method"] = {"name": label, "options": base.method.options if label == base.method.name else {}}
        else:
            data = apply_overrides(data, row_overrides)
            if data["method"]["name"] != base.method.name and not any(
                    part.startswith("method.options") for part in row_overrides):
                data["method"]["options"] = {}  # another method: its own defaults, not the config method's options
        data, note = without_needless_privacy(data)  # Local releases nothing: it runs without a mechanism
        if note is not None:
            needless[label] = note
        configs[label] = []
        for k in range(seeds):
            data["seed"] = base.seed + k
            configs[label].append(validate_config(data))
    # every row's privacy compatibility before the first run (a refusal after hours of other rows helps nobody)
    check_privacy_first((label, runs[0]) for label, runs in configs.items())
    labels = list(configs)
    planned = {(name, cfg.seed): (cfg, out / name / f"seed{cfg.seed}") for name, runs in configs.items()
               for cfg in runs}
    reused = {key: found for key, (cfg, folder) in planned.items() if (found := _finished_run_of(cfg, folder))}
    for key, (_, folder) in planned.items():
        if key not in reused:
            claim_out(folder, overwrite, resumable=False)  # before any run: a refusal leaves all as it was
    if reused:
        console.print(f"reusing {len(reused)} finished run(s) of the same config under {out}")
    summaries: dict[str, list[RunResult]] = {}
    for name, runs in configs.items():
        fresh = [cfg for cfg in runs if (name, cfg.seed) not in reused]
        ran = dict(zip([cfg.seed for cfg in fresh], _run_row(fresh, [planned[(name, cfg.seed)][1] for cfg in fresh],
                                                             pack, progress), strict=True))
        summaries[name] = [reused.get((name, cfg.seed)) or ran[cfg.seed] for cfg in runs]
    rows = compare_rows(summaries)
    add_standings(rows, test)
    for row in rows:
        row["releases_nothing"] = row["method"] in needless
    metric = rows[0]["metric"]
    dataset = next(iter(summaries.values()))[0].dataset  # a folder's own name (meta.yaml), not "folder"
    attacked = any(row["attacked"] for row in rows)  # the headline is then the honest clients' score
    columns, cells = comparison(rows)
    show(table(f"{dataset}: personalised {metric_label(metric, rows[0].get('units'))}, {seeds} seed(s)"
                + (" (malicious clients took part)" if attacked else ""), columns, cells))
    out.mkdir(parents=True, exist_ok=True)
    markdown = markdown_table(rows)
    # a flag's kind is its text before the clients it names: counted over the seeds (each summary names them)
    notes = [f"{name}: {kind} in {count} of {len(results)} seed(s) (each run's summary.json names them)"
             for name, results in summaries.items()
             for kind, count in Counter(flag.split(":")[0] for result in results for flag in result.flags).items()]
    notes += list(needless.values())
    for note in notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    if notes:
        markdown += "\n" + "".join(f"- note: {note}\n" for note in notes)
    verdicts = verdict_lines(rows, test)
    for line in verdicts:
        console.print(line)
    if verdicts:
        markdown += "\n" + "".join(f"- {line}\n" for line in verdicts)
    timing = time_to_target_line(rows, base.train.target_score)
    if timing:
        console.print(timing)
        markdown += f"\n- {timing}\n"
    guarantee = privacy_lines(summaries)
    for line in guarantee:
        console.print(line)
    if guarantee:
        markdown += "\n" + "".join(f"- {line}\n" for line in guarantee)
    atomic_write_text(out / "compare.csv", comparison_csv(rows))
    if per_client:  # each client, mean ± std over the seeds (clients matched by name), per row of the table
        csv_columns: list[str] = []
        csv_rows: list[list[Any]] = []
        for name, results in summaries.items():
            records = per_client_over_seeds(results)
            client_columns, client_cells = per_client_cells(records, metric, rows[0].get("units"))
            show(table(f"{name}: each client over {len(results)} seed(s) (trivial = majority class / mean target of "
                        f"its own training rows)", client_columns, client_cells))
            markdown += (f"\n## {name}: each client, mean ± std over {len(results)} seed(s)\n\n| "
                         + " | ".join(client_columns) + " |\n|" + "---|" * len(client_columns) + "\n"
                         + "".join("| " + " | ".join(cell) + " |\n" for cell in client_cells))
            csv_columns, rows_of_label = per_client_csv_rows(name, records)
            csv_rows += rows_of_label
        atomic_write_text(out / "per_client.csv", csv_text(csv_columns, csv_rows))
    atomic_write_text(out / "compare.md", markdown)
    atomic_write_text(out / "verdicts.json", json.dumps(standings_json(rows, test), indent=2) + "\n")
    atomic_write_text(out / "compare.json", json.dumps({name: [result.to_json() for result in results]
                                                        for name, results in summaries.items()}, indent=2) + "\n")
    histories = {name: RoundLog(out / name / f"seed{base.seed}").read() for name in labels}
    plot_comparison(histories, out / "compare.png", metric, title=dataset, x="sim_seconds" if x == "time" else x)
    extra = ", per_client.csv" if per_client else ""
    console.print(f"table: {out / 'compare.md'} (and compare.csv, verdicts.json{extra}), curves: {out / 'compare.png'}")
    fail_over_budget([run for results in summaries.values() for run in results])
    stopped = [f"{name} seed {run.seed}" for name, results in summaries.items() for run in results if not run.completed]
    if stopped:  # the other rows ran and are in the table; the exit code says the comparison is incomplete
        fail(f"{len(stopped)} run(s) stopped ({', '.join(stopped)}): the table covers the seeds that completed; "
              f"each stopped run's summary.json says why", EXIT_RUN)


#: a variant's label becomes a folder under --out: letters, digits, dots, dashes and underscores only
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _variant(text: str) -> tuple[str, list[str]]:
    """``LABEL:KEY=VALUE,KEY=VALUE`` -> (label, ["KEY=VALUE", ...]); commas inside brackets/braces stay in values."""
    label, sep, rest = text.partition(":")
    if not sep or not _LABEL.match(label):
        fail(f"--variant {text!r}: give LABEL:KEY=VALUE,... with a label of letters, digits, '.', '-' or '_'",
              EXIT_CONFIG)
    parts, depth, current = [], 0, ""
    for char in rest:
        depth += 1 if char in "[{" else -1 if char in "]}" else 0
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    pairs = [part for part in parts if part]
    if not pairs or any("=" not in part for part in pairs):
        fail(f"--variant {text!r}: after the label, give KEY=VALUE pairs separated by commas", EXIT_CONFIG)
    return label, pairs
