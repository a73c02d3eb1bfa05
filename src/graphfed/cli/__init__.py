"""Command line: ``graphfed run | compare | bench | inspect | ...``, one module per command group (Flower's own CLI,
``flwr/cli/``, is the anchor): :mod:`~graphfed.cli.common` holds the app and what the commands share, and importing
the package registers every command on it."""

from __future__ import annotations

from typing import Any

import typer

from graphfed.cli import bench, compare, data, export, flower, info, pretrain, privacy, run  # noqa: F401  (they register)
from graphfed.cli.common import app, stop_writing_stdout
from graphfed.config import load_config  # noqa: F401  (graphfed.cli.load_config, as before the package)

#: the order ``graphfed --help`` lists the commands in: a run's life first, then the tools around it
ORDER = ("run", "compare", "status", "flower-status", "show", "export", "predict", "pretrain", "flower-app",
         "privacy-audit", "plot-graphs", "bench", "run-pack", "inspect", "arch-graph", "list", "describe")
app.registered_commands.sort(key=lambda command: ORDER.index(command.name or command.callback.__name__))


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # the reader of standard output left while the framework wrote to it
        stop_writing_stdout()


def __getattr__(name: str) -> Any:
    """``click_command``: the CLI as a click command, built on first use (the docs' CLI reference reads it)."""
    if name == "click_command":
        return _with_plain_help_defaults(typer.main.get_command(app))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _with_plain_help_defaults(command: Any) -> Any:
    """Each command's ``--help`` with the default it has (off): click 8.3+ gives the help flag an internal sentinel
    as its default, which the generated reference printed as ``Sentinel.UNSET`` on every command."""
    make = command.get_help_option

    def help_option(ctx: Any) -> Any:
        option = make(ctx)
        if option is not None and type(option.default).__name__ == "Sentinel":
            option.default = False
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _with_plain_help_defaults(sub)
    return command


__all__ = ["app", "main"]
