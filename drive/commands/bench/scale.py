"""`drive bench scale`: collection frames/s on 1 and 2 Ray workers beside the local process pool, and training
samples/s on 1 and 2 DDP ranks beside one process using two threads, with an untimed warm-up, the variants timed in
alternating order over rounds (medians and spreads), start-up reported apart from throughput and the cores each run
was given. The method, its figures on this machine and what they cost: drive/studies/scale.py.

    drive bench scale --out runs/bench_scale.json            # ~9 minutes on 2 cores
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from datasets.files import atomic_write
from drive.errors import UserError
from drive.options import writable_file
from drive.studies import scale
from drive.studies.scale import ScaleOptions


@dataclass(frozen=True)
class Config(ScaleOptions):
    pass


def run(cfg: Config) -> int:
    from rich.console import Console

    if cfg.episodes < 2 or cfg.episodes % 2:
        raise UserError(f"--episodes must be even and >= 2, got {cfg.episodes}")
    if cfg.train_episodes < 3:
        raise UserError(f"--train-episodes must be >= 3 (train, validation and test splits), got {cfg.train_episodes}")
    unknown = set(cfg.skip) - set(scale.SKIPPABLE)
    if unknown:
        raise UserError(f"--skip {sorted(unknown)}: choose from {', '.join(scale.SKIPPABLE)}")
    if "collect" not in cfg.skip and "ray" not in cfg.skip:
        from drive.loop.pool import check_ray

        try:
            check_ray("local")
        except UserError as exc:
            raise UserError(f"{exc}; or time the process pool alone: --skip ray") from None
    if cfg.out is not None:
        writable_file(cfg.out, "--out")  # before ten minutes' measuring, not after
    import torch

    torch.set_num_threads(1)  # the 1-worker pool runs here: one thread, as the pool's and Ray's workers have
    console = Console() if sys.stdout.isatty() else Console(width=120)  # a log file: the ratios table unwrapped
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="bench_scale_data_"))
    try:
        data = work / "demos"
        warm = scale.warm_up(cfg, data, console)
        runs, ray_starts = scale.measure_collection(cfg, console) if "collect" not in cfg.skip else ([], [])
        train_runs = scale.measure_training(cfg, data, console) if "train" not in cfg.skip else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    collection, ratios = scale.collection_figures(runs, ray_starts)
    training: dict[str, scale.Spread] = {}
    if train_runs:
        training, train_ratios = scale.summarise(scale.by_round(train_runs, "samples_per_s"), scale.TRAINING_RATIOS)
        ratios.update(train_ratios)
    scale.print_tables(console, collection, training, ratios)
    results = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "warm_up_s": warm,
        "collection": {
            "runs": [r.to_dict() for r in runs],
            "ray_starts": [r.to_dict() for r in ray_starts],
            **{k: {v: asdict(s) for v, s in f.items()} for k, f in collection.items()},
        },
        "training": {
            "runs": [r.to_dict() for r in train_runs],
            "samples_per_s": {v: asdict(s) for v, s in training.items()},
        },
        "ratios": {k: asdict(s) for k, s in ratios.items()},
        "targets": scale.TARGETS,
        "verdicts": {k: scale.verdict(ratios[k], t) for k, t in scale.TARGETS.items() if k in ratios},
        "note": scale.shared_note(collection.get("cores", {})),
        "wall_s": time.time() - started,
    }
    if cfg.out is not None:
        atomic_write(Path(cfg.out), (json.dumps(results, indent=1) + "\n").encode())
        console.print(f"wrote {cfg.out}")
    return 0
