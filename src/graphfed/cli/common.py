"""What every command shares: the app, its one error rule, the console, and running configs with their exit codes."""

from __future__ import annotations

import functools
import logging
import os
import signal
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table
from typer.core import TyperGroup

from graphfed.config import RunConfig, load_config, printable
from graphfed.errors import EXIT_INPUT, EXIT_OVER_BUDGET, EXIT_STOPPED, GraphfedError

if TYPE_CHECKING:
    from graphfed.runs import RunResult

EXIT_CONFIG = EXIT_INPUT  # invalid config, unknown method/dataset/model, bad --set, data files, suites
EXIT_RUN = EXIT_STOPPED  # the run stopped (non-finite update, unusable checkpoint)
# EXIT_IN_USE (4, graphfed.errors): another process is writing the run folder
EXIT_INTERNAL = 1  # a bug: anything that is not a GraphfedError
EXIT_INTERRUPTED = 130
BUG_REPORT = ("this is a bug in graphfed (or in a plugin it runs), not in your input: please report it with the "
              "command and the output of the same command with --verbose (docs: Runs, errors and exit codes)")


#: click's usage error (a bad option value, a missing option, an unknown command), found through typer's own class
USAGE_ERROR: type[Exception] = next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "UsageError")


@contextmanager
def usage_errors_in_one_line() -> Iterator[None]:
    """A mistake in the command line is one line on standard error and exit 2, like every other mistake of a user
    (typer would draw a usage box). A bare command that prints its help (click's NoArgsIsHelpError) is left alone."""
    try:
        yield
    except USAGE_ERROR as err:
        if type(err).__name__ == "NoArgsIsHelpError":
            raise
        context = getattr(err, "ctx", None)
        # the command as the user typed it: "graphfed" whatever name the process or a test runner gave the program
        where = " ".join(["graphfed", *(context.command_path.split(" ")[1:] if context is not None else [])])
        message = " ".join(str(err.format_message()).split())  # type: ignore[attr-defined]
        typer.echo(f"error: {printable(where)}: {printable(message)} (see {where} --help)", err=True)
        raise typer.Exit(EXIT_CONFIG) from None


class OneLineUsageErrors(TyperGroup):
    """The command group whose parsing errors, its own and its commands', are one line (exit 2)."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with usage_errors_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with usage_errors_in_one_line():
            return super().invoke(ctx)


class Commands(typer.Typer):
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
        except BrokenPipeError:  # the reader stopped reading (``graphfed inspect ... | head -1``): it has its answer
            stop_writing_stdout()
            raise typer.Exit(0) from None
        except GraphfedError as err:
            fail(str(err), err.exit_code)
        except Exception as err:
            if kwargs.get("verbose") or os.environ.get("GRAPHFED_TRACEBACK"):
                traceback.print_exc()
            reason = (str(err).strip().splitlines() or [""])[0][:300]
            typer.echo(f"internal error: {type(err).__name__}: {printable(reason)}", err=True)
            typer.echo(BUG_REPORT, err=True)
            raise typer.Exit(EXIT_INTERNAL) from None

    return command


def stop_writing_stdout() -> None:
    """Point standard output at the null device: what is still buffered for a reader that left (a closed pipe) is
    dropped, instead of failing again when Python flushes it at exit."""
    import sys

    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    finally:
        os.close(null)


class CommandConsole(Console):
    """rich's console, but a reader that leaves (a closed pipe) is not an error: rich itself exits 1 there."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError  # the command's error rule ends it with exit 0


app = Commands(cls=OneLineUsageErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                help="graphfed: graph-relational personalised federated learning.")
console = CommandConsole()


def _print_version(asked: bool) -> None:
    if asked:
        from importlib import metadata

        try:
            version = metadata.version("graphfed")
        except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
            version = "unknown (not installed)"
        typer.echo(f"graphfed {version}")
        raise typer.Exit()


@app.callback()
def root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="print graphfed's version and exit")] = False) -> None:
    """graphfed: graph-relational personalised federated learning."""


def show(table: Table) -> None:
    """Print a table: in a terminal, at its width; elsewhere, every value in full."""
    from graphfed.report.tables import print_table

    print_table(console, table)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s",
                        handlers=[RichHandler(console=Console(stderr=True), show_path=False)], force=True)


def fail(message: str, code: int) -> None:
    typer.echo(f"error: {printable(message)}", err=True)  # one line, whatever a file or name held
    raise typer.Exit(code)


def check_out(out: Path, option: str = "--out") -> None:
    """Fail before any data is built when ``out`` cannot become a writable run folder (nothing is created)."""
    if out.exists() and not out.is_dir():
        fail(f"{option} {out}: exists and is not a directory", EXIT_CONFIG)
    existing = next(parent for parent in (out, *out.parents) if parent.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        fail(f"{option} {out}: {existing} is not a writable directory", EXIT_CONFIG)


def claim_out(out: Path, overwrite: bool, resumable: bool = True) -> None:
    """A new run may not silently replace the run ``out`` holds: refuse (one line), or clear it with --overwrite."""
    from graphfed.runs import clear_run, describe_run

    existing = describe_run(out)
    if existing is None:
        return
    if not overwrite:
        options = "pass --resume to continue it, --overwrite to replace it" if resumable else (
            "it was made by another config: pass --overwrite to replace it")
        fail(f"--out {out} holds {existing}; {options}, or choose another --out", EXIT_CONFIG)
    clear_run(out)


def load(config: Path | None, overrides: list[str] | None) -> RunConfig:
    return load_config(config, overrides or [])


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler stopping the job, ``kill``) ends a run like Ctrl-C: checkpoint kept, one line. The first
    SIGINT or SIGTERM interrupts; any that follow, while the run records its fate (its status ``interrupted``, its
    ledger) and the process exits 130, are ignored: a second Ctrl-C cannot cut that short and leave a run that
    resumes as nothing, or a process killed by the signal instead of exiting 130."""
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.getsignal(number) for number in handled}
    signalled = []

    def interrupt(signum: int, frame: Any) -> None:
        for number in handled:
            signal.signal(number, signal.SIG_IGN)  # the process is ending: kept ignored until it has
        signalled.append(signum)
        raise KeyboardInterrupt

    for number in handled:
        signal.signal(number, interrupt)
    try:
        yield
    finally:
        if not signalled:
            for number, handler in previous.items():
                signal.signal(number, handler)


def run_one(cfg: RunConfig, out: Path | None, resume: bool, progress: bool = True,
             keep_stopped: bool = False) -> RunResult:
    # Imported per command: `graphfed --help` should not pay for torch.
    from graphfed.sim.engine import run_config

    return run_many([cfg], [out], lambda: [run_config(cfg, out, resume=resume, progress=progress)],
                     keep_stopped)[0]


def run_many(configs: list[RunConfig], outs: list[Path | None], running: Callable[[], list[RunResult]],
              keep_stopped: bool = False) -> list[RunResult]:
    """``running()``'s results; an interrupt, or a run that stopped (unless ``keep_stopped``: a comparison goes on
    and says so at its end), is one line with its exit code."""
    try:
        with sigterm_as_interrupt():
            summaries = running()
    except KeyboardInterrupt:
        # Typer turns KeyboardInterrupt into a silent exit; say how to continue.
        where = outs[0] if len(outs) == 1 else f"each run's folder under {Path(str(outs[0])).parent.parent}"
        fail(f"interrupted; the last checkpoint in {where} is kept, continue with --resume", EXIT_INTERRUPTED)
    for summary, out in zip(summaries, outs, strict=True):
        if not summary.completed:
            if not keep_stopped:
                fail(f"{summary.status} (summary in {out})", EXIT_RUN)
            console.print(f"[yellow]stopped:[/yellow] {summary.method} seed {summary.seed}: {summary.status}; the "
                          f"comparison goes on")
    return summaries


def fail_over_budget(summaries: list[RunResult]) -> None:
    """The closing line and exit 6 of runs that completed with a client's epsilon above their target (after their
    results were printed: what they trained is kept, and a reader must not take them as within their budget)."""
    over = [summary for summary in summaries if (summary.privacy or {}).get("above_target")]
    if not over:
        return
    worst = max(max(summary.privacy["above_target"].values()) for summary in over)  # type: ignore[index]
    target = over[0].privacy["target_epsilon"]  # type: ignore[index]
    fail(f"privacy budget exceeded: {len(over)} run(s) released more than privacy.target_epsilon {target:g} allows "
         f"(up to ε {worst:.3g}); their summary.json names the clients (privacy.above_target)", EXIT_OVER_BUDGET)


SetOption = Annotated[list[str] | None, typer.Option("--set", help="override a field: KEY=VALUE, e.g. "
                                                      "train.rounds=100 (repeatable)")]


def table(title: str, columns: list[str], cells: list[list[str]]) -> Table:
    table = Table(title=title)
    for header in columns:
        table.add_column(header, overflow="fold")
    for row in cells:
        table.add_row(*row)
    return table


def names(text: str | None) -> list[str] | None:
    return [part.strip() for part in text.split(",") if part.strip()] if text else None
