"""A classical vision policy: follow the road seen in a camera frame, hold a speed. No learning, no privileged state.

It drives from exactly what the Udacity protocol carries -- the RGB frame and the speed -- so it can drive the
simulator (`drive udacity drive --driver vision`) and the CarRacing stand-in alike.

Steering (pure pursuit in the image, Coulter 1992): road pixels are the grey ones (low saturation, mid brightness:
asphalt), plus the red and white kerbs that line bends so a bend's road stays one piece. Scanning the reduced frame
row by row from just in front of the car upwards, the run of road under the car is followed -- each row keeps the
run nearest the previous row's centre, stopping where the road leaves the view or widens into the top of a hairpin
-- which traces the road's centre line and ignores other pieces of road in view. The traced point `lookahead`
rows ahead (+ more with speed; sooner if the trace ends) is the aim point; with (dx, dy) its offset from the car in
row units (`aspect` converts columns), the pursuit curvature is 2 dx / L^2, and

    steering = clip(gain * lookahead * 2 dx / L^2 + k_offset * (road centre in front of the car - car column), -1, 1)

(the offset term keeps the car off the inside kerb, which pure pursuit alone cuts towards).

Speed (`act`): a PD controller on the speed error towards a target lowered by the bend ahead -- `slowdown`, from
the traced line's sideways drift per row and the steering -- throttle in [-1, 1], negative brakes. `steer` alone
gives the steering and leaves `slowdown` in `last`, for a caller with its own speed controller.

Defaults were tuned on the CarRacing stand-in (a 96x84 top-down view stretched to 320x160, hence aspect 0.57):
seeds 0-5 complete a lap with no wheel off the road at 58-66 mph mean. On the 1,500 real Udacity frames in
shared/data (the jungle track, grey rock walls beside grey asphalt) its steering correlates with the human's at
r ~ 0.4: usable as a baseline on the simulator, not a trained driver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np


@dataclass(frozen=True)
class RoadFollowerConfig:
    grid: tuple[int, int] = (80, 40)
    """(width, height) the frame is reduced to before scanning (area averaging)"""
    max_saturation: int = 24
    """a road pixel's max-min over RGB is at most this (asphalt is grey)"""
    brightness: tuple[int, int] = (45, 190)
    """a road pixel's mean RGB lies in this range; brighter grey counts as a white kerb"""
    kerbs: bool = True
    """count red and white kerb pixels as road (they line the bends), so a bend's road run stays whole"""
    near_row: float = 0.78
    """where the scan starts, as a fraction of the frame height from the top (just in front of the car)"""
    far_row: float = 0.05
    """where the scan stops"""
    car_column: float = 0.5
    """the car's horizontal position in the frame"""
    aspect: float = 0.57
    """width of a column step in row steps (a 96x84 view shown as 320x160: (320/96) / (160/84) = 1.75 -> 1/1.75)"""
    lookahead: float = 5.0
    """aim-point distance at rest, in grid rows"""
    lookahead_per_mph: float = 0.05
    """extra aim-point rows per mph of speed"""
    gain: float = 1.6
    """steering gain on the pursuit curvature"""
    k_offset: float = 0.15
    """steering per row unit between the road centre in front of the car and the car's column"""
    max_jump: int = 6
    """largest sideways step (grid columns) from the previous row's centre to a road run"""
    max_width_ratio: float = 1.8
    """stop tracing where the road run is this much wider than in front of the car (the top of a hairpin)"""
    target_speed_mph: float = 90.0
    """cruise speed on a straight (act only)"""
    min_speed_mph: float = 30.0
    """speed target in the tightest bend (act only)"""
    bend_slowdown: float = 1.5
    """how strongly the bend ahead lowers the target speed"""
    kp: float = 0.08
    """throttle per mph of speed error (act only)"""
    kd: float = 0.02
    """throttle per mph of speed change since the last frame (act only)"""
    max_brake: float = 0.6
    """strongest braking, as negative throttle (act only)"""


class RoadFollower:
    """`act(rgb, speed_mph) -> (steering, throttle)`; `steer(rgb, speed_mph) -> steering`; `last` for overlays."""

    def __init__(self, cfg: RoadFollowerConfig = RoadFollowerConfig()):
        self.cfg = cfg
        self.reset()

    def reset(self) -> None:
        self._prev_speed: float | None = None
        self.last: dict = {}

    def road_mask(self, rgb: np.ndarray) -> np.ndarray:
        """(H, W, 3) uint8 RGB -> (grid_h, grid_w) bool road pixels."""
        small = cv2.resize(rgb, self.cfg.grid, interpolation=cv2.INTER_AREA).astype(np.int16)  # (h, w, 3)
        sat = small.max(-1) - small.min(-1)  # (h, w)
        val = small.mean(-1)  # (h, w)
        lo, hi = self.cfg.brightness
        road = (sat <= self.cfg.max_saturation) & (val >= lo) & (val <= hi)
        if self.cfg.kerbs:
            white = (sat <= self.cfg.max_saturation) & (val > hi)
            red = (small[..., 0] > 150) & (small[..., 1] < 110) & (small[..., 2] < 110)
            road |= white | red
        return road

    def trace(self, mask: np.ndarray) -> np.ndarray:
        """Centre of the followed road run per row, from the near row upwards: (n, 2) float (row, column)."""
        h, w = mask.shape
        x = self.cfg.car_column * (w - 1)
        points, first_width = [], 0
        for y in range(int(self.cfg.near_row * (h - 1)), int(self.cfg.far_row * (h - 1)) - 1, -1):
            row = np.concatenate([[False], mask[y], [False]])
            edges = np.flatnonzero(row[1:] != row[:-1])  # run starts and ends (exclusive), alternating
            if edges.size == 0:
                break
            starts, ends = edges[0::2], edges[1::2] - 1  # (k,), (k,)
            gap = np.maximum(0, np.maximum(starts - x, x - ends))  # (k,) 0 when x lies inside the run
            best = int(np.argmin(gap))
            width = int(ends[best] - starts[best] + 1)
            if gap[best] > self.cfg.max_jump or (points and width > self.cfg.max_width_ratio * max(first_width, 2)):
                break
            first_width = first_width or width
            x = 0.5 * (starts[best] + ends[best])
            points.append((y, x))
        return np.asarray(points, dtype=np.float64).reshape(-1, 2)

    def steer(self, rgb: np.ndarray, speed_mph: float) -> float:
        cfg = self.cfg
        mask = self.road_mask(rgb)
        line = self.trace(mask)
        h, w = mask.shape
        y0, x0 = cfg.near_row * (h - 1), cfg.car_column * (w - 1)
        if len(line) < 2:  # no road ahead in view: wheels straight, slowest speed
            steering, bend = 0.0, 1.0
        else:
            k = min(int(round(cfg.lookahead + cfg.lookahead_per_mph * max(speed_mph, 0.0))), len(line) - 1)
            dy, dx = y0 - line[k, 0], (line[k, 1] - x0) * cfg.aspect
            pursuit = cfg.gain * cfg.lookahead * 2.0 * dx / max(dx * dx + dy * dy, 1e-6)
            offset = (line[0, 1] - x0) * cfg.aspect
            steering = float(np.clip(pursuit + cfg.k_offset * offset, -1.0, 1.0))
            drift = np.abs(line[: k + 1, 1] - line[0, 1]) * cfg.aspect  # (k+1,) sideways drift of the road ahead
            bend = float(drift.max() / max(y0 - line[k, 0], 1.0))
        if not math.isfinite(steering):
            steering = 0.0
        slowdown = min(cfg.bend_slowdown * min(bend + 0.5 * abs(steering), 1.0), 1.0)
        self.last = {"line": line, "mask": mask, "slowdown": slowdown, "road_rows": len(line), "steering": steering}
        return steering

    def act(self, rgb: np.ndarray, speed_mph: float) -> tuple[float, float]:
        cfg = self.cfg
        steering = self.steer(rgb, speed_mph)
        target = max(cfg.min_speed_mph, cfg.target_speed_mph * (1.0 - self.last["slowdown"]))
        accel = 0.0 if self._prev_speed is None else speed_mph - self._prev_speed
        throttle = float(np.clip(cfg.kp * (target - speed_mph) - cfg.kd * accel, -cfg.max_brake, 1.0))
        self._prev_speed = speed_mph
        self.last["target_mph"] = target
        return steering, throttle
