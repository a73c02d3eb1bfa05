"""``graphfed export | predict``: a client's trained model, as a file and on new rows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    pass

from graphfed.cli.common import app, console


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

    from graphfed.export import client_state, predict, read_rows, rebuild, scaled_like_training, target_units
    from graphfed.runs import atomic_write_text

    state, model, _ = client_state(run_dir, client)
    inputs = scaled_like_training(run_dir, client, read_rows(rows, tuple(model["input_shape"])))
    outputs = predict(rebuild(model, state), inputs)
    if model["task"] == "classification":
        probabilities = outputs.softmax(dim=-1).numpy()
        header = ["prediction", *[f"p{k}" for k in range(probabilities.shape[1])]]
        table = np.column_stack([probabilities.argmax(axis=1), probabilities])
        lines = [",".join(header)] + [",".join([str(int(row[0])), *[f"{v:.6g}" for v in row[1:]]]) for row in table]
    else:  # in the units the federation declares (meta.yaml target_scale / target_units), as every output
        scale, units = target_units(run_dir)
        values = outputs.reshape(len(outputs), -1).numpy() * scale
        suffix = f" ({units})" if units else ""
        lines = [",".join(f"y{k}{suffix}" for k in range(values.shape[1]))] + [",".join(f"{v:.6g}" for v in row)
                                                                                for row in values]
    atomic_write_text(out, "\n".join(lines) + "\n")
    console.print(f"wrote {len(outputs)} predictions of client {client} to {out}")
