"""User errors: what the command line prints as one line, `drive COMMAND: error: ...`, with exit code 2.

A `UserError` is anything the person at the keyboard can fix: a bad option value, a missing path, a file of the
wrong kind. Library code raises it (or a subclass: `drive.checkpoint.CheckpointError`) where it knows the cause;
the data layer's `datasets.errors.DataError` counts the same. Everything else is a defect and keeps its traceback.
"""

from __future__ import annotations

import os

from datasets.errors import DataError


class UserError(ValueError):
    """Foreseeable bad input; the message is one line that says what is wrong and, where it helps, what to do."""


#: exception types the CLI reports as one line (OSError: a path that does not exist, a port that cannot be bound)
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, DataError, OSError)


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (a multi-line message is joined; an empty one names the type). An
    OSError from the system reads as a sentence, `x: no such file or directory`, not `[Errno 2] No such file or
    directory: 'x'`."""
    if isinstance(exc, OSError) and exc.strerror:
        names = [n for n in (exc.filename, exc.filename2) if n is not None]  # a file descriptor is an int
        where = " -> ".join(os.fsdecode(n) if isinstance(n, str | bytes) else str(n) for n in names)
        text = f"{where}: {_lower_first(exc.strerror)}" if where else _lower_first(exc.strerror)
    else:
        text = str(exc)
    return " ".join(text.split()) or type(exc).__name__


def _lower_first(text: str) -> str:
    """'No such file or directory' -> 'no such file or directory'; an acronym ('I/O error') keeps its case."""
    first, space, rest = text.partition(" ")
    return (first.lower() if first[1:] == first[1:].lower() else first) + space + rest
