"""The graphfed Flower App. ``pyproject.toml`` of a Flower App folder points here:

    [tool.flwr.app.components]
    serverapp = "graphfed.flower.app:server_app"
    clientapp = "graphfed.flower.app:client_app"

``graphfed flower-app CONFIG --out DIR`` writes such a folder with the run config filled in.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from graphfed.config import RunConfig, validate_config
from graphfed.flower import protocol
from graphfed.flower.client import client_app
from graphfed.flower.server import FlowerExecutor
from graphfed.sim.checkpoint import write_summary
from graphfed.sim.engine import Setup, Simulator

server_app = ServerApp()
log = logging.getLogger("graphfed.flower")


def run_on_grid(grid: Grid, config: RunConfig, out_dir: str | Path | None) -> dict[str, Any]:
    """The simulator's round loop with clients on ``grid``; writes the usual run directory to ``out_dir``."""
    executors: list[FlowerExecutor] = []

    def make_executor(setup: Setup) -> FlowerExecutor:
        executors.append(FlowerExecutor(grid, config, setup))
        executors[0].wait_for_nodes()
        return executors[0]

    summary = Simulator(config, out_dir, progress=False, executor=make_executor).run()
    summary.update(executors[0].report())
    if out_dir:
        # The simulator wrote summary.json; add what only the Flower engine knows.
        write_summary(Path(out_dir), summary)
    return summary


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    config = validate_config(yaml.safe_load(str(context.run_config[protocol.RUN_CONFIG_KEY])))
    out_dir = str(context.run_config.get(protocol.OUT_DIR_KEY, "")) or None
    summary = run_on_grid(grid, config, out_dir)
    dropped = sorted({d["client"] for d in summary["dropped_clients"]})
    log.info("graphfed run %s: test %s %.4g (best round %s); %d drop event(s), clients dropped at least once: %s",
             summary["status"], summary["metric"], summary["test_mean"] or float("nan"), summary["best_round"],
             len(summary["dropped_clients"]), dropped)


__all__ = ["client_app", "run_on_grid", "server_app"]
