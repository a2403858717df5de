"""The demonstration recorder: an observer that accumulates one episode's arrays in the dataset format.

Per step it codes the raw frame once (`datasets.frames`, the coding the dataset is recorded with) and stores it once
(the reader rebuilds the stacks: the first k - 1 stored frames pad the reset stack, as the closed loop's
`ObservationCoder` does), plus the clean label, the executed action, the privileged state, reward, progress, speed,
pose, off-track, and optionally the raw RGB frame. `arrays()` returns the shard's arrays
(datasets/demonstrations.py documents every field).
"""

from __future__ import annotations

import numpy as np

from datasets.frames import frame_coder
from drive.loop.rollout import StepRecord

STEP_FIELDS = ("label", "action", "state", "reward", "progress", "speed", "pose", "off_track", "raw")
_NO_POSE = np.full(3, np.nan)  # an env without a pose: read only (`arrays` copies it), so one for every step


class EpisodeRecorder:
    """Observer collecting one episode (call `arrays()` when it ended); frames coded with `coding`."""

    def __init__(self, frame_stack: int, coding: str, keep_raw: bool):
        if frame_stack < 1:
            raise ValueError(f"frame_stack must be >= 1, got {frame_stack}")
        self.k, self.keep_raw, self.code = frame_stack, keep_raw, frame_coder(coding)
        self.frames: list[np.ndarray] = []
        self.steps: dict[str, list] = {key: [] for key in STEP_FIELDS}

    def __call__(self, rec: StepRecord) -> None:
        raw = np.asarray(rec.obs)
        frame = self.code(raw)  # (84, 84)
        if rec.t == 0:
            self.frames.extend([frame] * (self.k - 1))  # the reset stack's padding
        self.frames.append(frame)
        s = self.steps
        s["label"].append(rec.label)
        s["action"].append(rec.action)
        s["state"].append(np.array(rec.info["state"], np.float32))
        s["reward"].append(rec.reward)
        s["progress"].append(rec.next_info.get("progress", np.nan))
        s["speed"].append(rec.info.get("speed", np.nan))
        s["pose"].append(rec.info.get("pose", _NO_POSE))
        s["off_track"].append(bool(rec.next_info.get("off_track", False)))
        if self.keep_raw:
            s["raw"].append(np.array(raw, np.uint8))

    def arrays(self) -> dict[str, np.ndarray]:
        s = self.steps
        out: dict[str, np.ndarray] = {
            "frames": np.stack(self.frames).astype(np.uint8, copy=False),  # (T + k - 1, 84, 84)
            "label": np.asarray(s["label"], np.float32),  # (T, 3)
            "action": np.asarray(s["action"], np.float32),  # (T, 3)
            "state": np.asarray(s["state"], np.float32),  # (T, S)
            "reward": np.asarray(s["reward"], np.float32),  # (T,)
            "progress": np.asarray(s["progress"], np.float32),  # (T,)
            "speed": np.asarray(s["speed"], np.float32),  # (T,)
            "pose": np.asarray(s["pose"], np.float32),  # (T, 3)
            "off_track": np.asarray(s["off_track"], bool),  # (T,)
        }
        if self.keep_raw:
            out["raw"] = np.asarray(s["raw"], np.uint8)  # (T, 96, 96, 3)
        return out


def recorder_for(settings: dict) -> EpisodeRecorder:
    """The recorder of one episode of a dataset with these settings (the factory `drive.loop.collect` calls)."""
    return EpisodeRecorder(int(settings["frame_stack"]), str(settings["frame_coding"]), bool(settings["keep_raw"]))
