"""Raw bearing folder -> feature CSV in the format of the published files, streamed file by file.

`extract_features(raw_dir, out_csv)` reads one bearing folder (`raw.find_bearing`), pushes each snapshot through
the optional Gaussian smoother and the windower (`features.py`), and writes one row per window as it goes: memory
holds one snapshot plus fewer than `window` samples of overlap, whatever the number of files (a PRONOSTIA run is up
to 2803 files, an XJTU-SY one up to 2538). The CSV is written to `<out>.partial` and renamed over `out_csv` only
when complete (atomic, not resumable: an interrupted run leaves no half file under the final name).

Columns and formats, as in the published files (floats as Python's shortest repr, `\\n` line ends):
- PRONOSTIA: `Horizontal,Vertical,Time,Temperature,Degradation,RPM,Load`; XJTU-SY:
  `Horizontal,Vertical,RUL,Time,RPM,Load,Degradation`. Horizontal/Vertical are stringified 7-float lists
  `[energy, dominant_frequency, entropy, kurtosis, skewness, mean, std]`, energy raw (not log10).
- `Time` = row * window / fs (`FeatureSpec.times`); `RUL` (XJTU-SY) = N - (position of the window centre's
  snapshot in concatenation order), i.e. snapshots left only in time order (`FeatureSpec.file_order`);
  `Degradation` = `labels.degradation(Time, RPM, Load)`.
- RPM / Load from the folder name's condition (`BearingC_K`): PRONOSTIA 1800/4000, 1650/4200, 1500/5000; XJTU-SY
  2100/12000, 2250/11000, 2400/10000 (PROVENANCE); `rpm=` / `load=` override.
- `Temperature` (PRONOSTIA): by default 298.15, the value NSAC substitutes for a missing column, and no temperature
  file is opened; `temperature=` forces another constant. With `temperature_files=True` the `temp_NNNNN.csv` readings
  (deg C) are linearly interpolated at each window's first sample clock time (held constant outside the recorded
  span); the run's short last temperature file (Bearing2_1: 37 of 600 rows) is used as far as it goes, since each
  reading carries its own clock, and a bearing without temperature files (Learning 2_2, 3_2, Test 1_3, ...) keeps
  298.15; both are reported through `on_note`. Departure: the published column is not derivable from the raw data
  (constant fills such as 100.253 or 290.045, also for bearings with temperature files, and a 284-value series for
  Bearing1_4), so this column will differ; units are mixed there as here.
- A short last acceleration snapshot is dropped (`raw.find_bearing`), reported through `on_note`; every other
  malformed or short file stops the run with an error naming the file and the line.
Departure: PRONOSTIA `Degradation_monotonic` is not written (its recipe is unknown, see `labels.py`).
"""

from __future__ import annotations

import csv
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from datasets.files import atomic_path

from .features import SPECS, FeatureSpec, GaussianStream, WindowStream, window_features
from .labels import degradation
from .raw import FS, PRONOSTIA_TEMP_ROWS, BearingFileError, RawBearing, find_bearing, read_pronostia_temp, unwrap_days

if TYPE_CHECKING:
    from _csv import _writer as CsvWriter

CONDITIONS = {  # condition number -> (RPM, load [N])
    "pronostia": {1: (1800.0, 4000.0), 2: (1650.0, 4200.0), 3: (1500.0, 5000.0)},
    "xjtu": {1: (2100.0, 12000.0), 2: (2250.0, 11000.0), 3: (2400.0, 10000.0)},
}
COLUMNS = {
    "pronostia": ("Horizontal", "Vertical", "Time", "Temperature", "Degradation", "RPM", "Load"),
    "xjtu": ("Horizontal", "Vertical", "RUL", "Time", "RPM", "Load", "Degradation"),
}
NO_TEMPERATURE = 298.15  # NSAC: T = Temperature if present else 25 + 273.15
log = logging.getLogger(__name__)


def _condition(bearing: RawBearing, rpm: float | None, load: float | None) -> tuple[float, float]:
    if rpm is not None and load is not None:
        return float(rpm), float(load)
    match = re.fullmatch(r"Bearing(\d)_\d+", bearing.name)
    known = CONDITIONS[bearing.layout].get(int(match.group(1))) if match else None
    if known is None:
        raise ValueError(f"{bearing.folder}: no operating condition in the name; pass rpm= and load=")
    return (known[0] if rpm is None else float(rpm)), (known[1] if load is None else float(load))


def _temperature_series(bearing: RawBearing, note: Callable[[str], None]) -> tuple[np.ndarray, np.ndarray] | None:
    """(unwrapped clock (M,), deg C (M,)) over all temperature files in order, or None without any."""
    files = bearing.temperature_files()
    snaps = [read_pronostia_temp(p, short_ok=k == len(files) - 1) for k, p in enumerate(files)]
    if snaps and len(snaps[-1].temperature) < PRONOSTIA_TEMP_ROWS:
        note(
            f"{files[-1]}: {len(snaps[-1].temperature)} of {PRONOSTIA_TEMP_ROWS} rows (the run stopped): "
            "its readings used as far as they go"
        )
    if not sum(len(s.temperature) for s in snaps):
        note(
            f"{bearing.folder}: no temperature readings (no temp_NNNNN.csv): Temperature is {NO_TEMPERATURE}, "
            "NSAC's fill"
        )
        return None
    return unwrap_days(np.concatenate([s.clock for s in snaps])), np.concatenate([s.temperature for s in snaps])


def _file_order(bearing: RawBearing, spec: FeatureSpec) -> list[int]:
    """Snapshot indices in concatenation order (time order, or by file name as the published XJTU-SY files)."""
    order = list(range(len(bearing.acc_files)))
    if spec.file_order == "lexicographic":
        return sorted(order, key=lambda i: bearing.acc_files[i].name)
    if spec.file_order != "numeric":
        raise ValueError(f"file_order must be 'numeric' or 'lexicographic', not {spec.file_order!r}")
    return order


def _floats(values) -> str:
    return "[" + ", ".join(repr(float(v)) for v in values) + "]"


class _RowWriter:
    """Turns windows into CSV rows; knows the precomputed per-row columns (Time, labels, temperature)."""

    def __init__(
        self,
        bearing: RawBearing,
        spec: FeatureSpec,
        rpm: float,
        load: float,
        temperature: float | None,
        readings: tuple[np.ndarray, np.ndarray] | None,
    ):
        self.bearing, self.spec, self.rpm, self.load = bearing, spec, rpm, load
        self.n_rows = spec.n_windows(len(bearing.acc_files) * bearing.rows_per_file)
        self.time = spec.times(self.n_rows)  # (n_rows,)
        self.label = degradation(self.time, rpm, load)  # (n_rows,)
        self.constant_temperature = temperature
        self.readings = readings
        self.file_clocks: list[float] = []  # first-sample clock of each snapshot read so far
        self.written = 0

    def temperature(self, starts: np.ndarray) -> np.ndarray:
        if self.constant_temperature is not None:
            return np.full(len(starts), float(self.constant_temperature))
        if self.readings is None:
            return np.full(len(starts), NO_TEMPERATURE)
        per_file = self.bearing.rows_per_file
        file_clock = unwrap_days(np.array(self.file_clocks))[starts // per_file]
        clock = file_clock + (starts % per_file) / FS
        temp_clock, temp = self.readings
        return np.interp(clock, temp_clock, temp)

    def write(self, out: CsvWriter, starts: np.ndarray, windows: np.ndarray) -> None:
        """starts (B,), windows (B, 2, window) -> up to B rows (never beyond the spec's row count)."""
        keep = max(0, min(len(starts), self.n_rows - self.written))
        if keep == 0:
            return
        starts, windows = starts[:keep], windows[:keep]
        horizontal = window_features(windows[:, 0], self.spec)  # (B, 7)
        vertical = window_features(windows[:, 1], self.spec)  # (B, 7)
        rows = self.written + np.arange(keep)
        if self.bearing.layout == "pronostia":
            temps = self.temperature(starts)
            for k, i in enumerate(rows):
                t, d = repr(float(self.time[i])), repr(float(self.label[i]))
                out.writerow(
                    [
                        _floats(horizontal[k]),
                        _floats(vertical[k]),
                        t,
                        repr(float(temps[k])),
                        d,
                        repr(self.rpm),
                        repr(self.load),
                    ]
                )
        else:
            # a dropped short last snapshot still counts: the run lasted n_recorded minutes
            rul = self.bearing.n_recorded - (starts + self.spec.window // 2) // self.bearing.rows_per_file
            for k, i in enumerate(rows):
                out.writerow(
                    [
                        _floats(horizontal[k]),
                        _floats(vertical[k]),
                        int(rul[k]),
                        repr(float(self.time[i])),
                        repr(self.rpm),
                        repr(self.load),
                        repr(float(self.label[i])),
                    ]
                )
        self.written += keep


def extract_features(
    raw_dir: str | os.PathLike,
    out_csv: str | os.PathLike,
    *,
    spec: FeatureSpec | None = None,
    rpm: float | None = None,
    load: float | None = None,
    temperature: float | None = None,
    temperature_files: bool = False,
    rows_per_file: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> int:
    """Write the feature CSV of ONE bearing folder; returns the number of rows (windows) written.

    spec: the recipe (default: the dataset's, `features.SPECS`); rpm/load/temperature/temperature_files: see the
    module docstring (both temperature options at once is a ValueError); rows_per_file: snapshot length override
    (shortened fixtures); on_progress(done_files, total_files) after each snapshot, for a progress bar; on_note(line)
    for each file dropped or partly used, all before the first snapshot is read (default: a logging warning)."""
    if temperature is not None and temperature_files:
        raise ValueError("give a constant temperature or temperature_files=True, not both")
    note = on_note or log.warning
    bearing = find_bearing(raw_dir, rows_per_file)
    for line in bearing.notes:
        note(line)
    spec = spec or SPECS[bearing.layout]
    rpm, load = _condition(bearing, rpm, load)
    readings = _temperature_series(bearing, note) if temperature_files and bearing.layout == "pronostia" else None
    rows = _RowWriter(bearing, spec, rpm, load, temperature, readings)
    smoother = GaussianStream(spec.smooth_sigma) if spec.smooth_sigma else None
    windower = WindowStream(spec.window, spec.step)
    out_csv = Path(out_csv)
    with atomic_path(out_csv) as partial:  # a failed or killed run leaves the old output, never half a file
        with open(partial, "w", newline="") as handle:
            out = csv.writer(handle, lineterminator="\n")
            out.writerow(COLUMNS[bearing.layout])
            for done, i in enumerate(_file_order(bearing, spec), start=1):
                snap = bearing.read(i)
                rows.file_clocks.append(float(snap.clock[0]))
                signal = smoother.push(snap.vibration) if smoother else snap.vibration  # (n, 2)
                rows.write(out, *windower.push(signal))
                if on_progress is not None:
                    on_progress(done, len(bearing.acc_files))
            if smoother:
                rows.write(out, *windower.push(smoother.finish()))
        if rows.written != rows.n_rows:
            raise BearingFileError(bearing.folder, None, f"{rows.written} windows, expected {rows.n_rows}")
    return rows.written
