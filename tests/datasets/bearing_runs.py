"""Synthetic PRONOSTIA run-to-failure folders built from the real files' rows, with a run's quirks on demand.

Every field's text is copied verbatim from a real file in ../shared/data/bearings/pronostia_raw/fixtures (the
delimiter, int or float microseconds with 2- or 3-digit exponents, zero-padded clock fields, 3-decimal readings);
only the hour, minute and second fields are rewritten so that the files follow each other as in a run (one acc file
every 10 s, one temp file a minute, from 9:00:00) and each acc file takes its vibration rows rotated by 97 rows per
file, so that no two snapshots are equal. `acc_rows` / `temp_rows` cut a file short at a line end, as a stopped run
leaves its last file (real Learning_set/Bearing2_1: temp_00151.csv has 37 of 600 rows).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

ACC_TEMPLATES = {
    ",": ["Learning_set/Bearing1_1/acc_00001.csv", "Learning_set/Bearing1_1/acc_02803.csv",
          "Test_set/Bearing1_4/acc_00001.csv"],
    ";": ["Full_Test_Set/Bearing1_4/acc_00001.csv"],
}  # fmt: skip
TEMP_TEMPLATES = {",": "Learning_set/Bearing1_1/temp_00001.csv", ";": "Learning_set/Bearing1_2/temp_00001.csv"}
START = 9 * 3600  # the run's first sample, seconds since midnight


def _hms(template: list[str], seconds: int) -> list[str]:
    """hour, minute, second of `seconds`, zero-padded where the template's fields are (`08;48;05`)."""
    values = (seconds // 3600, seconds // 60 % 60, seconds % 60)
    padded = [len(t) if t.startswith("0") and len(t) > 1 else 0 for t in template[:3]]
    return [f"{v:0{width}d}" for v, width in zip(values, padded, strict=True)]


def write_run(
    fixtures: Path,
    folder: Path,
    delim: str = ",",
    n_acc: int = 5,
    n_temp: int = 2,
    acc_rows: dict[int, int] | None = None,
    temp_rows: dict[int, int] | None = None,
) -> Path:
    """`folder` with acc_00001..n_acc and temp_00001..n_temp; acc_rows / temp_rows: {file number: rows} to cut."""
    folder.mkdir(parents=True)
    acc_rows, temp_rows = acc_rows or {}, temp_rows or {}
    templates = [(fixtures / name).read_text().splitlines() for name in ACC_TEMPLATES[delim]]
    for k in range(n_acc):
        lines = templates[k % len(templates)]
        rows = []
        for i in range(acc_rows.get(k + 1, 2560)):
            fields = lines[i].split(delim)
            vibration = lines[(i + 97 * k) % 2560].split(delim)[4:]
            rows.append(delim.join([*_hms(fields, START + 10 * k), fields[3], *vibration]))
        (folder / f"acc_{k + 1:05d}.csv").write_text("\n".join(rows) + "\n")
    temp_lines = (fixtures / TEMP_TEMPLATES[delim]).read_text().splitlines()
    for j in range(n_temp):
        rows = []
        for i in range(temp_rows.get(j + 1, 600)):
            fields = temp_lines[i].split(delim)
            rows.append(delim.join([*_hms(fields, START + 60 * j + i // 10), str(i % 10), fields[4]]))
        (folder / f"temp_{j + 1:05d}.csv").write_text("\n".join(rows) + "\n")
    return folder


def text_rows(path: Path) -> np.ndarray:
    """Independent parse of a raw file: split every line on , or ; with a regex, python float()."""
    return np.array([[float(f) for f in re.split(r"[;,]", line)] for line in path.read_text().splitlines()])
