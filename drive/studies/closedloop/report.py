"""What `drive bench closedloop` prints: its rows and ratios as tables, the ceilings under its targets, and the
cost of one controller call (timed here: controller_calls.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from drive.studies.closedloop.envs import Row
from drive.studies.closedloop.ratios import TARGETS, beside_rate, verdict


class CallsConfig(Protocol):
    """What `controller_calls` reads of `drive bench closedloop`'s Config."""

    @property
    def ckpt(self) -> Path: ...

    @property
    def samples(self) -> int: ...

    @property
    def first_seed(self) -> int: ...

    @property
    def controller_calls(self) -> int: ...


def controller_calls(cfg: CallsConfig, k: int | None, console: Any) -> dict[str, float] | str:
    """CPU ms of one eval controller call for the best K, back to back and between env steps
    (controller_calls.py): why eval stays below the bare env even with many cars per call."""
    from drive.studies.closedloop.controller_calls import call_costs

    if k is None or cfg.controller_calls == 0:
        return "not measured: no eval row, or --controller-calls 0"
    with console.status(f"timing the controller call of K={k} cars ..."):
        ms = call_costs(str(cfg.ckpt), k, cfg.samples, cfg.first_seed, cfg.controller_calls)
    console.print(
        f"one controller call, K={k} cars, S={cfg.samples} (CPU ms): back to back {ms['back_to_back']:.2f}, "
        f"after {k} frame-less env steps {ms['after_state_steps']:.2f}, after {k} pixel env steps "
        f"{ms['after_pixel_steps']:.2f} (drive/studies/closedloop/controller_calls.py says why)"
    )
    return ms


def print_tables(
    console: Any, rows: dict[str, Row], ratios: dict[str, float | None], ranges: dict[str, list[float] | None]
) -> None:
    from rich.table import Table

    table = Table(title="closed loop: steps per CPU-second (per core) and per second")
    for col in ("loop", "steps", "steps/CPU-s", "CPU s", "steps/s", "wall s", "our env beside it: random / laps"):
        table.add_column(col, justify="left" if col == "loop" else "right")
    for row in rows.values():
        if row.skipped:
            table.add_row(row.label, "-", row.skipped, "", "", "", "")
            continue
        rates = [beside_rate(near) for near in row.detail.get("beside", {}).values()]  # random, laps
        table.add_row(
            row.label,
            str(row.steps),
            f"{row.steps_per_cpu_s:.0f}",
            f"{row.cpu_s:.1f}",
            f"{row.steps_per_s:.0f}",
            f"{row.wall_s:.1f}",
            " / ".join(f"{r:.0f}" for r in rates),
        )
    console.print(table)
    checks = Table(title="ratios (per core; the 2-worker ones wall-clock)")
    for col in ("ratio", "measured", "round by round", "target", ""):
        checks.add_column(col, justify="right" if col else "left")
    for key, value in ratios.items():
        target, span = TARGETS.get(key), ranges.get(key)
        shown = "n/a" if value is None else f"{value:.2f}x"
        spread = "" if span is None else f"{span[0]:.2f}-{span[1]:.2f}x"
        checks.add_row(key, shown, spread, "-" if target is None else f">= {target}x", verdict(value, target, span))
    console.print(checks)


def print_ceilings(console: Any, ratios: dict[str, float | None], ceiling: float | None, best: int | None) -> None:
    """The two ceilings under the targets (drive/studies/closedloop/ratios.py): the laps' frames against random ones,
    and eval with nothing but the env step and the network's back-to-back call."""
    laps = ratios.get("renderer_driving_over_renderer")
    if laps is not None:
        console.print(
            f"ceiling against random actions: our env steps the expert's laps at {laps:.2f}x its rate on "
            f"random actions, so no loop that drives the laps (collect, eval) can exceed {laps:.2f}x there, "
            f"whatever its controller costs"
        )
    if ceiling is not None:
        console.print(
            f"ceiling of eval at K={best} on the laps: {ceiling:.2f}x our env, were nothing spent per "
            f"car-step but the env step and the controller call's back-to-back share"
        )
