"""``graphfed export | predict``: a client's trained model, as a file and on new rows."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from graphfed.cli.common import EXIT_CONFIG, app, console, fail


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
                    rows: Annotated[Path | None, typer.Option("--input", help="raw rows: rows.csv (a header, then "
                                                              "numbers; columns matched by name where the model "
                                                              "knows its features) or an .npz with 'x'")] = None,
                    out: Annotated[Path | None, typer.Option("--out", help="predictions CSV (with --prompt: the "
                                                             "text written, else printed)")] = None,
                    prompt: Annotated[str | None, typer.Option("--prompt", help="text models: the text to go on "
                                                               "from")] = None,
                    length: Annotated[int, typer.Option(help="--prompt: characters to write", min=1)] = 200) -> None:
    """The client's model on new raw rows (scaled as the run scaled that client's, from what the run saved; the
    training data are not read): the predicted class and each class's probability, or the regression outputs in
    the federation's declared units. A text model (shakespeare) goes on from --prompt instead, one most likely
    character at a time."""
    import torch

    from graphfed.export import deployed_model, generate, read_rows
    from graphfed.runs import atomic_write_text

    if (rows is None) == (prompt is None):
        fail("predict: give --input rows (with --out) or a text model's --prompt", EXIT_CONFIG)
    model = deployed_model(run_dir, client)
    if prompt is not None:
        text = generate(model, prompt, length)
        if out is not None:
            atomic_write_text(out, text)
        console.print(f"{client} goes on: {text!r}" if out is None else f"wrote {length} characters of {client} "
                      f"to {out}", markup=False, highlight=False)
        return
    if out is None:
        fail("predict --input: give --out, the predictions CSV to write", EXIT_CONFIG)
    assert rows is not None and out is not None
    inputs = read_rows(rows, model.input_shape, model.feature_names)
    with torch.no_grad():
        outputs = model(inputs).numpy()
    if model.task == "classification":
        header = ["prediction", *(["class"] if model.class_names else []),
                  *[f"p{k}" for k in range(outputs.shape[1])]]
        lines = [",".join(header)]
        for row in outputs:
            label = int(row.argmax())
            named = [_csv_text(model.class_names[label])] if model.class_names else []
            lines.append(",".join([str(label), *named, *[f"{v:.6g}" for v in row]]))
    else:  # in the units the federation declares (meta.yaml target_scale / target_units), as every output
        values = outputs.reshape(len(outputs), -1)
        suffix = f" ({model.target_units})" if model.target_units else ""
        lines = [",".join(f"y{k}{suffix}" for k in range(values.shape[1]))] + [",".join(f"{v:.6g}" for v in row)
                                                                                for row in values]
    atomic_write_text(out, "\n".join(lines) + "\n")
    console.print(f"wrote {len(outputs)} predictions of client {client} to {out}")


def _csv_text(text: str) -> str:
    """``text`` as one CSV field (quoted where it holds a comma or a quote)."""
    return f'"{text.replace(chr(34), chr(34) * 2)}"' if any(c in text for c in ',"\n') else text
