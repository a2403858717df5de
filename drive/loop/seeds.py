"""Track seeds on the command line: one grammar for every command (`--seeds 0-59`, `1000,1003`, `0-4,10,20-22`).

`parse_seeds` reads it (order kept; ranges inclusive; an empty item, a repeated seed, a backwards range, anything
but digits (a negative seed), or more than MAX_SEEDS seeds is an error naming the offending part); `format_seeds`
writes a sorted list back in the same grammar ([0, 1, 2, 5, 7, 8] -> "0-2,5,7-8").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from drive.errors import UserError

MAX_SEEDS = 1_000_000  # a range larger than this is a typo, not an experiment (and would not fit in memory)
_PART = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_seeds(spec: str) -> list[int]:
    """'A-B' (inclusive), 'A,B,C', or a mix: '0-4,10,20-22'. Non-negative integers, order kept, no repeats."""
    seeds: list[int] = []
    if not str(spec).strip():
        raise UserError(f"seed spec {spec!r} names no seeds")
    for part in str(spec).replace(" ", "").split(","):
        if not part:
            raise UserError(f"bad seed spec {spec!r}: an empty item (two commas, or one at an end)")
        match = _PART.match(part)
        if match is None:
            raise UserError(f"bad seed spec {spec!r} at {part!r}: use 'A-B' (inclusive), 'A,B,C' or a mix of them")
        a = int(match.group(1))
        b = int(match.group(2)) if match.group(2) is not None else a
        if b < a:
            raise UserError(f"bad seed spec {spec!r}: range {part!r} runs backwards (write {b}-{a})")
        if len(seeds) + (b - a + 1) > MAX_SEEDS:
            raise UserError(f"seed spec {spec!r} names more than {MAX_SEEDS:,} seeds")
        seeds.extend(range(a, b + 1))
    if not seeds:
        raise UserError(f"seed spec {spec!r} names no seeds")
    if len(set(seeds)) != len(seeds):
        raise UserError(f"seed spec {spec!r} repeats a seed")
    return seeds


def format_seeds(seeds: Iterable[int]) -> str:
    """Sorted seeds in the grammar above: [0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    runs: list[list[int]] = []
    for seed in sorted(seeds):
        if runs and seed == runs[-1][1] + 1:
            runs[-1][1] = seed
        else:
            runs.append([seed, seed])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
