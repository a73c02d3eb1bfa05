"""``graphfed flower-app``: the Flower App folder that runs a config on Flower."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    pass

from graphfed.cli.common import EXIT_CONFIG, SetOption, app, console, fail, load


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
        fail("the Flower engine needs flwr: pip install 'graphfed[flower]'", EXIT_CONFIG)
    cfg = load(config, overrides)
    if cfg.flower.secure_aggregation:  # refuse before writing anything: the method must need only the mean
        from graphfed.flower.secagg import secure_aggregation_refusal
        from graphfed.setup import build_setup

        refusal = secure_aggregation_refusal(cfg, build_setup(cfg))
        if refusal:
            fail(refusal, EXIT_CONFIG)
    path = write_app_folder(cfg, out, results)
    console.print(f"wrote {path}\n  local simulation: flwr run {out} --federation-config "
                  f"\"num-supernodes={cfg.dataset.num_clients or 'N'} "
                  f"client-resources-num-cpus={cfg.flower.client_cpus:g} "
                  f"client-resources-num-gpus={cfg.flower.client_gpus:g}\" --stream\n"
                  f"  deployment: see the docs, how-to/flower.md")
