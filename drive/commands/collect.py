"""`drive collect`: record expert demonstrations in CarRacing (resumable, parallel workers).

    drive collect --expert pursuit --seeds 0-59 --episodes 60 --action-noise 0.15 --workers 2 --out runs/demos

Killed at any moment, the same command resumes with nothing lost (drive/loop/collect.py); the dataset format is
datasets/demonstrations.py. Frames are stored coded for controllers (`--frame-coding full`, what `drive train`
reads by default); `--keep-raw` also keeps the raw RGB frames.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from drive.loop.options import CollectOptions

RESUMES = True  # rerunning the same command continues what an interrupted run left


@dataclass(frozen=True)
class Config(CollectOptions):
    pass


def run(cfg: Config) -> int:
    from datasets.demonstrations import read_manifest
    from drive.loop.collect import collect
    from drive.observe.demonstrations import recorder_for

    summary = collect(cfg, recorder_for)
    records = read_manifest(summary.out)["episodes"]
    flagged = [r["seed"] for r in records if r["flagged"]]
    print(
        f"recorded {len(summary.new)} new episode(s), {summary.frames} frames in {summary.seconds:.1f} s "
        f"({summary.fps:.0f} frames/s); {summary.skipped} already there"
    )
    print(
        f"dataset {summary.out}: {len(records)} episode(s), {len(flagged)} flagged (return < {cfg.min_return})"
        + (f": seeds {flagged}" if flagged else "")
    )
    if records and len(flagged) == len(records):
        print(
            "every episode is flagged, so `drive train` has nothing to train on: rerun this command with "
            "--min-return LOWER (e.g. --min-return 0; nothing is recorded again), or train with "
            "--set task.include_flagged=true"
        )
    print(f"inspect with: drive data info {shlex.quote(str(summary.out))}")
    return 0
