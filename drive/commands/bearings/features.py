"""`drive bearings features RAW_DIR [--out FILE.csv]`: one raw bearing folder -> its window-feature CSV.

    drive bearings features PHM2012/Learning_set/Bearing2_1 --temperature 100.253   # -> ./Bearing2_1_features.csv
    drive bearings features XJTU-SY_Bearing_Datasets/35Hz12kN/Bearing1_1 --out Bearing1_1_features_with_labels.csv

The folder is positional; `--raw DIR` (the form of older scripts) is the same. The folder's layout is recognised
(PRONOSTIA `acc_NNNNN.csv`, XJTU-SY `N.csv`) and the published recipe of its dataset applied
(`datasets/bearings/features.py`), streamed snapshot by snapshot: memory holds one snapshot and one window whatever
the number of files; the CSV appears under --out (default: the published file name in the current folder) only
when complete. Only the vibration files are read; PRONOSTIA `temp_NNNNN.csv` only with `--temperature-files`.

A run stops mid-file: a short last acceleration snapshot is dropped (`datasets/bearings/raw.py` says why) and a
short last temperature file used as far as it goes; each such file, and a bearing without temperature files, gets
one line on stderr, `drive bearings features: note: ...`. A short or malformed file anywhere else is an error
naming the file and the line.

Which options reproduce a published file: XJTU-SY, none (the default spec concatenates snapshots in the published
lexicographic order; `--file-order numeric` gives time order). PRONOSTIA: `--temperature` with the file's constant
fill (Bearing2_1 and 3_2: 100.253; 1_3, 2_2 and 3_1: 290.045; 1_2: 109.95399999999997; 2_3: 112.374), since the
published Temperature is not derivable from the raw temperature files; the bearings whose published Temperature is a
series (1_4, 1_7, 2_4, 2_6, 2_7, 3_3: one value per Time unit, ~100-850) cannot be matched in that column. Then
Horizontal, Vertical, Time, Temperature, RPM and Load match; `Degradation` is the labels ODE (within 1.3e-3 of the
published PRONOSTIA column, whose ODE variant is not published) and `Degradation_monotonic` is not written.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from drive.errors import UserError
from drive.options import NonNegativeFloat, PositiveFloat, PositiveInt

PUBLISHED_NAME = {"pronostia": "{}_features.csv", "xjtu": "{}_features_with_labels.csv"}


@dataclass(frozen=True)
class Config:
    raw_dir: Annotated[Path | None, tyro.conf.Positional, tyro.conf.arg(metavar="RAW_DIR")] = None
    """one bearing folder: PRONOSTIA acc_NNNNN.csv (+ temp_NNNNN.csv) or XJTU-SY N.csv snapshots (or --raw)"""
    raw: Path | None = None
    """the same folder as RAW_DIR, as a flag (older scripts)"""
    out: Path | None = None
    """feature CSV to write, atomically; None: the published name here, ./BearingC_K_features[_with_labels].csv"""
    spec: Literal["auto", "pronostia", "xjtu"] = "auto"
    """feature recipe (CWT band, smoothing, Time rounding): auto = the folder's own dataset's"""
    file_order: Literal["spec", "numeric", "lexicographic"] = "spec"
    """snapshot concatenation order: the spec's (XJTU-SY: lexicographic as published), numeric = time order"""
    rpm: PositiveFloat | None = None
    """shaft speed written to RPM and used by the Degradation ODE; None: from the folder name's condition"""
    load: NonNegativeFloat | None = None
    """radial load [N]; None: from the folder name's condition"""
    temperature: float | None = None
    """constant Temperature column (PRONOSTIA); None: 298.15 (NSAC's fill), or the files with --temperature-files"""
    temperature_files: bool = False
    """read PRONOSTIA temp_NNNNN.csv and write their readings, interpolated at each window's start, as Temperature"""
    all_windows: bool = False
    """keep every window (XJTU-SY's published files keep a multiple of 1000)"""
    rows_per_file: PositiveInt | None = None
    """samples per snapshot if not the format's (2560 PRONOSTIA, 32768 XJTU-SY), e.g. a shortened fixture"""
    progress: bool = True
    """show a progress bar over the snapshot files"""


def _folder(cfg: Config) -> Path:
    if cfg.raw_dir is not None and cfg.raw is not None and cfg.raw_dir != cfg.raw:
        raise UserError(f"two bearing folders, RAW_DIR {cfg.raw_dir} and --raw {cfg.raw}: give one")
    folder = cfg.raw_dir or cfg.raw
    if folder is None:
        raise UserError("no bearing folder: drive bearings features RAW_DIR (or --raw RAW_DIR)")
    return folder


def _check(cfg: Config, folder: Path) -> tuple[str, Path]:
    """The folder's layout and the output path, after the checks that need no feature computed (one-line errors)."""
    from datasets.bearings import find_bearing  # scipy: imported when the command runs, not for `--help`
    from datasets.bearings.extract import CONDITIONS

    if cfg.rows_per_file is not None and cfg.rows_per_file < 1:
        raise UserError(f"--rows-per-file must be >= 1, got {cfg.rows_per_file}")
    if cfg.temperature is not None and cfg.temperature_files:
        raise UserError("--temperature (a constant) and --temperature-files (the readings): give one")
    bearing = find_bearing(folder, cfg.rows_per_file)
    out = cfg.out or Path(PUBLISHED_NAME[bearing.layout].format(bearing.name))
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: folder {out.parent} does not exist")
    if bearing.layout == "xjtu" and (cfg.temperature is not None or cfg.temperature_files):
        raise UserError(f"{folder}: XJTU-SY records no temperature (its files have no Temperature column)")
    match = re.fullmatch(r"Bearing(\d)_\d+", bearing.name)
    known = match is not None and int(match.group(1)) in CONDITIONS[bearing.layout]
    if not known and (cfg.rpm is None or cfg.load is None):
        raise UserError(f"{folder}: no operating condition in the folder name (BearingC_K): pass --rpm, --load")
    return bearing.layout, out


def run(cfg: Config) -> int:
    from tqdm import tqdm

    from datasets.bearings import SPECS, BearingFileError, extract_features

    folder = _folder(cfg)
    try:
        layout, out = _check(cfg, folder)
        spec = SPECS[layout if cfg.spec == "auto" else cfg.spec]
        if cfg.file_order != "spec":
            spec = dataclasses.replace(spec, file_order=cfg.file_order)
        if cfg.all_windows:
            spec = dataclasses.replace(spec, round_rows_to=None)
        bar = tqdm(unit="file", desc=folder.name, disable=not cfg.progress, mininterval=0.5)

        files = [0]

        def on_progress(done: int, total: int) -> None:
            bar.total, files[0] = total, done
            bar.update(done - bar.n)

        def on_note(line: str) -> None:
            bar.write(f"drive bearings features: note: {line}", file=sys.stderr)

        t0 = time.perf_counter()
        with bar:
            n = extract_features(
                folder,
                out,
                spec=spec,
                rpm=cfg.rpm,
                load=cfg.load,
                temperature=cfg.temperature,
                temperature_files=cfg.temperature_files,
                rows_per_file=cfg.rows_per_file,
                on_progress=on_progress,
                on_note=on_note,
            )
    except BearingFileError as exc:
        raise UserError(str(exc)) from None
    print(f"wrote {n} rows ({layout} layout, {files[0]} files, {time.perf_counter() - t0:.1f} s) to {out}")
    return 0
