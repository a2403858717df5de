"""The one error type of the data layer: a file or folder that cannot be used, named in a one-line message.

Every loader raises a subclass (`DemonstrationError`, `UdacityLogError`, ...). It is a ValueError, so code that
validates input can catch it as such; the command line prints it as one line, `drive COMMAND: error: ...`.
"""

from __future__ import annotations


class DataError(ValueError):
    """A data file or folder is missing, corrupt, truncated or inconsistent; the message names it (and the line)."""
