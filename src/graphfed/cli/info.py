"""``graphfed list | describe | configs | arch-graph | plot-graphs``: what graphfed knows and draws."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from graphfed.config import shown_default

if TYPE_CHECKING:
    pass

from graphfed.cli.common import EXIT_CONFIG, Commands, app, console, fail, show


@app.command("plot-graphs")
def plot_graphs_command(run_dir: Annotated[Path, typer.Argument(help="a run directory with graphs/")],
                        out: Annotated[Path | None, typer.Option(help="default RUN_DIR/plots")] = None) -> None:
    """Heatmaps of a run's collaboration graphs, per layer and over rounds."""
    from graphfed.report.plots import plot_graphs

    for path in plot_graphs(run_dir, out):
        console.print(f"wrote {path}")


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
        fail(f"--input-shape {input_shape!r}: expected integers separated by commas, e.g. 3,32,32", EXIT_CONFIG)
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


configs_app = Commands(no_args_is_help=True, pretty_exceptions_enable=False,
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
        fail(f"no packaged config {name!r}; packaged: {', '.join(p.stem for p in packaged_configs().values())}",
              EXIT_CONFIG)
    target = to / source.name if to.is_dir() else to
    if target.exists():
        fail(f"{target} exists; give --to another path", EXIT_CONFIG)
    atomic_write_text(target, source.read_text(encoding="utf-8"))
    console.print(f"wrote {target}")


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
        table.add_row(*(Text(cell) for cell in row))  # plain text: "[beta1, beta2]" is no markup
    if not table.row_count:
        table.add_row("(none)", "", "")
    show(table)


@app.command()
def describe(method: Annotated[str, typer.Argument(help="a method name (graphfed list)")]) -> None:
    """One method: what it does, its algorithm, and each option with its default and meaning."""
    from graphfed import catalogue

    methods = catalogue.load()["methods"]
    if method not in methods:
        fail(f"method.name: unknown method '{method}'; allowed: {', '.join(sorted(methods))}", EXIT_CONFIG)
    entry = methods[method]
    console.print(f"[bold]{method}[/bold]: {entry['summary']}\n")
    console.print(entry["doc"], markup=False, highlight=False, soft_wrap=True)
    console.print(f"\nServer weighting: {entry['server_weighting']}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"With LoRA adapters: {entry['adapters']}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"Asynchronous rounds: {entry['asynchronous']}", markup=False, highlight=False, soft_wrap=True)
    _print_options(method, entry["options"])
