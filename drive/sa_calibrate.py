"""`drive sa calibrate --ckpt PATH`: inference-time stochastic attention (SA) on a trained behaviour-cloning controller.

SA (agents/layers/stochastic_attention.py) resamples the attention weights of a trained model; its concentration nu
is chosen on a held-out calibration split by `agents.sa.calibrate_nu` (Bayesian optimisation of L_SA). Here:

- calibration split = the checkpoint's validation episodes, report split = its test episodes, both rebuilt from its
  data fingerprint exactly as training built them (`drive.tasks.demos.checkpoint_split`); `--frames` subsamples the
  validation stacks evenly;
- f(x) = the controller's deterministic predictive mean in standardised target units (y standardised with the same
  y_loc / y_scale): `predict` for GMLE, DE (all members, exact) and DER (closed form); NSAC's mean-logit pass
  `head(x, 1, sample=False)`. MC dropout and SDE-Net are refused: their own sampling noise would be counted as SA
  dispersion;
- on the test split: the controller's own predictive (`predict`, as `drive train` reports it) against SA at the
  chosen nu, M passes of the deterministic pass: mean = E_m[mean_m], aleatoric = E_m[aleatoric_m],
  epistemic = Var_m[mean_m] + E_m[epistemic_m] (law of total variance; the last term is the deterministic pass's own
  epistemic variance: 0 for GMLE and NSAC's mean-logit pass, the member disagreement for DE, the NIG closed form
  for DER).
The encoder runs once per stack: SA only touches attention, so every encoder is swapped for a lookup into tokens
computed beforehand (`_cached_encoders`) and the M passes run the attention and heads alone.

Writes DIR/sa.json (atomically) and DIR/sa_curve.png (L_SA and dispersion vs nu).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from agents.base import Prediction
from agents.layers.stochastic_attention import stochastic_attention
from agents.sa import calibrate_nu
from datasets.demonstrations import atomic_write
from drive.checkpoint import CheckpointError, load_controller, read
from drive.tasks.demos import checkpoint_split, offline_report

log = logging.getLogger(__name__)

#: controllers with a deterministic base pass (SA needs f(x) without noise of its own)
DETERMINISTIC = ("gmle", "de", "der", "nsac")
REFUSED = {
    "mcd": "MC dropout draws a dropout mask in every pass (its noise would be counted as SA dispersion)",
    "sdenet": "SDE-Net integrates a stochastic differential equation in every pass (its noise would be counted "
    "as SA dispersion)",
}
NU_BOUNDS = (2, 1 << 16)
MAX_EVALS = 12  # agents.sa.calibrate_nu's default budget of L_SA evaluations
SHOWN = ("mse", "nll", "crps", "ece", "coverage_90", "width_90", "aleatoric_var", "epistemic_var")


@dataclass(frozen=True)
class Config:
    ckpt: Path
    """controller checkpoint trained on recorded demonstrations (`drive train --data DIR`)"""
    frames: int = 1024
    """calibration stacks: the validation episodes subsampled evenly to this many (0 = all)"""
    passes: int = 8
    """stochastic SA passes M per evaluation of nu, and for the test predictive with SA"""
    seed: int = 0
    """seed of the SA resampling (common random numbers) and of the Thompson draws"""
    out: Path = Path("out/sa")
    """output directory for sa.json and sa_curve.png"""
    batch_size: int = 512
    """stacks per encoder batch and per SA forward chunk (bounds memory)"""
    progress: bool = True
    """show a progress bar over the Bayesian-optimisation evaluations"""


def base_pass(model: nn.Module, name: str, x: Tensor) -> Prediction:
    """The deterministic predictive in standardised target units: mean, aleatoric, epistemic, each (B, D)."""
    if name == "nsac":
        mu, var = model.head(x, 1, sample=False)  # (1, B, D) each
        return Prediction(mu[0], var[0], torch.zeros_like(mu[0]))
    p = model.predict(x)
    scale2 = model.y_scale**2
    return Prediction((p.mean - model.y_loc) / model.y_scale, p.aleatoric_var / scale2, p.epistemic_var / scale2)


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


def _chunked(model: nn.Module, name: str, tokens: Tensor, batch_size: int) -> Prediction:
    parts = [base_pass(model, name, tokens[s : s + batch_size]) for s in range(0, len(tokens), batch_size)]
    return Prediction(*(torch.cat(ts) for ts in zip(*parts, strict=True)))


class SAPredictor:
    """`predict` of the controller under SA at concentration nu: M stochastic passes of the deterministic pass,
    combined by the law of total variance, in original units. Must be used inside `_cached_encoders`."""

    def __init__(self, model: nn.Module, name: str, tokens: Callable[[Tensor], Tensor], nu: int, n_passes: int,
                 batch_size: int):  # fmt: skip
        self.model, self.name, self.tokens = model, name, tokens
        self.nu, self.n_passes, self.batch_size = nu, n_passes, batch_size

    def eval(self) -> SAPredictor:
        return self

    @torch.no_grad()
    def predict(self, x: Tensor, n_samples: int | None = None, generator: torch.Generator | None = None) -> Prediction:
        t = self.tokens(x)  # (B, E, T, d)
        m, b = self.n_passes, len(x)
        with stochastic_attention(self.model, self.nu, generator):
            p = _chunked(self.model, self.name, t.repeat(m, 1, 1, 1), self.batch_size)  # (M*B, D) each
        mean, ale, epi = (v.view(m, b, -1) for v in p)  # (M, B, D) each
        scale = self.model.y_scale
        total_epi = mean.var(0, unbiased=False) + epi.mean(0)
        return Prediction(mean.mean(0) * scale + self.model.y_loc, ale.mean(0) * scale**2, total_epi * scale**2)


def _calibration_batch(ckpt: Path, fp: dict, n_frames: int) -> tuple[Tensor, Tensor]:
    val = checkpoint_split(ckpt, fp, "val")
    n = len(val)
    idx = np.arange(n) if n_frames <= 0 or n_frames >= n else np.unique(np.linspace(0, n - 1, n_frames).round())
    idx = torch.as_tensor(idx, dtype=torch.long)
    return val.stacks(idx), val.labels[idx]  # (N, k, 84, 84) uint8, (N, 3)


@contextmanager
def _progress_over_evaluations(show: bool, total: int) -> Iterator[None]:
    """A rich bar advanced by agents.sa's log record of each evaluation of nu (the library logs, the CLI shows)."""
    if not show:
        yield
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    sa_log = logging.getLogger("agents.sa")
    with Progress(TextColumn("SA nu search"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), transient=False) as bar:  # fmt: skip
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


def calibrate(cfg: Config) -> dict:
    """Choose nu on the validation episodes, report the test episodes without and with SA; returns sa.json's dict."""
    if cfg.passes < 2:
        raise ValueError(f"--passes must be >= 2 (SA dispersion needs several passes), got {cfg.passes}")
    start = time.perf_counter()
    payload = read(cfg.ckpt, kind="controller")
    name = payload["name"]
    if name in REFUSED:
        raise ValueError(f"{cfg.ckpt}: controller {name!r} has no deterministic base pass: {REFUSED[name]}")
    if name not in DETERMINISTIC:
        raise ValueError(f"{cfg.ckpt}: controller {name!r} is not supported; choose one of {DETERMINISTIC}")
    fp = payload.get("data", {})
    model, _ = load_controller(cfg.ckpt)
    x_cal, y_cal = _calibration_batch(cfg.ckpt, fp, cfg.frames)
    test = checkpoint_split(cfg.ckpt, fp, "test")
    log.info("%s: %d calibration stacks, %d test stacks", cfg.ckpt, len(x_cal), len(test))
    without = offline_report(model, test, cfg.batch_size, seed=cfg.seed)
    y_std = (y_cal - model.y_loc) / model.y_scale  # (N, D)
    with _cached_encoders(model, cfg.batch_size) as tokens:
        encode_start = time.perf_counter()
        t_cal = tokens(x_cal)  # (N, E, T, d)
        encode_s = time.perf_counter() - encode_start

        def forward(m: nn.Module, t: Tensor) -> Tensor:
            return _chunked(m, name, t, cfg.batch_size).mean

        with _progress_over_evaluations(cfg.progress, MAX_EVALS):
            result = calibrate_nu(model, t_cal, y_std, forward=forward, n_passes=cfg.passes, nu_bounds=NU_BOUNDS,
                                  max_evals=MAX_EVALS, seed=cfg.seed)  # fmt: skip
        predictor = SAPredictor(model, name, tokens, result.nu, cfg.passes, cfg.batch_size)
        with_sa = offline_report(predictor, test, cfg.batch_size, seed=cfg.seed)
    return {
        "ckpt": str(cfg.ckpt),
        "controller": name,
        "nu": result.nu,
        "nu_bounds": list(NU_BOUNDS),
        "curve": [[c["nu"], c["loss"], c["dispersion"]] for c in result.curve],
        "curve_columns": ["nu", "loss", "dispersion"],
        "wall_time_s": result.wall_time_s,
        "n_evals": result.n_evals,
        "converged": result.converged,
        "at_bound": result.nu in NU_BOUNDS,
        "encode_s": encode_s,
        "total_s": time.perf_counter() - start,
        "target_dispersion": result.target_dispersion,
        "slope": result.slope,
        "intercept": result.intercept,
        "n_passes": cfg.passes,
        "seed": cfg.seed,
        "n_calibration": len(x_cal),
        "calibration_seeds": fp["val_seeds"],
        "n_test": len(test),
        "test_seeds": fp["test_seeds"],
        "test": {"without_sa": without, "with_sa": with_sa},
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


def _print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['controller']} test split ({result['n_test']} stacks): without vs with SA")
    for col in ("metric", "without SA", f"SA nu={result['nu']}"):
        table.add_column(col, justify="right")
    for key in SHOWN:
        table.add_row(key, *(f"{result['test'][s][key]:.4g}" for s in ("without_sa", "with_sa")))
    Console().print(table)
    print(f"chosen nu {result['nu']} (bounds {result['nu_bounds']}), {result['n_evals']} evaluations, "
          f"converged {result['converged']}, wall time {result['wall_time_s']:.1f} s on "
          f"{result['n_calibration']} calibration stacks x {result['n_passes']} passes (+{result['encode_s']:.1f} s "
          f"encoding them once); target dispersion {result['target_dispersion']:.4g}, slope {result['slope']:.3f}; "
          f"whole command {result['total_s']:.0f} s")  # fmt: skip
    if result["at_bound"]:
        print(f"note: nu {result['nu']} is at a bound of {result['nu_bounds']}: L_SA may fall further outside them")


def run(cfg: Config) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = calibrate(cfg)
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"drive sa calibrate: error: {exc}", file=sys.stderr)
        return 2
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "sa.json", (json.dumps(result, indent=1) + "\n").encode())
    plot_curve(result, out / "sa_curve.png")
    _print_table(result)
    print(f"wrote {out / 'sa.json'} and {out / 'sa_curve.png'}")
    return 0
