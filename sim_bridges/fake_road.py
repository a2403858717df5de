"""A tiny, fast fake road with the CarRacing bridge's contract, for tests of the closed loop and the recorder.

Not a simulator of anything real: a kinematic car on a closed road whose curvature is a few seeded sinusoids.
It speaks the same contract as `sim_bridges.carracing.bridge.make_carracing(mode="pixels")` (registered as
`drive/FakeRoad-v0`):

- observation: a (96, 96, 3) uint8 RGB frame of the road ahead (a speed bar at the bottom, like CarRacing's
  dashboard), coded for controllers by `datasets.frames` like CarRacing's;
- action: Box(3) = (steer in [-1, 1], gas in [0, 1], brake in [0, 1]);
- reward: +1000 / n_tiles for each new tile reached, -0.1 per step (CarRacing's scheme);
- info: "state" (privileged float32 vector), "speed", "progress", "tiles_visited", "n_tiles", "pose" (x, y,
  heading), "off_track", "lap_finished".

It runs thousands of steps per second, so tests can drive whole episodes in milliseconds. `FakeRoadDriver` is the
road's scripted driver (acts from info["state"] like the CarRacing experts).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

DT = 0.05  # s per step, CarRacing's 50 FPS
HALF_WIDTH = 1.0  # road half-width (m); beyond it the car is off track
LOST = 3.0  # lateral offset (m) at which the episode terminates, like leaving CarRacing's playfield
LOOKAHEAD = (2.0, 5.0, 10.0)  # m ahead at which the state reports road curvature

#: layout of info["state"]
STATE_FIELDS = ("speed", "heading_error", "lateral_offset", "curvature_2m", "curvature_5m", "curvature_10m")


class FakeRoad(gym.Env):
    """The fake road; `make_fake_road` wraps it in a TimeLimit."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(self, n_tiles: int = 60):
        self.n_tiles = n_tiles
        self.length = 0.6 * n_tiles  # m of road; a tile is 0.6 m
        self.observation_space = spaces.Box(0, 255, (96, 96, 3), np.uint8)
        self.action_space = spaces.Box(np.array([-1, 0, 0], np.float32), np.array([1, 1, 1], np.float32))
        self._rows = np.arange(84, dtype=np.float32)[::-1, None] * 0.12  # (84, 1) m ahead of the car, per row
        self._cols = (np.arange(84, dtype=np.float32)[None, :] - 41.5) * 0.05  # (1, 84) m across, per column
        self._coef = np.zeros((3, 2), np.float32)

    def _curvature(self, s: np.ndarray | float) -> np.ndarray:
        phase = 2 * np.pi * np.asarray(s, np.float32)[..., None] / self.length * np.array([1, 2, 3], np.float32)
        return (self._coef[:, 0] * np.sin(phase) + self._coef[:, 1] * np.cos(phase)).sum(-1)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._coef = self.np_random.uniform(-0.15, 0.15, (3, 2)).astype(np.float32)
        self.s = 0.0  # arc length travelled along the road
        self.d = 0.0  # lateral offset, + to the right
        self.psi = 0.0  # heading error, + to the right
        self.v = 0.0
        self.x = self.y = self.theta = 0.0
        self.visited = np.zeros(self.n_tiles, bool)
        self.visited[0] = True
        self.off = False
        self.lap = False
        return self._frame(), self._info()

    def step(self, action):
        steer, gas, brake = np.clip(np.asarray(action, np.float64), self.action_space.low, self.action_space.high)
        kappa = float(self._curvature(self.s))
        drag = 0.6 if self.off else 0.1
        self.v = max(0.0, self.v + (4.0 * gas - 8.0 * brake - drag * self.v) * DT)
        self.psi += (1.2 * steer * self.v - kappa * self.v) * DT
        self.d += self.v * np.sin(self.psi) * DT
        self.s += self.v * np.cos(self.psi) * DT
        self.theta += 1.2 * steer * self.v * DT
        self.x += self.v * np.cos(self.theta) * DT
        self.y += self.v * np.sin(self.theta) * DT
        self.off = abs(self.d) > HALF_WIDTH
        reward = -0.1
        if not self.off:
            tile = int(self.s / self.length * self.n_tiles) % self.n_tiles
            if not self.visited[tile]:
                self.visited[tile] = True
                reward += 1000.0 / self.n_tiles
        self.lap = bool(self.visited.all() and self.s >= self.length)
        lost = abs(self.d) > LOST
        if lost:
            reward -= 100.0
        return self._frame(), reward, bool(self.lap or lost), False, self._info()

    def _frame(self) -> np.ndarray:
        """(96, 96, 3) uint8 RGB: the 84x84 gray road map upscaled (nearest) and tinted."""
        gray = np.repeat(np.repeat(self._gray(), 8, 0), 8, 1)[::7, ::7][:96, :96]  # (96, 96)
        return np.stack([gray, gray // 2 + 60, gray // 3], -1).astype(np.uint8)

    def _gray(self) -> np.ndarray:
        dist = self._rows  # (84, 1)
        kappa = self._curvature(self.s + dist[:, 0])[:, None]  # (84, 1)
        centre = -self.d - np.sin(self.psi) * dist + 0.5 * kappa * dist**2  # (84, 1) road centre in car frame
        on_road = np.abs(self._cols - centre) < HALF_WIDTH  # (84, 84)
        frame = np.where(on_road, 105, 160).astype(np.uint8)
        frame[78:, : min(84, int(self.v * 8))] = 255  # speed bar, like CarRacing's dashboard
        return frame

    def _info(self) -> dict:
        state = np.array(
            [self.v, self.psi, self.d, *(self._curvature(self.s + a) for a in LOOKAHEAD)], np.float32
        )  # (6,) see STATE_FIELDS
        info = {
            "state": state,
            "speed": float(self.v),
            "progress": float(self.visited.mean()),
            "tiles_visited": int(self.visited.sum()),
            "n_tiles": self.n_tiles,
            "pose": np.array([self.x, self.y, self.theta], np.float32),
            "off_track": bool(self.off),
            "lap_finished": bool(self.lap),
        }
        return info

    def render(self):
        return self._frame()


def make_fake_road(max_episode_steps: int = 300, n_tiles: int = 60) -> gym.Env:
    """The fake road with the pixel bridge's contract: (96, 96, 3) uint8 observations, Box(3) actions."""
    return TimeLimit(FakeRoad(n_tiles=n_tiles), max_episode_steps)


class FakeRoadDriver:
    """A scripted driver for the fake road: steers back to the centre line, holds a cruise speed. Acts from state."""

    def __init__(self, cruise_speed: float = 3.0):
        self.cruise_speed = cruise_speed

    def reset(self) -> None:
        pass

    def act(self, state: np.ndarray) -> np.ndarray:
        v, psi, d, k2 = (float(x) for x in state[:4])
        steer = np.clip((k2 - 1.5 * psi - 1.0 * d) / 1.2, -1.0, 1.0)
        gas = np.clip(0.6 * (self.cruise_speed - v), 0.0, 1.0)
        brake = np.clip(0.3 * (v - self.cruise_speed - 0.5), 0.0, 1.0)
        return np.array([steer, gas, brake], np.float32)
