"""Lanes: many closed-loop episodes in one controller call, each drawing the noise it would draw alone.

`drive eval --envs K` (drive/loop/rollout.py `run_lanes`) steps K cars in one process and calls the controller
once per step on the batch of their K observations. A lane's episode must not depend on which other lanes share
its batch, or the same seeds would give other records for another K. Two things could make it depend:

- **Noise.** One `torch.Generator` feeding a (S, B, ..) draw hands lane b other numbers than the lane would draw
  alone. `LaneGenerators` holds one generator per batch row; a stochastic controller draws through `lane_noise`,
  which with `LaneGenerators` fills row b of the lane axis from generator b alone — exactly the draw a batch of one
  makes. A plain generator (or None) draws as before, so training and offline use are untouched.
- **Kernel choice.** CPU GEMM and convolution kernels pick their algorithm by batch size, and a row's result in a
  batch of 1-3 differs in the last bits from the same row in a batch of 4 or more (measured on the shipped NSAC,
  one thread: rows agree bit for bit for every batch of 4-16, differ by ~1e-6 below 4). `MIN_ROWS` is the floor a
  closed-loop controller call pads its batch to (drive/loop/policies.py), so one car and sixteen cars run the same
  kernels; `tests/drive/loop/test_lanes.py` checks every closed-loop controller for it.

The closed-loop controllers whose sampling is lane-aware declare `lane_sampling = True` (agents/base.py); any other
controller still runs in lanes, one call per lane.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

MIN_ROWS = 4  # the smallest batch a closed-loop controller call runs (see the module docstring)


class LaneGenerators(torch.Generator):
    """One torch.Generator per batch row (lane), in batch order.

    A `torch.Generator` by type only, so it passes through every `generator` argument unchanged to the draws that
    know lanes (`lane_noise`); its own state is never meant to be drawn from. Only a controller declaring
    `lane_sampling` is handed one (drive/loop/policies.py).
    """

    def __new__(cls, generators: Sequence[torch.Generator]) -> LaneGenerators:
        return super().__new__(cls)

    def __init__(self, generators: Sequence[torch.Generator]):
        super().__init__()
        if not generators:
            raise ValueError("LaneGenerators needs at least one generator")
        self.generators = list(generators)

    def __len__(self) -> int:
        return len(self.generators)


Kind = Literal["normal", "uniform"]


def lane_noise(
    shape: Sequence[int],
    generator: torch.Generator | None,
    lane_axis: int,
    kind: Kind = "normal",
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> Tensor:
    """A `shape` tensor of N(0, 1) or U[0, 1) noise. With `LaneGenerators` shape[lane_axis] must equal the number of
    lanes, and index b along that axis is what generator b draws for the same shape with 1 there."""
    if not isinstance(generator, LaneGenerators):
        out = torch.empty(tuple(shape), dtype=dtype, device=device)
        return out.normal_(generator=generator) if kind == "normal" else out.uniform_(generator=generator)
    if shape[lane_axis] != len(generator):
        raise ValueError(f"lane axis {lane_axis} of {tuple(shape)} must hold the {len(generator)} lanes")
    if all(n == 1 for n in shape[:lane_axis]):  # each lane's slice is one contiguous block: drawn there, in place
        out = torch.empty(tuple(shape), dtype=dtype, device=device)
        for b, g in enumerate(generator.generators):  # a contiguous block draws what a fresh tensor of its shape does
            lane = out.narrow(lane_axis, b, 1)
            lane.normal_(generator=g) if kind == "normal" else lane.uniform_(generator=g)
        return out
    one = list(shape)
    one[lane_axis] = 1
    parts = [lane_noise(one, g, lane_axis, kind, dtype, device) for g in generator.generators]
    return torch.cat(parts, dim=lane_axis)
