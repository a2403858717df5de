"""CarRacing bridge: gymnasium + our contract, privileged features on hand-placed poses, no pixels in state mode."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from gymnasium.envs.box2d.car_racing import CarRacing

from sim_bridges.carracing.bridge import IDX, LOOKAHEAD_M, STATE_DIM, TRACK_HALF_WIDTH, make_carracing
from sim_bridges.registry import check_bridge

HAS_FAST = importlib.util.find_spec("sim_bridges.carracing.fast_render") is not None


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(mode="state"),
        dict(mode="pixels", fast_render=False),
        pytest.param(
            dict(mode="pixels", fast_render=True),
            marks=pytest.mark.skipif(not HAS_FAST, reason="sim_bridges.carracing.fast_render not present"),
        ),
    ],
)
def test_check_bridge_passes(kwargs):
    env = make_carracing(**kwargs)
    check_bridge(env)
    if kwargs["mode"] == "pixels":
        assert env.observation_space.shape == (96, 96, 3) and env.observation_space.dtype == np.uint8
    else:
        assert env.observation_space.shape == (STATE_DIM,)
    env.close()


def _place(env, x, y, heading):
    """Put a fresh car at (x, y) pointing along `heading` (world angle of its nose), at rest; its state."""
    obs, info = env.unwrapped.place_car(x, y, heading)
    np.testing.assert_array_equal(obs, info["state"])
    np.testing.assert_allclose(info["pose"], [x, y, heading], atol=1e-4)
    return info["state"]


def test_reset_pose_is_on_the_centreline_and_aligned():
    env = make_carracing(mode="state")
    _, info = env.reset(seed=7)
    s = info["state"]
    assert abs(s[IDX["lateral_offset"]]) < 0.05
    assert abs(s[IDX["heading_error"]]) < 0.02
    assert s[IDX["speed"]] < 1e-3 and not info["off_track"]
    assert info["n_tiles"] == len(env.unwrapped.track)
    assert info["tiles_visited"] <= 2  # the stock reset's physics step already touches the start tile(s)
    assert info["progress"] == pytest.approx(info["tiles_visited"] / info["n_tiles"])


@pytest.mark.parametrize("shift", [-4.0, -1.5, 0.0, 2.5, 5.0])
@pytest.mark.parametrize("dpsi", [-0.4, 0.0, 0.3])
def test_offset_and_heading_error_on_hand_placed_poses(shift, dpsi):
    env = make_carracing(mode="state")
    env.reset(seed=3)
    track = env.unwrapped.track
    i = 40
    _, beta, x, y = track[i]
    # The stock track stores beta with (cos beta, sin beta) pointing to the RIGHT of travel; travel is beta + pi/2.
    right = np.array([np.cos(beta), np.sin(beta)])
    travel = beta + np.pi / 2
    s = _place(env, x - shift * right[0], y - shift * right[1], travel + dpsi)
    # shift > 0 moves the car to the left of the centreline: offset positive (left); dpsi > 0 turns it left.
    assert s[IDX["lateral_offset"]] == pytest.approx(shift, abs=0.1)
    assert s[IDX["heading_error"]] == pytest.approx(dpsi, abs=0.08)


def _walk(track, i, d):
    """Independent reference: the centreline point d metres after track point i, stepping point to point."""
    pts = np.array([(t[2], t[3]) for t in track])
    j, p = i, pts[i].copy()
    while True:
        nxt = pts[(j + 1) % len(pts)]
        step = np.linalg.norm(nxt - p)
        if step >= d:
            return p + (nxt - p) * d / step
        d -= step
        p, j = nxt, j + 1


def test_lookahead_points_are_the_centreline_in_the_car_frame():
    env = make_carracing(mode="state")
    env.reset(seed=11)
    track = env.unwrapped.track
    i = 60
    _, beta, x, y = track[i]
    heading = beta + np.pi / 2 + 0.2
    s = _place(env, x, y, heading)
    fwd = np.array([np.cos(heading), np.sin(heading)])
    left = np.array([-fwd[1], fwd[0]])
    for d in LOOKAHEAD_M:
        rel = _walk(track, i, d) - np.array([x, y])
        got = s[[IDX[f"ahead_x_{d:g}"], IDX[f"ahead_y_{d:g}"]]]
        np.testing.assert_allclose(got, [rel @ fwd, rel @ left], atol=0.15, err_msg=f"look-ahead {d} m")


def test_lookahead_turns_left_where_the_track_turns_left():
    env = make_carracing(mode="state")
    env.reset(seed=5)
    track = env.unwrapped.track
    beta = np.unwrap([t[1] for t in track])
    turn = beta[10:] - beta[:-10]  # heading change over the next 10 points (no wrap: a lap adds 2 pi)
    for i, sign in ((int(np.argmax(turn)), 1.0), (int(np.argmin(turn)), -1.0)):
        _, b, x, y = track[i]
        s = _place(env, x, y, b + np.pi / 2)
        assert sign * s[IDX["ahead_y_30"]] > 1.0, f"point {i}: ahead_y_30 = {s[IDX['ahead_y_30']]}"
        assert sign * s[IDX["ahead_dir_30"]] > 0.1


def test_off_track_flags_follow_the_wheels():
    env = make_carracing(mode="state")
    env.reset(seed=2)
    _, beta, x, y = env.unwrapped.track[30]
    right = np.array([np.cos(beta), np.sin(beta)])
    s = _place(env, x, y, beta + np.pi / 2)
    assert s[IDX["off_track"]] == 0.0 and s[IDX["road_fl"] : IDX["road_rr"] + 1].tolist() == [1, 1, 1, 1]
    _, _, _, _, info = env.step(np.zeros(3, np.float32))
    assert not info["off_track"] and info["state"][IDX["road_fl"] : IDX["road_rr"] + 1].tolist() == [1, 1, 1, 1]
    far = 3 * TRACK_HALF_WIDTH
    _place(env, x + far * right[0], y + far * right[1], beta + np.pi / 2)
    _, _, _, _, info = env.step(np.zeros(3, np.float32))
    assert info["off_track"] and info["state"][IDX["off_track"]] == 1.0
    assert info["state"][IDX["lateral_offset"]] == pytest.approx(-far, abs=0.3)


def test_state_mode_never_renders(monkeypatch):
    calls = []
    original = CarRacing._render

    def spy(self, mode):
        calls.append(mode)
        return original(self, mode)

    monkeypatch.setattr(CarRacing, "_render", spy)
    env = make_carracing(mode="state")
    env.reset(seed=0)
    for _ in range(5):
        env.step(np.array([0.1, 0.5, 0.0], np.float32))
    assert calls == []
    pixel_env = make_carracing(mode="pixels", fast_render=False)  # the spy does see stock pixel rendering
    pixel_env.reset(seed=0)
    assert "state_pixels" in calls


def test_both_modes_share_physics_reward_and_state():
    actions = np.random.default_rng(0).uniform([-1, 0, 0], [1, 1, 0.3], (40, 3)).astype(np.float32)
    runs = {}
    for mode in ("state", "pixels"):
        env = make_carracing(mode=mode, fast_render=False)
        _, info = env.reset(seed=9)
        rows = [(0.0, info["state"])]
        for a in actions:
            _, r, _, _, info = env.step(a)
            rows.append((r, info["state"]))
        runs[mode] = rows
    for (r1, s1), (r2, s2) in zip(runs["state"], runs["pixels"], strict=True):
        assert r1 == r2
        np.testing.assert_array_equal(s1, s2)


def test_pixel_observation_is_the_rendered_frame_a_copy():
    env = make_carracing(mode="pixels", fast_render=False)
    obs, _ = env.reset(seed=1)
    np.testing.assert_array_equal(obs, env.unwrapped.state)  # the stock state pixels, not re-coded
    new, *_ = env.step(np.array([0.0, 1.0, 0.0], np.float32))
    assert new is not env.unwrapped.state and not np.shares_memory(new, env.unwrapped.state)
    assert not np.array_equal(new, obs)  # the view moved


def test_actions_are_clipped_and_prev_action_recorded():
    env = make_carracing(mode="state")
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([3.0, -1.0, 2.0], np.float32))
    assert info["state"][IDX["prev_steer"] : IDX["prev_brake"] + 1].tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="mode"):
        make_carracing(mode="rgb")


def test_clipped_actions_equal_np_clip_bit_for_bit():
    """The bridge's plain-float clip gives np.clip's float32 values, signed zeros and infinities included."""
    from itertools import product

    from sim_bridges.carracing.bridge import ACTION_HIGH, ACTION_LOW, _clipped

    edges = [-0.0, 0.0, np.inf, -np.inf, 1e30, -1e30, 0.5, -0.5, 1.0, -1.0, 2.0, 1e-45, -1e-45]
    rng = np.random.default_rng(0)
    actions = [np.array(a, np.float32) for a in product(edges, repeat=3)] + list(rng.normal(0, 2, (2000, 3)))
    for a in actions:
        a = np.asarray(a, np.float32)
        assert _clipped(a).tobytes() == np.clip(a, ACTION_LOW, ACTION_HIGH).tobytes(), a
    with pytest.raises(ValueError, match="non-finite"):
        _clipped(np.array([0.0, np.nan, 0.0], np.float32))


@pytest.mark.skipif(not HAS_FAST, reason="sim_bridges.carracing.fast_render not present")
def test_bridge_frames_equal_stock_while_tiles_change_colour(monkeypatch):
    """The bridge binds the road colours to one array (`road_rgb`) that the fast renderer reads: frames stay
    stock's while wheels recolour the tiles they touch, across resets, and after a recolouring perturbation."""
    from drive.perturb.wrappers import recolour
    from sim_bridges.carracing import raster

    reads = []
    pack = raster.pack_road_colours
    monkeypatch.setattr(raster, "pack_road_colours", lambda *args: reads.append(1) or pack(*args))

    stock, bridge = CarRacing(), make_carracing(mode="pixels").unwrapped
    rng = np.random.default_rng(0)
    for seed in (3, 4):
        np.testing.assert_array_equal(stock.reset(seed=seed)[0], bridge.reset(seed=seed)[0])
        assert bridge.road_rgb is not None and bridge.road_rgb_of is bridge.road_poly
        first = bridge.road_rgb.copy()
        for t in range(160):
            a = np.array([0.6 * np.sin(t / 9), 0.7, 0.0]) if t < 120 else rng.uniform([-1, 0, 0], [1, 1, 0.3])
            a = a.astype(np.float32)  # what the bridge executes: stock steps a float64 action differently
            obs_s, r_s, *_ = stock.step(a)
            obs_b, r_b, *_ = bridge.step(a)
            assert np.array_equal(obs_s, obs_b), f"seed {seed} step {t}"
            assert r_s == r_b
        assert (bridge.road_rgb != first).any(), "the drive should have recoloured some tiles"
        colours = (np.array([30.0, 60.0, 90.0]), np.array([10.0, 200.0, 10.0]), np.array([20.0, 220.0, 20.0]))
        np.testing.assert_array_equal(recolour(stock, colours), recolour(bridge, colours))
    assert len(reads) > 300, "the renderer should read the bound colours"
