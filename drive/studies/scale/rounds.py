"""`drive bench scale`: the variants' order over rounds, medians and spreads, ratios paired within a round, verdicts
and the printed tables (the method: drive/studies/scale/options.py)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from drive.studies.scale.options import (
    COLLECTION,
    FULL_SHARE,
    RAY_START,
    TARGETS,
)


def _load() -> float:
    return os.getloadavg()[0]


def round_orders(keys: Sequence[str], repeats: int) -> list[tuple[str, ...]]:
    """The order of the variants in each round: as given in even rounds, reversed in odd ones (ABBA): each ratio's
    sides swap places from one round to the next, so a drift of the machine over a pair of rounds falls on both."""
    return [tuple(keys) if r % 2 == 0 else tuple(reversed(keys)) for r in range(repeats)]


@dataclass(frozen=True)
class Spread:
    """A figure over rounds: the median, the range, and each round's value (in round order)."""

    median: float
    low: float
    high: float
    rounds: tuple[float, ...]


def spread(values: Sequence[float]) -> Spread:
    return Spread(statistics.median(values), min(values), max(values), tuple(values))


def summarise(
    per_round: Sequence[dict[str, float]], ratios: dict[str, tuple[str, str]]
) -> tuple[dict[str, Spread], dict[str, Spread]]:
    """Each variant's spread over rounds, and each ratio (name: (numerator, denominator)) taken within each round
    where both were measured, then spread over those rounds: a ratio of medians would pair a fast round's numerator
    with a slow round's denominator."""
    keys = dict.fromkeys(k for row in per_round for k in row)
    figures = {k: spread([row[k] for row in per_round if k in row]) for k in keys}
    paired = {name: [row[a] / row[b] for row in per_round if a in row and b in row] for name, (a, b) in ratios.items()}
    return figures, {name: spread(values) for name, values in paired.items() if values}


def by_round(runs: Sequence[Any], value: str) -> list[dict[str, float]]:
    """[{variant: run.value}] per round, from runs carrying `variant` and `round`."""
    rounds: dict[int, dict[str, float]] = {}
    for run in runs:
        rounds.setdefault(run.round, {})[run.variant] = float(getattr(run, value))
    return [rounds[r] for r in sorted(rounds)]


def verdict(ratio: Spread, target: float | None) -> str:
    """met / MISSED on the median; "within noise" where the rounds' range straddles the target."""
    if target is None:
        return ""
    word = "met" if ratio.median >= target else "MISSED"
    return f"{word}, within noise" if ratio.low < target <= ratio.high else word


def shared_note(cores: dict[str, Spread]) -> str:
    """A warning where the 2-worker runs' workers were given less than two cores (`CollectRun.cores`, medians): the
    machine was shared, and their wall-clock ratios then measure the neighbours ("" where they had the cores)."""
    short = {k: c.median for k, c in cores.items() if COLLECTION[k][0] == 2 and c.median < 2 * FULL_SHARE}
    if not short:
        return ""
    got = ", ".join(f"{k} {v:.2f}" for k, v in short.items())
    return (
        f"shared machine: the 2-worker runs' workers got {got} cores of 2 (medians), so the 2-over-1 ratios "
        "measure the neighbours too; the *_per_cpu ratios (frames per CPU-second: each engine's own cost) do not"
    )


def _span(s: Spread, digits: int = 0) -> str:
    return f"{s.low:.{digits}f}-{s.high:.{digits}f}"


def print_tables(
    console: Any, collection: dict[str, dict[str, Spread]], training: dict[str, Spread], ratios: dict[str, Spread]
) -> None:
    from rich.table import Table

    if collection:
        table = Table(title="collection: median over rounds, min-max in brackets")
        for col in ("variant", "frames/s", "start-up s", "share", "whole run frames/s", "frames per CPU-s", "cores"):
            table.add_column(col, justify="left" if col == "variant" else "right")
        for key, fps in collection["frames_per_s"].items():
            up, share, wall, cpu, cores = (
                collection[v][key]
                for v in ("startup_s", "startup_share", "wall_frames_per_s", "frames_per_cpu_s", "cores")
            )
            table.add_row(
                key,
                f"{fps.median:.0f} [{_span(fps)}]",
                f"{up.median:.2f} [{_span(up, 2)}]",
                f"{100 * share.median:.1f} %",
                f"{wall.median:.0f} [{_span(wall)}]",
                f"{cpu.median:.0f} [{_span(cpu)}]",
                f"{cores.median:.2f}",
            )
        if RAY_START in collection["startup_s"]:
            up = collection["startup_s"][RAY_START]
            table.add_row("Ray instance", "", f"{up.median:.2f} [{_span(up, 2)}]", "", "", "", "")
        console.print(table)
        if note := shared_note(collection["cores"]):
            console.print(note)
    if training:
        table = Table(title="training: median over rounds, min-max in brackets")
        for col in ("variant", "samples/s"):
            table.add_column(col, justify="left" if col == "variant" else "right")
        for key, sps in training.items():
            table.add_row(key, f"{sps.median:.0f} [{_span(sps)}]")
        console.print(table)
    table = Table(title="ratios: taken within each round; their median, min-max in brackets")
    for col in ("ratio", "median", "rounds", "target", ""):
        table.add_column(col, justify="left" if col == "ratio" else "right")
    for key, value in ratios.items():
        target = TARGETS.get(key)
        table.add_row(
            key,
            f"{value.median:.2f}x [{_span(value, 2)}]",
            " ".join(f"{v:.2f}" for v in value.rounds),
            f">= {target}x" if target else "",
            verdict(value, target),
        )
    console.print(table)
