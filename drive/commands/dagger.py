"""`drive dagger`: a DAgger round — the trained clone drives, the expert labels every state, the episodes are
aggregated with the data into a new dataset (drive/loop/dagger.py).

    drive dagger --ckpt runs/bc-nsac/best.pt --data runs/demos --out runs/demos-d1 --seeds 100-129 --beta 0.3
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datasets.demonstrations import read_manifest
from drive.loop.dagger import DaggerOptions, aggregate
from drive.observe.demonstrations import recorder_for


@dataclass(frozen=True)
class Config(DaggerOptions):
    pass


def run(cfg: Config) -> int:
    new = aggregate(cfg, recorder_for)
    returns = [r["return"] for r in new]
    total = len(read_manifest(cfg.out)["episodes"])
    print(f"{len(new)} DAgger episode(s) ({sum(r['steps'] for r in new)} frames, mean return under the mixture "
          f"{np.mean(returns):.1f}, {sum(r['labels'] for r in new)} expert labels)"
          f" + the {total - len(new)} episodes of {cfg.data} -> {cfg.out}")  # fmt: skip
    return 0
