"""The errors a user can act on, under one root.

Everything graphfed raises on purpose for a user to fix or to know is a :class:`GraphfedError`; the CLI turns
exactly these into one line and the exit code of their kind (:attr:`GraphfedError.exit_code`). Any other
exception is a bug in graphfed (or in a user's plugin): the CLI reports it as an internal error (exit 1) and shows
its traceback with ``--verbose``.

The input kinds also derive from ``ValueError`` (and a missing file from ``FileNotFoundError``), so library
callers that caught those before still catch them.
"""

from __future__ import annotations

from typing import ClassVar

#: exit codes of the CLI (docs/reference/runs-and-errors.md)
EXIT_INPUT = 2
EXIT_STOPPED = 3
EXIT_IN_USE = 4
#: a private run finished with a client's epsilon above its ``privacy.target_epsilon`` (its outputs say whose)
EXIT_OVER_BUDGET = 6


class GraphfedError(Exception):
    """Root of every error graphfed raises for its user."""

    #: the CLI's exit code for this kind
    exit_code: ClassVar[int] = EXIT_INPUT


class ConfigError(GraphfedError, ValueError):
    """A config, an override or a name in it is invalid (one line, naming the field)."""


class DataError(ConfigError):
    """Data files are corrupt, out of range or do not fit the config (one line, naming the file). A kind of config
    error: the config's dataset section points at them."""


class DataMissingError(DataError, FileNotFoundError):
    """Data files are not where the config points (names the path and the settings that move it)."""


class UntrustedInputError(GraphfedError, ValueError):
    """A file or message someone handed us (a suite, an npz, a Flower node's reply) fails its checks."""


class RunStoppedError(GraphfedError):
    """The run cannot go on; what it finished is kept (last good checkpoint, ``summary.json``)."""

    exit_code = EXIT_STOPPED


class CheckpointError(RunStoppedError):
    """A checkpoint or run log cannot be resumed from (missing, corrupt, from another config)."""


class NonFiniteUpdateError(RunStoppedError):
    """A client update or the server's weights became NaN/Inf; the run stops, checkpoint kept."""


class InvalidUpdateError(RunStoppedError, ValueError):
    """A client update has the wrong shape."""


class SolverError(RunStoppedError):
    """A server-side solver did not reach its stated tolerance within its iteration budget."""


class RunInUseError(GraphfedError):
    """Another process is writing this run folder (a second ServerApp for the same run, a second ``graphfed run``):
    refused before anything is read or written, so each round is trained once."""

    exit_code = EXIT_IN_USE


__all__ = ["EXIT_INPUT", "EXIT_IN_USE", "EXIT_OVER_BUDGET", "EXIT_STOPPED", "CheckpointError", "ConfigError",
           "DataError", "DataMissingError", "GraphfedError", "InvalidUpdateError", "NonFiniteUpdateError",
           "RunInUseError", "RunStoppedError", "SolverError", "UntrustedInputError"]
