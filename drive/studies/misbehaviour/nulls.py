"""Null controls for the misbehaviour protocol (drive/studies/misbehaviour/protocol.py): what a monitor's figures would
be if its score carried no information about when a misbehaviour comes, scored through the identical pipeline.

- `block_permuted`: each episode's scored part (after the warm-up, which stays in place) cut into blocks of
  block_s seconds (default 1 s = one window; the last block may be shorter) and the blocks shuffled within the
  episode. Each run keeps its values and their autocorrelation within a block, and loses their alignment with its
  onsets. A monitor whose shifted runs are merely hotter than nominal ones throughout keeps its AUROC on this null:
  clearing it says the score's timing predicts, not only that the shifted runs differ.
- `information_free`: every step of every episode replaced by an i.i.d. draw, with replacement, from the pooled
  scored steps of the nominal runs (after the warm-up, outside their own misbehaviours). Chance by construction on
  both sides, whatever the protocol: a figure a monitor does not clear it by is no evidence. i.i.d., not a block
  bootstrap: it drops the score's autocorrelation, which the protocol scored alike needs no help to face
  (tests/drive/studies/misbehaviour/test_protocol.py::test_an_information_free_score_sits_at_chance_with_the_defaults:
  AR(1) scores up to phi 0.98 sit at chance).
- `with_nulls`: the monitor and both nulls (one draw each, numpy Generator(seed)) through `protocol.evaluate` with
  the same settings and the same episode weights (each null keeps every run's family: pooled over families, each
  family weighted equally, as the monitor is), and per (level, TTM) whether the monitor's 95 % interval clears
  every null's: its F3 lower bound above each null's F3 upper bound, its AUROC likewise (a NaN bound clears
  nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from drive.studies.misbehaviour.protocol import LEVELS, TTMS, Row, evaluate
from drive.studies.misbehaviour.windows import DEFAULTS, Episode, ProtocolConfig, left_out

NULLS = ("block_permuted", "information_free")


def _with_scores(ep: Episode, scores: np.ndarray) -> Episode:
    return Episode(scores, ep.onsets, ep.nominal, ep.busy, ep.family)  # its family, so its weight, kept


def block_permuted(
    episodes: Sequence[Episode], rng: np.random.Generator, block_s: float = 1.0, cfg: ProtocolConfig = DEFAULTS
) -> list[Episode]:
    """The episodes with each one's scored steps shuffled in blocks of block_s s; labels, onsets, busy masks and
    families kept."""
    size, start = max(1, int(round(block_s * cfg.fps))), cfg.warmup_steps
    out = []
    for ep in episodes:
        blocks = np.array_split(ep.scores[start:], range(size, max(len(ep.scores) - start, 0), size))
        order = rng.permutation(len(blocks))
        out.append(_with_scores(ep, np.concatenate([ep.scores[:start], *(blocks[k] for k in order)])))
    return out


def information_free(
    episodes: Sequence[Episode], rng: np.random.Generator, cfg: ProtocolConfig = DEFAULTS
) -> list[Episode]:
    """The episodes with every score drawn i.i.d. from the pooled nominal scored steps; labels and families kept."""
    pool = np.concatenate(
        [e.scores[cfg.warmup_steps :][~left_out(e, cfg)[cfg.warmup_steps :]] for e in episodes if e.nominal]
        or [np.empty(0)]
    )
    if len(pool) == 0:
        raise ValueError("information_free needs nominal episodes with scored steps to draw from")
    return [_with_scores(ep, rng.choice(pool, len(ep.scores))) for ep in episodes]


class Clears(NamedTuple):
    level: float
    ttm: int
    f3: bool
    """the monitor's F3 lower bound lies above every null's F3 upper bound"""
    auroc: bool
    """likewise for AUROC"""


class Controlled(NamedTuple):
    rows: list[Row]
    """the monitor's rows"""
    nulls: dict[str, list[Row]]
    """each null's rows, in the same (level, TTM) order"""
    clears: list[Clears]
    """per row: whether the monitor's interval clears its nulls'"""


def clears(row: Row, null_rows: Sequence[Row]) -> Clears:
    """Whether `row`'s F3 and AUROC intervals lie wholly above those of every null row."""
    return Clears(
        row.level,
        row.ttm,
        all(row.low.f3 > n.high.f3 for n in null_rows),
        all(row.low.auroc > n.high.auroc for n in null_rows),
    )


def with_nulls(
    episodes: Sequence[Episode],
    cfg: ProtocolConfig = DEFAULTS,
    levels: Sequence[float] = LEVELS,
    ttms: Sequence[int] = TTMS,
    n_boot: int = 1000,
    seed: int = 0,
    block_s: float = 1.0,
) -> Controlled:
    """The monitor's rows, its nulls' rows (same settings, same bootstrap seed) and the flags of `clears`."""
    rng = np.random.default_rng(seed)
    nulls = {
        "block_permuted": block_permuted(episodes, rng, block_s, cfg),
        "information_free": information_free(episodes, rng, cfg),
    }
    rows = evaluate(episodes, cfg, levels, ttms, n_boot, seed)
    null_rows = {name: evaluate(eps, cfg, levels, ttms, n_boot, seed) for name, eps in nulls.items()}
    return Controlled(rows, null_rows, [clears(row, [r[k] for r in null_rows.values()]) for k, row in enumerate(rows)])
