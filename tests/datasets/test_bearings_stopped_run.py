"""A run-to-failure folder as the real ones end: a short last file is dropped (acc) or used as far as it goes (temp)
and reported, temperature files are not opened unless asked for, and a short file anywhere else is still an error."""

from __future__ import annotations

import csv
import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from datasets.bearings import PRONOSTIA_SPEC, XJTU_SPEC, BearingFileError, extract_features, find_bearing
from tests.conftest import REPO
from tests.datasets.bearing_runs import START, text_rows, write_run

XJTU_FIXTURE = REPO / "tests" / "fixtures" / "bearings" / "xjtu" / "35Hz12kN" / "Bearing1_1"
DELIMS = pytest.mark.parametrize("delim", [",", ";"], ids=["comma", "semicolon"])


@pytest.fixture(scope="module")
def fixtures(shared_data) -> Path:
    return shared_data / "bearings" / "pronostia_raw" / "fixtures"


def _extract(folder: Path, out: Path, **kwargs) -> tuple[int, list[str], list[dict[str, str]]]:
    notes: list[str] = []
    n = extract_features(folder, out, on_note=notes.append, **kwargs)
    with open(out, newline="") as handle:
        return n, notes, list(csv.DictReader(handle))


@DELIMS
def test_short_last_acc_dropped_rows_equal_the_complete_snapshots(fixtures, tmp_path, delim):
    stopped = write_run(fixtures, tmp_path / "stopped" / "Bearing2_1", delim, acc_rows={5: 1280}, temp_rows={2: 37})
    complete = tmp_path / "complete" / "Bearing2_1"
    complete.mkdir(parents=True)
    for k in range(1, 5):
        shutil.copy(stopped / f"acc_{k:05d}.csv", complete)
    n, notes, _ = _extract(stopped, tmp_path / "stopped.csv")
    assert n == PRONOSTIA_SPEC.n_windows(4 * 2560) == 19
    assert notes == [f"{stopped / 'acc_00005.csv'}: 1280 of 2560 rows (the run stopped mid-snapshot): dropped, "
                     "features from the 4 complete snapshots"]  # fmt: skip
    assert _extract(complete, tmp_path / "complete.csv")[:2] == (19, [])
    assert (tmp_path / "stopped.csv").read_bytes() == (tmp_path / "complete.csv").read_bytes()
    bearing = find_bearing(stopped)
    assert (len(bearing.acc_files), bearing.n_recorded) == (4, 5)


def test_temperature_files_not_opened_unless_asked(fixtures, tmp_path):
    folder = write_run(fixtures, tmp_path / "Bearing2_1", n_temp=3)
    bad = folder / "temp_00002.csv"
    bad.write_text(bad.read_text().replace("\n", "\nx\n", 1))  # garbage on line 2 of a middle file
    (folder / "temp_00003.csv").rename(folder / "temp_00005.csv")  # and a gap in the numbering
    n, notes, rows = _extract(folder, tmp_path / "f.csv")
    assert (
        n == PRONOSTIA_SPEC.n_windows(5 * 2560) == 24 and notes == [] and {r["Temperature"] for r in rows} == {"298.15"}
    )
    with pytest.raises(BearingFileError, match=r"Bearing2_1: snapshot 3 missing"):
        _extract(folder, tmp_path / "t.csv", temperature_files=True)
    (folder / "temp_00005.csv").rename(folder / "temp_00003.csv")
    with pytest.raises(BearingFileError, match=rf"^{re.escape(str(bad))}:2: .*fields, expected 5"):
        _extract(folder, tmp_path / "t.csv", temperature_files=True)


@DELIMS
def test_short_last_temp_file_read_as_far_as_it_goes(fixtures, tmp_path, delim):
    folder = write_run(fixtures, tmp_path / "Bearing2_1", delim, n_temp=2, temp_rows={2: 37})
    n, notes, rows = _extract(folder, tmp_path / "t.csv", temperature_files=True)
    assert notes == [f"{folder / 'temp_00002.csv'}: 37 of 600 rows (the run stopped): its readings used as far as "
                     "they go"]  # fmt: skip
    temps = np.concatenate([text_rows(folder / f"temp_0000{j}.csv") for j in (1, 2)])  # (637, 5)
    assert len(temps) == 637
    temp_clock = temps[:, 0] * 3600 + temps[:, 1] * 60 + temps[:, 2] + temps[:, 3] / 10
    starts = 500 * np.arange(n)
    first_us = np.array([text_rows(folder / f"acc_0000{k}.csv")[0, 3] for k in range(1, 6)])
    clock = START + 10 * (starts // 2560) + first_us[starts // 2560] * 1e-6 + (starts % 2560) / 25600
    expected = np.interp(clock, temp_clock, temps[:, 4])
    assert np.allclose([float(r["Temperature"]) for r in rows], expected, rtol=0, atol=1e-9)
    assert len(set(expected.round(3))) > 3  # the readings vary over the run: a constant would not pass


def test_bearing_without_temperature_files_noted(fixtures, tmp_path):
    folder = write_run(fixtures, tmp_path / "Bearing2_2", n_temp=0)  # as the real Learning_set/Bearing2_2
    n, notes, rows = _extract(folder, tmp_path / "t.csv", temperature_files=True)
    assert n == 24 and {r["Temperature"] for r in rows} == {"298.15"}
    assert notes == [f"{folder}: no temperature readings (no temp_NNNNN.csv): Temperature is 298.15, NSAC's fill"]


@pytest.mark.parametrize(("kind", "number", "rows", "line"), [("acc", 3, 1280, 1281), ("acc", 4, 0, 1),
                                                              ("temp", 1, 37, 38)])  # fmt: skip
def test_short_file_before_the_last_is_an_error_naming_it(fixtures, tmp_path, kind, number, rows, line):
    cut = {number: rows}
    folder = write_run(fixtures, tmp_path / "Bearing2_1", acc_rows=cut if kind == "acc" else None,
                       temp_rows=cut if kind == "temp" else None)  # fmt: skip
    path = folder / f"{kind}_{number:05d}.csv"
    what = "no data rows" if rows == 0 else f"file ends after {rows} of {2560 if kind == 'acc' else 600} rows"
    with pytest.raises(BearingFileError, match=rf"^{re.escape(str(path))}:{line}: {what}$"):
        _extract(folder, tmp_path / "f.csv", temperature_files=kind == "temp")
    assert not (tmp_path / "f.csv").exists()


def test_short_last_file_with_a_malformed_row_is_still_an_error(fixtures, tmp_path):
    folder = write_run(fixtures, tmp_path / "Bearing2_1", acc_rows={5: 1280})
    last = folder / "acc_00005.csv"
    lines = last.read_text().splitlines(keepends=True)
    last.write_text("".join([*lines[:7], "1,2\n", *lines[7:]]))  # a 2-field row at line 8
    with pytest.raises(BearingFileError, match=rf"^{re.escape(str(last))}:8: 2 fields, expected 6"):
        find_bearing(folder)


def test_only_snapshot_short_and_a_longer_file(fixtures, tmp_path):
    folder = write_run(fixtures, tmp_path / "Bearing2_1", n_acc=1, acc_rows={1: 100})
    only = r"acc_00001\.csv:101: file ends after 100 of 2560 rows, and it is the only snapshot"
    with pytest.raises(BearingFileError, match=only):
        find_bearing(folder)
    long = write_run(fixtures, tmp_path / "Bearing2_3", n_acc=2)
    (long / "acc_00001.csv").write_text((long / "acc_00001.csv").read_text() * 2)
    with pytest.raises(BearingFileError, match=r"acc_00001\.csv:2561: 5120 rows, more than the format's 2560"):
        _extract(long, tmp_path / "f.csv")


def test_xjtu_short_last_file_dropped_rul_counts_it(tmp_path):
    folder = tmp_path / "Bearing1_1"
    shutil.copytree(XJTU_FIXTURE, folder)
    last = folder / "10.csv"
    last.write_text("".join(last.read_text().splitlines(keepends=True)[:151]))  # header + 150 of 300 rows
    spec = dataclasses.replace(XJTU_SPEC, round_rows_to=None, file_order="numeric")
    n, notes, rows = _extract(folder, tmp_path / "f.csv", spec=spec, rows_per_file=300)
    assert n == (9 * 300 - 1000) // 500 + 1 == 4 and notes == [
        f"{last}: 150 of 300 rows (the run stopped mid-snapshot): dropped, features from the 9 complete snapshots"
    ]
    assert [int(r["RUL"]) for r in rows] == [10 - (500 * i + 500) // 300 for i in range(4)]  # the run lasted 10 min


def test_a_file_given_for_the_folder(fixtures, tmp_path):
    folder = write_run(fixtures, tmp_path / "Bearing2_1", n_acc=1, n_temp=0)
    with pytest.raises(BearingFileError, match=r"acc_00001\.csv: is a file, not a bearing folder \(.*acc_00001\.csv, "
                       rf"acc_00002\.csv, .*\); did you mean its folder {re.escape(str(folder))}\?$"):  # fmt: skip
        find_bearing(folder / "acc_00001.csv")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(BearingFileError, match=r"notes\.txt: is a file, not a bearing folder \([^;]*\)$"):
        find_bearing(tmp_path / "notes.txt")
