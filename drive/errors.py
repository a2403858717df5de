"""User errors: what the command line prints as one line, `drive COMMAND: error: ...`, with exit code 2.

A `UserError` is anything the person at the keyboard can fix: a bad option value, a missing path, a file of the
wrong kind. Library code raises it (or a subclass: `drive.checkpoint.CheckpointError`) where it knows the cause;
the data layer's `datasets.errors.DataError` counts the same. Everything else is a defect and keeps its traceback.
"""

from __future__ import annotations

from datasets.errors import DataError


class UserError(ValueError):
    """Foreseeable bad input; the message is one line that says what is wrong and, where it helps, what to do."""


#: exception types the CLI reports as one line (OSError: a path that does not exist, a port that cannot be bound)
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, DataError, OSError)


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (a multi-line message is joined; an empty one names the type)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
