"""`drive bench generalisation`: the field's published generalisation suite, CarRacingExtension (Tang, Nguyen & Ha,
"Neuroevolution of Self-Interpretable Agents", GECCO 2020; google/brain-tokyo-workshop, folder CarRacingExtension),
driven by our controllers beside the published agents.

An agent trained on the clean env is tested without retraining on each variant (sim_bridges/carracing/variants.py:
Color, Color3, Bar, Blob, Noise; Video with a folder of frames). Per controller and variant: the controller alone
(ungated), and with each gate of `gates` (drive/loop/fallback.py: `slow` uses nothing privileged; `expert` hands over
to the PPO expert, which drives from privileged state — an oracle bound, not the controller's own). One `drive eval`
per (controller, variant, gate) on the same unseen track seeds; each point's JSON lands in DIR/points/ as it
finishes, so a rerun resumes.

Figures per (controller, variant): return mean ± std over episodes (as the leaderboard reports it); off-track events
per episode and lap completion (a gate that stops the car safely loses return but leaves the road less); with a
gate, the share of the episodes whose ungated run left the road that the gated run drove without leaving it
(`failures_prevented`) and the share of steps handed over; the epistemic signal: the mean epistemic variance of the
steering per episode, its ratio to the clean runs' and the AUROC of that per-episode mean separating the variant's
episodes from the clean ones (does the controller know it is lost under Noise, and not under Bar?). Checkpoints whose
paths differ only in a `seed<N>` part are one controller over training seeds: its mean return with a 95 % percentile
bootstrap interval over the seeds (drive/studies/over_seeds.py; returns are unbounded). The published rows
(their env CarRacing-v0, agents learned by RL or evolution from pixels; ours v3, cloned from an expert) stand beside
ours, labelled.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from datasets.files import atomic_write
from drive import metrics
from drive.options import Workers
from drive.studies.over_seeds import UNBOUNDED, interval

CLEAN = "clean"
VARIANTS = ("clean", "carracing:color", "carracing:color3", "carracing:bar", "carracing:blob", "carracing:noise")
SEED_PART = re.compile(r"seed\d+")

# the suite's leaderboard (CarRacingExtension README; 100 episodes per variant, CarRacing-v0): mean ± std
PUBLISHED = {
    "AttentionAgent": {"clean": "914 ± 15", "color": "866 ± 112", "color3": "673 ± 372", "bar": "900 ± 35",
                       "blob": "898 ± 53", "noise": "-58 ± 12"},
    "World Models": {"clean": "901 ± 37", "color": "655 ± 353", "color3": "394 ± 413", "bar": "166 ± 137",
                     "blob": "446 ± 299", "noise": "–"},
    "PPO": {"clean": "865 ± 159", "color": "505 ± 464", "color3": "579 ± 444", "bar": "615 ± 217",
            "blob": "855 ± 172", "noise": "–"},
    "GA": {"clean": "859 ± 79", "color": "442 ± 362", "color3": "160 ± 304", "bar": "675 ± 254",
           "blob": "833 ± 135", "noise": "–"},
}  # fmt: skip


@dataclass(frozen=True)
class Suite:
    """What one benchmark drives (primitives: it is written into the results)."""

    controllers: tuple[str, ...]
    variants: tuple[str, ...] = VARIANTS
    gates: tuple[str, ...] = ("slow", "expert")
    seeds: str = "1000-1099"
    max_episode_steps: int = 1000
    workers: Workers = 1
    envs: int = 0
    samples: int | None = None
    progress: bool = False
    calibrate_seeds: str = "2000-2002"


def short(variant: str) -> str:
    """`carracing:color3` -> `color3`; `carracing:video=DIR` -> `video`; clean stays."""
    return variant.removeprefix("carracing:").split("=", 1)[0]


def point_path(out: Path, index: int, controller: str, variant: str, gate: str) -> Path:
    name = f"{index}_{Path(controller).parent.name if Path(controller).name == 'best.pt' else Path(controller).stem}"
    return out / "points" / f"{name}__{short(variant)}__{gate}.json"


def run_points(out: Path, suite: Suite, drive: bool = True) -> dict[str, dict[str, dict[str, Any]]]:
    """{controller: {variant: {gate: the point's summary}}}, each `drive eval` run once (kept in DIR/points/).

    Gate by gate, the ungated runs of every controller first: an interrupted run has the whole ungated table before
    any gated point. A gated point drives only the gated episodes; their ungated twins (the same controller, variant
    and seeds) are the ungated point's, identical until the gate first engages. Each controller's threshold is set
    once (thresholds.json), not per point; a controller whose gate could never fire (no epistemic variance) has no
    gated points, and thresholds.json says why."""
    from drive.loop.evaluate import evaluate  # torch and the simulator: not for `--help`
    from drive.loop.options import EvalOptions

    base = EvalOptions(
        seeds=suite.seeds,
        workers=suite.workers,
        envs=suite.envs,
        samples=suite.samples,
        max_episode_steps=suite.max_episode_steps,
        progress=suite.progress,
        failure_horizon=0,
        fallback_twin=False,
    )
    grid: dict[str, dict[str, dict[str, Any]]] = {}
    for gate in ("off", *suite.gates):
        for index, controller in enumerate(suite.controllers):
            threshold = None if gate == "off" or not drive else gate_threshold(out, suite, controller, gate)
            if gate != "off" and drive and threshold is None:
                continue
            for variant in suite.variants:
                path = point_path(out, index, controller, variant, gate)
                if path.is_file():
                    point = json.loads(path.read_text())
                elif not drive:
                    continue
                else:
                    perturb = "" if variant == CLEAN else variant
                    shadow = None if gate == "expert" else "none"  # the expert gate hands over to the shadow expert
                    opts = replace(
                        base,
                        policy=f"ckpt:{controller}",
                        perturb=perturb,
                        fallback=gate,
                        shadow=shadow,
                        fallback_threshold=threshold,
                    )
                    twins = None if gate == "off" else grid[controller][variant]["off"]["raw"]
                    point = summarise(evaluate(opts), twins)
                    atomic_write(path, (json.dumps(point, indent=1) + "\n").encode())
                grid.setdefault(controller, {}).setdefault(variant, {})[gate] = point
                if drive:
                    print(
                        f"{controller} {short(variant)} {gate}: return {point['mean_return']:.1f} ± "
                        f"{point['std_return']:.1f}, off-track {point['off_track_per_episode']:.2f} "
                        "per episode",
                        flush=True,
                    )
    return grid


def gate_threshold(out: Path, suite: Suite, controller: str, gate: str) -> float | None:
    """The controller's gate threshold for `gate` (stored in its checkpoint, else calibrated on nominal laps over
    `suite.calibrate_seeds`), set once per controller and gate score and kept in DIR/thresholds.json; None, with the
    reason kept there, when its gate could never fire."""
    from drive.errors import UserError
    from drive.loop.fallback import parse_fallback
    from drive.loop.seeds import parse_seeds
    from drive.loop.thresholds import resolve_threshold

    fb = parse_fallback(gate)
    assert fb is not None
    key = f"{controller}|{fb.signal}|{fb.variance}|q={fb.quantile}|samples={suite.samples}"
    path = out / "thresholds.json"
    known = json.loads(path.read_text()) if path.is_file() else {}
    if key not in known:
        env = {"name": "carracing", "max_episode_steps": suite.max_episode_steps}
        try:
            value, origin = resolve_threshold(
                controller, fb, None, parse_seeds(suite.calibrate_seeds), suite.samples, 0, env
            )
            known[key] = {"threshold": value, "origin": origin}
        except UserError as exc:
            known[key] = {"threshold": None, "origin": f"no gate: {exc}"}
        atomic_write(path, (json.dumps(known, indent=1) + "\n").encode())
    return known[key]["threshold"]


def summarise(result: Mapping[str, Any], twins: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """One point's figures from a `drive eval` result (its episodes); a gated point's also from `twins`, the same
    seeds' ungated episodes. `raw` keeps the episodes as driven."""
    episodes = result["episodes"]
    returns = np.array([e["return"] for e in episodes], float)
    out: dict[str, Any] = {
        "episodes": len(episodes),
        "mean_return": float(returns.mean()),
        "std_return": float(returns.std()),
        "returns": returns.tolist(),
        "mean_completion": float(np.mean([e["completion"] for e in episodes])),
        "off_track_per_episode": float(np.mean([e["off_track_events"] for e in episodes])),
        "epistemic": [float(e.get("epistemic_var_steer", math.nan)) for e in episodes],
        "wall_s": float(result.get("wall_s", math.nan)),
    }
    if twins is not None:
        plain = {e["seed"]: e for e in twins}
        failing = [e for e in episodes if plain.get(e["seed"], {}).get("off_track_events", 0) > 0]
        out["failures_ungated"] = len(failing)
        out["failures_prevented"] = (
            sum(1 for e in failing if e["off_track_events"] == 0) / len(failing) if failing else math.nan
        )
        out["engaged_before"] = engaged_before(episodes, plain)
        out["handed_over"] = float(np.mean([e.get("fallback_fraction", 0.0) for e in episodes]))
        out["threshold"] = result.get("fallback", {}).get("threshold")
    out["raw"] = list(episodes)
    return out


def engaged_before(episodes: Sequence[Mapping[str, Any]], twins: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Of the episodes whose ungated twin left the road, those whose gate engaged at or before the twin's first
    off-track step (the two runs are the same car until the gate first engages, so this is the gate acting before
    the misbehaviour), and beside it the null: a gate that engages at random, at this point's own rate of
    engagements per step, engages before step t with probability 1 - (1 - p)^(t + 1)."""
    starts = [iv["start"] for e in episodes for iv in e.get("interventions", [])]
    steps = sum(int(e["steps"]) for e in episodes)
    rate = len(starts) / steps if steps else 0.0
    hits, chance, n = 0, 0.0, 0
    for e in episodes:
        t = int(twins.get(e["seed"], {}).get("first_off_track", -1))
        if t < 0:
            continue
        n += 1
        first = min((iv["start"] for iv in e.get("interventions", [])), default=None)
        hits += int(first is not None and first <= t)
        chance += 1.0 - (1.0 - rate) ** (t + 1)
    share, null = (hits / n, chance / n) if n else (math.nan, math.nan)
    return {"misbehaviours": n, "engaged": hits, "share": share, "null": null}


def signal(grid: Mapping[str, Mapping[str, Any]], variant: str, n_null: int = 1000) -> dict[str, Any]:
    """The epistemic signal of one controller under `variant`: mean per-episode epistemic variance, its ratio to the
    clean runs' and the AUROC of the per-episode mean, variant episodes against clean ones (0.5: it cannot tell).
    Beside it its null: the same AUROC with the episodes' variant / clean labels shuffled (`n_null` draws, seeded),
    a score that carries no information about the variant; `clears` when the AUROC lies above the null's 97.5 %."""
    clean = np.array(grid[CLEAN]["off"]["epistemic"], float)
    shifted = np.array(grid[variant]["off"]["epistemic"], float)
    clean, shifted = clean[np.isfinite(clean)], shifted[np.isfinite(shifted)]
    if not len(clean) or not len(shifted):
        return {"mean": math.nan, "ratio": math.nan, "auroc": math.nan, "null": [math.nan, math.nan], "clears": False}
    auroc = float(metrics.auroc(clean, shifted))
    pooled, rng = np.concatenate([clean, shifted]), np.random.default_rng(0)
    draws = [metrics.auroc(*np.split(rng.permutation(pooled), [len(clean)])) for _ in range(n_null)]
    low, high = (float(q) for q in np.quantile(draws, [0.025, 0.975]))
    return {
        "mean": float(shifted.mean()),
        "ratio": float(shifted.mean() / clean.mean()) if clean.mean() else math.nan,
        "auroc": auroc,
        "null": [low, high],
        "clears": auroc > high,
    }


def over_seeds(grid: Mapping[str, Mapping[str, Any]], suite: Suite) -> dict[str, dict[str, dict[str, Any]]]:
    """{controller or its seed group: {variant: {gate: interval of the per-seed mean returns}}} over the points
    driven (a controller whose gate cannot fire has no gated points)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, members in groups(grid).items():
        for v in suite.variants:
            for g in ("off", *suite.gates):
                values = [grid[c][v][g]["mean_return"] for c in members if g in grid[c].get(v, {})]
                if values:
                    out.setdefault(name, {}).setdefault(v, {})[g] = interval(values, UNBOUNDED)
    return out


def groups(controllers: Sequence[str] | Mapping[str, Any]) -> dict[str, list[str]]:
    """{seed group: its checkpoints}, in order: paths that differ only in a `seed<N>` part are one controller."""
    out: dict[str, list[str]] = {}
    for controller in controllers:
        out.setdefault(SEED_PART.sub("seed*", controller), []).append(controller)
    return out


def run(out: Path, suite: Suite, drive: bool = True) -> dict[str, Any]:
    """Drive the points not yet driven (`drive=False`: none, the tables from those finished) and write
    DIR/results.json."""
    grid = run_points(out, suite, drive)
    wall = sum(p.get("wall_s", math.nan) for by in grid.values() for gates in by.values() for p in gates.values())
    thresholds = out / "thresholds.json"
    results = {
        "suite": suite.__dict__,
        "points": grid,
        "published": PUBLISHED,
        "points_wall_s": wall,
        "thresholds": json.loads(thresholds.read_text()) if thresholds.is_file() else {},
        "signal": {
            c: {v: signal(g, v) for v in suite.variants if v != CLEAN and CLEAN in g and v in g}
            for c, g in grid.items()
        },
        "over_seeds": over_seeds(grid, suite),
    }
    atomic_write(out / "results.json", (json.dumps(results, indent=1) + "\n").encode())
    return results
