"""Dataset builders: each module turns raw data (generated or read from disk) into per-client arrays."""

from __future__ import annotations

from pathlib import Path

from graphfed.errors import DataMissingError


def missing_data(what: str, path: Path | str, folder: str, needs: str = "") -> DataMissingError:
    """The error for data that is not where the config points: names the path and the settings that move it."""
    return DataMissingError(f"{what} not found: {path}; set dataset.data_dir (or the GRAPHFED_DATA environment "
                             f"variable) to the folder that contains '{folder}/'{needs}, or see graphfed data list "
                             f"for how to fetch it")


def require_file(path: Path, what: str, folder: str) -> None:
    """Raise :func:`missing_data` unless ``path`` is a file."""
    if not path.is_file():
        raise missing_data(what, path, folder)
