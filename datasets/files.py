"""Atomic file writing, one implementation for every writer in the project (datasets, checkpoints, traces, videos).

`atomic_write(path, data)` writes bytes; `atomic_path(path)` is a context manager that hands out a temporary path
beside `path` for a library that writes files itself (torch.save, pyarrow, cv2.VideoWriter) and renames it into
place only when the block finishes without an error. Either way the temp file is fsynced before the rename and the
directory after it, so after a kill `path` holds the old content or the new, never half of it; a failed block
leaves no temp file behind. Temp names start with "." and end in ".tmp" (and keep the suffix, which some writers
need to choose a format), so a reader's glob never mistakes one for a finished file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temp_path(path: str | os.PathLike) -> Path:
    """The temporary sibling of `path` an atomic writer uses (unique per process)."""
    path = Path(path)
    return path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: Path, path: Path) -> None:
    """Make a finished temp file `path`: fsync it, rename it over `path`, fsync the directory."""
    _fsync_file(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """`with atomic_path(p) as tmp: write(tmp)` -> p appears, complete, when the block ends; nothing on an error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        commit(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (temp file + fsync + rename + directory fsync)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def clean_temp(folder: str | os.PathLike) -> int:
    """Remove temp files a killed writer left in `folder` (not recursive); returns how many."""
    removed = 0
    for tmp in Path(folder).glob(".*.tmp*"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
            removed += 1
    return removed
