"""Recorded demonstrations (written by `drive collect`): the open format, its atomic writer and its reader.

Layout of a dataset directory:

    DIR/manifest.json                 the index: the only source of truth for which episodes exist
    DIR/episodes/seed_000123.npz      one compressed numpy archive per episode (np.load reads it)

`manifest.json` (rewritten atomically after every finished episode):

    format     "drive-demonstrations"
    version    FORMAT_VERSION
    settings   what produced the data: env, expert, action_noise (DART std), noise_seed, frame_stack,
               frame_coding (datasets/frames.py; absent in datasets recorded before codings had names: `cropped`),
               max_episode_steps, keep_raw, min_return (flag threshold), fast_render
    episodes   one record per finished episode, sorted by seed: seed, file (relative path), return, completion
               (fraction of track tiles visited), steps, tiles, n_tiles, off_track_events, lap_finished,
               flagged (return < min_return), sha256 and bytes of the shard; dagger, labels (`drive dagger`'s)

An episode shard of T steps with frame stack k holds (t = 0..T-1 is the step index):

    frames     (T + k - 1, 84, 84) uint8   each frame once, coded with settings.frame_coding; the controller's input
                                           at step t is the stack frames[t : t + k] (the first k - 1 pad the reset)
    label      (T, 3) float32              the expert's clean action (steer, gas, brake): the behaviour-cloning target
    action     (T, 3) float32              the executed action: label + DART noise, clipped (= label without noise)
    state      (T, S) float32              the privileged state the expert acted on at step t
    reward     (T,)   float32              reward received for step t
    progress   (T,)   float32              track progress (fraction of tiles visited) after step t
    speed      (T,)   float32              speed at step t
    pose       (T, 3) float32              (x, y, heading) at step t
    off_track  (T,)   bool                 off track after step t
    raw        (T, 96, 96, 3) uint8        optional (keep_raw): the env's raw RGB frame at step t

Crash safety: a shard is written to a temporary file, fsynced and renamed into place before the manifest names it,
and the manifest itself is replaced the same way, so a reader never sees a half-written episode; a shard on disk that
the manifest does not name (the writer was killed between the two renames) is ignored and redone by a resumed run.
Episodes whose return fell below `min_return` are flagged and left out unless `include_flagged=True`.

Never imports `drive`, `agents` or `sim_bridges`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datasets.errors import DataError
from datasets.files import atomic_write
from datasets.frames import LEGACY_CODING
from datasets.npz import npz_bytes

FORMAT = "drive-demonstrations"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
EPISODE_DIR = "episodes"
STEP_KEYS = ("label", "action", "state", "reward", "progress", "speed", "pose", "off_track")  # all (T, ...)
EPISODE_FIELDS = ("seed", "file", "return", "completion", "steps", "flagged", "sha256", "bytes")  # required


class DemonstrationError(DataError):
    """A dataset file is missing, corrupt, truncated or inconsistent; the message names the file."""


# -- writing ---------------------------------------------------------------------------------------------------------
def shard_path(seed: int) -> str:
    return f"{EPISODE_DIR}/seed_{int(seed):06d}.npz"


def write_episode(root: str | os.PathLike, seed: int, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Write one episode shard atomically; returns the manifest fields it owns (file, sha256, bytes)."""
    data = npz_bytes(arrays)  # deflated by ISA-L (datasets/npz.py); np.load reads it like any .npz
    rel = shard_path(seed)
    path = Path(root) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)
    return {"file": rel, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def write_manifest(
    root: str | os.PathLike,
    settings: dict[str, Any],
    episodes: Sequence[dict[str, Any]],
    pending: Sequence[int] = (),
) -> None:
    """`pending`: seeds the writing command has still to record (a run stopped halfway: readers refuse the dataset
    until the same command, rerun, finishes it); empty once complete."""
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "settings": settings,
        "episodes": sorted(episodes, key=lambda e: e["seed"]),
        "pending": sorted(int(s) for s in pending),
    }
    atomic_write(Path(root) / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())


# -- reading ---------------------------------------------------------------------------------------------------------
def read_manifest(root: str | os.PathLike) -> dict[str, Any]:
    """Parse and check manifest.json; a clear error naming the file on anything wrong."""
    path = Path(root) / MANIFEST
    if not Path(root).exists():
        raise DemonstrationError(f"{root}: no such folder")
    if not Path(root).is_dir():
        raise DemonstrationError(f"{root}: not a folder (a recorded dataset is a folder holding {MANIFEST})")
    if not path.is_file():
        raise DemonstrationError(
            f"{root}: holds no {MANIFEST}, so it is not a recorded dataset (drive collect --out DIR records one)"
        )
    try:
        manifest = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DemonstrationError(f"{path}: corrupt or truncated manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DemonstrationError(f"{path}: not a {FORMAT} manifest (format field is {_get(manifest, 'format')!r})")
    if manifest.get("version") != FORMAT_VERSION:
        raise DemonstrationError(
            f"{path}: format version {manifest.get('version')!r}, this reader reads {FORMAT_VERSION}"
        )
    for key, kind in (("settings", dict), ("episodes", list)):
        if not isinstance(manifest.get(key), kind):
            raise DemonstrationError(f"{path}: field {key!r} missing or not a {kind.__name__}")
    if not isinstance(manifest.get("pending", []), list):
        raise DemonstrationError(f"{path}: field 'pending' is not a list")
    for i, episode in enumerate(manifest["episodes"]):
        missing = [f for f in EPISODE_FIELDS if not isinstance(episode, dict) or f not in episode]
        if missing:
            raise DemonstrationError(f"{path}: episodes[{i}] lacks field(s) {missing}")
    return manifest


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else None


@dataclass(frozen=True)
class Episode:
    """One recorded episode; arrays as documented in the module docstring."""

    seed: int
    meta: dict[str, Any]
    frames: np.ndarray  # (T + k - 1, 84, 84) uint8
    label: np.ndarray  # (T, 3)
    action: np.ndarray  # (T, 3)
    state: np.ndarray  # (T, S)
    reward: np.ndarray  # (T,)
    progress: np.ndarray  # (T,)
    speed: np.ndarray  # (T,)
    pose: np.ndarray  # (T, 3)
    off_track: np.ndarray  # (T,)
    raw: np.ndarray | None  # (T, 96, 96, 3) or None
    frame_stack: int

    def __len__(self) -> int:
        return len(self.label)

    def stack(self, t: int) -> np.ndarray:
        """The observation the policy saw at step t, (k, 84, 84)."""
        if not 0 <= t < len(self):
            raise IndexError(f"step {t} out of range for an episode of {len(self)} steps")
        return self.frames[t : t + self.frame_stack]

    def stacks(self) -> np.ndarray:
        """All observations as a read-only view without copying, (T, k, 84, 84)."""
        view = np.lib.stride_tricks.sliding_window_view(self.frames, self.frame_stack, axis=0)  # (T, 84, 84, k)
        return np.moveaxis(view, -1, 1)


def load_episode(root: str | os.PathLike, meta: dict[str, Any], frame_stack: int, verify: bool = True) -> Episode:
    """Read one shard named by a manifest record; checks its hash (verify) and that its arrays agree."""
    path = Path(root) / meta["file"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DemonstrationError(f"{path}: cannot read episode shard ({exc.strerror or exc})") from None
    if verify and (len(data) != meta["bytes"] or hashlib.sha256(data).hexdigest() != meta["sha256"]):
        raise DemonstrationError(
            f"{path}: shard does not match the manifest ({len(data)} bytes, manifest says {meta['bytes']}; "
            "corrupt, truncated or replaced)"
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, KeyError) as exc:
        raise DemonstrationError(f"{path}: corrupt or truncated episode shard ({exc})") from None
    missing = [key for key in ("frames", *STEP_KEYS) if key not in arrays]
    if missing:
        raise DemonstrationError(f"{path}: episode shard lacks array(s) {missing}")
    n_steps = len(arrays["label"])
    bad = [key for key in (*STEP_KEYS, *(["raw"] if "raw" in arrays else [])) if len(arrays[key]) != n_steps]
    if bad or len(arrays["frames"]) != n_steps + frame_stack - 1 or n_steps != meta["steps"]:
        raise DemonstrationError(
            f"{path}: inconsistent lengths (steps {n_steps}, manifest {meta['steps']}, frames {len(arrays['frames'])}"
            f" for stack {frame_stack}, mismatched: {bad})"
        )
    return Episode(
        seed=int(meta["seed"]),
        meta=meta,
        raw=arrays.get("raw"),
        frame_stack=frame_stack,
        **{key: arrays[key] for key in ("frames", *STEP_KEYS)},
    )


def check_sizes(root: str | os.PathLike, episodes: Sequence[dict[str, Any]]) -> None:
    """The cheap integrity check every reader runs: each listed shard exists with the size the manifest records
    (a truncated, replaced or missing shard is a DemonstrationError naming it; hashes are checked on load)."""
    for ep in episodes:
        path = Path(root) / ep["file"]
        try:
            size = path.stat().st_size
        except OSError:
            raise DemonstrationError(f"{path}: listed in the manifest but missing") from None
        if size != ep["bytes"]:
            raise DemonstrationError(f"{path}: {size} bytes, the manifest says {ep['bytes']} (truncated or replaced)")


class Demonstrations:
    """A dataset directory: `Demonstrations(DIR)` lists the unflagged episodes; iterate, load or split them."""

    def __init__(
        self,
        root: str | os.PathLike,
        include_flagged: bool = False,
        verify: bool = True,
        min_return: float | None = None,
        allow_pending: bool = False,
    ):
        """`min_return` re-flags episodes by their recorded return instead of the threshold they were recorded with;
        `allow_pending` reads the finished episodes of a dataset whose writing run stopped halfway."""
        self.root = Path(root)
        self.manifest = read_manifest(self.root)
        self.settings: dict[str, Any] = self.manifest["settings"]
        self.verify = verify
        try:
            self.frame_stack = int(self.settings["frame_stack"])
        except (KeyError, TypeError, ValueError):
            raise DemonstrationError(f"{self.root / MANIFEST}: settings.frame_stack missing or not an int") from None
        self.frame_coding = str(self.settings.get("frame_coding", LEGACY_CODING))
        everything = self.manifest["episodes"]
        if min_return is not None:
            everything = [{**e, "flagged": bool(e["return"] < min_return)} for e in everything]
        self.n_flagged = sum(bool(e["flagged"]) for e in everything)
        self.episodes: list[dict[str, Any]] = [e for e in everything if include_flagged or not e["flagged"]]
        pending = self.manifest.get("pending", [])  # absent in datasets written before the field: complete
        if pending and not allow_pending:
            raise DemonstrationError(
                f"{self.root}: incomplete, {len(pending)} episode(s) still to record (a `drive collect` / `drive "
                "dagger` run stopped halfway); rerun the command that wrote it to finish it"
            )
        check_sizes(self.root, self.manifest["episodes"])

    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def seeds(self) -> list[int]:
        return [int(e["seed"]) for e in self.episodes]

    @property
    def n_frames(self) -> int:
        return sum(int(e["steps"]) for e in self.episodes)

    def load(self, seed: int) -> Episode:
        for meta in self.episodes:
            if int(meta["seed"]) == int(seed):
                return load_episode(self.root, meta, self.frame_stack, self.verify)
        raise KeyError(f"seed {seed} is not among the {len(self)} listed episodes of {self.root}")

    def __iter__(self) -> Iterator[Episode]:
        for meta in self.episodes:
            yield load_episode(self.root, meta, self.frame_stack, self.verify)

    def split(self, val_fraction: float = 0.2, seed: int = 0) -> tuple[list[int], list[int]]:
        """Train / validation track seeds, split by episode (never by frame), reproducible under `seed`."""
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        seeds = np.array(self.seeds)
        order = np.random.default_rng(seed).permutation(len(seeds))
        n_val = int(round(val_fraction * len(seeds)))
        if val_fraction > 0 and len(seeds) > 1:
            n_val = max(1, min(n_val, len(seeds) - 1))
        val, train = sorted(seeds[order[:n_val]].tolist()), sorted(seeds[order[n_val:]].tolist())
        return train, val

    def arrays(self, seeds: Sequence[int] | None = None) -> dict[str, np.ndarray]:
        """Concatenated (observations, labels, states) over episodes: obs (N, k, 84, 84) uint8, copies."""
        chosen = self.seeds if seeds is None else list(seeds)
        episodes = [self.load(s) for s in chosen]
        if not episodes:
            raise DemonstrationError(f"{self.root}: no episodes selected")
        return {
            "obs": np.concatenate([e.stacks() for e in episodes]),
            "label": np.concatenate([e.label for e in episodes]),
            "action": np.concatenate([e.action for e in episodes]),
            "state": np.concatenate([e.state for e in episodes]),
            "seed": np.concatenate([np.full(len(e), e.seed) for e in episodes]),
        }
