"""Option types with their range: `--help` shows it (`--episodes INT>=1`, `--port INT{0..65535}`) and the parser
rejects a value outside it with a one-line error, before a command runs or writes anything.

    episodes: PositiveInt = 2            # drive demo --episodes 0  ->  drive demo: error: --episodes: 0 is out ...
    port: Port = 4567
    lr: PositiveFloat = 1e-3
    workers: Workers = 1                 # 1 .. MAX_WORKERS (4 per CPU this process may use)

Paths a command will write are checked before it computes anything: `writable_file(cfg.out, "--out")`,
`writable_dir(cfg.trace, "--trace")` create the parent (the folder) and open a scratch file there, so a path
that cannot be written fails at once, naming the option and the path.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from tyro.constructors import PrimitiveConstructorSpec

from drive.errors import UserError


def _spec(kind: type, metavar: str, check: Callable[[Any], str | None]) -> PrimitiveConstructorSpec:
    def parse(args: list[str]) -> Any:
        try:
            value = kind(args[0])
        except ValueError:
            raise ValueError(f"{args[0]!r} is not {'an integer' if kind is int else 'a number'}") from None
        problem = check(value)
        if problem:
            raise ValueError(f"{args[0]} {problem}")
        return value

    return PrimitiveConstructorSpec(
        nargs=1,
        metavar=metavar,
        instance_from_str=parse,
        is_instance=lambda x: isinstance(x, kind) and not isinstance(x, bool),
        str_from_instance=lambda x: [str(x)],
    )


def IntRange(low: int | None = None, high: int | None = None) -> Any:  # noqa: N802 - a type factory
    """int within [low, high] (either bound may be open)."""
    if high is None:
        metavar = f"INT>={low}" if low is not None else "INT"
    else:
        metavar = f"INT{{{low}..{high}}}" if low is not None else f"INT<={high}"

    wanted = f">= {low}" if high is None else (f"<= {high}" if low is None else f"in {low}..{high}")

    def check(v: int) -> str | None:
        if (low is not None and v < low) or (high is not None and v > high):
            return f"is out of range: must be {wanted}"
        return None

    return Annotated[int, _spec(int, metavar, check)]


def FloatRange(low: float | None = None, high: float | None = None, open_low: bool = False) -> Any:  # noqa: N802
    """A finite float within [low, high] ((low, high] with open_low)."""
    lo = "" if low is None else (f">{low:g}" if open_low else f">={low:g}")
    hi = "" if high is None else f"<={high:g}"
    metavar = "FLOAT" + (lo + ("," if lo and hi else "") + hi)

    def check(v: float) -> str | None:
        if not math.isfinite(v):
            return "is not finite"
        if low is not None and (v <= low if open_low else v < low):
            return f"is out of range: must be {lo}"
        if high is not None and v > high:
            return f"is out of range: must be {hi}"
        return None

    return Annotated[float, _spec(float, metavar, check)]


PositiveInt = IntRange(1)
NonNegativeInt = IntRange(0)
Port = IntRange(0, 65535)  # 0: the system picks a free port
Probability = FloatRange(0.0, 1.0)
OpenUnit = FloatRange(0.0, 1.0, open_low=True)  # (0, 1]: a quantile, a fraction that cannot be 0
PositiveFloat = FloatRange(0.0, None, open_low=True)
NonNegativeFloat = FloatRange(0.0)


def _cpus() -> int:
    """CPUs this process may run on (its affinity mask where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# more worker processes than 4 per CPU only queue for it (and each holds an env, a policy and torch in memory);
# a Ray cluster larger than this machine still gets 64 episodes in flight
MAX_WORKERS = max(64, 4 * _cpus())


def _check_workers(v: int) -> str | None:
    if v < 1:
        return "is out of range: must be >= 1"
    if v > MAX_WORKERS:
        return f"is too many: at most {MAX_WORKERS} (the larger of 64 and 4 per CPU; {_cpus()} CPUs here)"
    return None


Workers = Annotated[int, _spec(int, f"INT{{1..{MAX_WORKERS}}}", _check_workers)]


def _scratch(folder: Path, option: str, path: Path) -> None:
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UserError(f"{option} {path}: cannot write there ({existing} is a file, not a folder)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".drive-write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"{option} {path}: cannot write there ({reason} at {exc.filename or folder})") from None


def writable_file(path: Path | str, option: str) -> None:
    """Fail now (a UserError naming `option` and `path`) unless a file can be written at `path`: its folder is
    created, a scratch file opened and removed there."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder; give a file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{option} {path}: the file exists and is not writable")
    _scratch(path.parent, option, path)


def writable_dir(path: Path | str, option: str) -> None:
    """Fail now unless `path` is (or can be created as) a folder files can be written into."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {path}: exists and is not a folder")
    _scratch(path, option, path)


def drive_program(argv0: str | None = None) -> str:
    """How to type `drive` in the shell this process was started from, for the "next:" hints commands print:
    `drive` when that name on $PATH is this program, else the path that started it, relative to the working
    directory where it lies inside it (`.venv/bin/drive` after the README's install, no venv activated)."""
    started = Path(argv0 if argv0 is not None else sys.argv[0])
    if started.name == "__main__.py":  # python -m drive
        return "python -m drive"
    if started.name != "drive" or not started.is_file():  # main() called in-process (tests)
        return "drive"
    found = shutil.which("drive")
    if found and Path(found).resolve() == started.resolve():
        return "drive"
    path = started.absolute()
    try:
        shown = path.relative_to(Path.cwd())
    except ValueError:
        return shlex.quote(str(path))
    return shlex.quote(shown.as_posix() if "/" in shown.as_posix() else f"./{shown}")
