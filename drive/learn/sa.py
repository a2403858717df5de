"""Inference-time stochastic attention (SA) on a trained controller: nu chosen on its validation split, its test split
reported without and with SA (`drive sa calibrate --ckpt PATH`).

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
  mean-logit pass, the member disagreement for DE, the NIG closed form for DER).
- the head's predicted noise, both ways (`test.with_sa` and `test.with_sa_plus_head` in sa.json): L_SA tunes the
  pass spread to the whole residual ||y - f(x)||, noise included, so for a Gaussian-head controller adding the
  head's aleatoric variance E_m[aleatoric_m] on top counts the noise twice (the FT-Transformer's docstring makes the
  same argument for a point model). `with_sa` is SA as the paper defines it, the spread alone (aleatoric 0);
  `with_sa_plus_head` adds the head's variance, what this command reported before. Which calibrates better is a
  measurement per controller and task: docs/sa_study.md shows both.
The encoder runs once per stack: SA only touches attention, so every encoder is swapped for a lookup into tokens
computed beforehand (`_cached_encoders`) and the M passes run the attention and heads alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from agents.base import Prediction
from agents.layers.stochastic_attention import stochastic_attention
from agents.sa import calibrate_nu
from datasets.regenerate import relocate
from drive import metrics
from drive.checkpoint import load_controller
from drive.errors import UserError
from drive.learn import tasks
from drive.learn.batches import predict_dataset, take
from drive.learn.options import SAOptions

log = logging.getLogger(__name__)

NU_BOUNDS = (1, 1 << 16)  # widened by agents.sa.calibrate_nu while the choice sits on an edge
MAX_EVALS = 12  # agents.sa.calibrate_nu's default budget of L_SA evaluations
SHOWN = ("mse", "nll", "crps", "ece", "coverage_90", "width_90", "aleatoric_var", "epistemic_var")


class _Take(nn.Module):
    """Stands in for encoder i: (B, E, T, d) precomputed tokens of all E encoders -> (B, T, d) of this one."""

    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def forward(self, tokens: Tensor) -> Tensor:
        return tokens[:, self.index]


@contextmanager
def _cached_encoders(model: nn.Module, batch_size: int) -> Iterator[Callable[[Tensor], Tensor]]:
    """Swap each `encoder` submodule for `_Take(i)`; yields tokens(x) -> (B, E, T, d) from the original encoders.

    Inside the block the model takes those tokens as its input. The encoders are put back on exit (also on error).
    """
    if getattr(getattr(model, "cfg", None), "time_feature", -1) >= 0:
        raise ValueError("NSAC reads time stamps from its raw input (time_feature >= 0): tokens cannot stand in")
    slots = [(model.get_submodule(n.rpartition(".")[0]), n.rpartition(".")[2]) for n, _ in model.named_modules()]
    slots = [(parent, attr) for parent, attr in slots if attr == "encoder"]
    if not slots:
        raise ValueError(f"{type(model).__name__} has no `encoder` submodule")
    encoders = [getattr(parent, attr) for parent, attr in slots]

    @torch.no_grad()
    def tokens(x: Tensor) -> Tensor:
        parts = [torch.stack([enc(x[s : s + batch_size]) for enc in encoders], 1) for s in range(0, len(x), batch_size)]
        return torch.cat(parts)  # (B, E, T, d)

    try:
        for i, (parent, attr) in enumerate(slots):
            setattr(parent, attr, _Take(i))
        yield tokens
    finally:
        for (parent, attr), enc in zip(slots, encoders, strict=True):
            setattr(parent, attr, enc)


def _chunked(model: nn.Module, tokens: Tensor, batch_size: int) -> Prediction:
    parts = [model.deterministic_pass(tokens[s : s + batch_size]) for s in range(0, len(tokens), batch_size)]  # type: ignore[operator]
    return Prediction(*(torch.cat(ts) for ts in zip(*parts, strict=True)))


class SAPredictor:
    """`predict` of the controller under SA at concentration nu: M stochastic passes of the deterministic pass,
    combined by the law of total variance, in original units. Must be used inside `_cached_encoders`."""

    def __init__(
        self,
        model: nn.Module,
        tokens: Callable[[Tensor], Tensor],
        nu: int,
        n_passes: int,
        batch_size: int,
        head_variance: bool = False,
    ):
        self.model, self.tokens = model, tokens
        self.nu, self.n_passes, self.batch_size = nu, n_passes, batch_size
        self.head_variance = head_variance

    def eval(self) -> SAPredictor:
        return self

    @torch.no_grad()
    def predict(self, x: Tensor, samples: int | None = None, generator: torch.Generator | None = None) -> Prediction:
        t = self.tokens(x)  # (B, E, T, d)
        m, b = self.n_passes, len(x)
        with stochastic_attention(self.model, self.nu, generator):
            p = _chunked(self.model, t.repeat(m, 1, 1, 1), self.batch_size)  # (M*B, D) each
        mean, ale, epi = (v.view(m, b, -1) for v in p)  # (M, B, D) each
        scale = self.model.y_scale
        total_epi = mean.var(0, unbiased=False) + epi.mean(0)
        ale = ale.mean(0) if self.head_variance else torch.zeros_like(total_epi)  # the head's noise, or none
        return Prediction(mean.mean(0) * scale + self.model.y_loc, ale * scale**2, total_epi * scale**2)


def _calibration_batch(val: Any, n_frames: int) -> tuple[Tensor, Tensor]:
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


def calibrate(opts: SAOptions) -> dict:
    """Choose nu on the validation split, report the test split without and with SA; returns sa.json's dict."""
    if opts.passes < 2:
        raise UserError(f"--passes must be >= 2 (SA dispersion needs several passes), got {opts.passes}")
    start = time.perf_counter()
    model, payload = load_controller(opts.ckpt)
    name = payload["name"]
    refusal = getattr(model, "sa_refusal", None)
    if refusal:
        raise UserError(f"{opts.ckpt}: controller {name!r} has no deterministic base pass: {refusal}")
    fingerprint = dict(payload.get("data", {}))
    if opts.data is not None:  # demonstrations regenerated elsewhere, or another data root
        fingerprint = (
            dict(relocate(fingerprint, opts.data))
            if fingerprint.get("task") == "demos"
            else {**fingerprint, "data_path": str(opts.data)}
        )
    data = tasks.rebuild(fingerprint)
    x_cal, y_cal = _calibration_batch(data.val, opts.frames)
    log.info("%s: %d calibration inputs, %d test inputs", opts.ckpt, len(x_cal), len(data.test))
    without = test_report(model, data.test, data.target_names, opts.batch_size, opts.seed)
    y_std = (y_cal - model.y_loc) / model.y_scale  # (N, D)
    with _cached_encoders(model, opts.batch_size) as tokens:
        encode_start = time.perf_counter()
        t_cal = tokens(x_cal)  # (N, E, T, d)
        encode_s = time.perf_counter() - encode_start

        def forward(m: nn.Module, t: Tensor) -> Tensor:
            return _chunked(m, t, opts.batch_size).mean

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
        predictor = SAPredictor(model, tokens, result.nu, opts.passes, opts.batch_size)
        with_sa = test_report(predictor, data.test, data.target_names, opts.batch_size, opts.seed)
        predictor.head_variance = True
        with_head = test_report(predictor, data.test, data.target_names, opts.batch_size, opts.seed)
    return {
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
        "test": {"without_sa": without, "with_sa": with_sa, "with_sa_plus_head": with_head},
    }


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
