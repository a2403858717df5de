"""`sim_bridges.carracing.track_frame` is bit for bit the numpy it replaced (kept here as the reference), on random
poses around real tracks and on the states of a driven lap."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim_bridges.carracing import track_frame
from sim_bridges.carracing.bridge import LOOKAHEAD_START, make_carracing


def _wrap(angle):
    return (angle + np.pi) % (2 * np.pi) - np.pi


def project_reference(env, pos):
    rel = pos[None, :] - env._pts  # (N, 2)
    u = np.clip((rel * env._seg).sum(1) / env._seg_len2, 0.0, 1.0)  # (N,)
    d = rel - u[:, None] * env._seg  # (N, 2)
    i = int(np.argmin((d * d).sum(1)))
    cross = env._seg[i, 0] * d[i, 1] - env._seg[i, 1] * d[i, 0]
    offset = math.hypot(d[i, 0], d[i, 1]) * (1.0 if cross >= 0 else -1.0)
    return i, float(env._cum[i] + u[i] * env._seg_len[i]), offset


def lookahead_reference(env, s, pos, heading):
    cos_h, sin_h = math.cos(heading), math.sin(heading)
    sd = (s + env._lookahead) % env._lap_len  # (K,)
    j = np.minimum(np.searchsorted(env._cum, sd, side="right") - 1, len(env._pts) - 1)  # (K,)
    p = env._pts[j] + ((sd - env._cum[j]) / env._seg_len[j])[:, None] * env._seg[j] - pos  # (K, 2)
    ahead = np.empty((len(sd), 3))
    ahead[:, 0] = p[:, 0] * cos_h + p[:, 1] * sin_h
    ahead[:, 1] = -p[:, 0] * sin_h + p[:, 1] * cos_h
    ahead[:, 2] = _wrap(env._seg_dir[j] - heading)
    return ahead


@pytest.mark.parametrize("seed", [0, 7, 1234])
def test_kernels_equal_the_numpy_on_random_poses(seed):
    env = make_carracing("state")
    env.reset(seed=seed)
    bridge = env.unwrapped
    rng = np.random.default_rng(seed)
    # around the centreline (on it, at its vertices, off the road) and anywhere on the field
    near = bridge._pts[rng.integers(0, len(bridge._pts), 600)] + rng.normal(0, 8, (600, 2))
    poses = np.concatenate([near, bridge._pts[:50], rng.uniform(-300, 300, (400, 2))])
    for pos, heading in zip(poses, rng.uniform(-10, 10, len(poses)), strict=True):
        want = project_reference(bridge, pos)
        got = bridge._project(pos)
        assert got == want and all(type(a) is type(b) for a, b in zip(got, want, strict=True))
        ahead = np.empty((len(bridge._lookahead), 3))
        track_frame.lookahead(want[1], bridge._lookahead, bridge._lap_len, bridge._cum, bridge._pts, bridge._seg,
                              bridge._seg_len, bridge._seg_dir, pos[0], pos[1], heading, math.cos(heading),
                              math.sin(heading), ahead)  # fmt: skip
        np.testing.assert_array_equal(ahead, lookahead_reference(bridge, want[1], pos, heading))
    env.close()


def test_privileged_state_of_a_driven_lap_is_unchanged():
    from drive.loop.specs import load_expert

    expert, env = load_expert("ppo"), make_carracing("state", max_episode_steps=300)
    _, info = env.reset(seed=5002)
    bridge = env.unwrapped
    for _ in range(300):
        state = info["state"]
        pos = np.array(bridge.car.hull.position, dtype=np.float64)
        heading = bridge.car.hull.angle + math.pi / 2
        _, s, offset = project_reference(bridge, pos)
        assert state[5] == np.float32(offset)
        want = lookahead_reference(bridge, s, pos, heading).astype(np.float32).ravel()
        np.testing.assert_array_equal(state[LOOKAHEAD_START:], want)
        _, _, terminated, truncated, info = env.step(expert.act(state))
        if terminated or truncated:
            break
    env.close()
