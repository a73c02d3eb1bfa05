"""The user's folders graphfed reads and writes by default: ``$GRAPHFED_DATA`` / ``$GRAPHFED_CACHE``, else the
platform's per-user data and cache folders (platformdirs: ``XDG_*`` on Linux, ``~/Library`` on macOS,
``%LOCALAPPDATA%`` on Windows), never a path relative to wherever a command runs."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "graphfed"


def user_cache_dir() -> Path:
    """``$GRAPHFED_CACHE``, else the per-user cache folder (``~/.cache/graphfed`` on Linux)."""
    configured = os.environ.get("GRAPHFED_CACHE")
    return Path(configured).expanduser() if configured else Path(platformdirs.user_cache_dir(APP_NAME))


def user_data_dir() -> Path:
    """``$GRAPHFED_DATA``, else the per-user data folder (``~/.local/share/graphfed`` on Linux)."""
    configured = os.environ.get("GRAPHFED_DATA")
    return Path(configured).expanduser() if configured else Path(platformdirs.user_data_dir(APP_NAME))
