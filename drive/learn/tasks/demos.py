"""Task "demos": behaviour cloning on recorded CarRacing demonstrations (`drive train --data DIR`).

Input: the frame stack the controller sees, (k, 84, 84) uint8 coded by `datasets.frames` (the encoder `frames`
turns each frame into one token, so the stack is the time axis, as in the NSAC CarRacing experiment). Target: the
expert's clean action label (steer, gas, brake) — with DART noise the executed action differs, the label never
does. The controller predicts the three as a Gaussian; the trainer fits the target standardisation on the training
split and saves it with the weights.

Split by episode (track seed), never by frame: consecutive frames are nearly identical, so a frame split would leak.
The episodes are split three ways, reproducibly under --seed (or `task.split_seed`, below): train, validation
(best.pt and early stopping on the validation MSE: `trainer.select=val_mse`, see below) and a held-out test split on
which `evaluate` reports the offline metrics (MSE, NLL, CRPS, ECE, PIT, coverage and width of central intervals;
overall and per action). With `task.test_data=DIR`, a separately collected dataset is the test split instead and
every episode of DIR is used for train/val.
`task.split_seed=N` draws the split from N instead of --seed, so runs of several --seed values share one split and
differ only in their initialisation and batch order (`drive bench controllers --split-seeds`): the spread over seeds
is then the initialisation's, and a second split value shows the split's share. Unset (None), the split follows
--seed as it always did, and the fingerprint is the one it always was; set, the fingerprint records `split_seed`.

Frames are held once per episode (T + k - 1 frames, not T stacks of k), and a batch's stacks are gathered by index:
50 episodes of 1,000 steps take ~0.35 GB instead of 1.4 GB. The data fingerprint saved in the checkpoint names the
frame coding and input representation, and the closed loop codes live frames with the same
`datasets.frames.ObservationCoder`, so training and driving can never differ:
- `task.frame_coding` (default `full`, what `drive collect` records by default: the whole view with the indicator
  bar — speed is visible, and clones trained without it did not brake before corners) or `cropped`. A dataset
  recorded with another coding is re-coded from its raw frames (recorded with --keep-raw); without them it is an
  error that says so.
- `task.input`: `frames` (the stack, oldest first) or `motion` ([newest frame, newest - previous, ...]).

Why best.pt follows the validation MSE here, not the NLL: the validation episodes are other tracks, and their NLL
rises as soon as the model grows confident on the training tracks, while the mean action keeps improving. Measured
on the shipped model's run (the command in checkpoints/carracing_nsac.md): val NLL best at epoch 5 (-1.90), then
-1.54 to -1.63, while the val MSE keeps falling, 0.0433 at epoch 1 to 0.0280 at epoch 8; the same run with
`ood_fit=1` (`--out runs/ref/ship`): val NLL -1.22 at epoch 2, then 0.16-3.48, val MSE 0.0420 -> 0.0274 (epoch 7).
The confidence is fixed after training instead (`drive calibrate`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from agents.checks import at_least, in_range
from agents.encoders import EncoderConfig
from datasets.demonstrations import Demonstrations
from datasets.frames import code_frames, fingerprint_coding, input_transform
from datasets.regenerate import require_episodes
from drive import metrics
from drive.errors import UserError
from drive.learn.tasks import TaskData
from sim_bridges.carracing.bridge import ACTION_NAMES

log = logging.getLogger(__name__)

DATA = "DIR: a dataset recorded by `drive collect` (or `drive dagger`)"
# the validation score best.pt and early stopping follow (trainer.select): the mean's squared error, since held-out
# NLL rises with confidence while the mean still improves; `drive train --help` reads it from here
SELECT = "val_mse"
TARGETS = ACTION_NAMES
# `drive bench controllers` (and `drive bench offline --task demos`): the six controllers and NSAC's variants, one
# budget for all (the command's --epochs and --set); NSAC's backbone of 8 neurons is the shipped model's
CONTROLLERS = ("nsac", "gmle", "mcd", "de", "der", "sdenet")
VARIANTS = {"nsac": ("nsac", ("backbone_units=8",)), "nsac-fit": ("nsac", ("backbone_units=8", "ood_fit=1"))}
DEFAULT_SEEDS = {"default": 3}
# NSAC's loss ablation (agents/nsac.py): the regulariser's form x what it averages x where the surrogate is drawn,
# and no regulariser; run only when named: drive bench controllers --controllers all nsac-noreg nsac-paper-batch-input
NAMED_VARIANTS = {
    f"nsac-{form}-{mean}-{at}": ("nsac", ("backbone_units=8", f"reg_form={form}",
                                          f"reg_pairs={'true' if mean == 'pairs' else 'false'}", f"ood_at={at}"))
    for form in ("paper", "anchored") for mean in ("batch", "pairs") for at in ("input", "heads")
    if (form, mean, at) != ("anchored", "pairs", "input")  # the row `nsac`: the default loss
} | {"nsac-noreg": ("nsac", ("backbone_units=8", "reg_weight=0"))}  # fmt: skip
# the weight of ood_fit (agents/nsac.py) below nsac-fit's 1: how much of the epistemic signal a weaker fit keeps
NAMED_VARIANTS |= {f"nsac-fit-{w}": ("nsac", ("backbone_units=8", f"ood_fit={w}")) for w in ("0.1", "0.3")}


@dataclass(frozen=True)
class Options:
    LABEL: ClassVar[str] = "task"  # errors name fields as `--set task.KEY` does

    frame_coding: Literal["full", "cropped"] = "full"
    """how frames are coded for the controller (full: the whole view, indicator bar kept; cropped: the bar cut off);
    another recorded coding is re-coded from raw"""
    input: Literal["frames", "motion"] = "frames"
    """the stack as is, or [newest frame, frame differences]"""
    val_fraction: float = 0.1
    """share of episodes held out for early stopping"""
    test_fraction: float = 0.1
    """share of episodes held out for the offline test report"""
    stride: int = 1
    """use every stride-th step of each episode for train/val (test: every step)"""
    max_episodes: int = 0
    """use only the first N episodes (0: all)"""
    test_data: str = ""
    """a separately recorded dataset as the test split (then every episode of --data trains or validates)"""
    include_flagged: bool = False
    """also use episodes flagged below the dataset's min_return"""
    split_seed: int | None = None
    """draws the episodes' train/val/test split (None: --seed draws it, as it draws the initialisation)"""

    def __post_init__(self) -> None:
        in_range(self, "val_fraction", 0, 1, high_open=True)
        in_range(self, "test_fraction", 0, 1, high_open=True)
        at_least(self, 1, "stride")
        at_least(self, 0, "max_episodes")


class StackDataset(torch.utils.data.Dataset):
    """(frame stack, action label) pairs over whole episodes, frames stored once.

    `frames` (F, 84, 84) uint8 holds every episode's frames back to back; sample i's stack is
    frames[start[i] : start[i] + k]. Items are (x (k, 84, 84) uint8, y (3,) float32).
    """

    def __init__(
        self,
        frames: np.ndarray,
        start: np.ndarray,
        labels: np.ndarray,
        k: int,
        seeds: np.ndarray,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.frames = torch.from_numpy(frames)  # (F, 84, 84) uint8
        self.start = torch.from_numpy(start.astype(np.int64))  # (N,)
        self.labels = torch.from_numpy(labels.astype(np.float32))  # (N, 3)
        self.seeds = seeds  # (N,) track seed of each sample
        self.k = k
        self._offsets = torch.arange(k)  # (k,)
        self.transform = transform or input_transform("frames")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def targets(self) -> torch.Tensor:
        return self.labels

    def stacks(self, idx: torch.Tensor) -> torch.Tensor:
        rows = self.start[idx][:, None] + self._offsets  # (B, k)
        return self.transform(self.frames[rows])  # (B, k, 84, 84)

    def __getitem__(self, i: int):
        return self.stacks(torch.as_tensor([i]))[0], self.labels[i]

    def batches(self, batch_size: int):
        for s in range(0, len(self), batch_size):
            idx = torch.arange(s, min(s + batch_size, len(self)))
            yield self.stacks(idx), self.labels[idx]


def episode_frames(ep: Any, recorded: str, coding: str, where: Path) -> np.ndarray:
    """(T + k - 1, 84, 84): the episode's frames in `coding`, padded like the reset stack."""
    if coding == recorded:
        return ep.frames
    if ep.raw is None:
        raise UserError(
            f"{where}: recorded with frame coding {recorded!r} and no raw frames; train with "
            f"--set task.frame_coding={recorded} or record with --frame-coding {coding}"
        )
    coded = code_frames(ep.raw, coding)  # (T, 84, 84)
    return np.concatenate([np.repeat(coded[:1], ep.frame_stack - 1, axis=0), coded])


def gather(data: Demonstrations, seeds: list[int], stride: int, coding: str, input_name: str) -> StackDataset:
    """The samples of these episodes (every stride-th step) with frames in `coding`."""
    frames, starts, labels, sample_seeds = [], [], [], []
    offset = 0
    for seed in seeds:
        ep = data.load(seed)
        steps = np.arange(0, len(ep), stride)
        steps = steps[np.isfinite(ep.label[steps]).all(1)]  # gated DAgger leaves unqueried states unlabelled (NaN)
        frames.append(episode_frames(ep, data.frame_coding, coding, data.root))
        starts.append(offset + steps)
        labels.append(ep.label[steps])
        sample_seeds.append(np.full(len(steps), seed))
        offset += len(frames[-1])
    if not frames:
        raise UserError(f"{data.root}: no episodes in this split")
    return StackDataset(
        np.concatenate(frames),
        np.concatenate(starts),
        np.concatenate(labels),
        data.frame_stack,
        np.concatenate(sample_seeds),
        input_transform(input_name),
    )


def split_seeds(seeds: list[int], val_fraction: float, test_fraction: float, seed: int):
    """Episode-level train / val / test split, reproducible under `seed`; each non-empty when fractions are > 0."""
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise UserError(
            f"task.val_fraction={val_fraction}, task.test_fraction={test_fraction}: need each in [0, 1) "
            "and their sum < 1"
        )
    order = np.random.default_rng(seed).permutation(len(seeds))
    n_val = max(1, int(round(val_fraction * len(seeds)))) if val_fraction > 0 else 0
    n_test = max(1, int(round(test_fraction * len(seeds)))) if test_fraction > 0 else 0
    if n_val + n_test >= len(seeds):
        raise UserError(
            f"{len(seeds)} episode(s) cannot be split into train/val/test ({n_val} val, {n_test} test, "
            "at least 1 train): record more episodes or lower task.val_fraction / "
            "task.test_fraction"
        )
    pick = [seeds[i] for i in order]
    return sorted(pick[n_val + n_test :]), sorted(pick[:n_val]), sorted(pick[n_val : n_val + n_test])


def offline_report(model, dataset: StackDataset, batch_size: int = 256, seed: int = 0) -> dict:
    """MSE/NLL/CRPS/ECE/coverage over all actions and per action, with the controller's default samples."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    parts = []
    with torch.inference_mode():
        for x, _ in dataset.batches(batch_size):
            parts.append(model.predict(x, None, generator))
    pred = type(parts[0])(*(torch.cat(ts) for ts in zip(*parts, strict=True)))
    y = dataset.labels
    per_action = {
        name: metrics.regression_report(type(pred)(*(t[:, d : d + 1] for t in pred)), y[:, d : d + 1])
        for d, name in enumerate(TARGETS)
    }
    return {**metrics.regression_report(pred, y), "per_action": per_action}


def _fingerprint(data: Demonstrations, splits: dict[str, list[int]], opts: Options) -> dict:
    manifest = (data.root / "manifest.json").read_bytes()
    return {
        "path": str(data.root.resolve()),
        "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
        "expert": str(data.settings.get("expert")),
        "action_noise": float(data.settings.get("action_noise", 0.0) or 0.0),
        "n_episodes": len(data),
        # episodes a `drive dagger` round recorded (its clone drove them): `drive collect` cannot regenerate those
        "dagger_seeds": sorted(int(e["seed"]) for e in data.manifest["episodes"] if e.get("dagger")),
        "stride": opts.stride,
        "frame_coding": opts.frame_coding,
        "input": opts.input,
        **{f"{name}_seeds": list(map(int, seeds)) for name, seeds in splits.items()},
        **({"test_data": str(Path(opts.test_data).resolve())} if opts.test_data else {}),
        **({"split_seed": opts.split_seed} if opts.split_seed is not None else {}),
        # task and options as tasks.load records them (same keys, same order), split_seed only when set: a run
        # without it keeps the fingerprint it always had
        "task": "demos",
        "options": {k: v for k, v in asdict(opts).items() if k != "split_seed" or v is not None},
    }


def _task_data(
    train: StackDataset, val: StackDataset, test: StackDataset, k: int, fingerprint: dict, seed: int
) -> TaskData:
    def evaluate(model) -> dict:
        return {"test": offline_report(model, test, seed=seed)}

    return TaskData(
        name="demos",
        train=train,
        val=val,
        test=test,
        encoder=EncoderConfig(kind="frames", n_tokens=k, d_model=32),
        out_dim=len(TARGETS),
        target_names=TARGETS,
        fingerprint=fingerprint,
        evaluate=evaluate,
        train_defaults={"epochs": 8, "batch_size": 64, "lr": 1e-3, "patience": 3, "select": SELECT},
    )


def build(opts: Options, data: Path | None, seed: int) -> TaskData:
    if data is None:
        raise UserError("task 'demos' needs --data DIR (a dataset recorded by `drive collect`)")
    demos = Demonstrations(data, include_flagged=opts.include_flagged)
    seeds = demos.seeds[: opts.max_episodes] if opts.max_episodes > 0 else demos.seeds
    needed = 1 + (opts.val_fraction > 0) + (opts.test_fraction > 0 and not opts.test_data)  # train, val, test
    if demos.n_flagged and len(seeds) < needed:
        total = len(demos.manifest["episodes"])
        raise UserError(
            f"{data}: {demos.n_flagged} of {total} episode(s) are flagged (return below the dataset's "
            f"--min-return {demos.settings.get('min_return')}) and left out, {len(seeds)} left: too few "
            "to split into train/val/test; rerun its `drive collect` command with --min-return LOWER "
            "(e.g. 0; nothing is recorded again) or train with --set task.include_flagged=true"
        )
    test_data = demos
    split = seed if opts.split_seed is None else opts.split_seed
    if opts.test_data:
        train_seeds, val_seeds, _ = split_seeds(seeds, opts.val_fraction, 0.0, split)
        test_data = Demonstrations(Path(opts.test_data), include_flagged=opts.include_flagged)
        test_seeds = test_data.seeds
    else:
        train_seeds, val_seeds, test_seeds = split_seeds(seeds, opts.val_fraction, opts.test_fraction, split)
    log.info(
        "demos %s: %d train, %d val, %d test episodes (stride %d)",
        data,
        len(train_seeds),
        len(val_seeds),
        len(test_seeds),
        opts.stride,
    )
    train = gather(demos, train_seeds, opts.stride, opts.frame_coding, opts.input)
    val = gather(demos, val_seeds, opts.stride, opts.frame_coding, opts.input)
    test = gather(test_data, test_seeds, 1, opts.frame_coding, opts.input)
    splits = {"train": train_seeds, "val": val_seeds, "test": test_seeds}
    return _task_data(train, val, test, demos.frame_stack, _fingerprint(demos, splits, opts), seed)


def rebuild(fp: dict[str, Any]) -> TaskData:
    """The splits of a checkpoint trained on this task, from its data fingerprint exactly as training built them
    (the seeds it lists; train and val at the training stride, test at stride 1, from test_data if given). Reads the
    fingerprints of older checkpoints too (`frames: full | bridge` instead of `frame_coding`)."""
    missing = [k for k in ("path", "train_seeds", "val_seeds", "test_seeds") if k not in fp]
    if missing:
        raise UserError(f"the checkpoint's demos fingerprint lacks {missing}")
    coding, input_name, stride = fingerprint_coding(fp), str(fp.get("input", "frames")), int(fp.get("stride", 1))
    if not fp.get("test_data"):
        require_episodes(Path(fp["path"]), [*fp["train_seeds"], *fp["val_seeds"], *fp["test_seeds"]], fp)
    demos = Demonstrations(Path(fp["path"]), include_flagged=True)
    test_demos = Demonstrations(Path(fp["test_data"]), include_flagged=True) if fp.get("test_data") else demos
    train = gather(demos, fp["train_seeds"], stride, coding, input_name)
    val = gather(demos, fp["val_seeds"], stride, coding, input_name)
    test = gather(test_demos, fp["test_seeds"], 1, coding, input_name)
    return _task_data(train, val, test, demos.frame_stack, dict(fp), int(fp.get("seed", 0)))
