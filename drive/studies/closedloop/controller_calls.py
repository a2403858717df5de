"""What one controller call for K cars costs in the closed loop, back to back and between env steps.

`drive bench closedloop` prints it beside the eval rows: `drive eval --envs K` calls the controller once per step on
K frames, and between two calls each of the K envs steps once. The same call (`predict_lanes`: frame coding, the
network's S samples, outputs to numpy) is timed in CPU ms three ways, interleaved call by call, on the same K lanes,
each call on K frames the network has not seen (one new frame per car, as in the loop):

- back to back: nothing runs between calls (what `drive bench latency` measures, batch 1);
- after K state-mode env steps: physics, reward and privileged state between calls, no frame drawn;
- after K pixel env steps: the exact renderer runs K times between calls, as in `drive eval`.

Where the third costs more than the first two, the renderer's kernels have evicted what the network's many small
torch ops need (presumably caches and branch predictors: the frame-less steps run the same Python and physics and
leave the call's cost as it is): work the controller does again every step, which batching K cars amortises but
cannot remove. A benchmark: nothing here asserts a speed.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from drive.loop.envs import make_env
from drive.loop.lanes import lane_copies, predict_lanes
from drive.loop.specs import controller_policy


def _frames(k: int, seed: int) -> list[np.ndarray]:
    """k frames of a short drive (gas, steering slowly), one per lane."""
    env = make_env("carracing", max_episode_steps=10 * k + 60)
    env.reset(seed=seed)
    out = []
    for t in range(10 * k + 50):
        obs, *_ = env.step(np.array([0.3 * np.sin(t / 15), 0.4, 0.0], np.float32))
        if t >= 50 and (t - 50) % 10 == 0:
            out.append(np.ascontiguousarray(obs))
    env.close()
    return out


def _marked(frame: np.ndarray, a: int, b: int, c: int) -> np.ndarray:
    """A copy of `frame` with its top-left pixel set from (a, b, c): a frame no call has seen, so each call encodes
    one new frame per lane, as in the loop (the network remembers the tokens of frames it has seen)."""
    out = frame.copy()
    out[0, 0] = (a, b % 256, (c + b // 256) % 256)
    return out


def call_costs(ckpt: str, k: int, samples: int, seed: int, calls: int = 30) -> dict[str, float]:
    """CPU ms per K-lane controller call: back_to_back, after_state_steps, after_pixel_steps (means of `calls`)."""
    policy = controller_policy(ckpt, samples=samples, shadow=None)
    lanes = lane_copies(policy, k)
    for i, lane in enumerate(lanes):
        lane.reset(seed=seed + i)
    frames = _frames(k, seed)
    act = np.array([0.0, 0.3, 0.0], np.float32)
    envs: dict[str, list[Any]] = {}
    for name, pixels in (("state", False), ("pixel", True)):
        envs[name] = [make_env("carracing", pixels=pixels, max_episode_steps=10_000) for _ in range(k)]
        for i, env in enumerate(envs[name]):
            env.reset(seed=seed + 100 + i)
    between = {"back_to_back": [], "after_state_steps": envs["state"], "after_pixel_steps": envs["pixel"]}
    spent = dict.fromkeys(between, 0.0)
    try:
        for _ in range(3):  # warm: the first calls load kernels
            predict_lanes(lanes, frames)
        for t in range(calls):  # the three interleaved, call by call: drift on a shared machine hits all alike
            for n, (name, stepped) in enumerate(between.items()):
                for env in stepped:
                    env.step(act)
                batch = [_marked(frames[(i + t) % k], n, t, i) for i in range(k)]
                t0 = time.process_time()
                predict_lanes(lanes, batch)
                spent[name] += time.process_time() - t0
    finally:
        for group in envs.values():
            for env in group:
                env.close()
    return {name: 1e3 * value / calls for name, value in spent.items()}
