"""`drive dagger`: a DAgger round — the trained clone drives, the expert labels every state, the episodes are
aggregated with the data into a new dataset (drive/loop/dagger.py).

    drive dagger --ckpt runs/bc-nsac/best.pt --data runs/demos --out runs/demos-d1 --seeds 100-129 --beta 0.3

Rerunning the same command resumes a stopped round; a finished one says so and prints the same summary again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drive.loop.options import DaggerOptions

RESUMES = True  # rerunning the same command continues what an interrupted run left


@dataclass(frozen=True)
class Config(DaggerOptions):
    pass


def run(cfg: Config) -> int:
    from datasets.demonstrations import read_manifest
    from drive.loop.dagger import aggregate
    from drive.observe.demonstrations import recorder_for

    new = aggregate(cfg, recorder_for)
    manifest = read_manifest(cfg.out)
    # this round's episodes are its seeds (the source may hold DAgger episodes of an earlier round)
    seeds = {int(s) for s in manifest["settings"]["dagger"]["seeds"]}
    rounds = [e for e in manifest["episodes"] if int(e["seed"]) in seeds]
    n_source = len(manifest["episodes"]) - len(rounds)
    if not new:
        print(f"{cfg.out} is already complete: nothing recorded")
    elif len(new) < len(rounds):
        print(f"resumed {cfg.out}: {len(new)} episode(s) recorded now, {len(rounds) - len(new)} already there")
    print(
        f"{len(rounds)} DAgger episode(s) ({sum(r['steps'] for r in rounds)} frames, mean return under the mixture "
        f"{np.mean([r['return'] for r in rounds]):.1f}, {sum(r['labels'] for r in rounds)} expert labels)"
        f" + the {n_source} episodes of {cfg.data} -> {cfg.out}"
    )
    return 0
