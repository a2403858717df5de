"""The ratios of `drive bench closedloop` (drive/commands/bench/closedloop.py) from its rows: per-core ratios with the
issue's targets, the range each spans round by round, and the verdict that range allows.

A loop row (collect, eval) is divided by our env as measured beside it (`detail["beside"]`, from
drive/studies/closedloop/envs.py's `bare_env`: in each collect round, and just before and after each eval run),
where the run has that measurement; otherwise by the env row of the same stream, measured minutes earlier.
`renderer_driving_over_renderer` is the ceiling of every loop ratio against random actions: what the expert's laps
cost our env per step against random actions, so what collect or eval could reach there with a free controller.
"""

from __future__ import annotations

from drive.studies.closedloop.envs import Row
from drive.studies.closedloop.loops import best_eval

TARGETS = {"renderer_over_envpool": 1.0, "collect1_over_renderer": 0.9, "eval_best_over_renderer": 0.8,
           "collect2_over_collect1": 1.7, "renderer_over_envpool_driving": 1.0,
           "collect1_over_renderer_driving": 0.9, "eval_best_over_renderer_driving": 0.8}  # fmt: skip


def _rate(rows: dict[str, Row], key: str, field: str = "steps_per_cpu_s") -> float | None:
    return getattr(rows[key], field) if key in rows else None


def _beside(rows: dict[str, Row], loop: str, env: str) -> list[list[float]] | None:
    """[steps, CPU s] of each measurement of our env's stream `env` taken beside loop row `loop`, or None."""
    row = rows.get(loop)
    return None if row is None or row.skipped else row.detail.get("beside", {}).get(env) or None


def beside_rate(measurements: list[list[float]]) -> float:
    """Steps per CPU-s of a row's `beside` measurements of one stream ([steps, CPU s] each), summed."""
    return sum(n for n, _ in measurements) / sum(c for _, c in measurements)


def _env_rate(rows: dict[str, Row], loop: str, env: str) -> float | None:
    """Steps per CPU-s of our env on stream `env`: measured beside row `loop` where it was, else the env row."""
    got = _beside(rows, loop, env)
    return beside_rate(got) if got else _rate(rows, env)


def _over(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def ratios_of(rows: dict[str, Row], ks: tuple[int, ...]) -> dict[str, float | None]:
    """Per-core ratios (steps per CPU-second), except the 2-worker ones: wall, what a second worker is for."""
    best = best_eval(rows, ks)
    per_cpu = {key: _rate(rows, key) for key in rows}
    wall = {key: _rate(rows, key, "steps_per_s") for key in rows}
    best_key = f"eval_k{best}" if best is not None else ""
    collect_ks = [key for key in rows if key.startswith("collect1_k")]  # collect1 with other K (`collect_envs`)
    return {
        "renderer_over_envpool": _over(per_cpu["renderer"], per_cpu["envpool"]),
        "renderer_over_stock": _over(per_cpu["renderer"], per_cpu["stock"]),
        "collect1_over_renderer": _over(per_cpu["collect1"], _env_rate(rows, "collect1", "renderer")),
        "eval_best_over_renderer": _over(per_cpu.get(best_key), _env_rate(rows, best_key, "renderer")),
        "collect2_over_collect1": _over(wall["collect2"], wall["collect1"]),
        # like for like: the bare env on the expert's laps (collect drives those very laps, eval similar ones)
        "renderer_over_envpool_driving": _over(per_cpu["renderer_driving"], per_cpu["envpool_driving"]),
        # the ceiling of the loops against random actions: the expert's laps over random actions in our env
        "renderer_driving_over_renderer": _over(per_cpu["renderer_driving"], per_cpu["renderer"]),
        # the floor: our physics, reward and state without a frame, against EnvPool's whole step
        "state_over_envpool_driving": _over(per_cpu["state_driving"], per_cpu["envpool_driving"]),
        "collect1_over_renderer_driving": _over(per_cpu["collect1"], _env_rate(rows, "collect1", "renderer_driving")),
        **{f"{key}_over_collect1": _over(per_cpu[key], per_cpu["collect1"]) for key in collect_ks},
        "eval_best_over_renderer_driving": _over(per_cpu.get(best_key), _env_rate(rows, best_key, "renderer_driving")),
        # parallel efficiency: 1.0 when the second worker costs no extra CPU per step (start-up, contention)
        "collect2_over_collect1_per_cpu": _over(per_cpu["collect2"], per_cpu["collect1"]),
        "eval2_over_eval_best": _over(wall["eval2"], wall.get(best_key)),
    }


def network_ceiling(rows: dict[str, Row], ks: tuple[int, ...], calls: dict[str, float] | str) -> float | None:
    """What eval at its best K could reach against our env on the laps were nothing but the env step and the
    controller call's back-to-back cost spent per car-step (drive/studies/closedloop/controller_calls.py): env / (env +
    call / K), in CPU time per step. Below a target, the network's own arithmetic stops that target, whatever else is
    cut."""
    best = best_eval(rows, ks)
    laps = _env_rate(rows, f"eval_k{best}", "renderer_driving") if best is not None else None
    call_ms = calls.get("back_to_back") if isinstance(calls, dict) else None
    if best is None or not laps or not call_ms:
        return None
    env_us, call_us = 1e6 / laps, call_ms * 1e3 / best
    return env_us / (env_us + call_us)


def round_ranges(rows: dict[str, Row], ks: tuple[int, ...]) -> dict[str, list[float] | None]:
    """[min, max] over the rounds of each per-core ratio that has rounds: two rows with rounds paired round by round
    (each round runs every env back to back; the 1-worker collect rows and our env beside them likewise), an eval
    row (run once) against each measurement of its env (beside it, before and after, or the env row's rounds). The
    ratio of the sums lies in between; a range that straddles a target says this machine's drift, not the code,
    decided that verdict. None where neither side has rounds or one is missing."""
    best = f"eval_k{best_eval(rows, ks)}"
    pairs = {
        "renderer_over_envpool": ("renderer", "envpool"),
        "renderer_over_stock": ("renderer", "stock"),
        "collect1_over_renderer": ("collect1", "renderer"),
        "eval_best_over_renderer": (best, "renderer"),
        "renderer_over_envpool_driving": ("renderer_driving", "envpool_driving"),
        "renderer_driving_over_renderer": ("renderer_driving", "renderer"),
        "state_over_envpool_driving": ("state_driving", "envpool_driving"),
        "collect1_over_renderer_driving": ("collect1", "renderer_driving"),
        "eval_best_over_renderer_driving": (best, "renderer_driving"),
        **{f"{key}_over_collect1": (key, "collect1") for key in rows if key.startswith("collect1_k")},
    }

    def rounds(key: str) -> list[float] | None:
        row = rows.get(key)
        if row is None or row.skipped or not row.steps_per_cpu_s:
            return None
        return list(row.detail.get("per_round_steps_per_cpu_s", [row.steps_per_cpu_s]))

    out: dict[str, list[float] | None] = {}
    for name, (a, b) in pairs.items():
        near = _beside(rows, a, b)
        ra, rb = rounds(a), [n / c for n, c in near] if near else rounds(b)
        if ra is None or rb is None or len(ra) == len(rb) == 1:
            out[name] = None
            continue
        ra, rb = ra * (len(rb) if len(ra) == 1 else 1), rb * (len(ra) if len(rb) == 1 else 1)
        values = [x / y for x, y in zip(ra, rb, strict=True)]
        out[name] = [min(values), max(values)]
    return out


def verdict(value: float | None, target: float | None, span: list[float] | None) -> str:
    """The verdict, "met" or "MISSED" by the ratio of the sums, ", within noise" added where its round-by-round range
    straddles the target (some rounds meet it, others miss it): this run alone does not decide it. "" where there is
    no target or no value."""
    if target is None or value is None:
        return ""
    said = "met" if value >= target else "MISSED"
    return f"{said}, within noise" if span is not None and span[0] < target <= span[1] else said
