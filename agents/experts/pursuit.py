"""Pure pursuit (Coulter 1992, "Implementation of the Pure Pursuit Path Tracking Algorithm") on the state vector.

Steering: pick the centreline point at look-ahead distance L_d = clip(k_v * speed + L_0, L_min, L_max) ahead of
the closest point (linear interpolation between the state's look-ahead samples), given in the car frame (x forward,
y left). The circular arc through it has curvature kappa = 2 y / (x^2 + y^2); the bicycle-model front-wheel angle is
delta = atan(wheelbase * kappa). CarRacing's steer action is a target wheel angle with the sign flipped (+1 = right)
and saturates at the joint limit (0.4 rad), so steer = -delta / max_wheel_angle, clipped to [-1, 1].

Departures: a speed governor chooses gas/brake, which the paper leaves out. The target speed is the smallest
over the look-ahead samples of sqrt(a_lat / |kappa_i|) (kappa_i from the heading change to sample i), relaxed
with distance by a braking term sqrt(v^2 + 2 a_brake d_i); gas is cut while steering hard, because the stock car
is rear-wheel driven and spins when it accelerates through a turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PursuitConfig:
    state_names: tuple[str, ...]
    """Names of the state vector's entries (sim_bridges.carracing.STATE_NAMES), so the expert finds its inputs."""
    lookahead_m: tuple[float, ...]
    """Arc-length distances of the state's look-ahead samples (sim_bridges.carracing.LOOKAHEAD_M)."""
    k_speed: float = 0.35
    """Look-ahead seconds: L_d grows with speed by this factor (m per m/s)."""
    l_0: float = 6.0
    """Look-ahead offset (m)."""
    l_min: float = 6.0
    """Minimum look-ahead (m)."""
    l_max: float = 30.0
    """Maximum look-ahead (m)."""
    wheelbase: float = 3.24
    """Distance between the stock car's axles (m): wheels at y = +80 and -82 units, times SIZE = 0.02."""
    max_wheel_angle: float = 0.4
    """The stock car's steering joint limit (rad)."""
    a_lat: float = 160.0
    """Lateral acceleration budget for the corner speed (m/s^2)."""
    a_brake: float = 25.0
    """Deceleration assumed when relaxing the corner speed with distance (m/s^2)."""
    v_max: float = 90.0
    """Speed cap on straights (m/s)."""
    k_gas: float = 0.1
    """Proportional gain from speed error (m/s) to gas."""
    k_brake: float = 0.06
    """Proportional gain from overspeed (m/s) to brake."""
    brake_max: float = 0.8
    """Brake cap (0.9 and above locks the wheels)."""

    def __post_init__(self):
        need = ["speed"] + [f"ahead_{k}_{d:g}" for d in self.lookahead_m for k in ("x", "y", "dir")]
        missing = [n for n in need if n not in self.state_names]
        if missing:
            raise ValueError(f"pure pursuit needs state entries {missing} that state_names lacks")


class PurePursuit:
    """Expert interface: `reset()`, `act(state) -> (3,) float32` (steer, gas, brake)."""

    def __init__(self, cfg: PursuitConfig):
        self.cfg = cfg
        idx = {n: i for i, n in enumerate(cfg.state_names)}
        self.n_state = len(cfg.state_names)
        self.i_speed = idx["speed"]
        self.d = np.asarray(cfg.lookahead_m, dtype=np.float64)  # (K,)
        self.ix = np.array([idx[f"ahead_x_{d:g}"] for d in cfg.lookahead_m])  # (K,)
        self.iy = np.array([idx[f"ahead_y_{d:g}"] for d in cfg.lookahead_m])  # (K,)
        self.idir = np.array([idx[f"ahead_dir_{d:g}"] for d in cfg.lookahead_m])  # (K,)

    def reset(self) -> None:
        pass

    def target_speed(self, state: np.ndarray) -> float:
        c = self.cfg
        dirs = state[self.idir].astype(np.float64)  # (K,) centreline direction relative to the car heading
        # curvature between consecutive samples: heading change over arc length (the car's own heading cancels)
        kappa = np.maximum(np.abs(np.diff(dirs)) / np.diff(self.d), 1e-4)  # (K-1,)
        v_corner = np.sqrt(c.a_lat / kappa)  # (K-1,)
        v_allowed = np.sqrt(v_corner**2 + 2.0 * c.a_brake * self.d[:-1])  # (K-1,) brake from here to there
        return float(min(c.v_max, v_allowed.min()))

    def act(self, state: np.ndarray) -> np.ndarray:
        c = self.cfg
        state = np.asarray(state, dtype=np.float64)
        if state.shape != (self.n_state,):
            raise ValueError(f"pure pursuit expects a state of shape ({self.n_state},), got {state.shape}")
        speed = state[self.i_speed]
        l_d = np.clip(c.k_speed * speed + c.l_0, c.l_min, c.l_max)
        x = np.interp(l_d, self.d, state[self.ix])
        y = np.interp(l_d, self.d, state[self.iy])
        kappa = 2.0 * y / max(x * x + y * y, 1e-6)
        delta = np.arctan(c.wheelbase * kappa)  # + = turn left
        steer = float(np.clip(-delta / c.max_wheel_angle, -1.0, 1.0))
        v_target = self.target_speed(state)
        err = v_target - speed
        gas = float(np.clip(c.k_gas * err, 0.0, 1.0)) * (1.0 - 0.7 * abs(steer))
        brake = float(np.clip(-c.k_brake * err, 0.0, c.brake_max))
        return np.array([steer, gas, brake], dtype=np.float32)
