"""`drive bench controllers`: the six controllers (and NSAC's variants) at one budget, ≥ 3 seeds, with intervals.

    drive bench controllers --data runs/ref/data --out runs/ref/bench       # the reference recipe (README)
    drive bench controllers --data runs/ref/data --out runs/ref/bench &     # a second process shares the work
    drive bench controllers --data runs/ref/data --out runs/ref/bench --report-only
    drive bench controllers --data runs/ref/data --out runs/ref/converged --seeds 5 --split-seeds 0 1 \
        --patience 5 --epochs 100                                          # converged budgets, two fixed splits

Trains every row on --data with the same --epochs and --set (one `drive train` command per run, recorded in
results.md), drives each best.pt on --eval-seeds clean and under every --shifts condition, scores OOD detection on
the --ood families per seed, and reports every figure as mean ± 95 % interval over the seeds with Welch's test
against --reference (drive/studies/controllers/grid.py). Rerunning resumes; cells are locked, so two processes running
the same command split it. Writes OUT/results.json, OUT/results.md and OUT/returns.png, and what each run cost and
whether it converged: OUT/budget.json, OUT/budget.md, OUT/curves/<row>.png (drive/studies/controllers/budget.py).

The converged protocol: --patience P stops every run after P epochs without a better validation score, and --epochs
is then the cap (a run that reaches it is flagged "not converged"); --split-seeds N fixes the episodes' split
(task.split_seed) so the training seeds differ only in their initialisation; two or more values run the whole bench
on each split, in OUT/split<N>, and OUT/splits.md gives the split's share of the spread over runs.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from drive.errors import UserError
from drive.options import NonNegativeInt, PositiveInt

RESUMES = True  # rerunning the same command continues what an interrupted run left

BUDGET = ("task.stride=4", "n_heads=4", "trainer.patience=0")


@dataclass(frozen=True)
class Config:
    data: Path
    """the demonstrations every row trains on (a `drive collect` / `drive dagger` dataset)"""
    out: Path
    """benchmark directory: runs/, ood/, results.json, results.md, returns.png; rerunning resumes"""
    controllers: tuple[str, ...] = ("all",)
    """rows: all (nsac gmle mcd de der sdenet nsac-fit) or controller / variant names"""
    seeds: PositiveInt = 3
    """training seeds 0..N-1 per row (seed s also draws the episodes' train/val/test split, the same for every row,
    unless --split-seeds fixes it)"""
    epochs: PositiveInt = 5
    """epochs of every row (with --patience: the cap, which a converged run stops before)"""
    patience: NonNegativeInt | None = None
    """stop a run after this many epochs without a better validation score (trainer.patience; default: the --set
    budget's, trainer.patience=0: every run trains --epochs)"""
    split_seeds: tuple[int, ...] = ()
    """fix the episodes' train/val/test split (task.split_seed) for every training seed, which then varies only the
    initialisation; two or more: the bench on each split in OUT/split<N>, and OUT/splits.md (default: none, seed s
    draws its own split)"""
    set: tuple[str, ...] = BUDGET
    """KEY=VALUE overrides of every row (as drive train --set): the common budget"""
    reference: str = "nsac"
    """the row every other is tested against"""
    eval_seeds: str = "1000-1009"
    """unseen track seeds of the closed loop"""
    shifts: tuple[str, ...] = ("noise:0.2", "motion_blur:9")
    """closed-loop conditions besides the clean camera (drive eval --perturb specs)"""
    ood: str = "motion_blur:9,fog:0.5,hue:90,jpeg:90,rain:40,blur:2,noise:0.1,brightness:0.6"
    """drive ood families (KIND:LEVEL,...); NSAC's surrogate families (noise, brightness) are reported apart"""
    ood_episodes: PositiveInt = 8
    """test episodes per seed scored by drive ood"""
    max_episode_steps: PositiveInt = 1000
    """closed-loop step limit per episode"""
    envs: NonNegativeInt = 0
    """cars per process in the closed loop (0: as drive eval picks it)"""
    threads: PositiveInt = 1
    """torch CPU threads per process"""
    device: str = "cpu"
    """torch device"""
    report_only: bool = False
    """train and drive nothing: the report from the finished files"""
    progress: bool = True
    """progress bars"""


def overrides(cfg: Config, split_seed: int | None) -> tuple[str, ...]:
    """Every row's --set: the budget, then trainer.patience from --patience and task.split_seed from --split-seeds
    (each replacing a value --set gave); without those options exactly --set, so the commands are today's."""
    sets = list(cfg.set)
    for key, value in (("trainer.patience", cfg.patience), ("task.split_seed", split_seed)):
        if value is not None:
            sets = [s for s in sets if not s.startswith(f"{key}=")] + [f"{key}={value}"]
    return tuple(sets)


def splits(cfg: Config) -> list[tuple[int | None, Path]]:
    """(split seed, output folder) of each bench the command runs: OUT itself for none or one, OUT/split<N> each
    for several."""
    if any(s < 0 for s in cfg.split_seeds) or len(set(cfg.split_seeds)) < len(cfg.split_seeds):
        raise UserError(f"--split-seeds {' '.join(map(str, cfg.split_seeds))}: need distinct integers >= 0")
    if len(cfg.split_seeds) <= 1:
        return [(cfg.split_seeds[0] if cfg.split_seeds else None, cfg.out)]
    return [(s, cfg.out / f"split{s}") for s in cfg.split_seeds]


def run(cfg: Config) -> int:
    from drive.perturb.registry import parse_shift
    from drive.studies.controllers import budget

    if not cfg.report_only and not (cfg.data / "manifest.json").is_file():
        raise UserError(f"--data {cfg.data}: not a dataset (no manifest.json; record one with drive collect)")
    for spec in cfg.shifts:
        try:
            parse_shift(spec)
        except ValueError as exc:
            raise UserError(f"--shifts {spec!r}: {exc}") from None
    argv = sys.argv[3:] if sys.argv[1:3] == ["bench", "controllers"] else []
    command = "drive bench controllers " + (shlex.join(argv) if argv else f"--data {cfg.data} --out {cfg.out}")
    by_split: dict[int, dict] = {}
    for split_seed, out in splits(cfg):
        results = _bench(cfg, out, overrides(cfg, split_seed), command)
        if split_seed is not None:
            by_split[split_seed] = results
    if len(by_split) > 1:
        paths = budget.write_splits(cfg.out, by_split, command)
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _bench(cfg: Config, out: Path, sets: tuple[str, ...], command: str) -> dict:
    """One bench (one split): train, drive, score, report in `out`; returns results.json's dict."""
    from drive.studies.controllers import budget
    from drive.studies.controllers import grid as study_mod
    from drive.studies.controllers.text import write_report
    from drive.studies.offline import grid as offline  # torch and the simulator: not for `--help`

    grid = offline.make_grid(
        "demos",
        controllers=cfg.controllers,
        seeds=cfg.seeds,
        out=out,
        data=str(cfg.data),
        epochs=cfg.epochs,
        overrides=sets,
        threads=cfg.threads,
        device=cfg.device,
    )
    if cfg.reference not in grid.rows:
        raise UserError(f"--reference {cfg.reference!r} is not a row ({', '.join(grid.rows)})")
    study = study_mod.Study(
        grid,
        cfg.eval_seeds,
        tuple(cfg.shifts),
        cfg.ood,
        cfg.ood_episodes,
        cfg.envs,
        cfg.reference,
        cfg.max_episode_steps,
    )
    try:
        study_mod._families(study)  # a bad --ood fails here, not after the training
    except ValueError as exc:
        raise UserError(f"--ood: {exc}") from None
    cells = offline.cells(grid)
    if cfg.report_only and not any(offline.cell_state(c) == "done" for c in cells):
        raise UserError(f"--report-only: no finished training run in {out} (run without it first)")
    print(
        f"{len(cells)} training runs ({sum(offline.cell_state(c) == 'done' for c in cells)} done), "
        f"{len(cells) * len(study.conditions)} closed-loop runs -> {out}"
    )
    if not cfg.report_only:
        study_mod.expert_cell(study)
        offline.run_grid(grid, progress=cfg.progress)
        study_mod.ood_cells(study)
        study_mod.drive_cells(study, progress=cfg.progress)
    results = study_mod.aggregate(study)
    paths = [*write_report(out, results, command), *budget.write(out, grid)]
    ref = results["rows"].get(cfg.reference, {}).get("clean return", {})
    if ref.get("mean") is not None:
        print(f"{cfg.reference}: clean return {ref['mean']:.1f} (n={ref['n']})")
    print("wrote " + ", ".join(str(p) for p in paths))
    return results
