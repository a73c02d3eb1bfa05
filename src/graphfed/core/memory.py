"""Memory pre-flight: stop before an allocation that cannot fit, and say what to change."""

from __future__ import annotations


def available_memory_bytes() -> int | None:
    """Memory the kernel says a new allocation can use (``MemAvailable``), or None where it does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(needed_bytes: float, what: str, advice: str) -> None:
    """Raise ``ConfigError`` (exit 2, one line) when ``what`` needs more than 80 % of the available memory."""
    available = available_memory_bytes()
    if available is None or needed_bytes <= 0.8 * available:
        return
    from graphfed.errors import ConfigError

    raise ConfigError(f"{what} needs {needed_bytes / 2**30:.1f} GiB but {available / 2**30:.1f} GiB is available; "
                      f"{advice}")
