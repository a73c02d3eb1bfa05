"""``graphfed data list | fetch`` and ``graphfed inspect``: the datasets and a federation's clients."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

if TYPE_CHECKING:
    pass

from graphfed.cli.common import EXIT_CONFIG, Commands, SetOption, app, console, fail, load, show


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
        fail("give a federation folder or --config CONFIG (one of the two)", EXIT_CONFIG)
    if directory is not None and overrides:
        fail("--set applies to --config only", EXIT_CONFIG)
    fed: Federation
    if directory is not None:
        fed = load_federation(directory)
    else:
        cfg = load(config, overrides)
        fed = build_federation(cfg.dataset, cfg.seed)
    render_federation(fed, console, max_clients)


data_app = Commands(no_args_is_help=True, pretty_exceptions_enable=False,
                     help="The papers' public datasets: what is where, and fetching them in their published formats.")
app.add_typer(data_app, name="data")


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
