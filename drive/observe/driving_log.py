"""The Udacity simulator's own recording format, written durably frame by frame (`drive udacity record`).

DIR/driving_log.csv in the simulator's format (no header; `center, left, right, steering, throttle, brake, speed`
separated by ", "; absolute image paths) and DIR/IMG/center_YYYY_MM_DD_HH_MM_SS_mmm.jpg -- the JPEG bytes exactly as
received. Each frame's image is written to a temporary file, fsynced and renamed into IMG/, then its csv row is
appended with a single write() and fsynced: a killed recorder leaves at most the frame it was writing half done
(a stray *.tmp), never a partial row. A reopened log never reuses an image name already on disk.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _number(x: float) -> str:
    """Like C#'s float.ToString(): up to 7 significant digits, exponent as E-05."""
    return format(float(x) + 0.0, ".7g").replace("e", "E")  # + 0.0 turns -0.0 into 0.0


class DrivingLogWriter:
    """Appends frames to DIR/driving_log.csv + DIR/IMG/, durably, frame by frame."""

    def __init__(self, out: str | os.PathLike):
        self.dir = Path(out).resolve()
        self.img = self.dir / "IMG"
        self.img.mkdir(parents=True, exist_ok=True)
        self._csv = os.open(self.dir / "driving_log.csv", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._img_fd = os.open(self.img, os.O_RDONLY)
        self._last_ms = 0
        self.n_frames = 0

    def _name(self) -> str:
        # Unique and increasing, like the simulator's names. Earlier writes may have run ahead of the clock (several
        # frames in one millisecond), so a reopened log must also skip names already on disk: never overwrite.
        ms = max(int(time.time() * 1000), self._last_ms + 1)
        while True:
            t = time.localtime(ms // 1000)
            name = f"center_{time.strftime('%Y_%m_%d_%H_%M_%S', t)}_{ms % 1000:03d}.jpg"
            if not (self.img / name).exists():
                self._last_ms = ms
                return name
            ms += 1

    def write(self, jpeg: bytes, steering: float, throttle: float, brake: float, speed: float) -> Path:
        path = self.img / self._name()
        tmp = path.with_suffix(".jpg.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, jpeg)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        os.fsync(self._img_fd)  # the rename itself is durable
        row = f"{path}, , , {_number(steering)}, {_number(throttle)}, {_number(brake)}, {_number(speed)}\n"
        os.write(self._csv, row.encode())
        os.fsync(self._csv)
        self.n_frames += 1
        return path

    def close(self) -> None:
        for fd in (self._csv, self._img_fd):
            try:
                os.close(fd)
            except OSError:
                pass
