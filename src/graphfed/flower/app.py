"""The graphfed Flower App. ``pyproject.toml`` of a Flower App folder points here:

    [tool.flwr.app.components]
    serverapp = "graphfed.flower.app:server_app"
    clientapp = "graphfed.flower.app:client_app"

``graphfed flower-app CONFIG --out DIR`` writes such a folder with the run config filled in.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from flwr.app import Context
from flwr.app.exception import AppExitException
from flwr.serverapp import Grid, ServerApp

from graphfed.config import ConfigError, RunConfig, read_yaml, validate_config
from graphfed.errors import RunInUseError, RunStoppedError
from graphfed.flower import protocol
from graphfed.flower.client import client_app
from graphfed.flower.server import FlowerExecutor
from graphfed.runs import RunResult, in_use_message, read_result, writer_holding
from graphfed.setup import Setup
from graphfed.sim.checkpoint import CHECKPOINT
from graphfed.sim.engine import Simulator

server_app = ServerApp()
log = logging.getLogger("graphfed.flower")
#: Flower's exit code for a ServerApp whose run was not started ("run start rejected")
RUN_START_REJECTED = 203


class RunRefusedError(AppExitException, RunInUseError):
    """A ServerApp refused before it asked any node for anything (a second ServerApp for a run in use). Flower
    records the run as failed with this message as its status details (``flwr ls``), logs it in one line
    (:mod:`graphfed.flower.logs`) and exits with :data:`RUN_START_REJECTED`."""

    exit_code = RUN_START_REJECTED  # type: ignore[assignment]


def run_on_grid(grid: Grid, config: RunConfig, out_dir: str | Path | None) -> RunResult:
    """The simulator's round loop with clients on ``grid``; writes the usual run directory to ``out_dir`` (its
    result carries what only Flower knows: dropped clients, refused nodes, clients that came back), with a
    checkpoint every ``flower.checkpoint_every`` rounds. With ``flower.resume: auto`` an unfinished run of this
    config in ``out_dir`` (a ServerApp that died, a run stopped by ``flower.min_replies``) continues from its
    checkpoint."""

    def make_executor(setup: Setup) -> FlowerExecutor:
        executor = FlowerExecutor(grid, config, setup)
        executor.wait_for_nodes()
        return executor

    if out_dir is not None:
        wait_for_the_other_writer(Path(out_dir), config.flower.writer_wait)
    resume = out_dir is not None and config.flower.resume == "auto" and unfinished_run(Path(out_dir))
    if resume:
        log.info("resuming the unfinished run in %s from its checkpoint", out_dir)
    return Simulator(config, out_dir, progress=False, executor=make_executor,
                     checkpoint_every=config.flower.checkpoint_every).run(resume=resume)


def wait_for_the_other_writer(out_dir: Path, seconds: float) -> None:
    """A second ServerApp for this run (``flwr run`` again while the first goes on, e.g. after a SuperLink restart
    it survived) is refused before it asks any node for anything; one that finds the first still letting go (it
    ended with its SuperLink) waits up to ``seconds`` for it. The run's writer lock, taken when the rounds start,
    is the real fence: this only refuses early."""
    deadline = time.monotonic() + seconds
    while (holder := writer_holding(out_dir)) is not None:
        if time.monotonic() >= deadline:
            raise RunInUseError(in_use_message(out_dir, holder))
        log.info("another ServerApp is still writing %s; waiting up to %.0f s for it to end", out_dir,
                 deadline - time.monotonic())
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))


def unfinished_run(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds a run that has a checkpoint and did not complete (its summary is missing or says
    stopped). Whether the checkpoint is this config's is checked when it is loaded."""
    if not (out_dir / CHECKPOINT).exists():
        return False
    try:
        return not read_result(out_dir).completed
    except FileNotFoundError:
        return True


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    config = validate_config(read_yaml(str(context.run_config[protocol.RUN_CONFIG_KEY])))
    if config.flower.secure_aggregation:
        raise ConfigError("flower.secure_aggregation: this app's ServerApp reads every reply; run the SecAgg+ app "
                          "(serverapp = graphfed.flower.secagg:server_app; graphfed flower-app writes it)")
    out_dir = str(context.run_config.get(protocol.OUT_DIR_KEY, "")) or None
    try:
        result = run_on_grid(grid, config, out_dir)
    except RunInUseError as err:
        raise RunRefusedError(f"refused: {err}") from None
    drops = result.dropped_clients or []
    dropped = sorted({drop["client"] for drop in drops})
    log.info("graphfed run %s: test %s %.4g (best round %s); %d drop event(s), clients dropped at least once: %s",
             result.status, result.metric, result.test_mean or float("nan"), result.best_round, len(drops), dropped)
    if not result.completed:  # Flower then records the run as failed, not completed; the checkpoint resumes it
        raise RunStoppedError(f"{result.status}; flwr run the same App again to resume from its checkpoint")


__all__ = ["RUN_START_REJECTED", "RunRefusedError", "client_app", "run_on_grid", "server_app"]
