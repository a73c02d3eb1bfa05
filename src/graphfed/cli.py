"""Command line: ``graphfed run | compare | list | describe | bench | inspect | ...``."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import signal
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from graphfed.config import RunConfig, load_config, printable, shown_default, validate_config
from graphfed.errors import EXIT_INPUT, EXIT_STOPPED, GraphfedError

if TYPE_CHECKING:
    from graphfed.runs import RunResult

EXIT_CONFIG = EXIT_INPUT  # invalid config, unknown method/dataset/model, bad --set, data files, suites
EXIT_RUN = EXIT_STOPPED  # the run stopped (non-finite update, unusable checkpoint)
# EXIT_IN_USE (4, graphfed.errors): another process is writing the run folder
EXIT_INTERNAL = 1  # a bug: anything that is not a GraphfedError
EXIT_INTERRUPTED = 130
BUG_REPORT = ("this is a bug in graphfed (or in a plugin it runs), not in your input: please report it with the "
              "command and the output of the same command with --verbose (docs: Runs, errors and exit codes)")


class _Commands(typer.Typer):
    """Every command reports graphfed's user-facing errors (:class:`GraphfedError`) as one line with the exit code of
    their kind, and anything else as an internal error (exit 1; the traceback with ``--verbose``)."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        register = super().command(*args, **kwargs)
        return lambda function: register(_reporting_errors(function))


#: what the CLI framework raises itself to end a command (an exit code, a usage error, Ctrl-C): passed through. Typer
#: up to 0.2x re-exports click's classes, later releases carry their own (a vendored click): both are covered by
#: naming typer's, and the usage errors by BadParameter's ClickException base, whichever module defines it.
FRAMEWORK_EXITS: tuple[type[BaseException], ...] = (
    typer.Exit, typer.Abort, KeyboardInterrupt,
    *(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException"))


def _reporting_errors(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except FRAMEWORK_EXITS:
            raise
        except GraphfedError as err:
            _fail(str(err), err.exit_code)
        except Exception as err:
            if kwargs.get("verbose") or os.environ.get("GRAPHFED_TRACEBACK"):
                traceback.print_exc()
            reason = (str(err).strip().splitlines() or [""])[0][:300]
            typer.echo(f"internal error: {type(err).__name__}: {printable(reason)}", err=True)
            typer.echo(BUG_REPORT, err=True)
            raise typer.Exit(EXIT_INTERNAL) from None

    return command


app = _Commands(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                help="graphfed: graph-relational personalised federated learning.")
console = Console()


def show(table: Table) -> None:
    """Print a table: in a terminal, at its width; elsewhere, every value in full."""
    from graphfed.report.tables import print_table

    print_table(console, table)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s",
                        handlers=[RichHandler(console=Console(stderr=True), show_path=False)], force=True)


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {printable(message)}", err=True)  # one line, whatever a file or name held
    raise typer.Exit(code)


def _check_out(out: Path, option: str = "--out") -> None:
    """Fail before any data is built when ``out`` cannot become a writable run folder (nothing is created)."""
    if out.exists() and not out.is_dir():
        _fail(f"{option} {out}: exists and is not a directory", EXIT_CONFIG)
    existing = next(parent for parent in (out, *out.parents) if parent.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        _fail(f"{option} {out}: {existing} is not a writable directory", EXIT_CONFIG)


def _claim_out(out: Path, overwrite: bool, resumable: bool = True) -> None:
    """A new run may not silently replace the run ``out`` holds: refuse (one line), or clear it with --overwrite."""
    from graphfed.runs import clear_run, describe_run

    existing = describe_run(out)
    if existing is None:
        return
    if not overwrite:
        options = "pass --resume to continue it, --overwrite to replace it" if resumable else (
            "it was made by another config: pass --overwrite to replace it")
        _fail(f"--out {out} holds {existing}; {options}, or choose another --out", EXIT_CONFIG)
    clear_run(out)


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


def _load(config: Path | None, overrides: list[str] | None) -> RunConfig:
    return load_config(config, overrides or [])


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler stopping the job, ``kill``) ends a run like Ctrl-C: checkpoint kept, one line."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_one(cfg: RunConfig, out: Path | None, resume: bool, progress: bool = True,
             keep_stopped: bool = False) -> RunResult:
    # Imported per command: `graphfed --help` should not pay for torch.
    from graphfed.sim.engine import run_config

    return _run_many([cfg], [out], lambda: [run_config(cfg, out, resume=resume, progress=progress)],
                     keep_stopped)[0]


def _run_many(configs: list[RunConfig], outs: list[Path | None], running: Callable[[], list[RunResult]],
              keep_stopped: bool = False) -> list[RunResult]:
    """``running()``'s results; an interrupt, or a run that stopped (unless ``keep_stopped``: a comparison goes on
    and says so at its end), is one line with its exit code."""
    try:
        with _sigterm_as_interrupt():
            summaries = running()
    except KeyboardInterrupt:
        # Typer turns KeyboardInterrupt into a silent exit; say how to continue.
        where = outs[0] if len(outs) == 1 else f"each run's folder under {Path(str(outs[0])).parent.parent}"
        _fail(f"interrupted; the last checkpoint in {where} is kept, continue with --resume", EXIT_INTERRUPTED)
    for summary, out in zip(summaries, outs, strict=True):
        if not summary.completed:
            if not keep_stopped:
                _fail(f"{summary.status} (summary in {out})", EXIT_RUN)
            console.print(f"[yellow]stopped:[/yellow] {summary.method} seed {summary.seed}: {summary.status}; the "
                          f"comparison goes on")
    return summaries


def _run_row(configs: list[RunConfig], outs: list[Path], pack: int, progress: bool) -> list[RunResult]:
    """The seeds of one row of ``compare``: packed (``--pack``: 0 = all of them where it measures faster, N = N at
    a time) when their runs can share calls, else one after another."""
    from graphfed.sim.pack import Pack, pack_refusal

    if pack == 1 or len(configs) < 2 or pack_refusal(configs[0]) is not None:
        return [_run_one(cfg, out, False, progress, keep_stopped=True) for cfg, out in zip(configs, outs, strict=True)]
    size = pack or len(configs)
    results: list[RunResult] = []
    for lo in range(0, len(configs), size):
        chunk, dirs = configs[lo:lo + size], outs[lo:lo + size]
        ran = _run_many(chunk, list(dirs), lambda chunk=chunk, dirs=dirs: Pack(chunk, list(dirs)).run(),
                        keep_stopped=True)
        shared = any((run.execution or {}).get("pack", {}).get("batched") for run in ran)
        console.print(f"{chunk[0].method.name}: seeds {', '.join(str(c.seed) for c in chunk)} "
                      + ("ran as one pack (their clients' calls shared)" if shared else
                         "ran one after another (sharing their calls measured no faster here)"))
        results += ran
    return results


SetOption = Annotated[list[str] | None, typer.Option("--set", help="override a field: KEY=VALUE, e.g. "
                                                      "train.rounds=100 (repeatable)")]


@app.command()
def run(config: Annotated[Path, typer.Argument(help="YAML run config")],
        overrides: SetOption = None,
        out: Annotated[Path | None, typer.Option(help="output directory (default runs/<method>_<dataset>)")] = None,
        resume: Annotated[bool, typer.Option(help="continue from OUT/checkpoint.pt")] = False,
        overwrite: Annotated[bool, typer.Option(help="replace the run OUT already holds")] = False,
        progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
        verbose: bool = False) -> None:
    """Run one method on one dataset; writes config.yaml, rounds.jsonl, summary.json, plots/."""
    _setup_logging(verbose)
    cfg = _load(config, overrides)
    out = out or Path("runs") / f"{cfg.method.name}_{cfg.dataset.name}_seed{cfg.seed}"
    _check_out(out)
    if not resume:
        _claim_out(out, overwrite)
    summary = _run_one(cfg, out, resume, progress)
    _print_summary(summary)
    console.print(f"results in [bold]{out}[/bold]")


def _print_summary(summary: RunResult) -> None:
    from graphfed.report.tables import format_value

    metric = summary.metric
    from graphfed.report.tables import metric_label, privacy_sentence

    chosen = ("last evaluated round" if summary.privacy and summary.privacy.get("model_selection") == "last"
              else "best validation round")
    table = Table(title=f"{summary.method} on {summary.dataset} ({chosen} {summary.best_round} of {summary.rounds})")

    for header in (f"test {metric_label(metric)} (mean ± std over clients)", "clients scored", "pooled", "novel",
                   "novel (adapted)", "wall s"):
        table.add_column(header, overflow="fold")
    pooled = summary.test_pooled
    scored, training = summary.scored_clients, summary.training_clients
    coverage = "—" if scored is None or training is None else f"{scored} of {training}" + (
        f" (no reply: {', '.join(summary.unscored_clients[:5])}{', ...' if len(summary.unscored_clients) > 5 else ''})"
        if summary.unscored_clients else " (shrank: replies lost)" if scored < training else "")
    table.add_row(format_value((summary.test_mean, summary.test_std), metric), coverage,
                  format_value((pooled, 0.0), metric).split(" ±")[0],
                  format_value(None if summary.novel_mean is None
                               else (summary.novel_mean, summary.novel_std), metric),
                  format_value(None if summary.novel_adapted_mean is None
                               else (summary.novel_adapted_mean, summary.novel_adapted_std), metric),
                  f"{summary.wall_seconds:.1f}")
    show(table)
    print_lost_uploads(summary)
    for flag in summary.flags:
        console.print(f"[yellow]note:[/yellow] {flag}")
    if summary.privacy:
        console.print(privacy_sentence(summary.privacy))
    attack = summary.attack
    if attack.get("malicious_clients") or summary.asr_mean is not None:
        robustness = Table(title=f"under attack: {attack.get('kind')}, {len(attack.get('malicious_clients', []))} "
                                 f"malicious client(s)")
        for header in ("honest clients", "malicious clients", "ASR honest", "ASR malicious"):
            robustness.add_column(header)
        honest, malicious = summary.honest_test_mean, summary.malicious_test_mean
        robustness.add_row(
            "—" if honest is None else format_value((honest, summary.honest_test_std), metric),
            "—" if malicious is None else format_value((malicious, 0.0), metric).split(" ±")[0],
            *("—" if asr is None else f"{100 * asr:.2f} %" for asr in (summary.asr_honest, summary.asr_malicious)))
        show(robustness)


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
            progress: bool = True, verbose: bool = False) -> None:
    """Run several methods (and variants) over several seeds; print one table of mean ± std over seeds."""
    from graphfed.config import apply_overrides
    from graphfed.report.plots import plot_comparison
    from graphfed.report.tables import (
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
    )
    from graphfed.runs import RoundLog, atomic_write_text
    from graphfed.setup import without_needless_privacy
    from graphfed.sim.stages import check_privacy_first

    _setup_logging(verbose)
    base = _load(config, overrides)
    names = _names(methods) or []
    rows_asked = {name: [f"method.name={name}"] for name in names}
    for text in variants or []:
        label, overrides_of = _variant(text)
        if label in rows_asked:
            _fail(f"--variant {text!r}: the label {label!r} is taken (a method or another variant)", EXIT_CONFIG)
        rows_asked[label] = overrides_of
    if not rows_asked:
        _fail(f"--methods: name at least one method, comma-separated (e.g. fedavg,ditto), or give --variant; got "
              f"{methods!r}", EXIT_CONFIG)
    _check_out(out)
    configs: dict[str, list[RunConfig]] = {}
    needless: dict[str, str] = {}
    for label, row_overrides in rows_asked.items():
        data = base.model_dump(mode="json")
        if label in names:  # a method by name: its own options default, the config's when it is the config's method
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
    names = list(configs)
    planned = {(name, cfg.seed): (cfg, out / name / f"seed{cfg.seed}") for name, runs in configs.items()
               for cfg in runs}
    reused = {key: found for key, (cfg, folder) in planned.items() if (found := _finished_run_of(cfg, folder))}
    for key, (_, folder) in planned.items():
        if key not in reused:
            _claim_out(folder, overwrite, resumable=False)  # before any run: a refusal leaves all as it was
    if reused:
        console.print(f"reusing {len(reused)} finished run(s) of the same config under {out}")
    summaries: dict[str, list[RunResult]] = {}
    for name, runs in configs.items():
        fresh = [cfg for cfg in runs if (name, cfg.seed) not in reused]
        ran = dict(zip([cfg.seed for cfg in fresh], _run_row(fresh, [planned[(name, cfg.seed)][1] for cfg in fresh],
                                                             pack, progress), strict=True))
        summaries[name] = [reused.get((name, cfg.seed)) or ran[cfg.seed] for cfg in runs]
    rows = compare_rows(summaries)
    for row in rows:
        row["releases_nothing"] = row["method"] in needless
    metric = rows[0]["metric"]
    dataset = next(iter(summaries.values()))[0].dataset  # a folder's own name (meta.yaml), not "folder"
    attacked = any(row["attacked"] for row in rows)  # the headline is then the honest clients' score
    columns, cells = comparison(rows)
    show(_table(f"{dataset}: personalised {metric_label(metric)}, {seeds} seed(s)"
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
            client_columns, client_cells = per_client_cells(records, metric)
            show(_table(f"{name}: each client over {len(results)} seed(s) (trivial = majority class / mean target of "
                        f"its own training rows)", client_columns, client_cells))
            markdown += (f"\n## {name}: each client, mean ± std over {len(results)} seed(s)\n\n| "
                         + " | ".join(client_columns) + " |\n|" + "---|" * len(client_columns) + "\n"
                         + "".join("| " + " | ".join(cell) + " |\n" for cell in client_cells))
            csv_columns, rows_of_label = per_client_csv_rows(name, records)
            csv_rows += rows_of_label
        atomic_write_text(out / "per_client.csv", csv_text(csv_columns, csv_rows))
    atomic_write_text(out / "compare.md", markdown)
    atomic_write_text(out / "compare.json", json.dumps({name: [result.to_json() for result in results]
                                                        for name, results in summaries.items()}, indent=2) + "\n")
    histories = {name: RoundLog(out / name / f"seed{base.seed}").read() for name in names}
    plot_comparison(histories, out / "compare.png", metric, title=dataset)
    console.print(f"table: {out / 'compare.md'} (and compare.csv{', per_client.csv' if per_client else ''}), "
                  f"curves: {out / 'compare.png'}")
    stopped = [f"{name} seed {run.seed}" for name, results in summaries.items() for run in results if not run.completed]
    if stopped:  # the other rows ran and are in the table; the exit code says the comparison is incomplete
        _fail(f"{len(stopped)} run(s) stopped ({', '.join(stopped)}): the table covers the seeds that completed; "
              f"each stopped run's summary.json says why", EXIT_RUN)


def _table(title: str, columns: list[str], cells: list[list[str]]) -> Table:
    table = Table(title=title)
    for header in columns:
        table.add_column(header, overflow="fold")
    for row in cells:
        table.add_row(*row)
    return table


#: a variant's label becomes a folder under --out: letters, digits, dots, dashes and underscores only
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _variant(text: str) -> tuple[str, list[str]]:
    """``LABEL:KEY=VALUE,KEY=VALUE`` -> (label, ["KEY=VALUE", ...]); commas inside brackets/braces stay in values."""
    label, sep, rest = text.partition(":")
    if not sep or not _LABEL.match(label):
        _fail(f"--variant {text!r}: give LABEL:KEY=VALUE,... with a label of letters, digits, '.', '-' or '_'",
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
        _fail(f"--variant {text!r}: after the label, give KEY=VALUE pairs separated by commas", EXIT_CONFIG)
    return label, pairs


#: ``graphfed status``'s exit code per fate (the table is in the docs, "Runs, errors and exit codes", and the README)
STATUS_EXIT = {"completed": 0, "failed": EXIT_INTERNAL, "none": EXIT_CONFIG, "stopped": EXIT_RUN, "running": 5,
               "interrupted": EXIT_INTERRUPTED}


@app.command("flower-status", hidden=True)  # the name a Flower operator looks for
@app.command("status")
def status_command(run_dir: Annotated[Path, typer.Argument(help="a run folder (graphfed run --out, or a Flower "
                                                                "app's out_dir)")],
                   wait: Annotated[bool, typer.Option("--wait", help="while the run is running, wait for its end")]
                   = False,
                   interval: Annotated[float, typer.Option(help="--wait: seconds between looks", min=0.1)] = 5.0
                   ) -> None:
    """The run's fate in one line and an exit code a supervisor can act on: 0 completed, 3 stopped (its reason
    follows; resume it), 1 failed (a bug), 130 interrupted, 5 still running, 2 no run there."""
    import time

    from graphfed.runs import run_fate

    if not run_dir.is_dir():
        _fail(f"{run_dir}: not a directory", EXIT_CONFIG)
    state, line = run_fate(run_dir)
    while wait and state == "running":
        time.sleep(interval)
        state, line = run_fate(run_dir)
    typer.echo(printable(line))
    raise typer.Exit(STATUS_EXIT[state])


@app.command("show")
def show_run(run_dir: Annotated[Path, typer.Argument(help="a run directory (holds summary.json)")],
             show_all: Annotated[bool, typer.Option("--all", help="every client, not the first 50")] = False) -> None:
    """A run's result: its headline and each client's score beside its trivial predictor (who gains, who loses)."""
    from graphfed.report.tables import per_client_table
    from graphfed.runs import SUMMARY, read_result

    if not (run_dir / SUMMARY).is_file():
        _fail(f"{run_dir}: no {SUMMARY} (not a finished run directory)", EXIT_CONFIG)
    result = read_result(run_dir)
    scale = 100.0 if result.metric == "accuracy" else 1.0
    headline = "—" if result.test_mean is None else f"{scale * result.test_mean:.4g}"
    trivial = "—" if result.trivial_test_mean is None else f"{scale * result.trivial_test_mean:.4g}"
    console.print(f"{result.method} on {result.dataset} (seed {result.seed}): {result.status}; test {headline} "
                  f"at round {result.best_round} of {result.rounds}; trivial predictors {trivial}")
    if result.stopped_early:
        console.print(f"stopped early at round {result.stopped_early['round']} (patience "
                      f"{result.stopped_early['patience']})")
    if result.privacy:
        from graphfed.report.tables import privacy_sentence

        console.print(privacy_sentence(result.privacy))
    print_lost_uploads(result)
    if not result.per_client:
        console.print("no per-client scores (a run written by an older graphfed)")
        return
    show(per_client_table(result, None if show_all else 50))


def print_lost_uploads(summary: RunResult) -> None:
    """Whose training uploads never reached the server, in which rounds (the simulator's train.dropout and
    stragglers; Flower's dropped replies)."""
    if not summary.missed_rounds:
        return
    lost = sum(len(rounds) for rounds in summary.missed_rounds.values())
    named = "; ".join(f"{client} in round{'s' if len(rounds) > 1 else ''} {', '.join(map(str, rounds))}"
                      for client, rounds in list(summary.missed_rounds.items())[:8])
    more = f"; and {len(summary.missed_rounds) - 8} more clients" if len(summary.missed_rounds) > 8 else ""
    console.print(f"[yellow]note:[/yellow] {lost} training upload(s) lost: {named}{more} (summary.json: "
                  f"dropped_clients)")


@app.command("export")
def export_command(run_dir: Annotated[Path, typer.Argument(help="a run directory (holds models/best.pt)")],
                   client: Annotated[str, typer.Option("--client", help="the client's name (graphfed show)")],
                   out: Annotated[Path, typer.Option("--out", help="the file to write (.pt)")]) -> None:
    """One client's trained model as a standalone PyTorch state_dict plus the config that rebuilds it."""
    from graphfed.export import export_client

    console.print(f"wrote {export_client(run_dir, client, out)} (graphfed.export.load_exported rebuilds the module)")


@app.command("predict")
def predict_command(run_dir: Annotated[Path, typer.Argument(help="a run directory (holds models/best.pt)")],
                    client: Annotated[str, typer.Option("--client", help="the client's name (graphfed show)")],
                    rows: Annotated[Path, typer.Option("--input", help="rows.csv (a header, then numbers) or an "
                                                       ".npz with 'x'")],
                    out: Annotated[Path, typer.Option("--out", help="predictions CSV")]) -> None:
    """The client's model on new rows: the predicted class and its probabilities, or the regression outputs."""
    import numpy as np

    from graphfed.export import client_state, predict, read_rows, rebuild
    from graphfed.runs import atomic_write_text

    state, model, _ = client_state(run_dir, client)
    outputs = predict(rebuild(model, state), read_rows(rows, tuple(model["input_shape"])))
    if model["task"] == "classification":
        probabilities = outputs.softmax(dim=-1).numpy()
        header = ["prediction", *[f"p{k}" for k in range(probabilities.shape[1])]]
        table = np.column_stack([probabilities.argmax(axis=1), probabilities])
        lines = [",".join(header)] + [",".join([str(int(row[0])), *[f"{v:.6g}" for v in row[1:]]]) for row in table]
    else:
        values = outputs.reshape(len(outputs), -1).numpy()
        lines = [",".join(f"y{k}" for k in range(values.shape[1]))] + [",".join(f"{v:.6g}" for v in row)
                                                                        for row in values]
    atomic_write_text(out, "\n".join(lines) + "\n")
    console.print(f"wrote {len(outputs)} predictions of client {client} to {out}")


@app.command("flower-app")
def flower_app(config: Annotated[Path, typer.Argument(help="YAML run config")],
               out: Annotated[Path, typer.Option(help="folder to write the Flower App into")],
               overrides: SetOption = None,
               results: Annotated[Path | None, typer.Option(help="where the ServerApp writes summary.json etc. "
                                                            "(default OUT/results)")] = None) -> None:
    """Write a Flower App folder that runs CONFIG on Flower: `flwr run OUT` (docs: how-to/flower.md)."""
    try:
        from graphfed.flower.app_folder import write_app_folder
    except ImportError:
        _fail("the Flower engine needs flwr: pip install 'graphfed[flower]'", EXIT_CONFIG)
    cfg = _load(config, overrides)
    if cfg.flower.secure_aggregation:  # refuse before writing anything: the method must need only the mean
        from graphfed.flower.secagg import secure_aggregation_refusal
        from graphfed.setup import build_setup

        refusal = secure_aggregation_refusal(cfg, build_setup(cfg))
        if refusal:
            _fail(refusal, EXIT_CONFIG)
    path = write_app_folder(cfg, out, results)
    console.print(f"wrote {path}\n  local simulation: flwr run {out} --federation-config "
                  f"\"num-supernodes={cfg.dataset.num_clients or 'N'} "
                  f"client-resources-num-cpus={cfg.flower.client_cpus:g} "
                  f"client-resources-num-gpus={cfg.flower.client_gpus:g}\" --stream\n"
                  f"  deployment: see the docs, how-to/flower.md")


@app.command("privacy-audit")
def privacy_audit(config: Annotated[Path, typer.Argument(help="YAML run config with a privacy section")],
                  overrides: SetOption = None,
                  canaries: Annotated[int, typer.Option(min=100, help="canary clients, each an independent "
                                                        "trial (more: a tighter bound, longer)")] = 50_000,
                  seed_attacker: Annotated[bool, typer.Option(help="the attacker also subtracts the noise the run's "
                                                              "seed regenerates")] = False) -> None:
    """Audit CONFIG's privacy mechanism: an epsilon lower bound from canary clients beside the claimed epsilon."""
    from graphfed.client.audit import audit
    from graphfed.data import build_federation
    from graphfed.setup import privacy_plan, resolve_method

    cfg = _load(config, overrides)
    if cfg.privacy.mechanism == "none":
        _fail("privacy.mechanism: none; nothing to audit (set privacy.mechanism and its noise)", EXIT_CONFIG)
    federation = build_federation(cfg.dataset, cfg.seed)  # the plan depends on how many clients train
    train = cfg.train
    plan = privacy_plan(cfg, federation, resolve_method(cfg))  # the run's own plan
    try:
        result = audit(plan, train.rounds, canaries, seed_attacker=seed_attacker, seed=cfg.seed)
    except ValueError as err:
        _fail(str(err), EXIT_CONFIG)
    console.print(f"{plan.mechanism} DP, {result.rounds} rounds, delta {plan.delta:.3g}: claimed epsilon "
                  f"{result.claimed_epsilon:.4g}; {result.attacker} attacker on {canaries:,} canaries: epsilon >= "
                  f"{result.epsilon_lower_bound:.4g} with {result.confidence:.0%} confidence (false positives "
                  f"{result.false_positives} of {result.scored_out}, false negatives {result.false_negatives} of "
                  f"{result.scored_in})")
    if result.epsilon_lower_bound > result.claimed_epsilon:
        typer.echo("the mechanism does not give its claimed epsilon" + (
            ": its noise is reproducible from the seed (privacy.reproducible_noise)" if plan.reproducible
            else f"; {BUG_REPORT}"), err=True)
        raise typer.Exit(EXIT_INTERNAL if not plan.reproducible else EXIT_RUN)
    console.print("the claim holds against this attack")


@app.command("plot-graphs")
def plot_graphs_command(run_dir: Annotated[Path, typer.Argument(help="a run directory with graphs/")],
                        out: Annotated[Path | None, typer.Option(help="default RUN_DIR/plots")] = None) -> None:
    """Heatmaps of a run's collaboration graphs, per layer and over rounds."""
    from graphfed.report.plots import plot_graphs

    for path in plot_graphs(run_dir, out):
        console.print(f"wrote {path}")


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
          verbose: bool = False) -> None:
    """Run a benchmark suite (resumable: finished cells are skipped) and write OUT/report.md (or the suite's
    report name)."""
    import shlex

    from graphfed.bench import run_suite
    from graphfed.config import apply_overrides

    _setup_logging(verbose)
    if plan:
        try:
            _print_plan(suite, out, _names(datasets), _names(methods), seeds, apply_overrides({}, overrides or []))
        except GraphfedError as err:
            _fail(str(err), EXIT_CONFIG)
        return
    _check_out(out)
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
        with _sigterm_as_interrupt():
            report, all_done = run_suite(suite, out, datasets=_names(datasets), methods=_names(methods), seeds=seeds,
                                         overrides=extra, data_dir=data_dir, in_process=in_process,
                                         echo=console.print, command=command, report_only=report_only,
                                         keep_stale=keep_stale, jobs=jobs, pack=pack)
    except KeyboardInterrupt:
        _fail(f"interrupted; finished cells are kept in {out}, run the same command again to continue",
              EXIT_INTERRUPTED)
    console.print(f"report: [bold]{report}[/bold]")
    if not all_done and not report_only:
        _fail(f"some cells did not complete; see {report}", EXIT_RUN)


@app.command("run-pack", hidden=True)
def run_pack(pack_file: Annotated[Path, typer.Argument(help="JSON list of {config, out, resume}")]) -> None:
    """Run several configs that differ in their seed only as one pack (``graphfed bench`` writes the file)."""
    from graphfed.errors import UntrustedInputError
    from graphfed.sim.pack import Pack

    try:
        entries = json.loads(pack_file.read_text())
        configs = [_load(Path(entry["config"]), []) for entry in entries]
        outs = [Path(entry["out"]) for entry in entries]
        resume = [bool(entry["resume"]) for entry in entries]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UntrustedInputError(f"{pack_file}: not a pack file ({type(err).__name__})") from None
    _run_many(configs, list(outs), lambda: Pack(configs, list(outs)).run(resume))


def _print_plan(suite: Path, out: Path, datasets: list[str] | None, methods: list[str] | None, seeds: int | None,
                overrides: dict[str, Any]) -> None:
    from rich.table import Table

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


def _names(text: str | None) -> list[str] | None:
    return [part.strip() for part in text.split(",") if part.strip()] if text else None


@app.command("inspect")
def inspect_command(directory: Annotated[Path | None, typer.Argument(help="a federation folder (docs: "
                                                                     "how-to/own-federation.md)")] = None,
                    config: Annotated[Path | None, typer.Option(help="inspect this run config's dataset instead")]
                    = None,
                    overrides: SetOption = None,
                    max_clients: Annotated[int, typer.Option(min=1, help="client rows to print")] = 50) -> None:
    """Validate a federation folder (or a config's dataset) and print its clients, targets and client graph."""
    from graphfed.data import build_federation
    from graphfed.data.datasets.folder import load_federation
    from graphfed.data.federation import Federation
    from graphfed.report.federation import render_federation

    if (directory is None) == (config is None):
        _fail("give a federation folder or --config CONFIG (one of the two)", EXIT_CONFIG)
    if directory is not None and overrides:
        _fail("--set applies to --config only", EXIT_CONFIG)
    fed: Federation
    if directory is not None:
        fed = load_federation(directory)
    else:
        cfg = _load(config, overrides)
        fed = build_federation(cfg.dataset, cfg.seed)
    render_federation(fed, console, max_clients)


@app.command("arch-graph")
def arch_graph_command(
        model: Annotated[str, typer.Argument(help="a model name (graphfed list), e.g. resnet-like")],
        options: Annotated[list[str] | None, typer.Option("--option", help="model option KEY=VALUE (repeatable), "
                                                          "e.g. arch=arch2")] = None,
        input_shape: Annotated[str, typer.Option(help="input shape, comma-separated")] = "3,32,32",
        classes: Annotated[int, typer.Option(help="outputs of the model")] = 10,
        draw: Annotated[Path | None, typer.Option(help="also draw the graph to this PNG")] = None) -> None:
    """The architecture graph FLHA-GHN's hypernetwork reads: layers and joins as nodes, data flow as edges."""
    from graphfed.config import parse_override
    from graphfed.models import build_model
    from graphfed.models.arch_graph import architecture_graph

    try:
        shape = tuple(int(part) for part in input_shape.split(","))
    except ValueError:
        _fail(f"--input-shape {input_shape!r}: expected integers separated by commas, e.g. 3,32,32", EXIT_CONFIG)
        raise
    parsed = {}
    for option in options or []:
        keys, value = parse_override(option, "--option", "arch=arch2")
        parsed[".".join(keys)] = value
    from graphfed.data.federation import ClientSplit, Federation

    empty = ClientSplit.from_lists([], [], "classification")
    federation = Federation(name="shape-only", task="classification", train=empty, val=empty, test=empty,
                            input_shape=shape, output_dim=classes)
    graph = architecture_graph(build_model(model, federation, parsed))
    label = f"{model} {parsed}" if parsed else model
    table = Table(title=f"{label}: {graph.num_nodes} nodes, {graph.edges.shape[1]} edges")
    for header in ("#", "node", "type", "kernel", "stride", "width", "inputs from"):
        table.add_column(header)
    incoming: dict[int, list[int]] = {}
    for source, target in graph.edges.T.tolist():
        incoming.setdefault(target, []).append(source)
    for i in range(graph.num_nodes):
        cells = (graph.kernels[i], graph.strides[i], graph.widths[i])
        table.add_row(str(i), graph.names[i], graph.kinds[i], *("" if c is None else str(c) for c in cells),
                      ", ".join(str(s) for s in incoming.get(i, [])))
    show(table)
    if draw is not None:
        from graphfed.report.plots import plot_arch_graph

        console.print(f"drew {plot_arch_graph(graph, draw, title=label)}")


data_app = _Commands(no_args_is_help=True, pretty_exceptions_enable=False,
                     help="The papers' public datasets: what is where, and fetching them in their published formats.")
app.add_typer(data_app, name="data")


configs_app = _Commands(no_args_is_help=True, pretty_exceptions_enable=False,
                        help="The configs shipped with graphfed: list them, copy one to edit.")
app.add_typer(configs_app, name="configs")


@configs_app.command("list")
def configs_list() -> None:
    """The packaged configs (usable by name anywhere: graphfed run demo)."""
    from graphfed.config import CONFIG_ALIASES, packaged_configs

    table = Table(title="packaged configs (graphfed run NAME)")
    for header in ("name", "also", "what"):
        table.add_column(header)
    aliases = {file: alias for alias, file in CONFIG_ALIASES.items()}
    for name, path in packaged_configs().items():
        first = path.read_text(encoding="utf-8").splitlines()[0].lstrip("# ") if path.stat().st_size else ""
        table.add_row(path.stem, aliases.get(name, ""), first)
    show(table)


@configs_app.command("copy")
def configs_copy(name: Annotated[str, typer.Argument(help="a packaged config (graphfed configs list)")],
                 to: Annotated[Path, typer.Option("--to", help="where to write it")] = Path(".")) -> None:
    """Copy a packaged config next to you, to edit."""
    from graphfed.config import packaged_config, packaged_configs
    from graphfed.runs import atomic_write_text

    source = packaged_config(name)
    if source is None:
        _fail(f"no packaged config {name!r}; packaged: {', '.join(p.stem for p in packaged_configs().values())}",
              EXIT_CONFIG)
    target = to / source.name if to.is_dir() else to
    if target.exists():
        _fail(f"{target} exists; give --to another path", EXIT_CONFIG)
    atomic_write_text(target, source.read_text(encoding="utf-8"))
    console.print(f"wrote {target}")


def _data_dir(folder: Path | None) -> Path:
    from graphfed.config import DatasetConfig

    return folder if folder is not None else DatasetConfig().resolved_data_dir()


@data_app.command("list")
def data_list(data_dir: Annotated[Path | None, typer.Option("--data-dir", help="default: $GRAPHFED_DATA, else the "
                                                            "per-user data folder")] = None) -> None:
    """Each dataset: present / missing / corrupt (checksum), its size, where it is read from, how to fetch it."""
    from graphfed.data.fetch import list_data

    folder = _data_dir(data_dir)
    table = Table(title=f"datasets in {folder}")
    for header in ("folder", "dataset.name", "status", "size", "detail", "fetch"):
        table.add_column(header)
    for row in list_data(folder):
        table.add_row(row.folder, row.dataset or "—", row.status, f"{row.size_bytes / 2**20:,.1f} MiB", row.detail,
                      row.command)
    show(table)


@data_app.command("fetch")
def data_fetch(name: Annotated[str, typer.Argument(help="mnist, fashion-mnist, cifar10, cifar100, metr-la, "
                                                   "pems-bay, tpt48 or femnist")],
               to: Annotated[Path | None, typer.Option("--to", help="the data folder (default: $GRAPHFED_DATA, else "
                                                       "the per-user data folder)")] = None,
               progress: Annotated[bool, typer.Option(help="a progress bar per file")] = True,
               timeout: Annotated[float, typer.Option(help="seconds to wait for a server")] = 30.0) -> None:
    """Download a dataset from its publisher (resumable, checksum-verified) into the data folder."""
    from graphfed.data.fetch import fetch

    folder = _data_dir(to)
    for line in fetch(name, folder, progress=progress and sys.stderr.isatty(), timeout=timeout):
        console.print(line)
    console.print(f"{name}: ready in {folder}")


@app.command("list")
def list_components(options: Annotated[bool, typer.Option("--options", help="also list each method's options, "
                                                          "defaults and meaning")] = False) -> None:
    """Methods (with their options), datasets and models graphfed knows."""
    from graphfed import catalogue

    known = catalogue.load()  # the registries' text without importing torch (see graphfed/catalogue.py)
    methods = Table(title="methods (graphfed describe METHOD: options in full)", show_header=False)
    for name, entry in known["methods"].items():
        defaults = ", ".join(f"{option}={default}" for option, default, _ in entry["options"])
        methods.add_row(name, entry["summary"] + (f"\n[dim]options: {defaults}[/dim]" if defaults else ""))
    show(methods)
    if options:
        for name, entry in known["methods"].items():
            _print_options(name, entry["options"])
    for title in ("datasets", "models"):
        table = Table(title=title, show_header=False)
        for name, text in known[title].items():
            table.add_row(name, text)
        show(table)
    from graphfed.config import AttackConfig, DefenseConfig  # pydantic only: no torch

    for section, model, what in (("attack", AttackConfig, "malicious clients"),
                                 ("defense", DefenseConfig, "client-side defences")):
        table = Table(title=f"{what} (config section `{section}:`)")
        for header in ("field", "default", "meaning"):
            table.add_column(header)
        for field, info in model.model_fields.items():
            choices = getattr(info.annotation, "__args__", None) if field == "kind" else None
            meaning = info.description or ("one of " + ", ".join(choices) if choices else "")
            table.add_row(f"{section}.{field}", shown_default(info), meaning)
        show(table)


def _print_options(method: str, rows: list[list[str]]) -> None:
    table = Table(title=f"{method}: method.options")
    for header in ("option", "default", "meaning"):
        table.add_column(header)
    for row in rows:
        table.add_row(*row)
    if not table.row_count:
        table.add_row("(none)", "", "")
    show(table)


@app.command()
def describe(method: Annotated[str, typer.Argument(help="a method name (graphfed list)")]) -> None:
    """One method: what it does, its algorithm, and each option with its default and meaning."""
    from graphfed import catalogue

    methods = catalogue.load()["methods"]
    if method not in methods:
        _fail(f"method.name: unknown method '{method}'; allowed: {', '.join(sorted(methods))}", EXIT_CONFIG)
    entry = methods[method]
    console.print(f"[bold]{method}[/bold]: {entry['summary']}\n")
    console.print(entry["doc"], markup=False, highlight=False, soft_wrap=True)
    _print_options(method, entry["options"])


def main() -> None:
    app()


def __getattr__(name: str) -> Any:
    """``click_command``: the CLI as a click command, built on first use (the docs' CLI reference reads it)."""
    if name == "click_command":
        return typer.main.get_command(app)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
