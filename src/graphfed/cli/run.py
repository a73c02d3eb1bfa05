"""``graphfed run | status | show``: one run, its fate and its result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from graphfed.config import printable

if TYPE_CHECKING:
    from graphfed.runs import RunResult

from graphfed.cli.common import (
    EXIT_CONFIG,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OVER_BUDGET,
    EXIT_RUN,
    SetOption,
    app,
    check_out,
    claim_out,
    console,
    fail,
    fail_over_budget,
    load,
    run_many,
    run_one,
    setup_logging,
    show,
)


@app.command()
def run(config: Annotated[Path, typer.Argument(help="YAML run config")],
        overrides: SetOption = None,
        out: Annotated[Path | None, typer.Option(help="output directory (default runs/<method>_<dataset>)")] = None,
        resume: Annotated[bool, typer.Option(help="continue from OUT/checkpoint.pt")] = False,
        overwrite: Annotated[bool, typer.Option(help="replace the run OUT already holds")] = False,
        progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
        verbose: bool = False) -> None:
    """Run one method on one dataset; writes config.yaml, rounds.jsonl, summary.json, plots/."""
    setup_logging(verbose)
    cfg = load(config, overrides)
    out = out or Path("runs") / f"{cfg.method.name}_{cfg.dataset.name}_seed{cfg.seed}"
    check_out(out)
    if not resume:
        claim_out(out, overwrite)
    summary = run_one(cfg, out, resume, progress)
    _print_summary(summary)
    console.print(f"results in [bold]{out}[/bold]")
    fail_over_budget([summary])


def _print_summary(result: RunResult) -> None:
    from graphfed.report.tables import (
        TRIVIAL_MARKS,
        format_value,
        higher_is_better,
        in_declared_units,
        metric_label,
        privacy_sentence,
        versus_trivial,
    )

    summary = in_declared_units(result)  # errors in the units the federation declares
    metric = summary.metric
    chosen = ("last evaluated round" if summary.privacy and summary.privacy.get("model_selection") == "last"
              else "best validation round")
    table = Table(title=f"{summary.method} on {summary.dataset} ({chosen} {summary.best_round} of {summary.rounds})")

    for header in (f"test {metric_label(metric, summary.target_units)} (mean ± std over clients)",
                   "trivial predictor", "clients scored", "pooled", "novel", "novel (adapted)", "wall s"):
        table.add_column(header, overflow="fold")
    pooled = summary.test_pooled
    scored, training = summary.scored_clients, summary.training_clients
    coverage = "—" if scored is None or training is None else f"{scored} of {training}" + (
        f" (no reply: {', '.join(summary.unscored_clients[:5])}{', ...' if len(summary.unscored_clients) > 5 else ''})"
        if summary.unscored_clients else " (shrank: replies lost)" if scored < training else "")
    relation = versus_trivial(summary.test_mean, summary.trivial_test_mean, higher_is_better(metric))
    mark = f" {TRIVIAL_MARKS[relation]}" if relation else ""
    table.add_row(format_value((summary.test_mean, summary.test_std), metric) + mark,
                  format_value(None if summary.trivial_test_mean is None else (summary.trivial_test_mean, 0.0),
                               metric).split(" ±")[0], coverage,
                  format_value((pooled, 0.0), metric).split(" ±")[0],
                  format_value(None if summary.novel_mean is None
                               else (summary.novel_mean, summary.novel_std), metric),
                  format_value(None if summary.novel_adapted_mean is None
                               else (summary.novel_adapted_mean, summary.novel_adapted_std), metric),
                  f"{summary.wall_seconds:.1f}")
    show(table)
    print_lost_uploads(summary)
    for line in clock_lines(summary):
        console.print(line)
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


#: ``graphfed status``'s exit code per fate (the table is in the docs, "Runs, errors and exit codes", and the README)
STATUS_EXIT = {"completed": 0, "failed": EXIT_INTERNAL, "none": EXIT_CONFIG, "stopped": EXIT_RUN, "running": 5,
               "interrupted": EXIT_INTERRUPTED, "over_budget": EXIT_OVER_BUDGET}


@app.command("flower-status", hidden=True)  # the name a Flower operator looks for
@app.command("status")
def status_command(run_dir: Annotated[Path, typer.Argument(help="a run folder (graphfed run --out, or a Flower "
                                                                "app's out_dir)")],
                   wait: Annotated[bool, typer.Option("--wait", help="while the run is running, wait for its end")]
                   = False,
                   interval: Annotated[float, typer.Option(help="--wait: seconds between looks", min=0.1)] = 5.0
                   ) -> None:
    """The run's fate in one line and an exit code a supervisor can act on: 0 completed, 3 stopped (its reason
    follows; resume it), 1 failed (a bug), 130 interrupted, 5 still running, 6 completed above its privacy target,
    2 no run there."""
    import time

    from graphfed.runs import run_fate

    if not run_dir.is_dir():
        fail(f"{run_dir}: not a directory", EXIT_CONFIG)
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
    from graphfed.report.tables import in_declared_units, per_client_table, plain
    from graphfed.runs import SUMMARY, read_result

    if not (run_dir / SUMMARY).is_file():
        fail(f"{run_dir}: no {SUMMARY} (not a finished run directory)", EXIT_CONFIG)
    result = in_declared_units(read_result(run_dir))  # errors in the units the federation declares
    scale = 100.0 if result.metric == "accuracy" else 1.0
    unit = "" if result.metric == "accuracy" or result.target_units is None else (
        f" ({result.target_units})²" if result.metric == "mse" else f" ({result.target_units})")
    headline = "—" if result.test_mean is None else f"{plain(scale * result.test_mean)}{unit}"
    trivial = "—" if result.trivial_test_mean is None else f"{plain(scale * result.trivial_test_mean)}{unit}"
    console.print(f"{result.method} on {result.dataset} (seed {result.seed}): {result.status}; test "
                  f"{result.metric} {headline} at round {result.best_round} of {result.rounds}; trivial predictors "
                  f"{trivial}")
    if result.stopped_early:
        console.print(f"stopped early at round {result.stopped_early['round']} (patience "
                      f"{result.stopped_early['patience']})")
    for line in clock_lines(result):
        console.print(line)
    if result.privacy:
        from graphfed.report.tables import privacy_sentence

        console.print(privacy_sentence(result.privacy))
    print_lost_uploads(result)
    if not result.per_client:
        console.print("no per-client scores (a run written by an older graphfed)")
        return
    show(per_client_table(result, None if show_all else 50))


def clock_lines(result: RunResult) -> list[str]:
    """What the simulated clock saw: asynchronous rounds, the time budget, the time to the target score."""
    from graphfed.report.tables import plain

    lines = []
    if result.asynchronous:
        rounds = result.asynchronous
        lines.append(f"asynchronous: {rounds['server_mode']}, {rounds['concurrency']} clients training at once, "
                     f"a server step every {rounds['buffer_size']} update(s) (staleness {rounds['staleness']}); "
                     f"{rounds['server_steps']} steps from {rounds['dispatches']} dispatches")
    if result.stopped_at_time:
        stop = result.stopped_at_time
        lines.append(f"stopped at round {stop['round']}: the simulated clock reached {stop['sim_seconds']:.0f} s of "
                     f"its {stop['time_budget']:g} s budget")
    elif result.sim_seconds and result.asynchronous:
        lines.append(f"simulated clock at the end: {result.sim_seconds:.0f} s")
    if result.time_to_target:
        reached = result.time_to_target
        scale = 100.0 if result.metric == "accuracy" else 1.0
        target = f"{plain(scale * reached['target'])}{' %' if result.metric == 'accuracy' else ''}"
        when = "" if reached["sim_seconds"] is None else f", {reached['sim_seconds']:.0f} simulated s"
        lines.append(f"test mean reached {target} at round {reached['round']}{when}" if reached["round"] is not None
                     else f"test mean never reached {target}")
    return lines


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


@app.command("run-pack", hidden=True)
def run_pack(pack_file: Annotated[Path, typer.Argument(help="JSON list of {config, out, resume}")]) -> None:
    """Run several configs that differ in their seed only as one pack (``graphfed bench`` writes the file)."""
    from graphfed.errors import UntrustedInputError
    from graphfed.sim.pack import Pack

    try:
        entries = json.loads(pack_file.read_text())
        configs = [load(Path(entry["config"]), []) for entry in entries]
        outs = [Path(entry["out"]) for entry in entries]
        resume = [bool(entry["resume"]) for entry in entries]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UntrustedInputError(f"{pack_file}: not a pack file ({type(err).__name__})") from None
    run_many(configs, list(outs), lambda: Pack(configs, list(outs)).run(resume))
