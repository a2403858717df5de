"""Where the real public data lives: one rule for every loader, command and test.

`data_root(explicit)` is, in order: the path given (an option such as `--data-root`), `$DRIVE_DATA_ROOT`, or
`../shared/data` beside the checkout (where tests and CI find it). Each folder inside keeps its original layout and a
PROVENANCE.md naming its source, so a user elsewhere points the root at copies fetched from those sources.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV_VAR = "DRIVE_DATA_ROOT"


def data_root(explicit: str | os.PathLike | None = None) -> Path:
    """The data root: `explicit`, else $DRIVE_DATA_ROOT, else ../shared/data beside the checkout (may not exist)."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else REPO.parent / "shared" / "data"


def data_folder(name: str, explicit: str | os.PathLike | None = None) -> Path:
    """`data_root(explicit) / name`, with an error naming where it looked and how to point elsewhere."""
    folder = data_root(explicit) / name
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder}: data folder not found (set ${ENV_VAR} or --data-root to the folder holding {name}/; "
            f"its PROVENANCE.md names the original source)"
        )
    return folder
