"""Raw run-to-failure vibration readers: PRONOSTIA / FEMTO-ST (IEEE PHM 2012) and XJTU-SY.

Sources and layouts (../shared/data/bearings/PROVENANCE.md, sections 2 and 3):
- PRONOSTIA (Nectoux et al., IEEE PHM 2012; copy: Lucky-Loek/ieee-phm-2012-data-challenge-dataset @ 129d43e0),
  one folder per bearing (`Learning_set/Bearing1_1/`, `Full_Test_Set/Bearing1_4/`, ...):
  * `acc_NNNNN.csv`: no header, 2560 rows x 6 fields `hour, minute, second, microsecond, horizontal, vertical`
    (acceleration in g), 25.6 kHz, one 0.1 s snapshot every 10 s.
  * `temp_NNNNN.csv`: no header, 600 rows x 5 fields `hour, minute, second, tenth, temperature` (deg C), 10 Hz, one
    file a minute; absent for some bearings (Learning 2_2, 3_2; Test/Full_Test 1_3, 2_3; Test 2_6).
- XJTU-SY (Wang, Lei, Li, Li, IEEE Trans. Rel. 2020), `{35Hz12kN,37.5Hz11kN,40Hz10kN}/BearingC_K/{1..N}.csv`: a header
  `Horizontal_vibration_signals,Vertical_vibration_signals`, then 32768 rows of 2 floats, 25.6 kHz, 1.28 s a minute.
- HUST: PROVENANCE identifies no raw run-to-failure layout (only feature files exist), so there is no HUST reader.

Quirks, each seen in the fixtures, and how they are handled:
- The delimiter is `,` except Full_Test_Set/Bearing1_4 acc files and some temp files, which use `;`: it is sniffed
  from the first line of every file (a file mixing both fails on the first line that disagrees).
- The microsecond field is an int (`65664`), a float with a 2-digit (`8.8441e+05`) or 3-digit exponent (`4.2504e+005`):
  every field is parsed as float64. It carries only 5 significant digits, so consecutive samples may share a value.
- Zero-padded clock fields (`08;48;05;7;57.181`) and signed zeros (`-0`) parse as ordinary floats.
- Clock times are seconds since midnight; a run crossing midnight is unwrapped across files (`unwrap_days`).
- Files are ordered by their number, not by name; numbers must run 1..N without a gap (a gap is a missing snapshot
  and raises, naming the folder and the first missing number).
- A run stops mid-file: the last file of a series may be short (PRONOSTIA Learning_set/Bearing2_1 ends with a 37-row
  temp_00151.csv). `find_bearing` drops a short LAST acceleration snapshot and says so in `RawBearing.notes`: the
  features then come from complete snapshots only, as every published row does (Bearing2_1: 911 x 2560 samples ->
  exactly its 4663 rows), and no window mixes a cut-off snapshot into a time base that assumes full ones. Its rows
  are still parsed, so a malformed row in it is an error like anywhere else. A short file anywhere else is
  corruption and raises, naming the file and the line where it ends. Temperature files are listed and read only on
  request (`RawBearing.temperature_files`); their short last file is kept (`short_ok`: its readings carry their own
  clock), see `extract.py`.
- A malformed file (wrong field count, a non-number, NaN/inf, an empty line, a missing or wrong XJTU header) or a
  truncated one (fewer rows than the format has) raises `BearingFileError` whose one-line message names the file and
  the line. The fast path is numpy's C parser; only when it fails or the shape is wrong is the file re-scanned line by
  line to name the culprit.
"""

from __future__ import annotations

import io
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datasets.errors import DataError

FS = 25600  # Hz, both PRONOSTIA and XJTU-SY accelerometers
PRONOSTIA_ROWS = 2560  # 0.1 s at 25.6 kHz
PRONOSTIA_TEMP_ROWS = 600  # 60 s at 10 Hz
XJTU_ROWS = 32768  # 1.28 s at 25.6 kHz
XJTU_HEADER = "Horizontal_vibration_signals,Vertical_vibration_signals"
PRONOSTIA_ACC = re.compile(r"acc_(\d+)\.csv")
PRONOSTIA_TEMP = re.compile(r"temp_(\d+)\.csv")
XJTU_FILE = re.compile(r"(\d+)\.csv")
BEARING_FOLDER = "one folder per bearing: PRONOSTIA acc_00001.csv, acc_00002.csv, ... or XJTU-SY 1.csv, 2.csv, ..."


class BearingFileError(DataError):
    """A raw or feature file that cannot be used. The one-line message names the file and the line."""

    def __init__(self, path: str | os.PathLike, line: int | None, what: str):
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {what}")


@dataclass(frozen=True)
class AccSnapshot:
    """One PRONOSTIA acceleration file."""

    path: Path
    clock: np.ndarray  # (2560,) seconds since midnight of each sample: hour*3600 + minute*60 + second + us*1e-6
    vibration: np.ndarray  # (2560, 2) horizontal, vertical acceleration [g]


@dataclass(frozen=True)
class TempSnapshot:
    """One PRONOSTIA temperature file."""

    path: Path
    clock: np.ndarray  # (600,) seconds since midnight: hour*3600 + minute*60 + second + tenth/10
    temperature: np.ndarray  # (600,) deg C


def _delimiter(path: Path, first_line: str) -> str:
    if ";" in first_line:
        return ";"
    if "," in first_line:
        return ","
    raise BearingFileError(path, 1, f"no ',' or ';' delimiter in {first_line[:40]!r}")


def _scan(path: Path, lines: list[str], delim: str, n_fields: int, first: int) -> np.ndarray:
    """Slow path: parse line by line, raising at the first bad line (1-based numbering as in an editor)."""
    rows = []
    for k, line in enumerate(lines, start=first):
        fields = line.split(delim)
        if line.strip() == "":
            raise BearingFileError(path, k, "empty line")
        if len(fields) != n_fields:
            raise BearingFileError(path, k, f"{len(fields)} fields, expected {n_fields} (truncated or malformed row)")
        try:
            values = [float(f) for f in fields]
        except ValueError:
            raise BearingFileError(path, k, f"not a number in {line[:60]!r}") from None
        if not all(math.isfinite(v) for v in values):
            raise BearingFileError(path, k, f"non-finite value in {line[:60]!r}")
        rows.append(values)
    return np.array(rows, dtype=np.float64).reshape(-1, n_fields)


def read_table(
    path: str | os.PathLike, n_fields: int, n_rows: int | None, header: str | None = None, short_ok: bool = False
) -> np.ndarray:
    """A delimited numeric file as (n_rows, n_fields) float64; `header`, if given, must be its first line exactly.

    `n_rows=None` accepts any positive number of rows; `short_ok` accepts 0..n_rows rows (the last file of a stopped
    run). Errors name the file and line (see the module docstring)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("ascii")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise BearingFileError(path, line, "non-ASCII bytes") from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():  # trailing blank lines, as some CSV writers leave, are not rows
        lines.pop()
    first = 1
    if header is not None:
        if not lines or lines[0].lstrip("\ufeff").strip() != header:
            raise BearingFileError(path, 1, f"expected header {header!r}")
        lines, first = lines[1:], 2
    if not lines:
        if short_ok:
            return np.empty((0, n_fields))
        raise BearingFileError(path, first, "no data rows")
    delim = _delimiter(path, lines[0])
    try:
        data = np.loadtxt(io.StringIO("\n".join(lines)), delimiter=delim, comments=None, ndmin=2)
        ok = data.shape[1] == n_fields and data.shape[0] == len(lines) and np.isfinite(data).all()
    except ValueError:
        ok = False
    if not ok:
        data = _scan(path, lines, delim, n_fields, first)
    if n_rows is not None and data.shape[0] > n_rows:
        raise BearingFileError(path, first + n_rows, f"{data.shape[0]} rows, more than the format's {n_rows}")
    if n_rows is not None and data.shape[0] < n_rows and not short_ok:
        raise BearingFileError(path, first + data.shape[0], f"file ends after {data.shape[0]} of {n_rows} rows")
    return data


def read_pronostia_acc(
    path: str | os.PathLike, n_rows: int | None = PRONOSTIA_ROWS, short_ok: bool = False
) -> AccSnapshot:
    data = read_table(path, 6, n_rows, short_ok=short_ok)  # (n, 6)
    clock = data[:, 0] * 3600 + data[:, 1] * 60 + data[:, 2] + data[:, 3] * 1e-6
    return AccSnapshot(Path(path), clock, np.ascontiguousarray(data[:, 4:6]))


def read_pronostia_temp(
    path: str | os.PathLike, n_rows: int | None = PRONOSTIA_TEMP_ROWS, short_ok: bool = False
) -> TempSnapshot:
    data = read_table(path, 5, n_rows, short_ok=short_ok)  # (n, 5)
    clock = data[:, 0] * 3600 + data[:, 1] * 60 + data[:, 2] + data[:, 3] / 10
    return TempSnapshot(Path(path), clock, data[:, 4].copy())


def read_xjtu(path: str | os.PathLike, n_rows: int | None = XJTU_ROWS, short_ok: bool = False) -> np.ndarray:
    """(n_rows, 2) horizontal, vertical acceleration [g] of one XJTU-SY snapshot."""
    return read_table(path, 2, n_rows, header=XJTU_HEADER, short_ok=short_ok)


def unwrap_days(clock: np.ndarray) -> np.ndarray:
    """Seconds-since-midnight stamps in recording order -> monotone seconds (adds a day at each backwards jump)."""
    days = np.concatenate([[0], np.cumsum(np.diff(clock) < -43200)])  # a jump back of > 12 h is midnight
    return clock + 86400.0 * days


def _numbered(folder: Path, pattern: re.Pattern) -> tuple[Path, ...]:
    found = {}
    for entry in os.scandir(folder):
        match = pattern.fullmatch(entry.name)
        if match and entry.is_file():
            found[int(match.group(1))] = Path(entry.path)
    numbers = sorted(found)
    for expected, got in enumerate(numbers, start=1):
        if got != expected:
            raise BearingFileError(folder, None, f"snapshot {expected} missing (numbers must run 1..N, next is {got})")
    return tuple(found[n] for n in numbers)


@dataclass(frozen=True)
class RawBearing:
    """The complete acceleration snapshot files of one bearing folder, in time order."""

    folder: Path
    layout: str  # "pronostia" or "xjtu"
    acc_files: tuple[Path, ...]  # (N,) complete acceleration snapshots
    rows_per_file: int  # samples in every acceleration snapshot
    n_recorded: int  # snapshot files in the folder: N, or N + 1 when a short last one was dropped
    notes: tuple[str, ...] = ()  # one line each: what was dropped and why

    @property
    def name(self) -> str:
        return self.folder.name

    def read(self, i: int) -> AccSnapshot:
        """Snapshot i (0-based). XJTU files carry no clock: theirs is (i*60 + sample/fs) s, one snapshot a minute."""
        path = self.acc_files[i]
        if self.layout == "pronostia":
            return read_pronostia_acc(path, self.rows_per_file)
        vibration = read_xjtu(path, self.rows_per_file)
        return AccSnapshot(path, 60.0 * i + np.arange(len(vibration)) / FS, vibration)

    def temperature_files(self) -> tuple[Path, ...]:
        """PRONOSTIA `temp_NNNNN.csv` in order (a gap raises); () when the bearing has none or for XJTU-SY."""
        return _numbered(self.folder, PRONOSTIA_TEMP) if self.layout == "pronostia" else ()


def _short_last(files: tuple[Path, ...], rows: int, layout: str) -> tuple[tuple[Path, ...], tuple[str, ...]]:
    """`files` without a short last snapshot (parsed, so a malformed row still raises) and the note saying so."""
    last = files[-1]
    with open(last, "rb") as handle:  # a complete file is not parsed twice: counting its lines is enough here
        n_lines = sum(1 for line in handle if line.strip())
    if n_lines >= rows + (layout == "xjtu"):
        return files, ()
    n = len(read_xjtu(last, rows, short_ok=True) if layout == "xjtu" else read_pronostia_acc(last, rows, True).clock)
    if len(files) == 1:
        what = f"file ends after {n} of {rows} rows, and it is the only snapshot: none complete to use"
        raise BearingFileError(last, n + 1 + (layout == "xjtu"), what)
    note = (
        f"{last}: {n} of {rows} rows (the run stopped mid-snapshot): dropped, features from the "
        f"{len(files) - 1} complete snapshots"
    )
    return files[:-1], (note,)


def find_bearing(folder: str | os.PathLike, rows_per_file: int | None = None) -> RawBearing:
    """Recognise a bearing folder: PRONOSTIA if it holds `acc_*.csv`, XJTU-SY if it holds numbered `*.csv`.

    Reads nothing but the last snapshot file's length (a short one is dropped, see the module docstring);
    temperature files are not looked at. `rows_per_file` overrides the format's snapshot length (2560 / 32768),
    e.g. for a shortened test fixture."""
    folder = Path(folder)
    if folder.is_file():
        snapshot = PRONOSTIA_ACC.fullmatch(folder.name) or XJTU_FILE.fullmatch(folder.name)
        hint = f"; did you mean its folder {folder.parent}?" if snapshot else ""
        raise BearingFileError(folder, None, f"is a file, not a bearing folder ({BEARING_FOLDER}){hint}")
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: bearing folder not found")
    layout, files = "pronostia", _numbered(folder, PRONOSTIA_ACC)
    if not files:
        layout, files = "xjtu", _numbered(folder, XJTU_FILE)
    if not files:
        raise BearingFileError(folder, None, "no PRONOSTIA acc_NNNNN.csv nor XJTU-SY N.csv snapshot files")
    rows = rows_per_file or (PRONOSTIA_ROWS if layout == "pronostia" else XJTU_ROWS)
    complete, notes = _short_last(files, rows, layout)
    return RawBearing(folder, layout, complete, rows, len(files), notes)
