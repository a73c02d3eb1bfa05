"""``graphfed pretrain``: a base network trained centrally on public text, for ``model.base``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from graphfed.cli.common import SetOption, app, console, load, setup_logging


@app.command("pretrain")
def pretrain_command(config: Annotated[Path, typer.Argument(help="YAML run config (its dataset names the "
                                                                 "federation's plays; its model is pretrained)")],
                     out: Annotated[Path, typer.Option("--out", help="the base file to write (.pt)")],
                     overrides: SetOption = None,
                     steps: Annotated[int, typer.Option(help="optimiser steps", min=1)] = 2000,
                     batch: Annotated[int, typer.Option(help="windows per step", min=1)] = 64,
                     lr: Annotated[float, typer.Option(help="Adam's learning rate (cosine decay to a tenth)",
                                                       min=0.0)] = 3e-3,
                     stride: Annotated[int, typer.Option(help="every s-th window of the public text", min=1)] = 8,
                     verbose: bool = False) -> None:
    """Train CONFIG's model (without its adapter) on the plays no client of its federation holds, and write the
    base a run reads with model.base (with its provenance: the plays, the steps, the seed, the code)."""
    from graphfed.models.pretrained import pretrain

    setup_logging(verbose)
    cfg = load(config, overrides)
    record = pretrain(cfg, out, steps=steps, batch=batch, lr=lr, stride=stride, echo=console.print)
    console.print(f"wrote {out}: {cfg.model.name} trained on {len(record['pretrained_on'])} public plays "
                  f"({record['windows']:,} windows), loss {record['final_loss']:.3f}, training accuracy "
                  f"{100 * record['train_accuracy']:.1f} % (use it with --set model.base={out})")
