"""`drive bench dagger`: uncertainty-gated against plain DAgger, closed-loop return against expert labels used.

    drive bench dagger --ckpt runs/c0/best.pt --data runs/demos --out runs/gd --gated-rounds 2 --plain-rounds 1

Both arms start from the same clone C0 (trained on --data). Each round (drive/loop/dagger.py) lets the current
clone drive `--episodes` new tracks with the expert mixed in (beta), aggregates them with the arm's data so far and
retrains the clone with the same recipe (`--epochs`, `--set`, as C0 was trained); plain rounds keep the expert's
label on every visited state, gated rounds only where the clone's steering epistemic variance exceeds the
`--query-quantile` of it on its nominal laps. Every clone (C0 included) drives `--eval-seeds`. Every step's output
(dataset, run directory, eval JSON) is kept under --out and reused by a rerun; `curve.json` and `curve.png` hold the
points (labels, mean and worst return).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from datasets.files import atomic_write
from drive.errors import UserError
from drive.loop.options import DaggerOptions, EvalOptions
from drive.options import NonNegativeInt, OpenUnit, PositiveInt, Probability, Workers

RESUMES = True  # rerunning the same command continues what an interrupted run left


@dataclass(frozen=True)
class Config:
    ckpt: Path
    """C0: the clone both arms start from"""
    data: Path
    """the demonstrations C0 was trained on"""
    out: Path
    """output directory (datasets, runs, evals, curve.json, curve.png)"""
    gated_rounds: NonNegativeInt = 2
    """rounds of uncertainty-gated DAgger"""
    plain_rounds: NonNegativeInt = 1
    """rounds of plain DAgger"""
    episodes: PositiveInt = 20
    """new episodes per round"""
    first_seed: NonNegativeInt = 400
    """track seed of round 1's first episode (round r uses the next `episodes` seeds after round r-1)"""
    beta: Probability = 0.2
    """probability per step that the expert's action is executed (both arms)"""
    query_quantile: OpenUnit = 0.9
    """gated rounds: query where the epistemic variance exceeds this quantile of it on nominal laps"""
    calibrate_seeds: str = "2000-2002"
    """gated rounds: the clone's nominal laps"""
    eval_seeds: str = "1000-1009"
    """unseen tracks every clone drives"""
    epochs: PositiveInt = 4
    """retraining epochs per round"""
    set: tuple[str, ...] = ("task.stride=4", "encoder.d_model=32", "n_heads=4", "backbone_units=8")
    """retraining overrides (as C0's command)"""
    workers: Workers = 1
    """parallel episodes (DAgger and eval)"""
    envs: NonNegativeInt = 0
    """cars per worker process, one clone call per step for all (DAgger and eval; 0: min(64, seeds per worker))"""


def _eval(cfg: Config, ckpt: Path, target: Path) -> dict:
    from drive.loop.evaluate import evaluate  # torch and the simulator: not for `--help`

    if not target.exists():
        result = evaluate(
            EvalOptions(
                policy=f"ckpt:{ckpt}",
                seeds=cfg.eval_seeds,
                workers=cfg.workers,
                envs=cfg.envs,
                progress=False,
                failure_horizon=0,
            )
        )
        result.pop("episodes", None)
        atomic_write(target, (json.dumps(result, indent=1) + "\n").encode())
    return json.loads(target.read_text())


def _round(cfg: Config, arm: str, r: int, clone: Path, data: Path) -> tuple[Path, Path, int]:
    """One round of `arm`: (its aggregated dataset, the retrained clone, expert labels it added)."""
    from datasets.demonstrations import read_manifest
    from drive import checkpoint
    from drive.learn.experiment import TrainRequest, train_and_evaluate
    from drive.loop.dagger import aggregate
    from drive.observe.demonstrations import recorder_for

    out = cfg.out / f"gd_{arm}{r}"
    start = cfg.first_seed + (r - 1) * cfg.episodes
    if not (out / "manifest.json").exists() or read_manifest(out).get("pending"):  # new, or stopped: resumed
        aggregate(
            DaggerOptions(
                ckpt=clone,
                data=data,
                out=out,
                seeds=f"{start}-{start + cfg.episodes - 1}",
                beta=cfg.beta,
                workers=cfg.workers,
                envs=cfg.envs,
                progress=False,
                calibrate_seeds=cfg.calibrate_seeds,
                query_quantile=cfg.query_quantile if arm == "gated" else None,
            ),
            recorder_for,
        )
    new = [e for e in read_manifest(out)["episodes"] if e.get("dagger") and e["seed"] >= start]
    run = cfg.out / f"gd_{arm[0].upper()}{r}"
    if not (run / "metrics.json").exists():
        name = checkpoint.read(cfg.ckpt, kind="controller")["name"]
        train_and_evaluate(
            TrainRequest(
                controller=name,
                out=run,
                data=str(out),
                epochs=cfg.epochs,
                batch_size=64,
                lr=1e-3,
                overrides=cfg.set,
                progress=False,
                command="drive bench dagger",
            )
        )
    return out, run / "best.pt", sum(int(e.get("labels", e["steps"])) for e in new)


def run(cfg: Config) -> int:
    from drive.observe.uq_plots import plot_dagger_curve

    if cfg.episodes < 1 or min(cfg.gated_rounds, cfg.plain_rounds) < 0:
        raise UserError("--episodes must be >= 1 and the round counts >= 0")
    cfg.out.mkdir(parents=True, exist_ok=True)
    c0 = _eval(cfg, cfg.ckpt, cfg.out / "gd_eval_C0.json")
    points = [
        {"arm": arm, "round": 0, "labels": 0, "mean_return": c0["mean_return"], "min_return": c0["min_return"]}
        for arm in ("gated", "plain")
    ]
    for arm, rounds in (("gated", cfg.gated_rounds), ("plain", cfg.plain_rounds)):
        clone, data, labels = cfg.ckpt, cfg.data, 0
        for r in range(1, rounds + 1):
            data, clone, added = _round(cfg, arm, r, clone, data)
            labels += added
            result = _eval(cfg, clone, cfg.out / f"gd_eval_{arm[0].upper()}{r}.json")
            points.append(
                {
                    "arm": arm,
                    "round": r,
                    "labels": labels,
                    "mean_return": result["mean_return"],
                    "min_return": result["min_return"],
                    "coverage90_steer": result.get("coverage90_steer"),
                }
            )
            print(
                f"{arm} round {r}: {labels} expert labels, return {result['mean_return']:.1f} "
                f"(worst {result['min_return']:.1f})"
            )
    atomic_write(
        cfg.out / "curve.json", (json.dumps({"points": points, "eval_seeds": cfg.eval_seeds}, indent=1) + "\n").encode()
    )
    figure = plot_dagger_curve(points, cfg.out / "curve.png")
    print(f"wrote {cfg.out / 'curve.json'} and {figure}")
    return 0
