"""Write a ready Flower App folder for a graphfed config (``graphfed flower-app``)."""

from __future__ import annotations

from pathlib import Path

from graphfed.config import ConfigError, RunConfig, dump_config
from graphfed.flower import protocol

# Components are plain module attributes of the installed graphfed (flwr resolves them by reading the source).
SERVER_APP = "graphfed.flower.app:server_app"
CLIENT_APP = "graphfed.flower.client:client_app"
#: flower.secure_aggregation: Flower's SecAgg+ workflow (graphfed.flower.secagg)
SECURE_SERVER_APP = "graphfed.flower.secagg:server_app"
SECURE_CLIENT_APP = "graphfed.flower.secagg:client_app"


def app_pyproject(config: RunConfig, out_dir: Path, name: str = "graphfed-run") -> str:
    import tomli_w  # ships with flwr

    document = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": name, "version": "1.0.0",
                    "description": f"graphfed: {config.method.name} on {config.dataset.name} (seed {config.seed})",
                    "license": "MIT", "dependencies": ["graphfed[flower]"]},
        "tool": {
            "hatch": {"build": {"targets": {"wheel": {"packages": ["."]}}}},
            "flwr": {"app": {
                "publisher": "graphfed",
                "components": ({"serverapp": SECURE_SERVER_APP, "clientapp": SECURE_CLIENT_APP}
                               if config.flower.secure_aggregation else
                               {"serverapp": SERVER_APP, "clientapp": CLIENT_APP}),
                "config": {protocol.RUN_CONFIG_KEY: dump_config(config), protocol.OUT_DIR_KEY: str(out_dir)},
            }},
        },
    }
    return tomli_w.dumps(document, multiline_strings=True)


def write_app_folder(config: RunConfig, app_dir: Path, results_dir: Path | None = None) -> Path:
    """``app_dir/pyproject.toml``; the ServerApp writes its run directory to ``results_dir``
    (default ``app_dir/results``; absolute, because the ServerApp runs in the SuperLink's directory). A config no
    deployment may run is refused before anything is written."""
    refusal = protocol.deployment_refusal(config)
    if refusal:
        raise ConfigError(refusal)
    app_dir.mkdir(parents=True, exist_ok=True)
    results = (results_dir or app_dir / "results").resolve()
    path = app_dir / "pyproject.toml"
    path.write_text(app_pyproject(config, results))
    return path
