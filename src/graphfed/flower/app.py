"""The graphfed Flower App. ``pyproject.toml`` of a Flower App folder points here:

    [tool.flwr.app.components]
    serverapp = "graphfed.flower.app:server_app"
    clientapp = "graphfed.flower.app:client_app"

``graphfed flower-app CONFIG --out DIR`` writes such a folder with the run config filled in.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from graphfed.config import RunConfig, validate_config
from graphfed.flower import protocol
from graphfed.flower.client import client_app
from graphfed.flower.server import FlowerExecutor
from graphfed.runs import RunResult
from graphfed.setup import Setup
from graphfed.sim.engine import Simulator

server_app = ServerApp()
log = logging.getLogger("graphfed.flower")


def run_on_grid(grid: Grid, config: RunConfig, out_dir: str | Path | None) -> RunResult:
    """The simulator's round loop with clients on ``grid``; writes the usual run directory to ``out_dir`` (its
    result carries what only Flower knows: dropped clients and refused nodes)."""

    def make_executor(setup: Setup) -> FlowerExecutor:
        executor = FlowerExecutor(grid, config, setup)
        executor.wait_for_nodes()
        return executor

    return Simulator(config, out_dir, progress=False, executor=make_executor).run()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    config = validate_config(yaml.safe_load(str(context.run_config[protocol.RUN_CONFIG_KEY])))
    out_dir = str(context.run_config.get(protocol.OUT_DIR_KEY, "")) or None
    result = run_on_grid(grid, config, out_dir)
    drops = result.dropped_clients or []
    dropped = sorted({drop["client"] for drop in drops})
    log.info("graphfed run %s: test %s %.4g (best round %s); %d drop event(s), clients dropped at least once: %s",
             result.status, result.metric, result.test_mean or float("nan"), result.best_round, len(drops), dropped)


__all__ = ["client_app", "run_on_grid", "server_app"]
