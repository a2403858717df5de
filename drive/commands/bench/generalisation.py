"""`drive bench generalisation`: every controller on CarRacingExtension's variants (Color, Color3, Bar, Blob, Noise;
Video with `--video DIR`), ungated and gated, beside the suite's published agents
(drive/studies/generalisation/suite.py).

    drive bench generalisation --ckpt checkpoints/carracing_nsac.pt --out runs/gen --seeds 1000-1099 --workers 2

DIR/points/ keeps each (controller, variant, gate) as it finishes, so a rerun resumes; DIR/results.json and
DIR/results.md hold the tables, DIR/returns.png the returns per variant beside AttentionAgent's, DIR/variants.png
one frame of each variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from datasets.root import portable
from drive.errors import UserError
from drive.loop.options import SHIPPED_CONTROLLER, SHIPPED_HINT
from drive.options import NonNegativeInt, PositiveInt, Workers, writable_dir

RESUMES = True  # rerunning the same command continues what an interrupted run left

VARIANTS = ("carracing:color", "carracing:color3", "carracing:bar", "carracing:blob", "carracing:noise")


@dataclass(frozen=True)
class Config:
    out: Path
    """output directory (points/, results.json, results.md, returns.png, variants.png); rerunning resumes"""
    ckpt: Annotated[tuple[Path, ...], SHIPPED_HINT] = (SHIPPED_CONTROLLER,)
    """controller checkpoints; paths that differ only in a seed<N> part are one controller over training seeds"""
    variants: tuple[str, ...] = VARIANTS
    """the suite's variants as shifts (the clean env always runs too): carracing:color, :color3, :bar, :blob,
    :noise"""
    video: Path | None = None
    """a folder of PNG frames: adds the Video variant (the grass replaced by these frames)"""
    gates: tuple[str, ...] = ("slow", "expert")
    """the gated runs beside the ungated one: slow (nothing privileged) and expert (a privileged oracle bound); any
    `drive eval --fallback` spec"""
    seeds: str = "1000-1099"
    """unseen track seeds, the same for every point (the leaderboard uses 100 episodes)"""
    calibrate_seeds: str = "2000-2002"
    """nominal laps (clean, ungated) that set a controller's gate threshold when its checkpoint stores none, once
    per controller (DIR/thresholds.json)"""
    max_episode_steps: PositiveInt = 1000
    """step limit per episode"""
    workers: Workers = 1
    """parallel worker processes"""
    envs: NonNegativeInt = 0
    """cars per worker process, one controller call per step for all (0: min(64, seeds per worker))"""
    samples: PositiveInt | None = None
    """stochastic samples per step (default: each controller's own)"""
    progress: bool = False
    """progress bars"""
    report_only: bool = False
    """drive nothing: the tables from the points already in DIR/points/ (an unfinished run says how many are
    missing)"""


def run(cfg: Config) -> int:
    from drive.loop.fallback import parse_fallback
    from drive.loop.seeds import parse_seeds
    from drive.perturb.registry import parse_shift  # the simulator and torch: not for `--help`
    from drive.studies.generalisation import figures
    from drive.studies.generalisation import suite as generalisation
    from drive.studies.generalisation.tables import tables

    if not cfg.ckpt:
        raise UserError("give at least one --ckpt")
    variants = [*cfg.variants, *([f"carracing:video={cfg.video}"] if cfg.video is not None else [])]
    for variant in variants:
        try:
            shift = parse_shift(variant)
        except ValueError as exc:
            raise UserError(f"--variants {variant!r}: {exc}") from None
        if not shift.family.startswith("carracing:"):
            raise UserError(f"--variants {variant!r}: not a CarRacingExtension variant (carracing:KIND)")
    for gate in cfg.gates:
        if gate == "off" or parse_fallback(gate) is None:
            raise UserError(
                f"--gates {gate!r}: give a fallback (slow, expert, MODE:KEY=VALUE); the ungated run is always there"
            )
    for path in cfg.ckpt:
        if not path.is_file():
            raise UserError(f"--ckpt {path}: no such file")
    for option, spec in (("--seeds", cfg.seeds), ("--calibrate-seeds", cfg.calibrate_seeds)):
        try:
            parse_seeds(spec)
        except UserError as exc:
            raise UserError(f"{option}: {exc}") from None
    if cfg.report_only and not (cfg.out / "points").is_dir():
        raise UserError(f"--report-only: {cfg.out / 'points'} does not exist: nothing has been driven there")
    writable_dir(cfg.out, "--out")
    # controllers named relative to the working directory: results.json stores no machine's folders
    suite = generalisation.Suite(
        controllers=tuple(str(portable(str(p))) for p in cfg.ckpt),
        variants=(generalisation.CLEAN, *variants),
        gates=cfg.gates,
        seeds=cfg.seeds,
        calibrate_seeds=cfg.calibrate_seeds,
        max_episode_steps=cfg.max_episode_steps,
        workers=cfg.workers,
        envs=cfg.envs,
        samples=cfg.samples,
        progress=cfg.progress,
    )
    results = generalisation.run(cfg.out, suite, drive=not cfg.report_only)
    text = "\n".join(tables(results)) + "\n"
    (cfg.out / "results.md").write_text(text)
    frames = figures.frames_figure(cfg.out / "variants.png", suite.variants)
    returns = figures.returns_figure(cfg.out / "returns.png", results)
    print(text)
    print(f"wrote {cfg.out / 'results.json'}, {cfg.out / 'results.md'}, {returns} and {frames}")
    return 0
