"""What Flower logs for graphfed's errors: one line for the user's, the traceback for a bug.

Flower's ServerApp and ClientApp runners log every exception the app raises with its traceback (``exc_info``). The
CLI's rule holds on Flower too: an error graphfed raises for its user (:class:`~graphfed.errors.GraphfedError`: a
refused second ServerApp, a SuperNode started with a bad ``partition-id``) is a line to act on, so Flower's line
carries its message instead of a traceback; any other exception is a bug and keeps its traceback. The filter sits
on Flower's logger in every process that imports graphfed's Flower App, so the line and the copy Flower pushes to
the SuperLink (``flwr log``) agree.
"""

from __future__ import annotations

import logging

from graphfed.errors import GraphfedError

FLOWER_LOGGER = "flwr"


class UserErrorsInOneLine(logging.Filter):
    """On Flower's logger: a record whose exception is a :class:`GraphfedError` becomes one line, its message
    followed by the error's."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, GraphfedError):
            record.msg, record.args = f"{record.getMessage()}: {error}", ()
            record.exc_info, record.exc_text = None, None
        return True


def user_errors_in_one_line() -> None:
    """Put :class:`UserErrorsInOneLine` on Flower's logger, once per process."""
    logger = logging.getLogger(FLOWER_LOGGER)
    if not any(isinstance(existing, UserErrorsInOneLine) for existing in logger.filters):
        logger.addFilter(UserErrorsInOneLine())


__all__ = ["UserErrorsInOneLine", "user_errors_in_one_line"]
