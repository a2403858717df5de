"""The misbehaviour protocol's result rows, typed, and their one JSON form.

A `Row` is one monitor's figures at one (level, TTM) (drive/studies/misbehaviour/protocol.py `evaluate`); results.json
holds it as the dict `Row.to_dict` writes, under {controller: {"prediction": {"groups": {group: {"monitors":
{monitor: [rows]}, "field": {monitor: row}, "nulls": {monitor: {null: row, ...}}}}}}}, and everything that reads the
rows back (the report's tables, the figures, the statistics over training seeds) reads them through `Row.from_dict`.
`pick` is the one lookup of a row by level and TTM: levels match to a relative 1e-9 (`same_level`), so a level
computed as 1 - 0.002 finds the row scored at 0.998, and a (level, TTM) no row holds is refused, naming those held.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

LEVEL_REL_TOL = 1e-9  # levels closer than this (relative) are one level: far below any two levels a table lists


class Figures(NamedTuple):
    threshold: float
    tp: float
    fn: float
    fp: float
    tn: float
    precision: float
    recall: float
    fpr: float
    accuracy: float
    f1: float
    f3: float
    auroc: float
    auprc: float
    median_lead_s: float


@dataclass(frozen=True)
class Row:
    level: float
    ttm: int
    value: Figures
    low: Figures
    """2.5 % bootstrap percentile of each figure"""
    high: Figures
    """97.5 % bootstrap percentile"""
    before_start: int
    """misbehaviours whose window would start before the first scored step (step 0 or the warm-up's end)"""
    overlap: int
    """misbehaviours whose window overlaps an earlier misbehaviour or its window (not scorable)"""
    merged: int
    """onsets while the previous misbehaviour was still on (no new misbehaviour)"""
    nominal_left_out: int | None
    """nominal windows not scored: they hold the run's own misbehaviour or the lead horizon before it; None in rows
    read from results written before they were counted (docs/misbehaviour_runs/seeds3_results.json.xz)"""

    def to_dict(self) -> dict[str, Any]:
        """The row as results.json holds it (keys in this order; `nominal_left_out` only where counted)."""
        out: dict[str, Any] = {
            "level": self.level,
            "ttm": self.ttm,
            "value": self.value._asdict(),
            "low": self.low._asdict(),
            "high": self.high._asdict(),
            "before_start": self.before_start,
            "overlap": self.overlap,
            "merged": self.merged,
        }
        if self.nominal_left_out is not None:
            out["nominal_left_out"] = self.nominal_left_out
        return out

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Row:
        """A row of results.json back (`to_dict` of it gives the same dict); ValueError naming what is missing."""
        try:
            return cls(
                row["level"],
                row["ttm"],
                Figures(**row["value"]),
                Figures(**row["low"]),
                Figures(**row["high"]),
                row["before_start"],
                row["overlap"],
                row["merged"],
                row.get("nominal_left_out"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(
                f"not a misbehaviour result row ({type(exc).__name__}: {exc}); its keys: {sorted(row)}"
            ) from None


def rows_of(rows: Iterable[Mapping[str, Any]]) -> list[Row]:
    """A list of results.json's rows, typed."""
    return [Row.from_dict(r) for r in rows]


def same_level(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=LEVEL_REL_TOL)


def pick(rows: Iterable[Row], level: float, ttm: int) -> Row:
    """The row scored at `level` (to a relative 1e-9) and `ttm`; LookupError naming the (level, TTM) pairs held when
    none is."""
    rows = list(rows)
    for row in rows:
        if row.ttm == ttm and same_level(row.level, level):
            return row
    held = ", ".join(f"({r.level}, {r.ttm})" for r in rows) or "none"
    raise LookupError(f"no row scored at level {level}, TTM {ttm} s; the rows hold (level, TTM): {held}")
