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


def read_table(path: str | os.PathLike, n_fields: int, n_rows: int | None, header: str | None = None) -> np.ndarray:
    """A delimited numeric file as (n_rows, n_fields) float64; `header`, if given, must be its first line exactly.

    `n_rows=None` accepts any positive number of rows. Errors name the file and line (see the module docstring)."""
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
        raise BearingFileError(path, first, "no data rows")
    delim = _delimiter(path, lines[0])
    try:
        data = np.loadtxt(io.StringIO("\n".join(lines)), delimiter=delim, comments=None, ndmin=2)
        ok = data.shape[1] == n_fields and data.shape[0] == len(lines) and np.isfinite(data).all()
    except ValueError:
        ok = False
    if not ok:
        data = _scan(path, lines, delim, n_fields, first)
    if n_rows is not None and data.shape[0] != n_rows:
        raise BearingFileError(path, first + data.shape[0], f"file ends after {data.shape[0]} of {n_rows} rows")
    return data


def read_pronostia_acc(path: str | os.PathLike, n_rows: int | None = PRONOSTIA_ROWS) -> AccSnapshot:
    data = read_table(path, 6, n_rows)  # (n, 6)
    clock = data[:, 0] * 3600 + data[:, 1] * 60 + data[:, 2] + data[:, 3] * 1e-6
    return AccSnapshot(Path(path), clock, np.ascontiguousarray(data[:, 4:6]))


def read_pronostia_temp(path: str | os.PathLike, n_rows: int | None = PRONOSTIA_TEMP_ROWS) -> TempSnapshot:
    data = read_table(path, 5, n_rows)  # (n, 5)
    clock = data[:, 0] * 3600 + data[:, 1] * 60 + data[:, 2] + data[:, 3] / 10
    return TempSnapshot(Path(path), clock, data[:, 4].copy())


def read_xjtu(path: str | os.PathLike, n_rows: int | None = XJTU_ROWS) -> np.ndarray:
    """(n_rows, 2) horizontal, vertical acceleration [g] of one XJTU-SY snapshot."""
    return read_table(path, 2, n_rows, header=XJTU_HEADER)


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
    """The snapshot files of one bearing folder, in time order."""

    folder: Path
    layout: str  # "pronostia" or "xjtu"
    acc_files: tuple[Path, ...]  # (N,) acceleration snapshots
    temp_files: tuple[Path, ...]  # PRONOSTIA temperature files; () when absent or XJTU
    rows_per_file: int  # samples in every acceleration snapshot

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


def find_bearing(folder: str | os.PathLike, rows_per_file: int | None = None) -> RawBearing:
    """Recognise a bearing folder: PRONOSTIA if it holds `acc_*.csv`, XJTU-SY if it holds numbered `*.csv`.

    `rows_per_file` overrides the format's snapshot length (2560 / 32768), e.g. for a shortened test fixture."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: bearing folder not found")
    acc = _numbered(folder, PRONOSTIA_ACC)
    if acc:
        return RawBearing(folder, "pronostia", acc, _numbered(folder, PRONOSTIA_TEMP), rows_per_file or PRONOSTIA_ROWS)
    xjtu = _numbered(folder, XJTU_FILE)
    if xjtu:
        return RawBearing(folder, "xjtu", xjtu, (), rows_per_file or XJTU_ROWS)
    raise BearingFileError(folder, None, "no PRONOSTIA acc_NNNNN.csv nor XJTU-SY N.csv snapshot files")
