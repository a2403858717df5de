"""The `full` frame coding in one numba pass, bit for bit what OpenCV computes.

`cv2.cvtColor(cv2.resize(rgb96, (84, 84), interpolation=cv2.INTER_AREA), cv2.COLOR_RGB2GRAY)` on a (96, 96, 3)
uint8 frame, which `drive collect`, `drive eval` and every closed-loop step run once per frame, computed as OpenCV
5's general area resize (`ResizeArea_Invoker`, the path for a non-integer scale, 96 / 84) and its RGB -> gray
conversion do:

- the tap tables of `computeResizeAreaTab` (double maths, weights rounded to float32; for 96 -> 84 every output
  pixel reads exactly two source pixels per axis);
- per source row, the horizontal sum ``buf = s0 * a0 + s1 * a1`` in float32, in tap order;
- per output row, ``sum = beta0 * buf_row0``, then ``sum += beta1 * buf_row1`` (float32, no fused multiply-add),
  rounded half to even and saturated to uint8 (``saturate_cast<uchar>``);
- gray ``(R * 9798 + G * 19235 + B * 3735 + 2**14) >> 15`` (OpenCV's 15-bit fixed-point ITU-R 601 weights).

Why not cv2: `drive bench render --steps 600 --seed 5002` prints both per frame on one core: 70.8 us for the two
cv2 calls, 14.1 us for this kernel (one run, 2026-12-06; 22.3 us before its loops ran over the padded slots
below). Exactness is tested, not assumed:
tests/datasets/test_area_gray.py compares it with cv2 on random and palette frames and on real CarRacing frames,
and the gray formula with cv2 on all 2**24 colours; should another OpenCV round differently, that test fails and
`code_full` must go back to cv2.
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numba import njit

SRC, DST = 96, 84
GRAY_R, GRAY_G, GRAY_B, GRAY_SHIFT = 9798, 19235, 3735, 15  # OpenCV's RGB2GRAY for uint8


def area_taps(ssize: int, dsize: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's `computeResizeAreaTab` as per output pixel (index, weight) pairs: (dsize, 2) int64 and float32.
    Only for scales where every output pixel reads exactly two source pixels (96 -> 84 does)."""
    scale = 1.0 / (dsize / ssize)  # OpenCV: 1 / inv_scale, inv_scale = dsize / ssize
    index: list[list[int]] = [[] for _ in range(dsize)]
    weight: list[list[np.float32]] = [[] for _ in range(dsize)]
    for dx in range(dsize):
        fsx1 = dx * scale
        fsx2 = fsx1 + scale
        cell = min(scale, ssize - fsx1)
        sx2 = min(math.floor(fsx2), ssize - 1)
        sx1 = min(math.ceil(fsx1), sx2)
        if sx1 - fsx1 > 1e-3:
            index[dx].append(sx1 - 1)
            weight[dx].append(np.float32((sx1 - fsx1) / cell))
        for sx in range(sx1, sx2):
            index[dx].append(sx)
            weight[dx].append(np.float32(1.0 / cell))
        if fsx2 - sx2 > 1e-3:
            index[dx].append(sx2)
            weight[dx].append(np.float32(min(min(fsx2 - sx2, 1.0), cell) / cell))
    if any(len(taps) != 2 for taps in index):
        raise ValueError(f"area_taps: {ssize} -> {dsize} has output pixels with other than two taps")
    return np.array(index, np.int64), np.array(weight, np.float32)


TAP_INDEX, TAP_WEIGHT = area_taps(SRC, DST)  # (84, 2) each: the same for rows and columns (square frame)
# 96 -> 84 is 8 source pixels to 7 output pixels: output dx reads source dx + dx // 7 and the one after it, so a
# resized row is 12 groups of 21 values (7 pixels x 3 channels), group g reading the 24 source values from 24 g on
# contiguously (value e of a group from source e and e + 3). The kernel relies on it; checked here, once.
GROUP_OUT, GROUP_SRC = 7, 8
if not (
    np.array_equal(TAP_INDEX[:, 0], np.arange(DST) + np.arange(DST) // GROUP_OUT)
    and np.array_equal(TAP_INDEX[:, 1], TAP_INDEX[:, 0] + 1)
    and DST % GROUP_OUT == 0
):
    raise ValueError("area_gray: the 96 -> 84 taps are not the 8-to-7 groups the kernel assumes")
# The kernel's padded layout: a resized row in the source row's 288 slots, value j of group g in slot 24 g + j (slots
# 21-23 of a group unused, weight 0), so slot x reads source x and x + 3 for every x: one contiguous loop per row
_PADDED = (np.arange(3 * DST) // (3 * GROUP_OUT)) * 3 * GROUP_SRC + np.arange(3 * DST) % (3 * GROUP_OUT)  # (252,)
_W0, _W1, _GRAY = (np.zeros(3 * SRC, np.float32), np.zeros(3 * SRC, np.float32), np.zeros(3 * SRC, np.int32))
for _t, _w in enumerate((_W0, _W1)):
    _w[_PADDED] = np.repeat(TAP_WEIGHT[:, _t], 3)  # (288,) float32: the weight of each slot's two taps
_GRAY[_PADDED] = np.tile([GRAY_R, GRAY_G, GRAY_B], DST)  # (288,) the gray weight of each slot's channel
_LAST = 3 * SRC - 3  # slots 285-287 (the last group's unused ones) would read past the row: left out


@njit(cache=True, boundscheck=False)
def _area_gray(src, w0, w1, gray, taps, weights, rows, rgb, out):
    """src (96, 96 * 3) uint8 -> out (84, 84) uint8 gray; rows (96, 288) float32 and rgb (288,) int32 scratch.
    Each value is computed with OpenCV's operations in its order (module docstring); only the loops differ, each a
    contiguous run over the padded slots that vectorises: the horizontal sums, the vertical sums rounded and
    weighted by their channel's gray weight, the three weighted channels of a pixel summed (integers: exact in any
    order), then each pixel's sum shifted into place."""
    for sy in range(SRC):  # horizontal pass of every source row
        s, h = src[sy], rows[sy]
        for x in range(_LAST):
            h[x] = np.float32(s[x]) * w0[x] + np.float32(s[x + 3]) * w1[x]
    for dy in range(DST):  # vertical pass, rounding, gray
        a, b = rows[taps[dy, 0]], rows[taps[dy, 1]]
        wa, wb = weights[dy, 0], weights[dy, 1]
        for x in range(_LAST):
            v = np.rint(wa * a[x] + wb * b[x])
            rgb[x] = np.int32(min(np.float32(255.0), max(np.float32(0.0), v))) * gray[x]
        for x in range(_LAST - 2):  # slot 24 g + 3 j: R + G + B of pixel 7 g + j (forward reads: vectorises)
            rgb[x] = rgb[x] + rgb[x + 1] + rgb[x + 2]
        o = out[dy]
        for g in range(DST // GROUP_OUT):
            for j in range(GROUP_OUT):
                o[GROUP_OUT * g + j] = (rgb[3 * GROUP_SRC * g + 3 * j] + (1 << (GRAY_SHIFT - 1))) >> GRAY_SHIFT
    return out


def area_gray(rgb96: np.ndarray) -> np.ndarray:
    """(96, 96, 3) uint8 C-contiguous RGB -> (84, 84) uint8 gray, as cv2's INTER_AREA resize then RGB2GRAY."""
    return area_gray_into(rgb96, np.empty((DST, DST), np.uint8))


_SCRATCH = threading.local()


def area_gray_into(rgb96: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`area_gray` written into `out` (84, 84) uint8 (a C-contiguous view, e.g. a slot of a frame stack)."""
    scratch = getattr(_SCRATCH, "buffers", None)
    if scratch is None:  # per thread: two threads coding at once never share scratch rows
        scratch = _SCRATCH.buffers = (np.zeros((SRC, 3 * SRC), np.float32), np.zeros(3 * SRC, np.int32))
    rows, rgb = scratch  # (96, 288) float32, (288,) int32
    return _area_gray(rgb96.reshape(SRC, SRC * 3), _W0, _W1, _GRAY, TAP_INDEX, TAP_WEIGHT, rows, rgb, out)
