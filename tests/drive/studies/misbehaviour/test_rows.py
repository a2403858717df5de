"""The misbehaviour study's result rows: one typed `Row`, one JSON form (results.json's, unchanged), one lookup by
level and TTM (`pick`) that finds a level however it was computed and refuses a missing one in one line."""

from __future__ import annotations

import json
import lzma
import math
from pathlib import Path

import numpy as np
import pytest

from drive.studies.misbehaviour.rows import Figures, Row, pick, rows_of

REPO = Path(__file__).resolve().parents[4]
ARCHIVE = REPO / "docs" / "misbehaviour_runs" / "seeds3_results.json.xz"


def _figures(base: float) -> Figures:
    return Figures(*(base + k for k in range(len(Figures._fields))))


def _row(level: float, ttm: int, base: float = 0.0) -> Row:
    return Row(level, ttm, _figures(base), _figures(base - 1), _figures(base + 1), 1, 2, 3, 4)


def _old_row_dict(row: Row) -> dict:
    """The row dict as report.py wrote it before rows were typed (`_row`), kept here as the format's reference."""
    return {
        "level": row.level,
        "ttm": row.ttm,
        "value": row.value._asdict(),
        "low": row.low._asdict(),
        "high": row.high._asdict(),
        "before_start": row.before_start,
        "overlap": row.overlap,
        "merged": row.merged,
        "nominal_left_out": row.nominal_left_out,
    }


def test_a_row_is_written_as_results_json_held_it_before_and_reads_back_unchanged():
    nan = _figures(0.0)._replace(precision=math.nan, median_lead_s=math.nan)
    rows = [
        _row(0.999, 2),
        Row(0.95, 1, nan, nan, nan, 0, 0, 0, 0),
        Row(0.99, 3, _figures(0.5), _figures(0.25), _figures(0.75), 0, 5, 0, 12),
    ]
    for row in rows:
        written = json.dumps(row.to_dict(), indent=1, default=float)
        assert written == json.dumps(_old_row_dict(row), indent=1, default=float)
        back = Row.from_dict(json.loads(written))
        assert json.dumps(back.to_dict(), indent=1, default=float) == written
    assert Row.from_dict(json.loads(json.dumps(rows[0].to_dict()))) == rows[0]  # no NaN: equal as values too


def test_a_row_holding_numpy_figures_as_evaluate_makes_them_is_written_alike():
    """protocol.evaluate fills Figures with numpy float64s: the JSON is that of the plain floats."""
    value = Figures(*np.linspace(0.0, 1.0, len(Figures._fields)))
    row = Row(0.999, 2, value, value, value, 0, 0, 0, 7)
    plain = Row(0.999, 2, *(Figures(*map(float, value)),) * 3, 0, 0, 0, 7)
    assert json.dumps(row.to_dict(), default=float) == json.dumps(plain.to_dict(), default=float)


def test_every_archived_row_round_trips_byte_for_byte():
    """docs/misbehaviour_runs/ rows (written before nominal_left_out was counted) read and write back unchanged."""
    with lzma.open(ARCHIVE) as f:
        results = json.load(f)
    n = 0
    for entry in results["controllers"].values():
        for table in entry["prediction"]["groups"].values():
            for rows in table["monitors"].values():
                for row in rows:
                    typed = Row.from_dict(row)
                    assert typed.nominal_left_out is None
                    assert json.dumps(typed.to_dict()) == json.dumps(row)
                    n += 1
    assert n > 1000


def test_pick_finds_a_level_computed_arithmetically_and_refuses_a_missing_one():
    rows = [_row(level, ttm, base=10 * ttm) for level in (0.95, 0.99, 0.998, 0.999) for ttm in (1, 2, 3, 4)]
    assert pick(rows, 1 - 0.002, 4) is rows[2 * 4 + 3]
    assert 0.1 * 9.98 != 0.998 and pick(rows, 0.1 * 9.98, 4) is rows[2 * 4 + 3]  # 0.9980000000000001
    assert pick(rows, 0.1 * 9.99, 2).level == 0.999  # 0.9990000000000001
    assert pick(rows_of(r.to_dict() for r in rows), 0.99, 3) == rows[1 * 4 + 2]
    with pytest.raises(LookupError, match=r"no row scored at level 0\.9999, TTM 4 s; the rows hold") as missing:
        pick(rows, 0.9999, 4)
    assert "\n" not in str(missing.value) and "(0.998, 4)" in str(missing.value)
    with pytest.raises(LookupError, match="TTM 5 s"):
        pick(rows, 0.998, 5)
    with pytest.raises(LookupError, match="hold .level, TTM.: none"):
        pick([], 0.999, 2)


def test_a_dict_that_is_no_row_is_refused_naming_its_keys():
    with pytest.raises(ValueError, match=r"not a misbehaviour result row .*\['level', 'ttm', 'value'\]"):
        Row.from_dict({"level": 0.999, "ttm": 2, "value": {"f3": 0.5}})


def test_the_asked_level_stands_for_an_equal_grid_level_and_is_scored_once():
    from drive.studies.misbehaviour.grid import Plan

    plan = Plan(controllers=("a.pt",), shifts=("blur:4",), nominal_seeds=(1, 2), seeds=(3,), level=0.1 * 9.99, ttm=4)
    assert plan.levels == (0.95, 0.99, 0.1 * 9.99, 0.9999, 0.99999) and plan.ttms == (1, 2, 3, 4)
    rows = [_row(level, ttm) for level in plan.levels for ttm in plan.ttms]
    assert pick(rows, 0.999, 4).level == plan.level
