"""Property-based tests of the parsers users and simulators feed: they never crash, never accept garbage, and
round-trip what they accept (hypothesis)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datasets.bearings.raw import BearingFileError, read_table
from datasets.errors import DataError
from datasets.udacity import UdacityLogError, read_log
from drive.errors import UserError
from drive.loop.seeds import MAX_SEEDS, format_seeds, parse_seeds
from drive.loop.specs import parse_policy_spec
from sim_bridges.udacity.protocol import TelemetryError, encode_jpeg, parse_telemetry

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(st.text(max_size=40))
def test_seed_specs_never_crash_and_accepted_ones_are_well_formed(spec):
    try:
        seeds = parse_seeds(spec)
    except UserError:
        return
    assert seeds and len(set(seeds)) == len(seeds) <= MAX_SEEDS and all(s >= 0 for s in seeds)
    assert all(c.isdigit() or c in ",- " for c in spec)


@FAST
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=60, unique=True))
def test_seed_sets_round_trip_through_their_spec(seeds):
    assert parse_seeds(format_seeds(seeds)) == sorted(seeds)


@FAST
@given(st.text(max_size=30))
def test_policy_specs_never_crash(spec):
    try:
        kind, arg = parse_policy_spec(spec)
    except UserError:
        return
    assert kind in ("expert", "ckpt") and arg and spec == f"{kind}:{arg}"


_FIELD = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=8),
                   st.sampled_from(["", "nan", "-0", "1e400", "0x10"]))  # fmt: skip


@FAST
@given(st.lists(st.lists(_FIELD, min_size=1, max_size=9), min_size=1, max_size=6))
def test_driving_log_lines_never_crash_and_refuse_garbage(tmp_path_factory, rows):
    root = tmp_path_factory.mktemp("log")
    (root / "IMG").mkdir()
    (root / "IMG" / "a.jpg").write_bytes(encode_jpeg(np.zeros((160, 320, 3), np.uint8)))
    text = "\n".join(", ".join(["IMG/a.jpg", *r]) for r in rows)
    (root / "driving_log.csv").write_text(text)
    try:
        log = read_log(root)
    except (UdacityLogError, DataError):
        return
    assert len(log) == len(rows) and np.all(np.isfinite(log.steering)) and np.all(np.abs(log.steering) <= 1)


@FAST
@given(st.lists(st.lists(_FIELD, min_size=1, max_size=6), min_size=1, max_size=5), st.sampled_from([",", ";"]))
def test_raw_bearing_rows_never_crash_and_refuse_garbage(tmp_path_factory, rows, delim):
    path = tmp_path_factory.mktemp("raw") / "acc_00001.csv"
    path.write_text("\n".join(delim.join(r) for r in rows))
    try:
        table = read_table(path, 6, None)
    except BearingFileError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        return
    assert table.shape == (len(rows), 6) and np.isfinite(table).all()


_JPEG = base64.b64encode(encode_jpeg(np.zeros((160, 320, 3), np.uint8))).decode()


_VALUE = st.one_of(_FIELD, st.integers(), st.none(), st.just(_JPEG), st.floats())


@FAST
@given(st.dictionaries(st.sampled_from(["steering_angle", "throttle", "speed", "image", "extra"]), _VALUE, max_size=5))
def test_telemetry_payloads_never_crash_and_refuse_garbage(payload):
    json.dumps(payload)  # what arrives over socket.io is JSON
    try:
        t = parse_telemetry(payload)
    except TelemetryError:
        return
    assert payload.get("image") == _JPEG and t.image.shape == (160, 320, 3)
    assert -1.0001 <= t.steering <= 1.0001 and np.isfinite([t.throttle, t.speed_mph]).all()


@pytest.mark.parametrize("bad", ["1-", "-1", "1,,", "1,2,,3", ",1", "1,", "3-1", "1--3", "-2-5", "1,x"])
def test_a_few_named_seed_mistakes(bad):
    with pytest.raises(UserError):  # an empty item is a typo, not a seed to skip
        parse_seeds(bad)
