"""Where the real public data lives: one rule for every loader, command and test.

`data_root(explicit)` is, in order: the path given (`drive train --data ROOT`, which `drive bench offline --data`
passes on), `$DRIVE_DATA_ROOT`, or `../shared/data` beside the checkout (where tests and CI find it). Each folder
inside keeps its original layout and a PROVENANCE.md naming its source, so a user elsewhere points the root at copies
fetched from those sources.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

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
            f"{folder}: data folder not found (give the folder holding {name}/ as --data ROOT or set ${ENV_VAR}; "
            f"its PROVENANCE.md names the original source)"
        )
    return folder


def portable(value: Any, base: str | os.PathLike | None = None) -> Any:
    """`value` with every absolute path in it written relative to `base` (default: the working directory): a str
    that is an absolute path, `PREFIX:/abs,/abs2` as in `udacity:DIR,DIR` or `KEY=/abs` as in `--set` (not a URL),
    inside dicts, lists and tuples too.
    What the project writes (checkpoints, config.json, metrics, traces) never names the folders of the machine that
    made it: a run made in a checkout beside shared/ records `../shared/data/...`, which resolves again from any
    checkout laid out the same way."""
    if isinstance(value, dict):
        return {k: portable(v, base) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(portable(v, base) for v in value)
    if not isinstance(value, str):
        return value
    for mark in (":", "="):  # udacity:/abs/a,/abs/b and task.test_data=/abs
        prefix, sep, rest = value.partition(mark)
        if sep and prefix.replace(".", "_").isidentifier() and rest.startswith("/") and not rest.startswith("//"):
            return f"{prefix}{mark}" + ",".join(portable(p, base) for p in rest.split(","))
    if not os.path.isabs(value):
        return value
    return os.path.relpath(value, os.fspath(base) if base is not None else os.getcwd())


def portable_command(command: str, base: str | os.PathLike | None = None) -> str:
    """A recorded command line with its absolute paths made relative (portable), words otherwise unchanged."""
    return shlex.join(portable(shlex.split(command), base))
