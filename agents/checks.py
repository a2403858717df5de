"""Range checks for the controller configs' `__post_init__`: a value out of range is a ValueError naming the config,
the field, the value and the range, so `drive train --set encoder.d_model=-4` fails in one line before anything is
built, and a config rebuilt from a checkpoint is checked the same way.

    at_least(self, 1, "n_heads", "n_samples")     # integers (sizes, counts) >= 1
    in_range(self, "dropout", 0.0, 1.0, high_open=True)

A message names the field as `NSACConfig.n_heads`, or, where the class sets `LABEL: ClassVar[str] = "trainer"`, as
the user spells it in `--set` (`trainer.epochs`).
"""

from __future__ import annotations

import math
from typing import Any


def label(cfg: Any) -> str:
    return getattr(cfg, "LABEL", type(cfg).__name__)


def _fail(cfg: Any, name: str, wanted: str) -> None:
    raise ValueError(f"{label(cfg)}.{name}={getattr(cfg, name)!r} must be {wanted}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def at_least(cfg: Any, low: float, *names: str) -> None:
    """Each field is a finite number >= low."""
    for name in names:
        value = getattr(cfg, name)
        if not _finite(value) or value < low:
            _fail(cfg, name, f">= {low:g}")


def positive(cfg: Any, *names: str) -> None:
    """Each field is a finite number > 0."""
    for name in names:
        value = getattr(cfg, name)
        if not _finite(value) or value <= 0:
            _fail(cfg, name, "> 0")


def in_range(cfg: Any, name: str, low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> None:
    """The field lies in the interval [low, high] (either end open)."""
    value = getattr(cfg, name)
    above = _finite(value) and (value > low if low_open else value >= low)
    below = _finite(value) and (value < high if high_open else value <= high)
    if not (above and below):
        _fail(cfg, name, f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}")


def one_of(cfg: Any, name: str, choices: Any) -> None:
    if getattr(cfg, name) not in choices:
        _fail(cfg, name, f"one of {', '.join(map(str, choices))}")


def heads_divide(cfg: Any, d_model: int) -> None:
    """n_heads >= 1 divides the token width (each head takes d_model / n_heads channels)."""
    at_least(cfg, 1, "n_heads")
    if d_model % cfg.n_heads:
        raise ValueError(f"{label(cfg)}.n_heads={cfg.n_heads} must divide encoder.d_model={d_model}")
