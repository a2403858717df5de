"""Task "bearings": bearing degradation, the NSAC paper's fourth experiment (`drive train --task bearings`).

Data: the published window-feature files (`datasets/bearings`, ../shared/data/bearings/PROVENANCE.md): 14 vibration
features (7 per channel, log10 energy), `Time` and `Temperature` (298.15 K where a file has none) as inputs, the
`Degradation` label as target. PRONOSTIA Bearing1_3's `Degradation` is NaN in every row, so that bearing is scored on
its `Degradation_monotonic` (each report names its `label`). The label is not a measurement but a deterministic
monotone function of `Time` (an ODE, `datasets/bearings/labels.py`), so the task runs two input protocols:
`protocol=time`, the paper's 16 inputs, and `protocol=no_time`, 15 inputs without `Time`: what the vibration
features carry on their own.

Protocol (itxwaleedrazzaq/neuronal_stochastic_attention_circuit @ 867c8aa7, RUL_exp/rul_random.py + rul_test.py):
train on XJTU-SY Bearing1_1..1_3 (28,000 rows, standardiser fitted on all of them), 90/10 random split with the
paper's seed 42 + s for run seed s (`datasets.bearings.nsac_split`, sklearn's split index for index); of the 90 %,
the last 10 % is the early-stopping validation split, as Keras' `validation_split=0.1` in their `fit` (22,680 train,
2,520 validation). The 10 % held out is reported as `heldout` (rul_random.py's numbers). Test bearings, zero-shot:
XJTU-SY Bearing1_1 (the paper's "in-distribution" row: 90 % of its rows were trained on), PRONOSTIA Bearing2_1,
HUST Bearing1, then every other staged bearing not trained on (`bearings=all`).

Test-bearing scaling (`test_scaling`). NSAC's rul_test.py refits a StandardScaler on each test bearing ("per_bearing",
the paper's numbers). That uses the whole life of the bearing being scored: with `Time` among the inputs its
standardised Time is the fraction of life elapsed, i.e. the test bearing's failure time leaks into every row. The
default here is the training standardiser ("train"), which leaks nothing; its catch is Temperature: constant
298.15 in training (scale 1), so PRONOSTIA's fills (100.253, 290.045, ...) enter as -198 / -8 and HUST's 25 as
-273, values no model has seen. Every run scores the paper's three bearings under both (see below).

metrics.json: `tests` = {name: report} for every test bearing under the chosen scaling (the paper's three first),
plus the paper's three under the other one as "NAME@SCALING" (`both_scalings`); each report is
`drive.metrics.regression_report` plus its `label` column and two `references`: `train_mean` (N(mean, var) of the
training labels) and `life_fraction` (the training bearings' mean label curve read at the test row's fraction of
life, Time / the bearing's last Time: the score that knowing the test bearing's failure time buys, which
per-bearing scaling hands a model through Time). `test` = the paper's three test bearings pooled (also
RUN/predictions.npz), `heldout` = NSAC's 10 % split. RUN/tubes.npz holds the paper bearings' predictive along their
life (`NAME/{x,y,mean,aleatoric_var,epistemic_var}`, x = Time) for the report's multi-controller figure;
RUN/bearings.png is the paper's Figure 5 for this run: degradation over each paper bearing's life with the
50 / 90 % tubes, and the aleatoric / epistemic standard deviations along it.

Departures: our six controllers share one encoder (a token per feature, d_model 32) instead of the authors' NAC
over one 16-wide token; AdamW 1e-3 with a cosine schedule and the best validation epoch kept (theirs: AdamW 1e-4,
DER 1e-3, the last of 20 epochs; measured with GMLE, seed 42: lr 1e-4 gives held-out MSE 0.0105, 1e-3 0.0077),
and the checkpoint kept is the one of best validation NLL with early stopping after 10 epochs without a better one
(the harness's rule for every task). XJTU-SY rows are in the published (lexicographic snapshot) order
(`datasets/bearings/table.py`): Time and the label rise with the row, but the snapshot a row's vibration comes from
does not (Spearman correlation of row position and true snapshot time: 0.03 for Bearing1_1, -0.35 for 1_2 and
1_3), so without Time the training labels are not in step with the vibration they are paired with.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch

from agents.checks import at_least
from agents.encoders import EncoderConfig
from datasets.bearings import PAPER_TESTS, TRAIN, FeatureTable, TestBearing, nsac_split, read_feature_csv, staged_files
from datasets.files import atomic_write
from drive import metrics
from drive.errors import UserError
from drive.learn.batches import predict_dataset
from drive.learn.tasks import TaskData
from drive.learn.tasks.scoring import constant_gaussian_report, point_report

DATA = "DIR: the data root holding bearings/features/ (default: $DRIVE_DATA_ROOT or ../shared/data)"
PROTOCOLS = ("time", "no_time")
CONTROLLERS = ("nsac", "gmle", "mcd", "de", "der", "sdenet")
DEFAULT_SEEDS = {"time": 5, "no_time": 5}  # the paper's seeds 42..46
REPORT_PLOTS = ("tubes", "reliability", "pit")
SMOKE_OPTIONS = {"bearings": "paper", "subsample": "20"}
SCALINGS = ("train", "per_bearing")
OTHER = {"train": "per_bearing", "per_bearing": "train"}
# The paper's numbers (NSAC paper, bearing experiment, from its text: it prints no table for it). They were made
# with Time among the inputs and per-bearing test scaling (the authors' rul_test.py), so they sit beside our
# "BEARING@per_bearing" tables; table keys as drive/studies/offline/grid.py names them.
PAPER = {
    "time": {
        "bearings/xjtu/Bearing1_1@per_bearing": {
            "nsac": {"mse": 0.0048, "nll": -0.0219, "crps": 0.0261, "ece": 0.1404},
            "sdenet": {"mse": 0.0068}, "mcd": {"mse": 0.0145}, "de": {"mse": 0.0139}, "gmle": {"mse": 0.0221},
            "der": {"mse": 0.0331, "nll": -2.2316},
        },
        "bearings/pronostia/Bearing2_1@per_bearing": {
            "nsac": {"crps": 0.0310, "ece": 0.1337},
            "der": {"mse": 0.0252, "nll": -2.1217, "crps": 0.6716},
        },
        "bearings/hust/Bearing1@per_bearing": {
            "nsac": {"mse": 0.0033, "nll": -1.5889, "crps": 0.0231, "ece": 0.0841},
            "de": {"crps": 0.0217}, "der": {"nll": -2.2585},
        },
    }
}  # fmt: skip
PAPER_SOURCES = {"time": "NSAC paper, bearing degradation (section 4, text); Time as input, per-bearing test scaling"}
PAPER_SEED = 42  # run seed s uses the paper's seed 42 + s
KERAS_VALIDATION = 0.1  # Keras fit(validation_split=0.1): the last 10 % of the training arrays
EVAL_BATCH = 1024
FIELDS = ("mean", "aleatoric_var", "epistemic_var")


@dataclass(frozen=True)
class Options:
    LABEL: ClassVar[str] = "task"  # errors name fields as `--set task.KEY` does

    protocol: Literal["time", "no_time"] = "time"
    """inputs: "time" = the paper's 16 (14 vibration features, Time, Temperature); "no_time" = 15, without Time"""
    test_scaling: Literal["train", "per_bearing"] = "train"
    """test bearings standardised by the training scaler, or refitted on each test bearing (as NSAC's authors test)"""
    both_scalings: bool = True
    """also score the paper's three test bearings under the other scaling (tests "BEARING@SCALING")"""
    bearings: Literal["paper", "all"] = "all"
    """test bearings: the paper's three, or also every other staged bearing not trained on"""
    subsample: int = 1
    """keep every k-th row of every split (1: all rows; for smoke runs)"""
    eval_samples: int = 0
    """stochastic samples per evaluation prediction (0: the controller's default)"""

    def __post_init__(self) -> None:
        at_least(self, 1, "subsample")
        at_least(self, 0, "eval_samples")


def _tensors(x: np.ndarray, y: np.ndarray) -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.from_numpy(x).float(), torch.from_numpy(y).float().reshape(-1, 1))


def _read(data: Path | None, bearings: str) -> tuple[dict, dict]:
    try:
        files = staged_files(data)
    except FileNotFoundError as exc:
        raise UserError(f"task 'bearings': {exc}") from None
    if bearings == "paper":
        files = {n: p for n, p in files.items() if n in (*TRAIN, *PAPER_TESTS)}
    missing = sorted((set(TRAIN) | set(PAPER_TESTS)) - set(files))
    if missing:
        raise UserError(f"task 'bearings': feature files missing under {data or 'the data root'}: {missing}")
    read = {n: _table(str(p), n, p.stat().st_mtime_ns, p.stat().st_size) for n, p in files.items()}
    return {n: t for n, (t, _) in read.items()}, {n: d for n, (_, d) in read.items()}


@functools.lru_cache(maxsize=64)
def _table(path: str, name: str, mtime_ns: int, size: int) -> tuple[FeatureTable, str]:
    """A feature file parsed once per process (a grid of runs reads the same 23 files; keyed on mtime and size)."""
    return read_feature_csv(path, name), hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _life_curve(tables: dict) -> tuple[np.ndarray, np.ndarray]:
    """The training bearings' mean label against the fraction of life elapsed (Time / last Time), on a grid."""
    grid = np.linspace(0.0, 1.0, 1001)
    curves = [np.interp(grid, tables[n].time / tables[n].time[-1], tables[n].label) for n in TRAIN]
    return grid, np.mean(curves, axis=0)


def _test_sets(tables: dict, opts: Options, seed: int) -> tuple[dict[str, TestBearing], object]:
    """{test name: TestBearing}: every test bearing under the chosen scaling, the paper's three also under the
    other ("NAME@SCALING"), rows subsampled; and the chosen split (training rows, scaler)."""
    include_time, k = opts.protocol == "time", opts.subsample
    split = nsac_split(PAPER_SEED + seed, include_time=include_time, test_scaling=opts.test_scaling, tables=tables)
    tests = dict(split.tests)
    if opts.both_scalings:
        other = OTHER[opts.test_scaling]
        alt = nsac_split(PAPER_SEED + seed, include_time=include_time, test_scaling=other, tables=tables)
        tests.update({f"{n}@{other}": alt.tests[n] for n in PAPER_TESTS})
    return {n: b._replace(x=b.x[::k], y=b.y[::k], time=b.time[::k]) for n, b in tests.items()}, split


def build(opts: Options, data: Path | None, seed: int) -> TaskData:
    tables, digests = _read(data, opts.bearings)
    tests, split = _test_sets(tables, opts, seed)
    k, n_fit = opts.subsample, math.floor(len(split.y_train) * (1 - KERAS_VALIDATION))
    train = _tensors(split.x_train[:n_fit:k], split.y_train[:n_fit:k])
    val = _tensors(split.x_train[n_fit::k], split.y_train[n_fit::k])
    heldout = _tensors(split.x_val[::k], split.y_val[::k])
    grid, curve = _life_curve(tables)
    y_fit = split.y_train[:n_fit]
    references = {}
    for name, b in tests.items():
        table = tables[name.split("@")[0]]
        life = np.interp(b.time / table.time[-1], grid, curve)
        references[name] = {
            "train_mean": constant_gaussian_report(y_fit.mean(), y_fit.std(), b.y),
            "life_fraction": point_report(life, b.y),
        }
    labels = {n: tables[n.split("@")[0]].label_column for n in tests}
    cache: dict = {}

    def evaluate(model) -> dict:
        return evaluate_bearings(model, tests, heldout, labels, references, opts, seed, cache)

    def plots(model, run_dir: Path) -> list[Path]:
        return plot_bearings(model, tests, opts, seed, cache, Path(run_dir))

    pooled = [tests[n] for n in PAPER_TESTS]
    return TaskData(
        name="bearings",
        train=train,
        val=val,
        test=_tensors(np.concatenate([b.x for b in pooled]), np.concatenate([b.y for b in pooled])),
        encoder=EncoderConfig(kind="features", in_dim=len(split.feature_names), d_model=32),
        out_dim=1,
        target_names=("degradation",),
        fingerprint={
            "data_path": None if data is None else str(data),
            "files_sha256": digests,
            "paper_seed": PAPER_SEED + seed,
            "feature_names": list(split.feature_names),
        },
        evaluate=evaluate,
        plots=plots,
        standardiser=split.scaler,
        controller_defaults={"encoder.d_model": 32, "n_heads": 4},
        train_defaults={"epochs": 20, "batch_size": 64, "lr": 1e-3, "patience": 10},
    )


def _predict(model, x: np.ndarray, opts: Options, seed: int):
    dataset = _tensors(x, np.zeros(len(x)))
    device = str(next(model.parameters()).device)
    pred, _ = predict_dataset(model, dataset, EVAL_BATCH, opts.eval_samples or None, seed, device)
    return pred  # Prediction of (N, 1) tensors


def evaluate_bearings(
    model, tests: dict, heldout, labels: dict, references: dict, opts: Options, seed: int, cache: dict
) -> dict:
    """metrics.json's task part (see the module docstring); keeps the paper bearings' predictions in `cache`."""
    reports, pooled = {}, []
    for name, bearing in tests.items():
        pred = _predict(model, bearing.x, opts, seed)
        if name.split("@")[0] in PAPER_TESTS:
            cache[name] = pred
        reports[name] = {
            **metrics.regression_report(pred, bearing.y.reshape(-1, 1)),
            "label": labels[name],
            "references": references[name],
        }
    for name in PAPER_TESTS:
        pooled.append((cache[name], tests[name].y))
    pred = type(pooled[0][0])(*(torch.cat([p[i] for p, _ in pooled]) for i in range(3)))
    y = np.concatenate([t for _, t in pooled]).reshape(-1, 1)
    held_pred, held_y = _predict(model, heldout.tensors[0].numpy(), opts, seed), heldout.tensors[1]
    return {
        "test": metrics.regression_report(pred, y),
        "tests": reports,
        "heldout": metrics.regression_report(held_pred, held_y),
        "protocol": (
            f"train XJTU-SY {', '.join(TRAIN)} (seed {PAPER_SEED + seed}); inputs {opts.protocol}; test "
            f"bearings scaled by {opts.test_scaling!r} ('NAME@SCALING': the other); 'test' = "
            f"{', '.join(PAPER_TESTS)} pooled; 'heldout' = the 10% random split"
        ),
    }


def plot_bearings(model, tests: dict, opts: Options, seed: int, cache: dict, run_dir: Path) -> list[Path]:
    """RUN/tubes.npz (the paper bearings' predictive along their life, every scaling scored; for the report's
    multi-controller figure) and RUN/bearings.png (the paper's Figure 5 for this run)."""
    panels = {}
    for name, bearing in tests.items():
        if name.split("@")[0] in PAPER_TESTS:
            pred = cache.get(name) or _predict(model, bearing.x, opts, seed)
            panels[name] = {"x": bearing.time, "y": bearing.y, **{f: getattr(pred, f)[:, 0].numpy() for f in FIELDS}}
    buf = io.BytesIO()
    np.savez_compressed(buf, **{f"{n}/{k}": v for n, arrays in panels.items() for k, v in arrays.items()})
    atomic_write(run_dir / "tubes.npz", buf.getvalue())
    title = f"{type(model).__name__}, inputs {opts.protocol}, test scaling {opts.test_scaling}"
    return [draw_tubes({n: panels[n] for n in PAPER_TESTS}, run_dir / "bearings.png", title)]


def draw_tubes(panels: dict[str, dict], path: Path, title: str) -> Path:
    """One column per bearing: degradation vs Time with the predictive mean and 50 / 90 % tubes (top), the
    aleatoric and epistemic standard deviations along the life (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    z50, z90 = 0.6744897501960817, 1.6448536269514722  # central 50 / 90 % of a Gaussian
    fig, axes = plt.subplots(
        2,
        len(panels),
        figsize=(4.2 * len(panels), 5.2),
        squeeze=False,
        gridspec_kw={"height_ratios": [2.2, 1]},
        sharex="col",
    )
    for col, (name, p) in enumerate(panels.items()):
        order = np.argsort(p["x"], kind="stable")
        t, y, mean = p["x"][order], p["y"][order], p["mean"][order]
        ale, epi = p["aleatoric_var"][order], p["epistemic_var"][order]
        std = np.sqrt(ale + epi)
        top, bottom = axes[0, col], axes[1, col]
        top.fill_between(t, mean - z90 * std, mean + z90 * std, color="tab:blue", alpha=0.18, lw=0, label="90 %")
        top.fill_between(t, mean - z50 * std, mean + z50 * std, color="tab:blue", alpha=0.35, lw=0, label="50 %")
        top.plot(t, mean, color="tab:blue", lw=0.6, label="mean")
        top.plot(t, y, color="k", lw=1.0, label="degradation")
        top.set_title(name, fontsize=10)
        top.set_ylim(-0.3, 1.3)
        bottom.plot(t, np.sqrt(ale), color="tab:orange", lw=0.6, label="aleatoric std")
        bottom.plot(t, np.sqrt(epi), color="tab:green", lw=0.6, label="epistemic std")
        bottom.set_yscale("log")
        bottom.set_xlabel("Time (feature file units)")
    axes[0, 0].legend(fontsize=7, loc="upper left")
    axes[1, 0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
