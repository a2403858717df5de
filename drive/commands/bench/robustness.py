"""`drive bench robustness`: closed-loop return, coverage of the shadow expert's steering and mean epistemic variance
of each controller against the level of each camera perturbation (`drive eval --perturb KIND:LEVEL` per point).

    drive bench robustness --ckpt checkpoints/carracing_nsac.pt runs/c/gmle/best.pt ... --out runs/robust \
        --sweep noise:0.05,0.1,0.2 blur:1,2 domain_randomize --seeds 1000-1004

Level 0 of every kind is the clean camera (one shared run per controller). Each point's eval JSON is written to
DIR/points/ as it finishes, so a rerun resumes; DIR/robustness.json holds the table and DIR/robustness.png the
figure (one row per perturbation kind: return, coverage90 steer, mean epistemic variance of the steering).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from datasets.files import atomic_write
from drive.errors import UserError
from drive.loop.options import EvalOptions
from drive.options import NonNegativeInt, PositiveInt, Workers

RESUMES = True  # rerunning the same command continues what an interrupted run left

KEYS = ("mean_return", "min_return", "coverage90_steer", "epistemic_var_steer", "laps_finished")


@dataclass(frozen=True)
class Config:
    ckpt: tuple[Path, ...]
    """controller checkpoints, one curve each"""
    out: Path
    """output directory (points/, robustness.json, robustness.png)"""
    sweep: tuple[str, ...] = (
        "noise:0.05,0.1,0.2",
        "blur:1,2,3",
        "occlusion:0.05,0.15",
        "brightness:0.5,1.6",
        "domain_randomize",
    )
    """per kind KIND:LEVEL,LEVEL,... (domain_randomize: no levels)"""
    seeds: str = "1000-1004"
    """track seeds of every point"""
    workers: Workers = 1
    """parallel episodes per point"""
    envs: NonNegativeInt = 0
    """cars per worker process, one controller call per step for all (drive eval --envs; 0: min(64, seeds per
    worker))"""
    samples: PositiveInt | None = None
    """stochastic samples per step (default: each controller's own)"""
    progress: bool = False
    """progress bars"""


def points(sweep: tuple[str, ...]) -> list[tuple[str, float, str]]:
    """[(kind, level, perturbation spec or '' for clean)] with level 0 (clean) first for every kind."""
    from drive.perturb.camera import WORLD_KINDS, parse_perturbation  # OpenCV: not for `--help`

    out: list[tuple[str, float, str]] = []
    for item in sweep:
        kind, _, levels = item.partition(":")
        try:
            if kind in WORLD_KINDS:
                out += [(kind, 0.0, ""), (kind, 1.0, str(parse_perturbation(kind)))]
                continue
            values = [float(v) for v in levels.split(",") if v.strip()]
            specs = [str(parse_perturbation(f"{kind}:{v:g}")) for v in values]
        except ValueError as exc:
            raise UserError(f"--sweep {item!r}: {exc}") from None
        neutral = 1.0 if kind == "brightness" else 0.0
        out += [(kind, neutral, "")] + list(zip([kind] * len(values), values, specs, strict=True))
    return out


def run(cfg: Config) -> int:
    from drive.loop.evaluate import evaluate  # torch and the simulator: not for `--help`
    from drive.observe.uq_plots import plot_robustness

    if not cfg.ckpt:
        raise UserError("give at least one --ckpt")
    grid = points(cfg.sweep)
    (cfg.out / "points").mkdir(parents=True, exist_ok=True)
    base = EvalOptions(
        seeds=cfg.seeds,
        workers=cfg.workers,
        envs=cfg.envs,
        samples=cfg.samples,
        progress=cfg.progress,
        failure_horizon=0,
    )
    table: dict[str, list[dict]] = {}
    for i, path in enumerate(cfg.ckpt):
        name = f"{i}_{path.parent.name if path.name == 'best.pt' else path.stem}"
        rows = table.setdefault(name, [])
        for kind, level, spec in grid:
            target = cfg.out / "points" / f"{name}__{spec.replace(':', '_') or 'clean'}.json"
            if target.exists():
                result = json.loads(target.read_text())
            else:
                result = evaluate(replace(base, policy=f"ckpt:{path}", perturb=spec))
                result.pop("episodes", None)
                atomic_write(target, (json.dumps(result, indent=1) + "\n").encode())
            rows.append({"kind": kind, "level": level, "perturb": spec or "clean", **{k: result.get(k) for k in KEYS}})
            cov, epi = result.get("coverage90_steer", float("nan")), result.get("epistemic_var_steer", 0.0)
            print(f"{name} {spec or 'clean'}: return {result['mean_return']:.1f}, cov90 {cov:.3f}, epistemic {epi:.2e}")
    atomic_write(
        cfg.out / "robustness.json", (json.dumps({"seeds": cfg.seeds, "controllers": table}, indent=1) + "\n").encode()
    )
    figure = plot_robustness(table, cfg.out / "robustness.png")
    print(f"wrote {cfg.out / 'robustness.json'} and {figure}")
    return 0
