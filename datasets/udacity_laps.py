"""Time in a Udacity log: frame times from the image names, segments between gaps, splits by time, label smoothing.

The simulator names every image `center_YYYY_MM_DD_HH_MM_SS_mmm.jpg` at the moment it was written, so a log carries
its own clock (~10-14 Hz). A recording may have gaps (the lake log in ../shared/data/udacity_lake withholds 71 s of
laps between its rows 1557 and 1558; a recorder paused and resumed): a *segment* is a run of frames with no gap longer
than `max_gap_s` between neighbours. Time never flows across a gap here: blocks are cut on the *active* time (gaps
squeezed out), near-twin frames are looked for within a segment only, smoothing never mixes two segments.

`block_split`: the log is cut into `n_blocks` contiguous blocks of equal active time; held-out blocks (test, val) are
whole stretches of driving, and a training frame within `gap_s` seconds of a held-out frame of the same segment is
dropped (neighbouring frames are near duplicates: a frame-by-frame split leaks). `random_split`: the NSAC paper's
protocol (a random fraction of frames held out), kept for comparison with its table only: it leaks by construction.

`smooth_labels`: keyboard driving records steering as short spikes (a key held for 2-4 frames, then 0). A Gaussian
kernel over time (standard deviation `sigma_s` seconds, truncated at 3 sigma, renormalised at segment ends) turns
them into the steering intent a camera frame can show; it is applied to training labels only and every evaluation
scores against the raw recorded labels.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_STAMP = re.compile(r"(\d{4})_(\d\d)_(\d\d)_(\d\d)_(\d\d)_(\d\d)_(\d{3})\.\w+$")
DEFAULT_PERIOD_S = 0.1  # the simulator's nominal frame interval, for logs whose image names carry no time


def frame_times(names: Sequence[str | Path]) -> np.ndarray:
    """Seconds since the first frame, from the image names; the row index * 0.1 s when a name carries no time."""
    stamps = []
    for name in names:
        m = _STAMP.search(Path(name).name)
        if m is None:
            return np.arange(len(names)) * DEFAULT_PERIOD_S
        y, mo, d, h, mi, s, ms = map(int, m.groups())
        stamps.append(np.datetime64(f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}.{ms:03d}", "ms"))
    t = (np.asarray(stamps) - stamps[0]).astype(np.float64) / 1e3 if stamps else np.zeros(0)
    if np.any(np.diff(t) < 0):  # names out of order (a hand-edited log): time is not trustworthy, rows are
        return np.arange(len(names)) * DEFAULT_PERIOD_S
    return t


def segments(t: np.ndarray, max_gap_s: float = 1.0) -> np.ndarray:
    """(N,) segment index of each frame: a new segment starts after a gap longer than max_gap_s."""
    return np.concatenate([[0], np.cumsum(np.diff(t) > max_gap_s)]).astype(np.int64) if len(t) else np.zeros(0, int)


def active_time(t: np.ndarray, max_gap_s: float = 1.0) -> np.ndarray:
    """Time with every gap longer than max_gap_s squeezed to the median frame interval."""
    if len(t) < 2:
        return np.zeros(len(t))
    dt = np.diff(t)
    dt = np.where(dt > max_gap_s, np.median(dt), dt)
    return np.concatenate([[0.0], np.cumsum(dt)])


def _check_blocks(n_blocks: int, test_blocks: tuple[int, ...], val_blocks: tuple[int, ...]) -> None:
    held = (*test_blocks, *val_blocks)
    bad = [b for b in held if not 0 <= b < n_blocks]
    if n_blocks < 1:
        raise ValueError(f"n_blocks must be >= 1, got {n_blocks}")
    if bad:
        raise ValueError(f"block(s) {bad} outside 0..{n_blocks - 1}")
    if len(set(held)) != len(held):
        raise ValueError(f"test blocks {test_blocks} and val blocks {val_blocks} overlap or repeat")
    if not test_blocks or not val_blocks or len(held) >= n_blocks:
        raise ValueError("need at least one test block, one val block and one training block")


def block_of(t: np.ndarray, n_blocks: int, max_gap_s: float = 1.0) -> np.ndarray:
    """(N,) block of each frame: n_blocks contiguous blocks of equal active time."""
    active = active_time(t, max_gap_s)
    total = active[-1] if len(active) else 0.0
    if total <= 0:
        return np.arange(len(t)) * n_blocks // max(len(t), 1)
    return np.minimum((active / total * n_blocks).astype(np.int64), n_blocks - 1)


def block_split(
    t: np.ndarray,
    n_blocks: int,
    test_blocks: tuple[int, ...],
    val_blocks: tuple[int, ...],
    gap_s: float,
    max_gap_s: float = 1.0,
) -> dict[str, np.ndarray]:
    """Row indices of train / val / test for frames at times t (seconds, in recording order)."""
    _check_blocks(n_blocks, test_blocks, val_blocks)
    if len(t) < n_blocks:
        raise ValueError(f"n_blocks must be at most the {len(t)} frames, got {n_blocks}")
    block = block_of(t, n_blocks, max_gap_s)
    is_test, is_val = np.isin(block, test_blocks), np.isin(block, val_blocks)
    seg = segments(t, max_gap_s)
    near = is_test | is_val
    if gap_s > 0:
        held = np.flatnonzero(near)
        # for every frame, the distance in time to the nearest held-out frame of its own segment
        for s in np.unique(seg[held]):
            mine, theirs = np.flatnonzero(seg == s), held[seg[held] == s]
            pos = np.searchsorted(t[theirs], t[mine])
            left = np.abs(t[mine] - t[theirs[np.clip(pos - 1, 0, len(theirs) - 1)]])
            right = np.abs(t[theirs[np.clip(pos, 0, len(theirs) - 1)]] - t[mine])
            near[mine] |= np.minimum(left, right) <= gap_s
    return {"train": np.flatnonzero(~near), "val": np.flatnonzero(is_val), "test": np.flatnonzero(is_test)}


def random_split(n: int, test_fraction: float, val_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """The NSAC paper's protocol: a random `test_fraction` of frames for test, `val_fraction` for validation."""
    if not (0 < test_fraction and 0 < val_fraction and test_fraction + val_fraction < 1):
        raise ValueError(f"test and val fractions must be > 0 and sum below 1, got {test_fraction}, {val_fraction}")
    order = np.random.default_rng([seed, 10]).permutation(n)
    n_test, n_val = max(1, round(n * test_fraction)), max(1, round(n * val_fraction))
    return {
        "train": np.sort(order[n_test + n_val :]),
        "val": np.sort(order[n_test : n_test + n_val]),
        "test": np.sort(order[:n_test]),
    }


def smooth_labels(y: np.ndarray, t: np.ndarray, sigma_s: float, max_gap_s: float = 1.0) -> np.ndarray:
    """Gaussian smoothing of y over time t (std sigma_s seconds, truncated at 3 sigma), within each segment."""
    y = np.asarray(y, dtype=np.float64)
    if sigma_s <= 0 or len(y) < 2:
        return y.copy()
    out = np.empty_like(y)
    seg = segments(t, max_gap_s)
    for s in np.unique(seg):
        idx = np.flatnonzero(seg == s)
        ts, ys = t[idx], y[idx]
        for i0 in range(0, len(idx), 512):  # rows in chunks, against the columns within 3 sigma of them
            i1 = min(i0 + 512, len(idx))
            j0, j1 = np.searchsorted(ts, ts[i0] - 3 * sigma_s), np.searchsorted(ts, ts[i1 - 1] + 3 * sigma_s, "right")
            d = ts[i0:i1, None] - ts[None, j0:j1]  # (rows, columns)
            w = np.exp(-0.5 * (d / sigma_s) ** 2) * (np.abs(d) <= 3 * sigma_s)
            out[idx[i0:i1]] = (w @ ys[j0:j1]) / w.sum(1)
    return out
