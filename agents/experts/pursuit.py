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
    """Names of the state vector's entries (sim_bridges.carracing.bridge.STATE_NAMES), so the expert finds its
    inputs."""
    lookahead_m: tuple[float, ...]
    """Arc-length distances of the state's look-ahead samples (sim_bridges.carracing.bridge.LOOKAHEAD_M)."""
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
    """Expert interface: `reset()`, `act(state) -> (3,) float32` (steer, gas, brake); `act_many` for K cars."""

    def __init__(self, cfg: PursuitConfig):
        self.cfg = cfg
        idx = {n: i for i, n in enumerate(cfg.state_names)}
        self.n_state = len(cfg.state_names)
        self.i_speed = idx["speed"]
        self.d = np.asarray(cfg.lookahead_m, dtype=np.float64)  # (K,)
        self.ix = np.array([idx[f"ahead_x_{d:g}"] for d in cfg.lookahead_m])  # (K,)
        self.iy = np.array([idx[f"ahead_y_{d:g}"] for d in cfg.lookahead_m])  # (K,)
        self.idir = np.array([idx[f"ahead_dir_{d:g}"] for d in cfg.lookahead_m])  # (K,)
        # a str caches its hash: the config's own hash went through its ~50 state names for every car at every step
        self._lane_key = f"pursuit {cfg!r}"

    def reset(self) -> None:
        pass

    @property
    def lane_key(self) -> str:
        """Experts with equal keys (equal configs) answer in one `act_many` call (drive/loop/lanes.py
        `expert_lanes`)."""
        return self._lane_key

    def target_speed(self, state: np.ndarray) -> float:
        return float(self.target_speeds(np.asarray(state, dtype=np.float64)[None])[0])

    def target_speeds(self, states: np.ndarray) -> np.ndarray:  # (K, n_state) float64 -> (K,)
        c = self.cfg
        dirs = states[:, self.idir]  # (K, n) centreline direction relative to the car heading
        # curvature between consecutive samples: heading change over arc length (the car's own heading cancels)
        kappa = np.maximum(np.abs(np.diff(dirs, axis=1)) / np.diff(self.d), 1e-4)  # (K, n-1)
        v_corner = np.sqrt(c.a_lat / kappa)  # (K, n-1)
        v_allowed = np.sqrt(v_corner**2 + 2.0 * c.a_brake * self.d[:-1]).min(axis=1)  # (K,) brake from there
        return np.where(v_allowed < c.v_max, v_allowed, c.v_max)  # Python's min(v_max, v): v_max where v is nan

    def act(self, state: np.ndarray) -> np.ndarray:
        state = np.asarray(state, dtype=np.float64)
        if state.shape != (self.n_state,):
            raise ValueError(f"pure pursuit expects a state of shape ({self.n_state},), got {state.shape}")
        return self.act_many(state[None])[0]

    def act_many(self, states: np.ndarray) -> np.ndarray:
        """(K, n_state) states -> (K, 3) float32 actions, each row its own: elementwise numpy on float64 (and
        `_interp_rows`, np.interp's arithmetic per row), so K cars in one call get what each gets alone."""
        c = self.cfg
        states = np.asarray(states, dtype=np.float64)
        if states.ndim != 2 or states.shape[1] != self.n_state:
            raise ValueError(f"pure pursuit expects states of shape (K, {self.n_state}), got {states.shape}")
        speed = states[:, self.i_speed]  # (K,)
        l_d = np.clip(c.k_speed * speed + c.l_0, c.l_min, c.l_max)  # (K,)
        x = _interp_rows(l_d, self.d, states[:, self.ix])  # (K,) the look-ahead point, car frame
        y = _interp_rows(l_d, self.d, states[:, self.iy])
        kappa = 2.0 * y / np.maximum(x * x + y * y, 1e-6)
        delta = np.arctan(c.wheelbase * kappa)  # (K,) + = turn left
        steer = np.clip(-delta / c.max_wheel_angle, -1.0, 1.0)
        err = self.target_speeds(states) - speed
        gas = np.clip(c.k_gas * err, 0.0, 1.0) * (1.0 - 0.7 * np.abs(steer))
        brake = np.clip(-c.k_brake * err, 0.0, c.brake_max)
        return np.stack([steer, gas, brake], axis=1).astype(np.float32)  # (K, 3)


def _interp_rows(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Row k: np.interp(x[k], xp, fp[k]) with numpy's arithmetic (numpy/_core/src/multiarray/compiled_base.c
    `arr_interp`): the end values outside xp, fp[j] where x equals xp[j], else slope * (x - xp[j]) + fp[j] with
    slope = (fp[j+1] - fp[j]) / (xp[j+1] - xp[j]), retried from j + 1 when that is nan. x (K,), xp (n,), fp (K, n)."""
    n = len(xp)
    j = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, n - 2)  # (K,) xp[j] <= x < xp[j+1] inside
    rows = np.arange(len(x))
    f0, f1 = fp[rows, j], fp[rows, j + 1]  # (K,)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (f1 - f0) / (xp[j + 1] - xp[j])
        out = slope * (x - xp[j]) + f0
        retry = slope * (x - xp[j + 1]) + f1
    out = np.where(np.isnan(out), np.where(np.isnan(retry) & (f0 == f1), f0, retry), out)
    out = np.where(x == xp[j], f0, out)
    out = np.where(x < xp[0], fp[:, 0], np.where(x >= xp[-1], fp[:, -1], out))
    return np.where(np.isnan(x), x, out)
