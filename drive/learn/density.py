"""Fit a trained controller's feature density (agents/density_controller.py) and write it as a controller.

The density's mean and shrunk covariance come from the checkpoint's training split, its scale (the median score)
from its validation split, both rebuilt from its data fingerprint exactly as training built them (as `drive sa
calibrate` does: drive/learn/sa.py) and subsampled evenly to `--frames`. No track and no shift family is seen. The
report gives the score's quantiles on the validation and test splits (a typical frame scores ~1; the test split,
unseen by the fit, shows how far held-out nominal frames drift) and the regression report of the predictive on the
test split, which is the base's deterministic pass: the base drives exactly as its own deterministic pass drives.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from agents.density_controller import DensityController, DensityControllerConfig
from agents.layers.token_cache import check_cacheable
from agents.registry import CONTROLLERS, config_from_dict, config_to_dict
from datasets.root import portable
from drive import checkpoint
from drive.checkpoint import load_controller
from drive.errors import UserError
from drive.learn import tasks
from drive.learn.options import DensityOptions
from drive.learn.sa import data_fingerprint, evenly, test_report

CONTROLLER_FILE = "density_controller.pt"  # beside density.json
QUANTILES = (0.5, 0.9, 0.99)


class DensityFit(NamedTuple):
    report: dict[str, Any]  # density.json's dict
    controller: DensityController
    payload: dict[str, Any]  # the base checkpoint's


def _features(model: DensityController, x: Any, batch_size: int) -> Any:
    import torch

    return torch.cat([model.features(x[s : s + batch_size]) for s in range(0, len(x), batch_size)])


def fit(opts: DensityOptions) -> DensityFit:
    start = time.perf_counter()
    base, payload = load_controller(opts.ckpt)
    name = payload["name"]
    if name not in CONTROLLERS:
        raise UserError(f"{opts.ckpt}: {name!r} is a wrapper of a trained controller: fit its base's checkpoint")
    try:
        check_cacheable(base)
    except ValueError as exc:
        raise UserError(f"{opts.ckpt}: controller {name!r}: {exc}") from None
    data = tasks.rebuild(data_fingerprint(payload, opts.data))
    x_train, _ = evenly(data.train, opts.frames)
    x_val, _ = evenly(data.val, opts.frames)
    x_test, _ = evenly(data.test, opts.frames)
    probe = DensityController(DensityControllerConfig(name, config_from_dict(name, payload["config"]), 1), base=base)
    n_features = probe.features(x_val[:1]).shape[1]
    cfg = DensityControllerConfig(name, probe.cfg.base_config, n_features, batch_size=opts.batch_size)
    model = DensityController(cfg, base=base)
    figures = model.fit(_features(model, x_train, opts.batch_size), _features(model, x_val, opts.batch_size))
    scores = {split: _scores(model, x, opts.batch_size) for split, x in (("val", x_val), ("test", x_test))}
    report = {
        "ckpt": str(opts.ckpt),
        "controller": name,
        "task": data.name,
        "features": n_features,
        **figures,
        "score_quantiles": {
            split: {f"q{round(q * 100)}": float(np.quantile(v, q)) for q in QUANTILES} for split, v in scores.items()
        },
        "n_test": len(x_test),
        "test": test_report(model, data.test, data.target_names, opts.batch_size, 0),
        "total_s": time.perf_counter() - start,
    }
    return DensityFit(report, model, payload)


def _scores(model: DensityController, x: Any, batch_size: int) -> np.ndarray:
    parts = [model.predict(x[s : s + batch_size]).epistemic_var[:, 0] for s in range(0, len(x), batch_size)]
    return np.concatenate([p.numpy() for p in parts])


def save_controller(result: DensityFit, path: str | Path) -> Path:
    """The density controller as a controller checkpoint every closed-loop command loads (`--ckpt PATH`): the base's
    weights, standardisation and data fingerprint, the fitted density, and in extra["density"] how it was fitted;
    the base's own extra is kept apart, in extra["base"]. No absolute path of this machine is written."""
    report = result.report
    fitted = {k: report[k] for k in ("features", "shrinkage", "median_raw_score_val", "n_train", "n_val", "task")}
    return checkpoint.save(
        path,
        kind="controller",
        name="density",
        config=config_to_dict(result.controller.cfg),
        module=result.controller,
        normalisation=result.payload["normalisation"],
        data=result.payload["data"],
        metrics={"test": report["test"]},
        extra={
            "density": {**fitted, "base_ckpt": portable(str(report["ckpt"]))},
            "base": {
                "name": result.payload["name"],
                "extra": result.payload["extra"],
                "metrics": result.payload["metrics"],
            },
        },
    )
