"""Published feature tables and the NSAC splits: shapes, values against the text, standardiser, Time in/out."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math

import numpy as np
import pytest

from datasets.bearings import (
    PAPER_TESTS,
    TRAIN,
    BearingFileError,
    input_names,
    nsac_split,
    read_feature_csv,
    staged_files,
    train_val_indices,
)

ROWS = {  # PROVENANCE.md, per-file facts
    "hust/Bearing1": 12387, "hust/Bearing6": 10444,
    "pronostia/Bearing1_2": 4458, "pronostia/Bearing1_3": 12159, "pronostia/Bearing1_4": 7310,
    "pronostia/Bearing1_7": 11565, "pronostia/Bearing2_1": 4663, "pronostia/Bearing2_2": 4079,
    "pronostia/Bearing2_3": 10008, "pronostia/Bearing2_4": 3844, "pronostia/Bearing2_6": 3588,
    "pronostia/Bearing2_7": 1176, "pronostia/Bearing3_1": 2635, "pronostia/Bearing3_2": 8380,
    "pronostia/Bearing3_3": 2221,
    "xjtu/Bearing1_1": 8000, "xjtu/Bearing1_2": 10000, "xjtu/Bearing1_3": 10000, "xjtu/Bearing1_4": 7000,
    "xjtu/Bearing1_5": 3000, "xjtu/Bearing2_2": 10000, "xjtu/Bearing2_4": 2000, "xjtu/Bearing3_5": 7000,
}  # fmt: skip


@pytest.fixture(scope="module")
def tables(shared_data):
    return {name: read_feature_csv(path, name) for name, path in staged_files(shared_data).items()}


def test_every_staged_file_read_with_its_shape(tables):
    assert {name: len(t) for name, t in tables.items()} == ROWS
    for name, table in tables.items():
        assert table.horizontal.shape == table.vertical.shape == (len(table), 7)
        assert (table.temperature is None) == name.startswith("xjtu")
        assert (table.rul is None) != name.startswith("xjtu")
        assert table.label.min() == 0.0 and table.label.max() == 1.0
        # non-decreasing everywhere but PRONOSTIA Bearing2_6 (10 steps down, at most 1.1e-5: its Temperature varies)
        assert (np.count_nonzero(np.diff(table.label) < 0) == 10) == (name == "pronostia/Bearing2_6")


def test_bearing1_3_uses_degradation_monotonic(tables):
    assert tables["pronostia/Bearing1_3"].label_column == "Degradation_monotonic"
    assert {t.label_column for n, t in tables.items() if n != "pronostia/Bearing1_3"} == {"Degradation"}


def test_values_match_the_text(tables):
    table = tables["pronostia/Bearing2_1"]
    with gzip.open(table.path, "rt") as handle:
        lines = handle.read().splitlines()
    for i in (0, 1, 4662):
        horizontal, rest = lines[i + 1][2:].split(']","[')
        vertical, rest = rest.split(']",')
        time, temperature, label, rpm, load, _ = (float(v) for v in rest.split(","))
        assert table.horizontal[i].tolist() == json.loads(f"[{horizontal}]")
        assert table.vertical[i].tolist() == json.loads(f"[{vertical}]")
        assert [table.time[i], table.temperature[i], table.label[i], table.rpm[i], table.load[i]] == [
            time,
            temperature,
            label,
            rpm,
            load,
        ]


def test_inputs_log_energy_temperature_fill_and_time_switch(tables):
    xjtu, hust = tables["xjtu/Bearing1_1"], tables["hust/Bearing1"]
    with_time, without = xjtu.inputs(True), xjtu.inputs(False)
    assert with_time.shape == (8000, 16) and without.shape == (8000, 15)
    assert np.array_equal(with_time[:, 0], np.log10(xjtu.horizontal[:, 0] + 1e-8))
    assert np.array_equal(with_time[:, 8:14], xjtu.vertical[:, 1:])
    assert np.array_equal(with_time[:, 14], xjtu.time) and np.all(with_time[:, 15] == 298.15)
    assert np.array_equal(np.delete(with_time, 14, axis=1), without)
    assert np.all(hust.inputs()[:, 15] == 25.0)
    assert input_names(True)[14:] == ("Time", "Temperature") and "Time" not in input_names(False)


def test_train_val_split_shapes_and_seeds(tables):
    split = nsac_split(42, tables=tables)
    n = sum(ROWS[name] for name in TRAIN)
    assert split.x_train.shape == (n - math.ceil(0.1 * n), 16) and split.x_val.shape == (math.ceil(0.1 * n), 16)
    assert split.feature_names == input_names(True)
    train, val = train_val_indices(n, 42)
    assert len(np.intersect1d(train, val)) == 0 and len(np.union1d(train, val)) == n
    labels = np.concatenate([tables[name].label for name in TRAIN])
    assert np.array_equal(split.y_train, labels[train]) and np.array_equal(split.y_val, labels[val])
    other = nsac_split(43, tables=tables)
    assert not np.array_equal(other.y_val, split.y_val) and np.array_equal(other.scaler.mean, split.scaler.mean)


def test_scaler_fitted_on_training_bearings_only(tables):
    split = nsac_split(42, tables=tables)
    x = np.concatenate([tables[name].inputs() for name in TRAIN])
    assert np.allclose(split.scaler.mean, x.mean(axis=0)) and split.scaler.scale[15] == 1.0  # constant 298.15
    changed = dict(tables)
    test = tables["pronostia/Bearing2_1"]
    changed["pronostia/Bearing2_1"] = dataclasses.replace(test, horizontal=test.horizontal * 1000 + 5)
    after = nsac_split(42, tables=changed)
    assert np.array_equal(after.scaler.mean, split.scaler.mean) and np.array_equal(after.x_train, split.x_train)
    assert not np.array_equal(after.tests["pronostia/Bearing2_1"].x, split.tests["pronostia/Bearing2_1"].x)
    trained = tables["xjtu/Bearing1_2"]
    changed["xjtu/Bearing1_2"] = dataclasses.replace(trained, horizontal=trained.horizontal * 2)
    assert not np.array_equal(nsac_split(42, tables=changed).scaler.mean, split.scaler.mean)


def test_tests_hold_the_paper_bearings_then_every_other(tables):
    split = nsac_split(42, include_time=False, tables=tables)
    assert tuple(split.tests)[:3] == PAPER_TESTS
    assert set(split.tests) == set(ROWS) - {"xjtu/Bearing1_2", "xjtu/Bearing1_3"}
    bearing = split.tests["hust/Bearing1"]
    assert bearing.x.shape == (12387, 15) and np.array_equal(bearing.time, tables["hust/Bearing1"].time)
    assert np.array_equal(bearing.x, split.scaler.transform(tables["hust/Bearing1"].inputs(False)))


def test_per_bearing_scaling_reproduces_nsac_test_script(tables):
    split = nsac_split(42, test_scaling="per_bearing", tables=tables)
    x = split.tests["pronostia/Bearing2_1"].x
    assert np.allclose(x[:, :15].mean(axis=0), 0, atol=1e-9) and np.allclose(x[:, :14].std(axis=0), 1)
    assert np.allclose(x[:, 15], 0.0, atol=1e-9)  # constant Temperature column: scale 1, centred


@pytest.mark.parametrize(
    ("edit", "line", "what"),
    [
        (lambda ls: [*ls[:4], ls[4].replace(", ", ", x", 1), *ls[5:]], 5, "Horizontal is not a list of 7 numbers"),
        (lambda ls: [*ls[:6], ls[6].rsplit(",", 1)[0], *ls[7:]], 7, "fields, expected 7"),
        (lambda ls: [*ls[:8], ls[8].rsplit(",", 1)[0] + ",", *ls[9:]], 9, "Degradation is empty or NaN"),
    ],
)
def test_malformed_feature_csv_names_file_and_line(tables, tmp_path, edit, line, what):
    with gzip.open(tables["xjtu/Bearing1_4"].path, "rt") as handle:
        lines = handle.read().splitlines()
    path = tmp_path / "Bearing1_4_features_with_labels.csv"
    path.write_text("\n".join(edit(lines[:20])) + "\n")
    with pytest.raises(BearingFileError) as err:
        read_feature_csv(path)
    assert str(err.value).startswith(f"{path}:{line}: ") and what in str(err.value)
