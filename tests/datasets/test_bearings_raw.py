"""Raw PRONOSTIA / XJTU-SY readers against the files' own text, and their errors on broken files."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from datasets.bearings.raw import (
    XJTU_HEADER,
    BearingFileError,
    find_bearing,
    read_pronostia_acc,
    read_pronostia_temp,
    read_xjtu,
    unwrap_days,
)
from tests.conftest import REPO

XJTU_FIXTURE = REPO / "tests" / "fixtures" / "bearings" / "xjtu" / "35Hz12kN" / "Bearing1_1"
ACC = [
    "Learning_set/Bearing1_1/acc_00001.csv",  # comma, int microseconds, 1.6558e+005 later on
    "Learning_set/Bearing1_1/acc_02803.csv",  # last file of a 2803-file run
    "Test_set/Bearing1_4/acc_00001.csv",  # comma, 3-digit exponents 4.2504e+005
    "Full_Test_Set/Bearing1_4/acc_00001.csv",  # semicolon
]
TEMP = [
    "Learning_set/Bearing1_1/temp_00001.csv",  # comma
    "Learning_set/Bearing1_2/temp_00001.csv",  # semicolon, zero-padded 08;48;05
    "Test_set/Bearing1_4/temp_00001.csv",
    "Full_Test_Set/Bearing1_4/temp_00001.csv",
]


@pytest.fixture(scope="module")
def fixtures(shared_data) -> Path:
    return shared_data / "bearings" / "pronostia_raw" / "fixtures"


def _text_rows(path: Path) -> list[list[float]]:
    """Independent parse: split every line on , or ; with a regex, python float()."""
    return [[float(f) for f in re.split(r"[;,]", line)] for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", ACC)
def test_acc_matches_text(fixtures, name):
    rows = _text_rows(fixtures / name)
    snap = read_pronostia_acc(fixtures / name)
    assert snap.vibration.shape == (2560, 2) and len(rows) == 2560
    for i in (0, 1, 1279, 2559):
        h, m, s, us, horizontal, vertical = rows[i]
        assert snap.vibration[i].tolist() == [horizontal, vertical]
        assert snap.clock[i] == h * 3600 + m * 60 + s + us * 1e-6
    assert np.array_equal(snap.vibration, np.array(rows)[:, 4:6])


@pytest.mark.parametrize("name", TEMP)
def test_temp_matches_text(fixtures, name):
    rows = np.array(_text_rows(fixtures / name))
    snap = read_pronostia_temp(fixtures / name)
    assert snap.temperature.shape == (600,)
    assert np.array_equal(snap.temperature, rows[:, 4])
    assert np.array_equal(snap.clock, rows[:, 0] * 3600 + rows[:, 1] * 60 + rows[:, 2] + rows[:, 3] / 10)


def test_exponent_and_delimiter_variants_read_the_same_snapshot(fixtures):
    # Test_set is a prefix of Full_Test_Set: one snapshot written `8,8,0,4.2504e+005,...` and `8;8;0;4.2504e+05;...`
    comma = read_pronostia_acc(fixtures / "Test_set/Bearing1_4/acc_00001.csv")
    semicolon = read_pronostia_acc(fixtures / "Full_Test_Set/Bearing1_4/acc_00001.csv")
    assert np.array_equal(comma.vibration, semicolon.vibration)
    assert np.array_equal(comma.clock, semicolon.clock)
    assert comma.clock[0] == 8 * 3600 + 8 * 60 + 425040e-6
    assert (fixtures / "Learning_set/Bearing1_2/temp_00001.csv").read_text().startswith("08;48;05;7;57.181")
    assert read_pronostia_temp(fixtures / "Learning_set/Bearing1_2/temp_00001.csv").clock[0] == 8 * 3600 + 48 * 60 + 5.7


def test_find_bearing_pronostia_with_and_without_temperature(fixtures, tmp_path):
    full = find_bearing(fixtures / "Full_Test_Set" / "Bearing1_4")
    assert (full.layout, full.name, full.rows_per_file) == ("pronostia", "Bearing1_4", 2560)
    assert [p.name for p in full.acc_files] == ["acc_00001.csv"] and full.notes == ()
    assert [p.name for p in full.temperature_files()] == ["temp_00001.csv"]  # listed only when asked for
    alone = tmp_path / "Bearing2_2"
    alone.mkdir()
    (alone / "acc_00001.csv").write_bytes((fixtures / ACC[0]).read_bytes())
    assert find_bearing(alone).temperature_files() == ()


def test_find_bearing_rejects_a_gap(fixtures):
    # the fixture folder holds only the first and the last file of the run
    with pytest.raises(BearingFileError, match=r"Bearing1_1: snapshot 2 missing"):
        find_bearing(fixtures / "Learning_set" / "Bearing1_1")


def test_xjtu_fixture_sorted_numerically_and_matches_text():
    bearing = find_bearing(XJTU_FIXTURE, rows_per_file=300)
    assert bearing.layout == "xjtu" and [p.name for p in bearing.acc_files] == [f"{k}.csv" for k in range(1, 11)]
    lines = (XJTU_FIXTURE / "10.csv").read_text().splitlines()
    assert lines[0] == XJTU_HEADER
    data = read_xjtu(XJTU_FIXTURE / "10.csv", n_rows=300)
    for i in (0, 150, 299):
        assert data[i].tolist() == [float(f) for f in lines[i + 1].split(",")]
    snap = bearing.read(9)  # XJTU carries no clock: one snapshot a minute
    assert snap.clock[0] == 540.0 and snap.clock[1] == 540.0 + 1 / 25600


def test_xjtu_full_length_file(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(32768, 2)).astype(np.float32).astype(np.float64)
    body = "\n".join(f"{a!r},{b!r}" for a, b in values.tolist())
    (tmp_path / "1.csv").write_text(f"{XJTU_HEADER}\n{body}\n")
    assert np.array_equal(read_xjtu(tmp_path / "1.csv"), values)
    (tmp_path / "2.csv").write_text(f"{XJTU_HEADER}\n" + "\n".join(body.splitlines()[:-1]) + "\n")
    with pytest.raises(BearingFileError, match=r"2\.csv:32769: file ends after 32767 of 32768 rows"):
        read_xjtu(tmp_path / "2.csv")


def _broken(tmp_path: Path, source: Path, edit) -> Path:
    lines = source.read_text().splitlines(keepends=True)
    path = tmp_path / source.name
    path.write_text("".join(edit(lines)))
    return path


def _refused_at(reader, path, line: int, what: str) -> None:
    """`reader(path)` fails with one line that starts with PATH:LINE and says `what`."""
    with pytest.raises(BearingFileError) as err:
        reader(path)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: ") and what in message and "\n" not in message


@pytest.mark.parametrize(
    ("edit", "line", "what"),
    [
        (lambda ls: [*ls[:1200], ls[1200][:9]], 1201, "fields, expected 6"),  # cut mid-line, as a truncated copy
        (lambda ls: ls[:1200], 1201, "file ends after 1200 of 2560 rows"),  # cut at a line end
        (lambda ls: [*ls[:16], ls[16].replace("0.", "x.", 1), *ls[17:]], 17, "not a number"),
        (lambda ls: [*ls[:40], "\n", *ls[40:]], 41, "empty line"),
        (lambda ls: [*ls[:99], "nan,nan,nan,nan,nan,nan\n", *ls[100:]], 100, "non-finite"),
        (lambda ls: [*ls[:5], ls[5].replace(",", ";", 1), *ls[6:]], 6, "fields, expected 6"),
    ],
)
def test_malformed_acc_names_file_and_line(fixtures, tmp_path, edit, line, what):
    path = _broken(tmp_path, fixtures / ACC[0], edit)
    _refused_at(read_pronostia_acc, path, line, what)


def test_xjtu_header_missing(tmp_path):
    path = _broken(tmp_path, XJTU_FIXTURE / "1.csv", lambda ls: ls[1:])
    with pytest.raises(BearingFileError, match=rf"^{re.escape(str(path))}:1: expected header"):
        read_xjtu(path, n_rows=299)


def test_unwrap_days_across_midnight():
    clock = np.array([86390.0, 86395.0, 5.0, 10.0])
    assert unwrap_days(clock).tolist() == [86390.0, 86395.0, 86405.0, 86410.0]


@pytest.mark.parametrize(
    ("edit", "line", "what"),
    [
        (lambda ls: [*ls[:300], ls[300][:7]], 301, "fields, expected 5"),  # a truncated copy, cut mid-line
        (lambda ls: ls[:300], 301, "file ends after 300 of 600 rows"),
        (lambda ls: [*ls[:9], ls[9].replace(";", ";x", 1), *ls[10:]], 10, "not a number"),
    ],
)
def test_malformed_semicolon_temp_names_file_and_line(fixtures, tmp_path, edit, line, what):
    path = _broken(tmp_path, fixtures / TEMP[1], edit)
    _refused_at(read_pronostia_temp, path, line, what)


def test_xjtu_malformed_value_names_file_and_line(tmp_path):
    path = _broken(tmp_path, XJTU_FIXTURE / "1.csv", lambda ls: [*ls[:7], "0.1,abc\n", *ls[8:]])
    with pytest.raises(BearingFileError, match=rf"^{re.escape(str(path))}:8: .*not a number"):
        read_xjtu(path, n_rows=299)
