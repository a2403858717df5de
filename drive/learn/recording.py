"""Offline evaluation of a steering checkpoint on every frame of Udacity driving logs (`drive eval --data udacity:DIR`).

No simulator, no training: each log is read in any variant `datasets.udacity.read_log` knows (header or not, `,` or
`", "`, relative, Windows or POSIX paths), every center frame goes through `datasets.udacity.preprocess` (what
training and `drive udacity drive` use), the controller predicts in batches of `batch_size` with S samples, and the
predictive Gaussian (mean, aleatoric + epistemic variance) is scored against the recorded steering with
`drive.metrics` (a controller taking F frames gets each frame stacked with its F - 1 predecessors of the same
segment, as in training): MSE, MAE, NLL, CRPS, ECE, coverage and width of the central 90 % interval. For scale,
`mse_mean_predictor` is the MSE of always predicting the checkpoint's training mean steering (`train_mean_steering`
in its data fingerprint; older checkpoints: the training-target mean the trainer standardised with, `y_loc`), and
`mse_ratio` = mse / mse_mean_predictor. A row naming a missing image, or an image that does not decode, is an error
naming the log's file and line; with `skip_bad` such rows are left out and counted (`skipped_rows`, `skipped`).

`plot_recording` draws predicted steering +- 2 sigma against the recorded steering over time (time from the image
names, gaps in a log drawn as breaks), one panel per recording.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from agents.base import Prediction
from agents.encoders import input_frames
from datasets.files import atomic_path
from datasets.udacity import UdacityLogError, load_row_frame, preprocess, read_log
from datasets.udacity_history import history_rows, stack_history
from datasets.udacity_laps import frame_times
from drive import metrics
from drive.checkpoint import CheckpointError, load_controller
from drive.errors import UserError

log = logging.getLogger(__name__)
PREFIX = "udacity:"


class Scored(NamedTuple):
    """One recording's frames as scored: time, recorded steering, the predictive, log rows used."""

    name: str
    t: np.ndarray  # (N,) seconds since the first frame of the log
    y: np.ndarray  # (N,) recorded steering
    pred: Prediction  # (N, 1) each
    lines: np.ndarray  # (N,) line numbers in the log


def parse_data(data: str) -> list[Path]:
    if not data.startswith(PREFIX) or not data[len(PREFIX) :].strip(","):
        raise UserError(f"--data must be udacity:DIR[,DIR...] (a driving_log.csv and its IMG/), got {data!r}")
    paths = [Path(p) for p in data[len(PREFIX) :].split(",") if p]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise UserError(f"--data: no such recording {', '.join(missing)}")
    return paths


def load_steering_model(path: str | Path) -> tuple[Any, dict[str, Any], float, str]:
    """(controller, payload, training mean steering, where that mean came from); refuses non-Udacity checkpoints."""
    model, payload = load_controller(path)
    encoder, out_dim = payload["config"].get("encoder", {}), payload["config"].get("out_dim")
    if encoder.get("kind") != "nvidia" or out_dim != 1:
        raise CheckpointError(
            f"{path}: a controller for {encoder.get('kind')!r} input with {out_dim} output(s); "
            "scoring a driving log needs one trained on Udacity frames (drive train --data "
            "udacity:DIR)"
        )
    data = payload.get("data", {})
    if "train_mean_steering" in data:
        return model, payload, float(data["train_mean_steering"]), "checkpoint data.train_mean_steering"
    return model, payload, float(payload["normalisation"]["y_loc"][0]), "checkpoint normalisation.y_loc"


def _frames(path: Path, skip_bad: bool, progress: bool) -> tuple[Any, np.ndarray, list[int], list[str]]:
    """The log, its preprocessed center frames (N, 3, 66, 200) uint8, the rows kept, and skipped-row messages."""
    log_ = read_log(path, skip_bad=skip_bad)
    skipped, rows, xs = list(log_.skipped), [], []
    for i in tqdm(range(len(log_)), desc=f"frames {log_.path.parent.name}", leave=False, disable=not progress):
        try:
            xs.append(preprocess(load_row_frame(log_, i)))
        except UdacityLogError as exc:
            if not skip_bad:
                raise
            skipped.append(str(exc))
            continue
        rows.append(i)
    if not rows:
        raise UdacityLogError(f"{log_.path}: no readable frame ({len(skipped)} rows skipped)")
    return log_, np.stack(xs), rows, skipped


@torch.no_grad()
def predict_frames(model, x: np.ndarray, samples: int | None, seed: int, batch_size: int) -> Prediction:
    generator = torch.Generator().manual_seed(seed)
    parts = []
    for start in range(0, len(x), batch_size):
        batch = torch.from_numpy(x[start : start + batch_size])  # (B, 3 F, 66, 200) uint8
        parts.append(model.predict(batch, samples, generator))
    return Prediction(*(torch.cat(ts) for ts in zip(*parts, strict=True)))


def score(y: np.ndarray, pred: Prediction, train_mean: float) -> dict[str, Any]:
    """The metrics of one set of frames (y (N,) recorded steering)."""
    target = torch.as_tensor(y, dtype=torch.float32).reshape(-1, 1)
    report = metrics.regression_report(pred, target)
    mse_mean = metrics.mse(np.full(target.shape, train_mean), target)
    return {
        "n_frames": int(len(y)),
        "mse": report["mse"],
        "mae": report["mae"],
        "nll": report["nll"],
        "crps": report["crps"],
        "coverage90": report["coverage_90"],
        "width90": report["width_90"],
        "ece": report["ece"],
        "mse_mean_predictor": mse_mean,
        "mse_ratio": report["mse"] / mse_mean if mse_mean > 0 else math.inf,
        "coverage50": report["coverage_50"],
        "pit_w1": report["pit_w1"],
        "aleatoric_var": report["aleatoric_var"],
        "epistemic_var": report["epistemic_var"],
    }


def evaluate_recordings(
    ckpt: str | Path,
    data: str,
    *,
    samples: int | None = None,
    seed: int = 0,
    batch_size: int = 256,
    skip_bad: bool = False,
    progress: bool = True,
) -> tuple[dict[str, Any], list[Scored]]:
    """Score a checkpoint on every frame of the recordings; returns (results, per-recording scored frames)."""
    paths = parse_data(data)
    if batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {batch_size}")
    model, payload, train_mean, origin = load_steering_model(ckpt)
    start = time.perf_counter()
    scored, skipped, per = [], [], {}
    for path in paths:
        log_, x, rows, bad = _frames(path, skip_bad, progress)
        skipped += bad
        t = frame_times([log_.center[i] for i in rows])
        x = stack_history(x, history_rows(t, input_frames(model)))  # (N, 3 F, 66, 200): F = 1 leaves x as is
        t0 = time.perf_counter()
        pred = predict_frames(model, x, samples, seed, batch_size)
        log.info("%s: %d frames predicted in %.1f s", log_.path, len(x), time.perf_counter() - t0)
        scored.append(Scored(log_.path.parent.name, t, log_.steering[rows], pred, log_.line[rows]))
        per[str(log_.path)] = score(log_.steering[rows], pred, train_mean)
    y = np.concatenate([s.y for s in scored])
    pooled = Prediction(*(torch.cat(ts) for ts in zip(*(s.pred for s in scored), strict=True)))
    results = {
        "checkpoint": str(ckpt),
        "controller": payload["name"],
        "data": [str(p) for p in paths],
        **score(y, pooled, train_mean),
        "train_mean_steering": train_mean,
        "train_mean_origin": origin,
        "n_samples": samples,
        "seed": seed,
        "skipped_rows": len(skipped),
        "skipped": skipped[:100],
        "trained_on": [r.get("path") for r in payload.get("data", {}).get("recordings", [])]
        or [payload.get("data", {}).get("path")],
        "wall_s": time.perf_counter() - start,
    }
    if len(paths) > 1:
        results["per_recording"] = per
    return results, scored


def describe(results: dict[str, Any]) -> str:
    r = results
    line = (
        f"{r['controller']} on {r['n_frames']} frames: mse {r['mse']:.5f} (mean predictor "
        f"{r['mse_mean_predictor']:.5f}, ratio {r['mse_ratio']:.3f}), mae {r['mae']:.4f}, nll {r['nll']:.3f}, "
        f"crps {r['crps']:.4f}, coverage90 {r['coverage90']:.3f} (width {r['width90']:.3f}), ece {r['ece']:.4f}"
    )
    return line + (f"; {r['skipped_rows']} rows skipped" if r["skipped_rows"] else "")


def plot_recording(scored: list[Scored], path: Path, title: str = "") -> Path:
    """Predicted steering +- 2 sigma against the recorded steering over time, one panel per recording."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(scored), 1, figsize=(14, 3.2 * len(scored)), squeeze=False)
    for ax, s in zip(axes[:, 0], scored, strict=True):
        t = s.t.astype(np.float64).copy()
        breaks = np.flatnonzero(np.diff(t) > 1.0) + 1  # a gap in the log: no line across it
        mean = s.pred.mean[:, 0].numpy().astype(np.float64)
        std = np.sqrt((s.pred.aleatoric_var + s.pred.epistemic_var)[:, 0].numpy().astype(np.float64))
        for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, len(t)], strict=True):
            sl = slice(lo, hi)
            ax.fill_between(
                t[sl],
                (mean - 2 * std)[sl],
                (mean + 2 * std)[sl],
                color="tab:blue",
                alpha=0.25,
                lw=0,
                label="predicted ± 2σ" if lo == 0 else None,
            )
            ax.plot(t[sl], s.y[sl], color="k", lw=0.8, label="recorded" if lo == 0 else None)
            ax.plot(t[sl], mean[sl], color="tab:blue", lw=1.0, label="predicted mean" if lo == 0 else None)
        for b in breaks:
            ax.axvspan(t[b - 1], t[b], color="0.85", lw=0)
        ax.set(ylabel="steering", xlabel="time in the log (s)", title=f"{s.name}: {len(t)} frames", ylim=(-1.05, 1.05))
        ax.legend(loc="upper right", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path
