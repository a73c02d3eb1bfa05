"""``graphfed bench``: benchmark suites, resumable, with their reports and plans."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from graphfed.errors import GraphfedError

if TYPE_CHECKING:
    pass

from graphfed.cli.common import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_RUN,
    SetOption,
    app,
    check_out,
    console,
    fail,
    names,
    setup_logging,
    sigterm_as_interrupt,
)


@app.command()
def bench(suite: Annotated[Path, typer.Argument(help="suite YAML: methods x datasets x seeds, paper numbers")],
          out: Annotated[Path, typer.Option(help="output directory: runs/, plots/, report.md, report.json")],
          datasets: Annotated[str | None, typer.Option(help="comma-separated dataset keys of the suite (default all)")]
          = None,
          methods: Annotated[str | None, typer.Option(help="comma-separated methods (default each dataset's)")] = None,
          seeds: Annotated[int | None, typer.Option(min=1, help="seeds per cell (default the suite's)")] = None,
          overrides: SetOption = None,
          data_dir: Annotated[Path | None, typer.Option(help="data folder for datasets whose config names none")]
          = None,
          in_process: Annotated[bool, typer.Option(help="run cells in this process instead of one process each "
                                                   "(faster start, but peak RSS is then shared)")] = False,
          jobs: Annotated[int, typer.Option(min=1, help="cells run at once, each in its own process; keep jobs x "
                                            "the suite's torch_threads within the CPU cores")] = 1,
          pack: Annotated[int, typer.Option(min=0, help="a cell's seeds run as one pack, one batched call per round "
                                            "for all of them (0: every seed, where packing measures faster; N: N "
                                            "at a time; 1: one run at a time)")] = 0,
          report_only: Annotated[bool, typer.Option(help="run nothing: rewrite the report from the finished "
                                                    "run directories")] = False,
          keep_stale: Annotated[bool, typer.Option(help="reuse finished cells made by other code (another code id) "
                                                   "instead of re-running them; the report marks them stale")]
          = False,
          plan: Annotated[bool, typer.Option(help="run and write nothing: per dataset, the runs finished by today's "
                                             "code, by other code (stale) and not at all, and the training time "
                                             "the rest needs")] = False,
          time_budget: Annotated[float | None, typer.Option(min=1, help="a slot of this many seconds: start each "
                                                            "run only when its projected time fits what is left, "
                                                            "the claims' cells first, and write the finished runs "
                                                            "to one archive (--archive)")] = None,
          archive: Annotated[Path | None, typer.Option(help="--time-budget: the archive to write (default "
                                                       "OUT/slot.tar.gz, at most 16 MiB)")] = None,
          import_from: Annotated[Path | None, typer.Option("--import", help="merge a slot's archive into OUT "
                                                           "(files, configs and code ids checked) and rewrite the "
                                                           "report")] = None,
          verbose: bool = False) -> None:
    """Run a benchmark suite (resumable: finished cells are skipped) and write OUT/report.md (or the suite's
    report name)."""
    import shlex

    from graphfed.bench import run_suite
    from graphfed.config import apply_overrides

    setup_logging(verbose)
    if import_from is not None:
        from graphfed.bench import import_runs

        check_out(out)
        report, count = import_runs(suite, out, import_from, echo=console.print)
        console.print(f"imported {count} run(s) from {import_from}; report: [bold]{report}[/bold]")
        return
    if time_budget is not None:
        from graphfed.bench import run_slot

        check_out(out)
        report, written, count = run_slot(suite, out, time_budget, archive, names(datasets), names(methods), seeds,
                                          apply_overrides({}, overrides or []), data_dir, in_process,
                                          echo=console.print)
        console.print(f"report: [bold]{report}[/bold]; archive: {written}")
        return
    if plan:
        try:
            _print_plan(suite, out, names(datasets), names(methods), seeds, apply_overrides({}, overrides or []))
        except GraphfedError as err:
            fail(str(err), EXIT_CONFIG)
        return
    check_out(out)
    try:
        extra = apply_overrides({}, overrides or [])
        command = shlex.join(["graphfed", "bench", str(suite), "--out", str(out),
                              *(["--datasets", datasets] if datasets else []),
                              *(["--methods", methods] if methods else []),
                              *(["--seeds", str(seeds)] if seeds else []),
                              *(f"--set={text}" for text in overrides or []),
                              *(["--data-dir", str(data_dir)] if data_dir else []),
                              *(["--in-process"] if in_process else []),
                              *(["--jobs", str(jobs)] if jobs > 1 else []),
                              *(["--pack", str(pack)] if pack else []),
                              *(["--keep-stale"] if keep_stale else [])])
        with sigterm_as_interrupt():
            report, all_done = run_suite(suite, out, datasets=names(datasets), methods=names(methods), seeds=seeds,
                                         overrides=extra, data_dir=data_dir, in_process=in_process,
                                         echo=console.print, command=command, report_only=report_only,
                                         keep_stale=keep_stale, jobs=jobs, pack=pack)
    except KeyboardInterrupt:
        fail(f"interrupted; finished cells are kept in {out}, run the same command again to continue",
              EXIT_INTERRUPTED)
    console.print(f"report: [bold]{report}[/bold]")
    if not all_done and not report_only:
        fail(f"some cells did not complete; see {report}", EXIT_RUN)


def _print_plan(suite: Path, out: Path, datasets: list[str] | None, methods: list[str] | None, seeds: int | None,
                overrides: dict[str, Any]) -> None:

    from graphfed.bench import plan_suite
    from graphfed.provenance import behaviour

    plans = plan_suite(suite, out, datasets, methods, seeds, overrides)
    table = Table(title=f"{suite} in {out}: today's engine behaviour {behaviour()}")
    for column in ("dataset", "current", "stale", "missing", "to run", "training time"):
        table.add_column(column, justify="left" if column == "dataset" else "right")

    def hours(plan_seconds: float, unestimated: int) -> str:
        return f"{plan_seconds / 3600:.1f} h" + (f" + {unestimated} unknown" if unestimated else "")

    for section in plans:
        table.add_row(section.dataset, str(section.current), str(sum(section.stale.values())), str(section.missing),
                      str(section.to_run), hours(section.seconds, section.unestimated))
    table.add_row("all", str(sum(p.current for p in plans)), str(sum(sum(p.stale.values()) for p in plans)),
                  str(sum(p.missing for p in plans)), str(sum(p.to_run for p in plans)),
                  hours(sum(p.seconds for p in plans), sum(p.unestimated for p in plans)))
    console.print(table)
    whys = [f"  {section.dataset}: {why}: {count}" for section in plans for why, count in section.stale.most_common()]
    if whys:  # unwrapped, one per line: a module path or a behaviour id must survive a copy
        console.print("why the stale runs are stale (runs):\n" + "\n".join(whys), soft_wrap=True, highlight=False)
    console.print("training time: each stale run's own recorded time, each missing run the mean of its method's "
                  "(else its section's) finished runs; process start and data loading come on top")
