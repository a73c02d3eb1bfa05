"""Memory pre-flight: stop before an allocation that cannot fit, and say what to change.

The host's free memory comes from psutil (Linux, macOS and Windows alike); a CUDA device's from the device itself
(``torch.cuda.mem_get_info``), so a run that would not fit on the GPU stops before round 1 rather than midway."""

from __future__ import annotations

import psutil
import torch


def available_memory_bytes(device: torch.device | None = None) -> int | None:
    """Memory a new allocation on ``device`` (default: the host) can use, or None where nothing says."""
    if device is not None and device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device is not None and device.type != "cpu":
        return None  # MPS shares the host's memory and reports no free figure of its own
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        return None


def _within(needed_bytes: float, available: int) -> bool:
    return needed_bytes <= 0.8 * available


def fits(needed_bytes: float, device: torch.device | None = None) -> bool:
    """``needed_bytes`` fit in 80 % of the memory available on ``device`` (default: the host), or nothing says."""
    available = available_memory_bytes(device)
    return available is None or _within(needed_bytes, available)


def check_fits(needed_bytes: float, what: str, advice: str, device: torch.device | None = None) -> None:
    """Raise ``ConfigError`` (exit 2, one line) when ``what`` needs more than 80 % of the memory available on
    ``device`` (default: the host)."""
    available = available_memory_bytes(device)  # asked once: the message names the figure the check used
    if available is None or _within(needed_bytes, available):
        return
    from graphfed.errors import ConfigError

    where = "on the host" if device is None or device.type == "cpu" else f"on {device}"
    raise ConfigError(f"{what} needs {needed_bytes / 2**30:.1f} GiB but {available / 2**30:.1f} GiB is available "
                      f"{where}; {advice}")
