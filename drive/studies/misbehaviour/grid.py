"""`drive bench misbehaviour`: misbehaviour prediction and prevention in closed loop, on the field's protocol with our
departures (drive/studies/misbehaviour/protocol.py; `Plan.protocol` "field" scores by their rules, and ours shows theirs
beside).

A grid of cells (drive/studies/misbehaviour/cells.py), one per (controller, condition[, fallback]): `nominal` (clean
camera, the false-positive windows) and each shift spec (drive/perturb/wrappers.py grammar: `KIND:LEVEL`,
`domain_randomize`, a user's `module:function:LEVEL`, `escalate:...`). A killed benchmark rerun with the same
arguments keeps every finished cell and runs the rest.

The prevention cells rerun each shifted condition (and nominal) with the uncertainty-gated fallback engaged on the
declared monitor (`Plan.gate_signal`, fixed before the run: the summed epistemic variance by default; the headline
row of the prediction table is the same monitor) at the threshold the protocol fits on it at `--level` over every
other nominal seed (1st, 3rd, ...); the gated nominal cell runs on the other nominal seeds, so its false alarms are
counted out of sample. "Prevented" and "false alarms" use the detector the prediction table scores.
drive/studies/misbehaviour/report.py turns the cells into results.json, results.md and plots; each controller's
ungated cells are also written as records, one Parquet row per step (drive/studies/misbehaviour/records.py), which
`score_records` scores again without driving.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from drive.loop.fallback import MODES
from drive.studies.misbehaviour import records as records
from drive.studies.misbehaviour import report as report
from drive.studies.misbehaviour.cells import Cell, RunSettings, cell_path, ensure_cell, slug, summary
from drive.studies.misbehaviour.protocol import FIELD, LEVELS, SCORINGS, TTMS, ProtocolConfig
from drive.studies.misbehaviour.report import NOMINAL
from drive.studies.misbehaviour.rows import same_level
from drive.studies.misbehaviour.seeds import over_seeds

# the monitors a gate can read every step (drive/loop/fallback.py): monitor -> (its signal, its variance)
GATES = {"epistemic_sum": ("sum", "epistemic"), "epistemic_steer": ("steer", "epistemic"),
         "total_steer": ("steer", "total")}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """What a benchmark runs and how it is scored. The headline's level and TTM are scored too, whichever levels and
    TTMs the tables list (any level in (0, 1), any whole TTM >= 1: drive/studies/misbehaviour/protocol.py)."""

    controllers: tuple[str, ...]
    shifts: tuple[str, ...]
    nominal_seeds: tuple[int, ...]
    seeds: tuple[int, ...]
    fallback: tuple[str, ...] = ("slow", "expert")
    """the prevention modes, each its own gated cells; the first is the headline (slow: nothing privileged), the
    others bounds (expert: the PPO expert drives from privileged state); () or "off": prediction only"""
    level: float = 0.999
    ttm: int = 2
    n_boot: int = 1000
    seed: int = 0
    levels: tuple[float, ...] = LEVELS
    ttms: tuple[int, ...] = TTMS
    protocol: str = "alike"
    """alike (ours: protocol.ProtocolConfig()) or field (protocol.FIELD, the field's rules)"""
    monitors: tuple[str, ...] = ()
    """your monitors, module:function each (drive/studies/misbehaviour/records.py)"""
    gate_signal: str = "epistemic_sum"
    """the declared monitor, fixed before the run: the headline's row and the signal the fallback gates on"""
    gate_budget: float | None = None
    """the gate's false-alarm budget, hand-overs per km on the calibration seeds (report.budget_threshold); None:
    the threshold at `level` (report.nominal_threshold)"""

    def __post_init__(self) -> None:
        if not 0 < self.level < 1 or int(self.ttm) != self.ttm or self.ttm < 1 or self.protocol not in SCORINGS:
            raise ValueError(
                f"Plan: level in (0, 1), a whole ttm >= 1, protocol in {SCORINGS}; got {self.level}, "
                f"{self.ttm}, {self.protocol!r}"
            )
        modes = (self.fallback,) if isinstance(self.fallback, str) else tuple(self.fallback)
        modes = tuple(m for m in modes if m != "off")
        if len(set(modes)) != len(modes) or not set(modes) <= set(MODES):
            raise ValueError(f"Plan: fallback modes from {MODES}, each once; got {self.fallback!r}")
        object.__setattr__(self, "fallback", modes)
        if self.gate_budget is not None and not self.gate_budget > 0:
            raise ValueError(f"Plan: gate_budget {self.gate_budget} hand-overs per km must be above 0")
        if self.gate_signal not in GATES:
            raise ValueError(f"Plan: gate_signal {self.gate_signal!r}, choose one of {sorted(GATES)}")
        levels = {v for v in self.levels if not same_level(v, self.level)}  # the asked level stands for its equal
        object.__setattr__(self, "levels", tuple(sorted({*levels, self.level})))
        object.__setattr__(self, "ttms", tuple(sorted({*self.ttms, self.ttm})))

    @property
    def protocol_config(self) -> ProtocolConfig:
        return FIELD if self.protocol == "field" else ProtocolConfig()

    def gate(self, mode: str) -> str:
        """The fallback spec of a mode's prevention cells: the mode, gating on the declared monitor."""
        signal, variance = GATES[self.gate_signal]
        return f"{mode}:signal={signal},variance={variance}"

    @property
    def calibration_seeds(self) -> tuple[int, ...]:
        """The nominal seeds the gate's threshold is fitted on (1st, 3rd, ...); the others measure its false alarms."""
        return self.nominal_seeds[0::2] if len(self.nominal_seeds) > 1 else self.nominal_seeds

    @property
    def false_alarm_seeds(self) -> tuple[int, ...]:
        return self.nominal_seeds[1::2] if len(self.nominal_seeds) > 1 else self.nominal_seeds


def _results(plan: Plan, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "plan": {**plan.__dict__},
        "protocol": report.protocol_settings(plan.protocol_config),
        "settings": settings,
        "controllers": {},
        "published": report.PUBLISHED,
    }


def _predicted(plan: Plan, cells: dict[str, Any], families: dict[str, tuple[str, bool]] | None = None) -> dict:
    """A controller's prediction tables and episode counts from its ungated cells ({condition: cell})."""
    return {
        "prediction": report.prediction(
            cells,
            plan.protocol_config,
            plan.levels,
            plan.ttms,
            plan.n_boot,
            plan.seed,
            level=plan.level,
            ttm=plan.ttm,
            families=families,
        ),
        "episodes": {c: summary(v) for c, v in cells.items()},
    }


def run_plan(out: Path, plan: Plan, run: RunSettings, run_missing: bool = True) -> dict[str, Any]:
    """Every cell (run if missing, unless `run_missing` is False: then only the finished ones count), each
    controller's records (DIR/records/, records.py), then the tables of
    drive/studies/misbehaviour/report.py; returns results.json's dict."""
    cfg = plan.protocol_config
    monitors = records.load_monitors(plan.monitors)
    results = _results(plan, run.__dict__)
    results["records"] = []
    seconds = 0.0

    def cell(c: Cell) -> dict[str, Any] | None:
        nonlocal seconds
        if not run_missing and not cell_path(out, c).is_file():
            return None
        got = ensure_cell(out, c, run)
        seconds += float(got.get("seconds", 0.0))
        return got

    for position, controller in enumerate(plan.controllers):
        entry: dict[str, Any] = {}
        cells: dict[str, Any] = {}
        for condition in (NOMINAL, *plan.shifts):
            seeds = plan.nominal_seeds if condition == NOMINAL else plan.seeds
            got = cell(Cell(controller, condition, seeds))
            if got is not None:
                cells[condition] = got
        records.with_monitors(cells, monitors)
        if any(c["episodes"] for c in cells.values()):
            path = Path("records") / f"{slug(controller)}.parquet"  # results.json names it relative to `out`
            records.write_records(out / path, controller, cells, position)
            results["records"].append(str(path))
        if NOMINAL in cells:
            entry |= _predicted(plan, cells)
            try:
                threshold = (
                    None
                    if not plan.fallback
                    else report.nominal_threshold(
                        cells[NOMINAL], plan.level, cfg, plan.gate_signal, plan.calibration_seeds
                    )
                    if plan.gate_budget is None
                    else report.budget_threshold(
                        cells[NOMINAL], plan.gate_budget, plan.gate_signal, plan.calibration_seeds
                    )
                )
            except ValueError as exc:  # a controller that misbehaves on every nominal run: nothing to gate on
                entry["fallback_skipped"] = f"no prevention cells: {exc}"
                threshold = None
            # an episode whose first misbehaviour comes before its first scorable window at the headline TTM
            # (warm-up + TTM) failed too early to predict: counted apart, not in the per-episode share prevented
            early = round(cfg.fps * (cfg.warmup_s + plan.ttm))
            for mode in plan.fallback if threshold is not None else ():
                block: dict[str, Any] = {
                    "mode": mode,
                    "threshold": threshold,
                    "level": plan.level,
                    "budget_per_km": plan.gate_budget,
                    "signal": plan.gate_signal,
                    "calibrated_on": list(plan.calibration_seeds),
                    "conditions": {},
                }
                for condition, ungated in cells.items():
                    seeds = plan.false_alarm_seeds if condition == NOMINAL else plan.seeds
                    gated = cell(Cell(controller, condition, seeds, plan.gate(mode), threshold))
                    if gated is not None:
                        block["conditions"][condition] = report.prevention(
                            ungated, gated, plan.n_boot, plan.seed, early_steps=early
                        )
                entry.setdefault("fallbacks", {})[mode] = block
        results["controllers"][controller] = entry
    results["cells_wall_s"] = seconds
    results["over_seeds"] = over_seeds(results)
    return results


def score_records(folder: Path, plan: Plan) -> dict[str, Any]:
    """results.json's dict from a run's records (records.py) instead of its cells: the prediction tables
    of every controller there, scored by `plan`'s protocol, levels, TTMs and monitors; no prevention (it needs
    driving). The controllers, conditions and seeds are the records'."""
    monitors = records.load_monitors(plan.monitors)
    controllers, families = records.read_records(folder)
    conditions = dict.fromkeys(c for cells in controllers.values() for c in cells if c != NOMINAL)
    seeds = {
        c: sorted({ep["seed"] for cells in controllers.values() for ep in cells.get(c, {}).get("episodes", [])})
        for c in (NOMINAL, *conditions)
    }
    plan = replace(
        plan,
        controllers=tuple(controllers),
        shifts=tuple(conditions),
        fallback=(),
        nominal_seeds=tuple(seeds[NOMINAL]),
        seeds=tuple(sorted({s for c in conditions for s in seeds[c]})),
    )
    results = _results(plan, {"from_records": str(folder)})
    for controller, cells in controllers.items():
        records.with_monitors(cells, monitors)
        entry = _predicted(plan, cells, families)
        entry["fallback_skipped"] = "scored from records: prevention needs driving"
        results["controllers"][controller] = entry
    results["cells_wall_s"] = 0.0
    results["over_seeds"] = over_seeds(results)
    return results
