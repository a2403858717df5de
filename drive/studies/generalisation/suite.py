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
from drive.studies.over_seeds import UNBOUNDED, cell_text, interval

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


def short(variant: str) -> str:
    """`carracing:color3` -> `color3`; `carracing:video=DIR` -> `video`; clean stays."""
    return variant.removeprefix("carracing:").split("=", 1)[0]


def point_path(out: Path, index: int, controller: str, variant: str, gate: str) -> Path:
    name = f"{index}_{Path(controller).parent.name if Path(controller).name == 'best.pt' else Path(controller).stem}"
    return out / "points" / f"{name}__{short(variant)}__{gate}.json"


def run_points(out: Path, suite: Suite) -> dict[str, dict[str, dict[str, Any]]]:
    """{controller: {variant: {gate: the point's summary}}}, each `drive eval` run once (kept in DIR/points/)."""
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
    )
    grid: dict[str, dict[str, dict[str, Any]]] = {}
    for index, controller in enumerate(suite.controllers):
        for variant in suite.variants:
            for gate in ("off", *suite.gates):
                path = point_path(out, index, controller, variant, gate)
                if path.is_file():
                    point = json.loads(path.read_text())
                else:
                    perturb = "" if variant == CLEAN else variant
                    shadow = None if gate == "expert" else "none"  # the expert gate hands over to the shadow expert
                    result = evaluate(
                        replace(base, policy=f"ckpt:{controller}", perturb=perturb, fallback=gate, shadow=shadow)
                    )
                    point = summarise(result, gated=gate != "off")
                    atomic_write(path, (json.dumps(point, indent=1) + "\n").encode())
                grid.setdefault(controller, {}).setdefault(variant, {})[gate] = point
                print(
                    f"{controller} {short(variant)} {gate}: return {point['mean_return']:.1f} ± "
                    f"{point['std_return']:.1f}, off-track {point['off_track_per_episode']:.2f} "
                    "per episode"
                )
    return grid


def summarise(result: Mapping[str, Any], gated: bool) -> dict[str, Any]:
    """One point's figures from a `drive eval` result (its episodes; with a gate, also the ungated episodes)."""
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
    if gated:
        plain = {e["seed"]: e for e in result.get("episodes_no_fallback", [])}
        failing = [e for e in episodes if plain.get(e["seed"], {}).get("off_track_events", 0) > 0]
        out["failures_ungated"] = len(failing)
        out["failures_prevented"] = (
            sum(1 for e in failing if e["off_track_events"] == 0) / len(failing) if failing else math.nan
        )
        out["handed_over"] = float(np.mean([e.get("fallback_fraction", 0.0) for e in episodes]))
        out["threshold"] = result.get("fallback", {}).get("threshold")
    return out


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
    """{controller or its seed group: {variant: {gate: interval of the per-seed mean returns}}}."""
    groups: dict[str, list[str]] = {}
    for controller in grid:
        groups.setdefault(SEED_PART.sub("seed*", controller), []).append(controller)
    return {
        name: {
            v: {g: interval([grid[c][v][g]["mean_return"] for c in members], UNBOUNDED) for g in ("off", *suite.gates)}
            for v in suite.variants
        }
        for name, members in groups.items()
    }


def run(out: Path, suite: Suite) -> dict[str, Any]:
    grid = run_points(out, suite)
    wall = sum(p.get("wall_s", math.nan) for by in grid.values() for gates in by.values() for p in gates.values())
    results = {
        "suite": suite.__dict__,
        "points": grid,
        "published": PUBLISHED,
        "points_wall_s": wall,
        "signal": {c: {v: signal(g, v) for v in suite.variants if v != CLEAN} for c, g in grid.items()},
        "over_seeds": over_seeds(grid, suite),
    }
    atomic_write(out / "results.json", (json.dumps(results, indent=1) + "\n").encode())
    return results


def _name(controller: str) -> str:
    path = Path(controller)
    return f"{path.parent.name}/{path.name}" if path.name == "best.pt" else path.name


def _cell(point: Mapping[str, Any]) -> str:
    return f"{point['mean_return']:.0f} ± {point['std_return']:.0f}"


def _label(controller: str, gate: str) -> str:
    if gate == "off":
        return f"{_name(controller)}, ungated"
    return f"{_name(controller)}, gate {gate}" + (" (privileged oracle)" if gate.startswith("expert") else "")


def _row(label: str, cells: Sequence[str]) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"


def tables(results: Mapping[str, Any]) -> list[str]:
    """results.md: the leaderboard (published rows labelled, ours ungated and gated), the gates' safety, the
    epistemic signal per variant, and the interval over training seeds where a controller has several."""
    suite, grid = results["suite"], results["points"]
    variants, gates = list(suite["variants"]), list(suite["gates"])
    runs = ("off", *gates)
    head = [_row("agent", [short(v) for v in variants]), "|---|" + "---|" * len(variants)]
    lines = ["## Return, mean ± std over episodes", "", *head]
    for agent, row in results["published"].items():
        cells = [row.get(short(v), "–") for v in variants]
        lines.append(_row(f"{agent} (published: v0, RL / evolution from pixels)", cells))
    for controller, by in grid.items():
        for g in runs:
            lines.append(_row(f"{_label(controller, g)} (ours: v3, cloned)", [_cell(by[v][g]) for v in variants]))
    lines += ["", "## Off the road and how far: off-track events per episode / lap completion", "", *head]
    for controller, by in grid.items():
        for g in runs:
            cells = [f"{by[v][g]['off_track_per_episode']:.2f} / {by[v][g]['mean_completion']:.2f}" for v in variants]
            lines.append(_row(_label(controller, g), cells))
    lines += [
        "",
        "## The gates: episodes whose ungated run left the road: the share the gated run kept on it (steps "
        "handed over)",
        "",
        *head,
    ]
    for controller, by in grid.items():
        for g in gates:
            cells = [
                f"{by[v][g]['failures_ungated']}: {_share(by[v][g]['failures_prevented'])} "
                f"({by[v][g]['handed_over']:.2f})"
                for v in variants
            ]
            lines.append(_row(_label(controller, g), cells))
    shifted = [v for v in variants if v != CLEAN]
    title = (
        "## Does it know it is lost? Epistemic variance of the steering: ratio to clean, AUROC against clean "
        "(its null: the labels shuffled, 95 %; * clears it)"
    )
    lines += ["", title, "", _row("controller", [short(v) for v in shifted]), "|---|" + "---|" * len(shifted)]
    for controller, by in results["signal"].items():
        cells = [
            f"{by[v]['ratio']:.2f}x, {by[v]['auroc']:.2f}{' *' if by[v]['clears'] else ''} "
            f"(null {by[v]['null'][0]:.2f}-{by[v]['null'][1]:.2f})"
            for v in shifted
        ]
        lines.append(_row(_name(controller), cells))
    seeded = {k: v for k, v in results["over_seeds"].items() if "seed*" in k}
    if seeded:
        lines += ["", "## Over training seeds: mean return [95 % bootstrap interval over the seeds]", "", *head]
        for name, by in seeded.items():
            lines += [_row(_label(name, g), [cell_text(by[v][g]) for v in variants]) for g in runs]
    return lines


def _share(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{value:.0%}"


def frames_figure(path: Path, variants: Sequence[str], seed: int = 1000, step: int = 60) -> Path:
    """One frame of each variant (the clean env first), seed `seed` at step `step` of a fixed gentle throttle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from drive.loop.envs import make_env
    from drive.perturb.registry import parse_shift, shifted_env

    frames = []
    for variant in variants:
        env = make_env("carracing", max_episode_steps=step + 1)
        env = shifted_env(env, None if variant == CLEAN else parse_shift(variant))
        obs, _ = env.reset(seed=seed)
        for _ in range(step):
            obs, *_ = env.step(np.array([0.0, 0.3, 0.0], np.float32))
        frames.append(np.asarray(obs))
        env.close()
    fig, axes = plt.subplots(1, len(frames), figsize=(2.2 * len(frames), 2.6))
    for ax, frame, variant in zip(np.atleast_1d(axes), frames, variants, strict=True):
        ax.imshow(frame, interpolation="nearest")
        ax.set_title(short(variant), fontsize=10)
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
