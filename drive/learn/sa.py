"""Inference-time stochastic attention (SA) on a trained controller: nu chosen on its validation split, its test split
reported without and with SA, and the controller with SA engaged at that nu written as a checkpoint to drive
(`drive sa calibrate --ckpt PATH --out DIR`; DIR/sa_controller.pt, agents/sa_controller.py).

SA (agents/layers/stochastic_attention.py) resamples the attention weights of a trained model; its concentration nu
is chosen on a held-out calibration split by `agents.sa.calibrate_nu` (Bayesian optimisation of L_SA). Here:

- calibration split = the checkpoint's validation split, report split = its test split, both rebuilt from its
  data fingerprint exactly as training built them (`drive.learn.tasks.rebuild`, any task); `--frames` subsamples
  the validation inputs evenly;
- f(x) = the controller's `deterministic_pass` (standardised target units; y standardised with the same y_loc /
  y_scale): `predict` for GMLE, DE (all members, exact) and DER (closed form); NSAC's mean-logit pass. A controller
  whose own sampling would be counted as SA dispersion says so in `sa_refusal` (MC dropout, SDE-Net) and is refused;
- on the test split: the controller's own predictive (`predict`, as `drive train` reports it) against SA at the
  chosen nu, M passes of the deterministic pass: mean = E_m[mean_m], epistemic = Var_m[mean_m] + E_m[epistemic_m]
  (law of total variance; the last term is the deterministic pass's own epistemic variance: 0 for GMLE and NSAC's
  mean-logit pass, the member disagreement for DE, the NIG closed form for DER). That predictive is
  `agents.sa_controller.SAController`'s `predict`, the very controller `save_controller` writes: the checkpoint,
  loaded and asked with the same seed and batches, gives the test report in sa.json bit for bit.
- the head's predicted noise, both ways (`test.with_sa` and `test.with_sa_plus_head` in sa.json): L_SA tunes the
  pass spread to the whole residual ||y - f(x)||, noise included, so for a Gaussian-head controller adding the
  head's aleatoric variance E_m[aleatoric_m] on top counts the noise twice (the FT-Transformer's docstring makes the
  same argument for a point model). `with_sa` is SA as the paper defines it, the spread alone (aleatoric 0);
  `with_sa_plus_head` adds the head's variance, what this command reported before. Which calibrates better is a
  measurement per controller and task (docs/methods.md: on a GMLE the spread alone under-covers, the head's noise
  on top covers); the saved controller keeps the head's noise unless `--no-head-variance`.
The encoder runs once per stack: SA only touches attention, so every encoder is swapped for a lookup into tokens
computed beforehand (agents/layers/token_cache.py) and the M passes run the attention and heads alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from agents.layers.token_cache import cached_encoders, chunked_pass
from agents.registry import config_from_dict, config_to_dict
from agents.sa import calibrate_nu
from agents.sa_controller import SAController, SAControllerConfig
from datasets.regenerate import relocate
from datasets.root import portable
from drive import checkpoint, metrics
from drive.checkpoint import load_controller
from drive.errors import UserError
from drive.learn import tasks
from drive.learn.batches import predict_dataset, take
from drive.learn.options import SAOptions

log = logging.getLogger(__name__)

NU_BOUNDS = (1, 1 << 16)  # widened by agents.sa.calibrate_nu while the choice sits on an edge
MAX_EVALS = 12  # agents.sa.calibrate_nu's default budget of L_SA evaluations
SHOWN = ("mse", "nll", "crps", "ece", "coverage_90", "width_90", "aleatoric_var", "epistemic_var")


def evenly(val: Any, n_frames: int) -> tuple[Tensor, Tensor]:
    n = len(val)
    idx = np.arange(n) if n_frames <= 0 or n_frames >= n else np.unique(np.linspace(0, n - 1, n_frames).round())
    return take(val, torch.as_tensor(idx, dtype=torch.long))


def test_report(predictor: Any, test: Any, target_names: tuple[str, ...], batch_size: int, seed: int) -> dict:
    """The regression report over the test split, overall and per target."""
    pred, y = predict_dataset(predictor, test, batch_size, None, seed)
    per_target = {
        name: metrics.regression_report(type(pred)(*(t[:, d : d + 1] for t in pred)), y[:, d : d + 1])
        for d, name in enumerate(target_names)
    }
    return {**metrics.regression_report(pred, y), "per_target": per_target}


@contextmanager
def _progress_over_evaluations(show: bool, total: int) -> Iterator[None]:
    """A rich bar advanced by agents.sa's log record of each evaluation of nu (the library logs, the CLI shows)."""
    if not show:
        yield
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    sa_log = logging.getLogger("agents.sa")
    with Progress(
        TextColumn("SA nu search"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        transient=False,
    ) as bar:
        task = bar.add_task("", total=total)

        class _Advance(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                nu, loss, disp = record.args
                bar.update(task, advance=1, description=f"nu={nu} L_SA={loss:.4g} dispersion={disp:.3g}")

        handler, level, propagate = _Advance(), sa_log.level, sa_log.propagate
        sa_log.addHandler(handler)
        sa_log.setLevel(logging.INFO)
        sa_log.propagate = False
        try:
            yield
        finally:
            sa_log.removeHandler(handler)
            sa_log.setLevel(level)
            sa_log.propagate = propagate


def data_fingerprint(payload: dict[str, Any], data: Path | None) -> dict[str, Any]:
    """The checkpoint's data fingerprint, pointed at `data` where given (demonstrations regenerated elsewhere, or
    another data root)."""
    fingerprint = dict(payload.get("data", {}))
    if data is None:
        return fingerprint
    if fingerprint.get("task") == "demos":
        return dict(relocate(fingerprint, data))
    return {**fingerprint, "data_path": str(data)}


class SACalibration(NamedTuple):
    report: dict[str, Any]  # sa.json's dict
    controller: SAController  # SA at the chosen nu, the head's noise as `opts.head_variance` says (sa_controller.pt)
    payload: dict[str, Any]  # the base checkpoint's


def calibrate(opts: SAOptions) -> SACalibration:
    """Choose nu on the validation split, report the test split without and with SA, and build the SA controller."""
    if opts.passes < 2:
        raise UserError(f"--passes must be >= 2 (SA dispersion needs several passes), got {opts.passes}")
    start = time.perf_counter()
    model, payload = load_controller(opts.ckpt)
    name = payload["name"]
    refusal = getattr(model, "sa_refusal", None)
    if refusal:
        raise UserError(f"{opts.ckpt}: controller {name!r} has no deterministic base pass: {refusal}")
    data = tasks.rebuild(data_fingerprint(payload, opts.data))
    x_cal, y_cal = evenly(data.val, opts.frames)
    log.info("%s: %d calibration inputs, %d test inputs", opts.ckpt, len(x_cal), len(data.test))
    without = test_report(model, data.test, data.target_names, opts.batch_size, opts.seed)
    y_std = (y_cal - model.y_loc) / model.y_scale  # (N, D)
    with cached_encoders(model, opts.batch_size) as tokens:
        encode_start = time.perf_counter()
        t_cal = tokens(x_cal)  # (N, E, T, d)
        encode_s = time.perf_counter() - encode_start

        def forward(m: nn.Module, t: Tensor) -> Tensor:
            return chunked_pass(m, t, opts.batch_size).mean

        with _progress_over_evaluations(opts.progress, MAX_EVALS):
            result = calibrate_nu(
                model,
                t_cal,
                y_std,
                forward=forward,
                n_passes=opts.passes,
                nu_bounds=NU_BOUNDS,
                max_evals=MAX_EVALS,
                seed=opts.seed,
            )
    base_cfg = config_from_dict(name, payload["config"])
    sa_cfg = SAControllerConfig(name, base_cfg, result.nu, opts.passes, batch_size=opts.batch_size)
    reports = {}
    for key, head in (("with_sa", False), ("with_sa_plus_head", True)):
        sa = SAController(replace(sa_cfg, head_variance=head), base=model)
        reports[key] = test_report(sa, data.test, data.target_names, opts.batch_size, opts.seed)
    report = {
        "ckpt": str(opts.ckpt),
        "controller": name,
        "task": data.name,
        "nu": result.nu,
        "nu_bounds": list(result.nu_bounds),
        "curve": [[c["nu"], c["loss"], c["dispersion"]] for c in result.curve],
        "curve_columns": ["nu", "loss", "dispersion"],
        "wall_time_s": result.wall_time_s,
        "n_evals": result.n_evals,
        "converged": result.converged,
        "at_bound": result.at_bound,
        "n_extensions": result.n_extensions,
        "encode_s": encode_s,
        "total_s": time.perf_counter() - start,
        "target_dispersion": result.target_dispersion,
        "slope": result.slope,
        "intercept": result.intercept,
        "n_passes": opts.passes,
        "seed": opts.seed,
        "n_calibration": len(x_cal),
        "n_test": len(data.test),
        "head_variance": opts.head_variance,
        "test": {"without_sa": without, **reports},
    }
    return SACalibration(report, SAController(replace(sa_cfg, head_variance=opts.head_variance), base=model), payload)


CONTROLLER_FILE = "sa_controller.pt"  # beside sa.json


def save_controller(cal: SACalibration, path: str | Path) -> Path:
    """Write the SA controller as a controller checkpoint every closed-loop command loads (`--ckpt PATH`): the base's
    weights, standardisation and data fingerprint (the frame coder and the labelling expert come from it), nu, and
    in extra["sa"] how nu was chosen; the base's own extra (its fallback threshold and temperature fit, made for its
    own predictive) is kept apart, in extra["base"]. No absolute path of this machine is written."""
    report = cal.report
    test = report["test"]["with_sa_plus_head" if cal.controller.cfg.head_variance else "with_sa"]
    sa = {key: report[key] for key in ("nu", "nu_bounds", "at_bound", "n_passes", "seed", "n_calibration", "task")}
    return checkpoint.save(
        path,
        kind="controller",
        name="sa",
        config=config_to_dict(cal.controller.cfg),
        module=cal.controller,
        normalisation=cal.payload["normalisation"],
        data=cal.payload["data"],
        metrics={"test": test, "test_without_sa": report["test"]["without_sa"]},
        extra={
            "sa": {**sa, "base_ckpt": portable(str(report["ckpt"]))},
            "base": {"name": cal.payload["name"], "extra": cal.payload["extra"], "metrics": cal.payload["metrics"]},
        },
    )


def plot_curve(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nus, losses, disps = (np.array(c, dtype=float) for c in zip(*result["curve"], strict=True))
    fig, (ax_loss, ax_disp) = plt.subplots(2, 1, figsize=(6, 6), sharex=True)
    ax_loss.loglog(nus, losses, "o-", color="C0")
    ax_loss.set_ylabel("L_SA (calibration split)")
    ax_disp.loglog(nus, disps, "o-", color="C1", label="dispersion E||f_nu - f||")
    ax_disp.axhline(result["target_dispersion"], color="C2", ls=":", label="target dispersion")
    ax_disp.set_ylabel("dispersion (standardised units)")
    ax_disp.set_xlabel("nu")
    for ax in (ax_loss, ax_disp):
        ax.axvline(result["nu"], color="k", ls="--", label=f"chosen nu = {result['nu']}")
        ax.grid(True, which="both", alpha=0.3)
    ax_disp.legend(fontsize=8)
    fig.suptitle(f"SA calibration: {result['controller']} ({result['wall_time_s']:.1f} s, {result['n_evals']} evals)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
