"""``graphfed privacy-audit``: an epsilon lower bound from canary clients beside the claim."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    pass

from graphfed.cli.common import BUG_REPORT, EXIT_CONFIG, EXIT_INTERNAL, EXIT_RUN, SetOption, app, console, fail, load


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

    cfg = load(config, overrides)
    if cfg.privacy.mechanism == "none":
        fail("privacy.mechanism: none; nothing to audit (set privacy.mechanism and its noise)", EXIT_CONFIG)
    federation = build_federation(cfg.dataset, cfg.seed)  # the plan depends on how many clients train
    train = cfg.train
    plan = privacy_plan(cfg, federation, resolve_method(cfg))  # the run's own plan
    try:
        result = audit(plan, train.rounds, canaries, seed_attacker=seed_attacker, seed=cfg.seed)
    except ValueError as err:
        fail(str(err), EXIT_CONFIG)
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
