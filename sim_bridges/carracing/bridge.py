"""CarRacing-v3 (continuous) as our bridge: the 96x96 RGB frame, or a privileged state vector, plus rich info.

`make_carracing(mode=...)` subclasses gymnasium's `CarRacing` and wraps it in `TimeLimit`; `sim_bridges.registry`
registers it as `drive/CarRacing-v0` for `gym.make`. Step semantics (physics, reward, termination) are the stock
ones in both modes; only the observation differs:

- ``mode="pixels"``: ``(96, 96, 3) uint8`` RGB, the stock observation (drawn by `sim_bridges.carracing.fast_render` when
  ``fast_render=True``, bit-identical to the stock pygame renderer). The bridge does not code or stack frames: what
  a controller sees is coded once per step by its `datasets.frames.ObservationCoder`, the coder training used.
- ``mode="state"``: the privileged state vector below; the frame is never drawn (fast mode for RL and experts).

``variant=`` draws one of CarRacingExtension's generalisation variants (Color, Color3, Bar, Blob, Noise, Video:
`sim_bridges.carracing.variants`) into the frame; same track, physics and reward as the clean env.

Privileged state (float32, ``STATE_DIM`` values, names in ``STATE_NAMES``). Units: metres, seconds, radians.
The car frame is x forward, y to the LEFT; angles are counter-clockwise positive (so a positive heading error or
lateral offset means "too far left", corrected by steering right, i.e. a positive steer action).

    0  speed            |v| (m/s)
    1  v_forward        velocity along the car's heading (m/s)
    2  v_left           sideways velocity, + to the left (m/s): the slip a pure-kinematic model ignores
    3  yaw_rate         hull angular velocity (rad/s, + counter-clockwise)
    4  heading_error    car heading minus centreline direction at the closest point (rad, wrapped to [-pi, pi))
    5  lateral_offset   signed distance from the centreline (m, + left); the road edge is at +-TRACK_HALF_WIDTH
    6  steer_angle      front-wheel joint angle (rad, + left); lags the steer command
    7-10 wheel_omega    wheel angular speeds (rad/s), front-left, front-right, rear-left, rear-right
    11-14 wheel_on_road 1 if that wheel touches a road tile, else 0
    15 off_track        1 if no wheel touches a road tile
    16 progress         fraction of tiles visited
    17-19 prev_action   the (steer, gas, brake) applied at the previous step (zeros after reset)
    20+ look-ahead      for each d in LOOKAHEAD_M (arc length along the centreline from the closest point):
                        (x, y) of that centreline point in the car frame (m) and the centreline direction there
                        relative to the car heading (rad) -- so curvature ahead is visible as a change of angle.
"""

from __future__ import annotations

import logging
import math

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.box2d.car_racing import TRACK_WIDTH, CarRacing
from gymnasium.wrappers import TimeLimit

from sim_bridges.carracing import track_frame
from sim_bridges.carracing import variants as variants

log = logging.getLogger(__name__)

TRACK_HALF_WIDTH = float(TRACK_WIDTH)  # 6.67 m: tiles span +-TRACK_WIDTH around the centreline
LOOKAHEAD_M = (2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 65.0, 80.0)
_BASE_NAMES = (
    "speed v_forward v_left yaw_rate heading_error lateral_offset steer_angle "
    "omega_fl omega_fr omega_rl omega_rr road_fl road_fr road_rl road_rr off_track progress "
    "prev_steer prev_gas prev_brake"
).split()
STATE_NAMES = tuple(_BASE_NAMES) + tuple(f"{k}_{d:g}" for d in LOOKAHEAD_M for k in ("ahead_x", "ahead_y", "ahead_dir"))
STATE_DIM = len(STATE_NAMES)
IDX = {name: i for i, name in enumerate(STATE_NAMES)}
LOOKAHEAD_START = len(_BASE_NAMES)

INFO_KEYS = ("state", "speed", "progress", "tiles_visited", "n_tiles", "pose", "off_track", "lap_finished")
ACTION_NAMES = ("steer", "gas", "brake")
ACTION_LOW = np.array([-1.0, 0.0, 0.0], dtype=np.float32)
ACTION_HIGH = np.array([1.0, 1.0, 1.0], dtype=np.float32)
FRAME_SHAPE = (96, 96, 3)
_LOW, _HIGH = ACTION_LOW.tolist(), ACTION_HIGH.tolist()  # the bounds as Python floats, for `_clipped`


def _clipped(action) -> np.ndarray:
    """The action as float32 (3,), clipped to the action space like np.clip (an infinite value clipped, NaN refused),
    in plain float maths: np.clip and np.isfinite on three values cost more than the rest of the bridge's step."""
    values = np.asarray(action, dtype=np.float32).reshape(3).tolist()  # float32 values, exact as Python floats
    if values[0] != values[0] or values[1] != values[1] or values[2] != values[2]:
        raise ValueError(f"non-finite action {np.asarray(values, np.float32)}")
    return np.array([min(hi, max(lo, v)) for v, lo, hi in zip(values, _LOW, _HIGH, strict=True)], np.float32)


def _wrap(angle):
    return (angle + np.pi) % (2 * np.pi) - np.pi


class CarRacingBridge(CarRacing):
    """Stock CarRacing physics and reward; our observation (pixels or privileged state) and info; optionally a
    CarRacingExtension variant of the world (`variant`, e.g. "color3" or "video" with `video_dir`: `set_variant`)."""

    def __init__(self, mode="pixels", fast_render=True, render_mode=None, variant=None, video_dir=None):
        if mode not in ("pixels", "state"):
            raise ValueError(f"mode must be 'pixels' or 'state', got {mode!r}")
        super().__init__(render_mode=render_mode, continuous=True)
        self.mode = mode
        self._fast = None
        if mode == "pixels" and fast_render:
            from sim_bridges.carracing.fast_render import render_state_pixels

            self._fast = render_state_pixels
        self.set_variant(variant, video_dir)
        self.action_space = spaces.Box(ACTION_LOW, ACTION_HIGH, dtype=np.float32)
        if mode == "pixels":
            self.observation_space = spaces.Box(0, 255, FRAME_SHAPE, np.uint8)
        else:
            self.observation_space = spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32)
        self._prev_action = np.zeros(3, np.float32)
        self.road_rgb: np.ndarray | None = None  # (P, 3) road colours, bound at reset (`_bind_road_colours`)
        self.road_rgb_of: list | None = None

    # --- rendering: skipped in state mode, optionally replaced by the fast renderer in pixel mode ---
    def _render(self, mode):
        if mode == "state_pixels":
            if self.mode == "state":
                return None
            if self._fast is not None and "t" in self.__dict__:
                return self._fast(self)
        return super()._render(mode)

    # --- track geometry, cached per track ---
    def _build_geometry(self):
        pts = np.array([(t[2], t[3]) for t in self.track], dtype=np.float64)  # (N, 2) centreline points
        seg = np.roll(pts, -1, axis=0) - pts  # (N, 2) segment i runs from point i to point i+1
        seg_len = np.linalg.norm(seg, axis=1)  # (N,)
        self._pts, self._seg, self._seg_len = pts, seg, seg_len
        self._seg_dir = np.arctan2(seg[:, 1], seg[:, 0])  # (N,)
        self._cum = np.concatenate([[0.0], np.cumsum(seg_len)])  # (N+1,) arc length at each point
        self._lap_len = float(self._cum[-1])
        self._seg_len2 = seg_len**2
        self._lookahead = np.asarray(LOOKAHEAD_M, dtype=np.float64)

    def _project(self, pos):
        """Closest point on the closed centreline: (segment index, arc length s, lateral offset + left)."""
        i, u, d0, d1 = track_frame.closest_point(pos[0], pos[1], self._pts, self._seg, self._seg_len2)
        cross = self._seg[i, 0] * d1 - self._seg[i, 1] * d0  # + when the car is left of the segment
        offset = math.hypot(d0, d1) * (1.0 if cross >= 0 else -1.0)
        return i, float(self._cum[i] + u * self._seg_len[i]), offset

    def privileged_state(self) -> np.ndarray:
        car = self.car
        pos = np.array(car.hull.position, dtype=np.float64)
        heading = car.hull.angle + math.pi / 2  # the hull's local +y axis is its nose
        cos_h, sin_h = math.cos(heading), math.sin(heading)
        vx, vy = car.hull.linearVelocity
        i, s, offset = self._project(pos)
        on_road = [float(len(w.tiles) > 0) for w in car.wheels]
        out = np.empty(STATE_DIM, dtype=np.float64)
        out[:LOOKAHEAD_START] = [
            math.hypot(vx, vy),
            vx * cos_h + vy * sin_h,
            -vx * sin_h + vy * cos_h,
            car.hull.angularVelocity,
            _wrap(heading - self._seg_dir[i]),
            offset,
            car.wheels[0].joint.angle,
            *(w.omega for w in car.wheels),
            *on_road,
            float(not any(on_road)),
            self.tile_visited_count / len(self.track),
            *self._prev_action.tolist(),
        ]
        ahead = out[LOOKAHEAD_START:].reshape(-1, 3)  # (K, 3) view: (x, y, direction) of each look-ahead point
        track_frame.lookahead(
            s,
            self._lookahead,
            self._lap_len,
            self._cum,
            self._pts,
            self._seg,
            self._seg_len,
            self._seg_dir,
            pos[0],
            pos[1],
            heading,
            cos_h,
            sin_h,
            ahead,
        )
        return out.astype(np.float32)

    def _info(self, base_info):
        state = self.privileged_state()
        info = {
            "state": state,
            "speed": float(state[IDX["speed"]]),
            "progress": self.tile_visited_count / len(self.track),
            "tiles_visited": int(self.tile_visited_count),
            "n_tiles": len(self.track),
            "pose": np.array([*self.car.hull.position, self.car.hull.angle + np.pi / 2], dtype=np.float32),
            "off_track": bool(state[IDX["off_track"]]),
            "lap_finished": bool(base_info.get("lap_finished", False)),
        }
        return info

    def _observe(self, info):
        if self.mode == "state":
            return info["state"].copy()
        return np.array(self.state, dtype=np.uint8)  # (96, 96, 3) RGB, a copy: the renderer reuses its buffer

    def place_car(self, x: float, y: float, heading: float):
        """Replace the car by one at rest at (x, y) whose nose points along `heading` (world angle, rad).

        For tests and training-time start perturbations; returns the new (observation, info). Tiles already
        visited stay visited; in pixel mode the observation is the new view.
        """
        from gymnasium.envs.box2d.car_dynamics import Car

        self.car.destroy()
        self.car = Car(self.world, heading - math.pi / 2, x, y)  # the hull's angle is its nose's minus pi/2
        self._prev_action = np.zeros(3, np.float32)
        self.world.Step(0.0, 6 * 30, 2 * 30)  # dt = 0: registers the wheel/tile contacts without moving anything
        if self.mode == "pixels":
            self.state = self._render("state_pixels")
        info = self._info({})
        return self._observe(info), info

    def _bind_road_colours(self):
        """Make the road's colours rows of one (P, 3) float64 array, `road_rgb`, in road_poly order: each tile's
        `color` and its road_poly entry become the same view of its row (they were the same array before), the
        kerbs' constant tuples are copied. Contacts and perturbations still write `tile.color[:]` in place, so the
        values and every reader are unchanged; the fast renderer reads the visible rows in one kernel instead of a
        Python loop over the road (`sim_bridges.carracing.fast_render`). `road_rgb_of` names the road_poly list it
        binds."""
        tiles = {id(tile.color): tile for tile in self.road}
        owners = [tiles.get(id(colour)) for _, colour in self.road_poly]
        for (_, colour), tile in zip(self.road_poly, owners, strict=True):
            if tile is None and isinstance(colour, np.ndarray):
                return  # an array no tile owns (someone else may change it): left as it is
            if tile is not None and (colour.shape != (3,) or colour.dtype != np.float64):
                return  # a tile colour of another kind: left as it is
        rgb = np.array([np.asarray(colour, np.float64) for _, colour in self.road_poly], np.float64).reshape(-1, 3)
        for i, ((vertices, _), tile) in enumerate(zip(self.road_poly, owners, strict=True)):
            if tile is not None:
                row = rgb[i]  # (3,) view
                tile.color, self.road_poly[i] = row, (vertices, row)
        self.road_rgb, self.road_rgb_of = rgb, self.road_poly

    def set_variant(self, variant: str | variants.Variant | None, video_dir: str | None = None) -> None:
        """Draw a CarRacingExtension variant (`sim_bridges.carracing.variants`: a Variant, or its spec such as "color3",
        "video" with `video_dir`) from the next reset on; None: the clean env. Drawn by our renderer only, the
        state_pixels observation (not stock's human / rgb_array render)."""
        if isinstance(variant, str):
            variant = variants.parse_variant(variant if video_dir is None else f"{variant}={video_dir}")
        elif video_dir is not None:
            raise ValueError("video_dir goes with variant='video'")
        if variant is not None and self.mode == "pixels" and self._fast is None:
            raise ValueError(f"CarRacing variant {variant}: drawn by the fast renderer only (fast_render=True)")
        if self.__dict__.get("variant") is not None:
            self._init_colors()  # stock's colours back: a colour variant changed them
        self.variant: variants.Variant | None = variant
        self._video = variants.VideoFrames(variant.video_dir) if variant is not None and variant.video_dir else None
        self._variant_rng: np.random.Generator | None = None
        self.episode_variant: variants.EpisodeVariant | None = None  # read by sim_bridges.carracing.fast_render

    def _start_variant(self, seed) -> None:
        """The episode's variant, its stream seeded from `seed` (continued where None), its colours set before the
        track is built (tile colours are the road colour plus stock's shading)."""
        if self.variant is None:
            return
        if seed is not None or self._variant_rng is None:
            self._variant_rng = variants.variant_rng(self.variant, seed)
        self.episode_variant = variants.EpisodeVariant(self.variant, self._variant_rng, self._video)
        if self.variant.kind in variants.COLOUR_KINDS:
            self.road_color, self.bg_color, self.grass_color = self.episode_variant.colours()

    def reset(self, *, seed=None, options=None):
        self._prev_action = np.zeros(3, np.float32)
        self.road_rgb = self.road_rgb_of = None  # the first frame, inside the stock reset, reads road_poly
        self._start_variant(seed)
        super().reset(seed=seed, options=options)  # calls self.step(None) once, which renders the first frame
        if self.mode == "pixels":
            self._bind_road_colours()
        self._build_geometry()
        info = self._info({})
        return self._observe(info), info

    def step(self, action):
        if action is None:  # the stock reset's internal first step
            return super().step(None)
        action = _clipped(action)
        _, reward, terminated, truncated, base_info = super().step(action)
        self._prev_action = action
        info = self._info(base_info)
        return self._observe(info), float(reward), terminated, truncated, info


def make_carracing(
    mode="pixels", fast_render=True, max_episode_steps=1000, render_mode=None, variant=None, video_dir=None
) -> gym.Env:
    """CarRacing-v3 (continuous) bridge wrapped in TimeLimit(max_episode_steps); see the module docstring."""
    bridge = CarRacingBridge(mode, fast_render, render_mode, variant, video_dir)
    return TimeLimit(bridge, max_episode_steps=max_episode_steps)
