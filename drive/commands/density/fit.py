"""`drive density fit --ckpt PATH --out DIR`: fit a Gaussian density on a trained controller's encoder features (its
training split; the scale on its validation split) and write DIR/density_controller.pt, the controller whose
epistemic signal is that density's Mahalanobis score (agents/density_controller.py: the post-hoc, DDU-style
single-pass reference), and DIR/density.json. Every command taking `--ckpt PATH` drives it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from datasets.files import atomic_write
from drive.learn.options import DensityOptions
from drive.options import writable_dir


@dataclass(frozen=True)
class Config(DensityOptions):
    pass


def run(cfg: Config) -> int:
    from drive.learn.density import CONTROLLER_FILE, fit, save_controller  # torch: not for `--help`

    writable_dir(cfg.out, "--out")
    result = fit(cfg)
    report = result.report
    cfg.out.mkdir(parents=True, exist_ok=True)
    atomic_write(cfg.out / "density.json", (json.dumps(report, indent=1) + "\n").encode())
    saved = save_controller(result, cfg.out / CONTROLLER_FILE)
    quantiles = report["score_quantiles"]
    print(
        f"{report['controller']}: Gaussian on {report['features']} encoder features of {report['n_train']} training "
        f"inputs (Ledoit-Wolf shrinkage {report['shrinkage']:.3f}); score median / q90 / q99 on validation "
        f"{quantiles['val']['q50']:.2f} / {quantiles['val']['q90']:.2f} / {quantiles['val']['q99']:.2f}, on test "
        f"{quantiles['test']['q50']:.2f} / {quantiles['test']['q90']:.2f} / {quantiles['test']['q99']:.2f}; "
        f"{report['total_s']:.0f} s"
    )
    print(f"wrote {cfg.out / 'density.json'} and {saved}; drive it with `drive eval --ckpt {saved}`")
    return 0
