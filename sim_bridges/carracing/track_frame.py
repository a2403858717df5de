"""The privileged state's track geometry (`sim_bridges.carracing.bridge`), in numba: the closest centreline point and
the look-ahead points in the car frame.

Each kernel performs the same IEEE operations, in the same order, as the numpy expressions it replaced (numba
neither fuses a multiply and an add nor reorders float maths without fastmath), so the state is bit-identical; the
numpy versions are kept as the reference in tests/sim_bridges/carracing/test_track_frame.py, which compares both on
random poses of real tracks. Why: those numpy expressions were ~15 small array operations per step, whose call overhead
outweighs their arithmetic, on every step of the state mode PPO trains in (`drive bench render --breakdown` times
the privileged state).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_TWO_PI = 2 * np.pi


@njit(cache=True)
def closest_point(px, py, pts, seg, seg_len2):
    """The segment i whose closest point to (px, py) is nearest (the first on ties, as np.argmin), the fraction u
    along it (clipped to [0, 1]) and the vector (d0, d1) from that point to the car."""
    best, bi, bu, bd0, bd1 = np.inf, 0, 0.0, 0.0, 0.0
    for k in range(pts.shape[0]):
        r0, r1 = px - pts[k, 0], py - pts[k, 1]
        u = (r0 * seg[k, 0] + r1 * seg[k, 1]) / seg_len2[k]
        u = min(max(u, 0.0), 1.0)
        d0, d1 = r0 - u * seg[k, 0], r1 - u * seg[k, 1]
        q = d0 * d0 + d1 * d1
        if q < best:
            best, bi, bu, bd0, bd1 = q, k, u, d0, d1
    return bi, bu, bd0, bd1


@njit(cache=True)
def lookahead(s, ahead_m, lap_len, cum, pts, seg, seg_len, seg_dir, px, py, heading, cos_h, sin_h, out):
    """For each distance in ahead_m: the centreline point at arc length s + d (around the lap) in the car frame and
    the centreline direction there relative to `heading`, wrapped to [-pi, pi); written as (x, y, dir) rows of out."""
    last = pts.shape[0] - 1
    for k in range(ahead_m.shape[0]):
        sd = (s + ahead_m[k]) % lap_len
        j = min(np.searchsorted(cum, sd, side="right") - 1, last)
        t = (sd - cum[j]) / seg_len[j]
        p0 = pts[j, 0] + t * seg[j, 0] - px
        p1 = pts[j, 1] + t * seg[j, 1] - py
        out[k, 0] = p0 * cos_h + p1 * sin_h
        out[k, 1] = -p0 * sin_h + p1 * cos_h
        out[k, 2] = (seg_dir[j] - heading + math.pi) % _TWO_PI - math.pi
