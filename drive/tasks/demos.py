"""Task "demos": behaviour cloning on recorded CarRacing demonstrations (`drive train --data DIR`).

Input: the frame stack the policy saw, (k, 84, 84) uint8 (the encoder `frames` turns each frame into one token, so
the stack is the time axis, as in the NSAC CarRacing experiment). Target: the expert's clean action label
(steer, gas, brake) — with DART noise the executed action differs, the label never does. The controller predicts the
three as a Gaussian; the trainer fits the target standardisation on the training split and saves it with the weights.

Split by episode (track seed), never by frame: consecutive frames are nearly identical, so a frame split would leak.
The episodes are split three ways, reproducibly under --seed: train, validation (early stopping on NLL) and a
held-out test split on which `evaluate` reports the offline metrics (MSE, NLL, CRPS, ECE, PIT, coverage and
width of central intervals; overall and per action). With `task.test_data=DIR`, a separately collected dataset is
the test split instead and every episode of DIR is used for train/val.

Frames are held once per episode (T + k - 1 frames, not T stacks of k), and a batch's stacks are gathered by index:
50 episodes of 1,000 steps take ~0.35 GB instead of 1.4 GB.

Observation coding — two options, saved in the checkpoint's data fingerprint; drive/policies.py rebuilds the same
observation in the closed loop with `ObservationCoder`, so training and driving can never differ:
- `task.frames`: `full` (default) codes each frame from the env's raw 96x96 RGB frame (`full_frame`: gray, resized
  to 84x84, the indicator bar kept: speed, ABS, steering and gyro bars, as every CarRacing pixel agent sees them);
  needs data collected with --keep-raw. `bridge` takes the bridge's own 84x84 frame, which crops that bar. Why
  `full`: the expert's gas and brake depend on speed; without the bar, speed is only visible as motion between
  frames, and clones trained on bridge frames did not brake before corners (measured; see the model card).
- `task.input`: `frames` (default), the stack oldest first, one token per frame; or `motion`, [newest frame,
  newest - previous, ..., second - oldest] (differences stored as 128 + diff / 2), an invertible re-coding that hands
  the per-frame CNN the motion directly (each controller pools its attention output, a convex combination of
  per-token read-outs, which cannot itself subtract two frames).

Options (`--set task.KEY=VALUE`): frames (full), input (frames), val_fraction (0.1), test_fraction (0.1), stride (1:
every step; 2: every other step, for quick runs), max_episodes (0: all), test_data (a dataset dir), include_flagged.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import cv2
import numpy as np
import torch

from agents.encoders import EncoderConfig
from datasets.demonstrations import Demonstrations
from drive import metrics
from drive.tasks import TaskConfig, TaskData

log = logging.getLogger(__name__)

TARGETS = ("steer", "gas", "brake")
OPTIONS = ("frames", "input", "val_fraction", "test_fraction", "stride", "max_episodes", "test_data", "include_flagged")


def motion_stack(x: torch.Tensor) -> torch.Tensor:
    """(..., k, H, W) uint8 frame stack (oldest first) -> (..., k, H, W) uint8 [newest, newest - previous, ...]."""
    xi = x.to(torch.int16)
    diffs = xi[..., 1:, :, :] - xi[..., :-1, :, :]  # (..., k-1, H, W): f_{j+1} - f_j
    coded = (128 + torch.div(diffs.flip(-3), 2, rounding_mode="floor")).clamp(0, 255)  # newest difference first
    return torch.cat([xi[..., -1:, :, :], coded], dim=-3).to(torch.uint8)


INPUTS = {"frames": lambda x: x, "motion": motion_stack}


FRAME_SOURCES = ("full", "bridge")


def input_transform(name: str):
    """The stack transform a demos-trained controller expects (applied to uint8 tensors (..., k, 84, 84))."""
    if name not in INPUTS:
        raise ValueError(f"unknown input representation {name!r}; choose one of {sorted(INPUTS)}")
    return INPUTS[name]


def full_frame(rgb96: np.ndarray) -> np.ndarray:
    """(96, 96, 3) uint8 RGB raw frame -> (84, 84) uint8 gray, the whole view including the indicator bar."""
    small = cv2.resize(np.ascontiguousarray(rgb96), (84, 84), interpolation=cv2.INTER_AREA)  # (84, 84, 3)
    return cv2.cvtColor(small, cv2.COLOR_RGB2GRAY)


class ObservationCoder:
    """The closed-loop observation of a demos-trained controller, built exactly as its training stacks were.

    `bridge`: the env's observation (k, 84, 84); `full`: a sliding window of `full_frame(info["raw_frame"])`,
    filled with the first frame after reset (as the bridge fills its stack); then the `input` transform.
    """

    def __init__(self, frames: str = "bridge", input: str = "frames", k: int = 4):
        if frames not in FRAME_SOURCES:
            raise ValueError(f"unknown frame source {frames!r}; choose one of {FRAME_SOURCES}")
        self.frames, self.k, self.transform = frames, k, input_transform(input)
        self.needs_raw = frames == "full"
        self.reset()

    @classmethod
    def from_fingerprint(cls, data: dict, k: int) -> ObservationCoder:
        # checkpoints from before these options existed were trained on bridge frames, untransformed
        return cls(data.get("frames", "bridge"), data.get("input", "frames"), k)

    def reset(self) -> None:
        self._stack: np.ndarray | None = None

    def __call__(self, obs, info) -> torch.Tensor:
        if self.frames == "bridge":
            stack = np.asarray(obs)
        else:
            if "raw_frame" not in info:
                raise KeyError("this controller sees full frames: run the env with keep_raw=True (info['raw_frame'])")
            frame = full_frame(info["raw_frame"])
            if self._stack is None:
                self._stack = np.repeat(frame[None], self.k, axis=0)  # (k, 84, 84)
            else:
                self._stack = np.concatenate([self._stack[1:], frame[None]])
            stack = self._stack
        return self.transform(torch.as_tensor(stack)[None])  # (1, k, 84, 84)


class StackDataset(torch.utils.data.Dataset):
    """(frame stack, action label) pairs over whole episodes, frames stored once.

    `frames` (F, 84, 84) uint8 holds every episode's frames back to back; sample i's stack is
    frames[start[i] : start[i] + k]. Items are (x (k, 84, 84) uint8, y (3,) float32).
    """

    def __init__(self, frames: np.ndarray, start: np.ndarray, labels: np.ndarray, k: int, seeds: np.ndarray,
                 transform=INPUTS["frames"]):  # fmt: skip
        self.frames = torch.from_numpy(frames)  # (F, 84, 84) uint8
        self.start = torch.from_numpy(start.astype(np.int64))  # (N,)
        self.labels = torch.from_numpy(labels.astype(np.float32))  # (N, 3)
        self.seeds = seeds  # (N,) track seed of each sample
        self.k = k
        self._offsets = torch.arange(k)  # (k,)
        self.transform = transform

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


def episode_frames(ep, source: str, where: Path) -> np.ndarray:
    """(T + k - 1, 84, 84): the episode's frames in the chosen coding, padded like the bridge's reset stack."""
    if source == "bridge":
        return ep.frames
    if ep.raw is None:
        raise ValueError(f"{where}: seed {ep.seed} has no raw frames; task.frames=full needs data collected with "
                         "--keep-raw (or use task.frames=bridge)")  # fmt: skip
    coded = np.stack([full_frame(f) for f in ep.raw])  # (T, 84, 84)
    return np.concatenate([np.repeat(coded[:1], ep.frame_stack - 1, axis=0), coded])


def _gather(data: Demonstrations, seeds: list[int], stride: int, transform, source: str) -> StackDataset:
    frames, starts, labels, sample_seeds = [], [], [], []
    offset = 0
    for seed in seeds:
        ep = data.load(seed)
        steps = np.arange(0, len(ep), stride)
        frames.append(episode_frames(ep, source, data.root))
        starts.append(offset + steps)
        labels.append(ep.label[steps])
        sample_seeds.append(np.full(len(steps), seed))
        offset += len(frames[-1])
    if not frames:
        raise ValueError(f"{data.root}: no episodes in this split")
    return StackDataset(
        np.concatenate(frames), np.concatenate(starts), np.concatenate(labels), data.frame_stack,
        np.concatenate(sample_seeds), transform,
    )  # fmt: skip


def split_seeds(seeds: list[int], val_fraction: float, test_fraction: float, seed: int):
    """Episode-level train / val / test split, reproducible under `seed`; each non-empty when fractions are > 0."""
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(f"task.val_fraction={val_fraction}, task.test_fraction={test_fraction}: need sum < 1")
    order = np.random.default_rng(seed).permutation(len(seeds))
    n_val = max(1, int(round(val_fraction * len(seeds)))) if val_fraction > 0 else 0
    n_test = max(1, int(round(test_fraction * len(seeds)))) if test_fraction > 0 else 0
    if n_val + n_test >= len(seeds):
        raise ValueError(f"{len(seeds)} episodes cannot be split into train/val/test ({n_val} val, {n_test} test)")
    pick = [seeds[i] for i in order]
    return sorted(pick[n_val + n_test :]), sorted(pick[:n_val]), sorted(pick[n_val : n_val + n_test])


def _fingerprint(data: Demonstrations, splits: dict[str, list[int]], stride: int, source: str, input_name: str) -> dict:
    manifest = (data.root / "manifest.json").read_bytes()
    return {
        "path": str(data.root.resolve()),
        "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
        "expert": str(data.settings.get("expert")),
        "action_noise": float(data.settings.get("action_noise", 0.0) or 0.0),
        "n_episodes": len(data),
        "stride": stride,
        "frames": source,
        "input": input_name,
        **{f"{name}_seeds": list(map(int, seeds)) for name, seeds in splits.items()},
    }


def offline_report(model, dataset: StackDataset, batch_size: int = 256, seed: int = 0) -> dict:
    """MSE/NLL/CRPS/ECE/coverage over all actions and per action, with the controller's default samples."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    parts = []
    with torch.inference_mode():
        for x, _ in dataset.batches(batch_size):
            pred = model.predict(x, None, generator)
            parts.append(pred)
    mean, ale, epi = (torch.cat(ts) for ts in zip(*parts, strict=True))
    pred = type(parts[0])(mean, ale, epi)
    y = dataset.labels
    report = metrics.regression_report(pred, y)
    per_action = {}
    for d, name in enumerate(TARGETS):
        sub = type(pred)(mean[:, d : d + 1], ale[:, d : d + 1], epi[:, d : d + 1])
        per_action[name] = metrics.regression_report(sub, y[:, d : d + 1])
    return {**report, "per_action": per_action}


def checkpoint_test_report(path: str | Path, seed: int = 0) -> dict:
    """The offline test metrics of any checkpoint trained on this task (e.g. last.pt, which `drive train` does not
    report), on the test episodes and observation coding its data fingerprint names."""
    from drive.checkpoint import load_controller

    model, payload = load_controller(path)
    return offline_report(model, checkpoint_split(path, payload.get("data", {}), "test"), seed=seed)


def checkpoint_split(path: str | Path, fp: dict, split: str) -> StackDataset:
    """The train/val/test split of a checkpoint trained on this task, rebuilt from its data fingerprint `fp` exactly
    as training built it: train and val at the training stride, test at stride 1 (from task.test_data if given)."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"unknown split {split!r}; choose train, val or test")
    missing = [k for k in ("path", f"{split}_seeds") if k not in fp]
    if fp.get("task") != "demos" or missing:
        raise ValueError(f"{path}: not trained on task demos (data fingerprint lacks {missing or 'task=demos'})")
    root = Path(fp.get("test_data", fp["path"]) if split == "test" else fp["path"])
    stride = 1 if split == "test" else int(fp.get("stride", 1))
    source, name = fp.get("frames", "bridge"), fp.get("input", "frames")
    data = Demonstrations(root, include_flagged=True)
    return _gather(data, fp[f"{split}_seeds"], stride, input_transform(name), source)


def build(cfg: TaskConfig) -> TaskData:
    cfg.check_known(OPTIONS)
    root = cfg.require_data()
    include_flagged = cfg.get("include_flagged", False)
    data = Demonstrations(root, include_flagged=include_flagged)
    input_name, source = cfg.get("input", "frames"), cfg.get("frames", "full")
    transform = input_transform(input_name)
    if source not in FRAME_SOURCES:
        raise ValueError(f"task.frames={source!r}: choose one of {FRAME_SOURCES}")
    stride = cfg.get("stride", 1)
    if stride < 1:
        raise ValueError(f"task.stride={stride}: must be >= 1")
    seeds = data.seeds
    max_episodes = cfg.get("max_episodes", 0)
    if max_episodes > 0:
        seeds = seeds[:max_episodes]
    test_dir = cfg.get("test_data", "")
    val_fraction, test_fraction = cfg.get("val_fraction", 0.1), cfg.get("test_fraction", 0.1)
    if test_dir:
        train_seeds, val_seeds, _ = split_seeds(seeds, val_fraction, 0.0, cfg.seed)
        test_data = Demonstrations(Path(test_dir), include_flagged=include_flagged)
        test_seeds = test_data.seeds
    else:
        train_seeds, val_seeds, test_seeds = split_seeds(seeds, val_fraction, test_fraction, cfg.seed)
        test_data = data
    log.info("demos %s: %d train, %d val, %d test episodes (stride %d)", root, len(train_seeds), len(val_seeds),
             len(test_seeds), stride)  # fmt: skip
    train = _gather(data, train_seeds, stride, transform, source)
    val = _gather(data, val_seeds, stride, transform, source)
    test = _gather(test_data, test_seeds, 1, transform, source)

    def evaluate(model) -> dict:
        return {"test": offline_report(model, test, seed=cfg.seed)}

    splits = {"train": train_seeds, "val": val_seeds, "test": test_seeds}
    fingerprint = _fingerprint(data, splits, stride, source, input_name)
    if test_dir:
        fingerprint["test_data"] = str(Path(test_dir).resolve())
    return TaskData(
        name="demos",
        train=train,
        val=val,
        encoder=EncoderConfig(kind="frames", n_tokens=data.frame_stack, d_model=32),
        out_dim=len(TARGETS),
        target_names=TARGETS,
        fingerprint=fingerprint,
        evaluate=evaluate,
        controller_defaults={},
        train_defaults={"epochs": 8, "batch_size": 64, "lr": 1e-3, "patience": 3},
    )
