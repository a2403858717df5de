"""Task "udacity": steering from the front camera of a Udacity simulator log (`drive train --data udacity:DIR`).

Input: the center camera through `datasets.udacity.preprocess` (crop, 200x66, YUV; (3, 66, 200) uint8), the very
function `drive udacity drive` applies to live frames, into the NVIDIA PilotNet encoder (EncoderConfig "nvidia").
Target: steering in [-1, 1] (D = 1).

Split by time. The frames are a ~10 Hz video: neighbouring frames are near duplicates, so a random frame split
would leak the held-out set into training. The log (in recording order) is cut into `n_blocks` contiguous blocks;
`test_blocks` are held out for the final evaluation, `val_blocks` for early stopping, the rest train. Training
frames within `gap` frames of a held-out frame are dropped as well, so no training frame is a near twin of one it
is scored on. Defaults: 10 blocks (~15 s each on the 1,500-frame recording), test = blocks 2 and 7 (20%, two
separate stretches of track), validation = block 9 (the last 10%), gap 10 frames (~1 s).

Training samples are augmented as in naokishibuya's car-behavioral-cloning (`datasets.udacity.augment`: random
camera +-0.2, flip, translate, shadow, brightness, each sample with probability 0.6), drawn from a numpy Generator
seeded by (seed, epoch, row): the same run sees the same images, and a resumed run continues exactly. Validation
and test frames are the center camera as recorded, never augmented.

Evaluation (`test` in metrics.json): `drive.metrics.regression_report` (MSE, NLL, CRPS, ECE, PIT, coverage, ...)
on the test blocks, plus the MSE of predicting the training mean steering, for scale, and the same per test block
(`test.per_block`): on the staged recording block 2 is ordinary lake-track driving, block 7 a slow multi-point turn
at a "road closed" barrier (full lock left and right, steering variance 0.63 against 0.11 in training).

Options (`--set task.KEY=VALUE`): the `Options` dataclass below.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from agents.encoders import EncoderConfig
from datasets.udacity import AugmentConfig, UdacityLog, augment, decode_frame, preprocess, read_log
from drive import metrics
from drive.errors import UserError
from drive.learn.batches import predict_dataset
from drive.learn.tasks import TaskData

log = logging.getLogger(__name__)

DATA = "udacity:DIR: a Udacity simulator recording (driving_log.csv + IMG/, or the csv itself)"


@dataclass(frozen=True)
class Options:
    n_blocks: int = 10
    """contiguous time blocks the log is cut into"""
    test_blocks: tuple[int, ...] = (2, 7)
    """blocks held out for the test report (comma list)"""
    val_blocks: tuple[int, ...] = (9,)
    """blocks held out for early stopping (comma list)"""
    gap: int = 10
    """training frames within this many frames of a held-out frame are dropped"""
    augment: bool = True
    """naokishibuya's augmentation of training samples"""
    p_augment: float = 0.6
    """probability that a training sample is augmented"""
    max_rows: int = 0
    """use only a prefix of the log (0: all; for smoke runs)"""
    eval_samples: int = 0
    """stochastic samples per evaluation prediction (0: the controller's default)"""


def block_split(
    n: int, n_blocks: int, test_blocks: tuple[int, ...], val_blocks: tuple[int, ...], gap: int
) -> dict[str, np.ndarray]:
    """Row indices of train / val / test for n frames in time order, cut into n_blocks contiguous blocks."""
    if not 1 <= n_blocks <= n:
        raise UserError(f"task 'udacity': n_blocks must be in [1, {n}] for {n} frames, got {n_blocks}")
    held = (*test_blocks, *val_blocks)
    bad = [b for b in held if not 0 <= b < n_blocks]
    if bad:
        raise UserError(f"task 'udacity': block(s) {bad} outside 0..{n_blocks - 1}")
    if len(set(held)) != len(held):
        raise UserError(f"task 'udacity': test blocks {test_blocks} and val blocks {val_blocks} overlap or repeat")
    if not test_blocks or not val_blocks or len(held) >= n_blocks:
        raise UserError("task 'udacity': need at least one test block, one val block and one training block")
    block = np.arange(n) * n_blocks // n  # (n,) block of each frame, contiguous and as equal as possible
    is_test, is_val = np.isin(block, test_blocks), np.isin(block, val_blocks)
    held_out = (is_test | is_val).astype(np.int64)
    # a training frame within `gap` frames of any held-out frame is dropped (a window max over held_out)
    near = np.convolve(held_out, np.ones(2 * gap + 1, np.int64), mode="same") > 0 if gap > 0 else held_out > 0
    return {"train": np.flatnonzero(~near), "val": np.flatnonzero(is_val), "test": np.flatnonzero(is_test)}


class UdacityFrames(torch.utils.data.Dataset):
    """(x (3, 66, 200) uint8, y (1,) float32) for the given rows of a log; augmented when `augment_cfg` is given."""

    def __init__(self, log: UdacityLog, rows: np.ndarray, augment_cfg: AugmentConfig | None = None, seed: int = 0):
        self.log, self.rows, self.augment_cfg, self.seed = log, np.asarray(rows), augment_cfg, seed
        self.epoch = 0
        self.targets = torch.from_numpy(log.steering[self.rows]).float().unsqueeze(1)  # (N, 1), recorded steering
        self._bytes: dict = {}  # JPEG bytes by path: 4,500 frames are ~50 MB compressed, ~700 MB decoded
        if augment_cfg is None:
            rows = tqdm(self.rows, desc="frames", leave=False, disable=None)  # disable=None: silent when not a tty
            x = np.stack([preprocess(self._frame(log.center[r])) for r in rows])  # (N, 3, 66, 200)
            self.tensors = (torch.from_numpy(x), self.targets)  # (N, 3, 66, 200) uint8, (N, 1)
            self._bytes.clear()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.rows)

    def _frame(self, path) -> np.ndarray:
        data = self._bytes.get(path)
        if data is None:
            try:
                data = self._bytes[path] = path.read_bytes()
            except OSError as exc:
                raise OSError(f"{path}: cannot read image named by {self.log.path} ({exc.strerror})") from exc
        return decode_frame(data, path)

    def __getitem__(self, i: int):
        row = int(self.rows[i])
        if self.augment_cfg is None:
            return self.tensors[0][i], self.tensors[1][i]
        rng = np.random.default_rng([self.seed, self.epoch, row])
        cameras = [None if p is None else partial(self._frame, p) for p in self.log.cameras(row)]  # decoded if used
        rgb, steering = augment(cameras, self.log.steering[row], rng, self.augment_cfg)
        return torch.from_numpy(preprocess(rgb)), torch.tensor([steering], dtype=torch.float32)


def fingerprint(log: UdacityLog) -> dict:
    digest = hashlib.sha256(log.path.read_bytes())
    return {"path": str(log.path.resolve()), "log_sha256": digest.hexdigest(), "n_rows": len(log)}


def build(opts: Options, data: Path | None, seed: int) -> TaskData:
    if data is None:
        raise UserError("task 'udacity' needs --data udacity:DIR (a driving_log.csv and its IMG/ folder)")
    if not 0.0 <= opts.p_augment <= 1.0:
        raise UserError(f"task 'udacity': task.p_augment must be in [0, 1], got {opts.p_augment}")
    log_ = read_log(data)
    n = min(len(log_), opts.max_rows) if opts.max_rows > 0 else len(log_)
    split = block_split(n, opts.n_blocks, opts.test_blocks, opts.val_blocks, opts.gap)
    aug = AugmentConfig(p_augment=opts.p_augment) if opts.augment else None
    log.info("udacity %s: %d frames -> train %d, val %d, test %d (blocks of %d)", log_.path, n,
             *(len(split[k]) for k in ("train", "val", "test")), n // opts.n_blocks)  # fmt: skip
    train = UdacityFrames(log_, split["train"], aug, seed)
    val = UdacityFrames(log_, split["val"])
    test = UdacityFrames(log_, split["test"])
    train_mean = float(log_.steering[split["train"]].mean())

    def evaluate(model) -> dict:
        blocks = split["test"] * opts.n_blocks // n
        return evaluate_udacity(model, test, blocks, train_mean, opts.eval_samples, seed)

    return TaskData(
        name="udacity",
        train=train,
        val=val,
        test=test,
        encoder=EncoderConfig(kind="nvidia", d_model=32),
        out_dim=1,
        target_names=("steering",),
        fingerprint={
            **fingerprint(log_),
            "data_path": str(data),
            "rows_used": n,
            "split": {"n_blocks": opts.n_blocks, "test_blocks": list(opts.test_blocks),
                      "val_blocks": list(opts.val_blocks), "gap": opts.gap,
                      **{f"n_{k}": len(v) for k, v in split.items()}},
            "augment": None if aug is None else aug.__dict__,
        },  # fmt: skip
        evaluate=evaluate,
        controller_defaults={"encoder.d_model": 32},
        train_defaults={"epochs": 25, "batch_size": 32, "lr": 1e-3, "patience": 10},
    )


@torch.no_grad()
def evaluate_udacity(
    model, test: UdacityFrames, blocks: np.ndarray, train_mean: float, n_samples: int, seed: int
) -> dict:
    """The test report over all held-out frames, and one per test block (`blocks`: the block of each test frame)."""
    pred, y = predict_dataset(model, test, 256, n_samples or None, seed, next(model.parameters()).device.type)
    report = _report(pred, y, train_mean)
    report["per_block"] = {
        str(b): _report(type(pred)(*(t[blocks == b] for t in pred)), y[blocks == b], train_mean)
        for b in np.unique(blocks)
    }
    return {
        "test": report,
        "protocol": "test = held-out contiguous blocks of the recording (center camera, not augmented); "
        "mse_train_mean = MSE of always predicting the training mean steering",
    }


def _report(pred, y: torch.Tensor, train_mean: float) -> dict:
    report = metrics.regression_report(pred, y)
    report["mse_train_mean"] = metrics.mse(np.full(y.shape, train_mean), y)
    report["n_frames"] = len(y)
    return report
