"""Option types with their range: `--help` shows it (`--episodes INT>=1`, `--port INT{0..65535}`) and the parser
rejects a value outside it with a one-line error, before a command runs or writes anything.

    episodes: PositiveInt = 2            # drive demo --episodes 0  ->  drive demo: error: --episodes: 0 is out ...
    port: Port = 4567
    lr: PositiveFloat = 1e-3
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

from tyro.constructors import PrimitiveConstructorSpec


def _spec(kind: type, metavar: str, check: Callable[[Any], str | None]) -> PrimitiveConstructorSpec:
    def parse(args: list[str]) -> Any:
        try:
            value = kind(args[0])
        except ValueError:
            raise ValueError(f"{args[0]!r} is not {'an integer' if kind is int else 'a number'}") from None
        problem = check(value)
        if problem:
            raise ValueError(f"{args[0]} {problem}")
        return value

    return PrimitiveConstructorSpec(nargs=1, metavar=metavar, instance_from_str=parse,
                                    is_instance=lambda x: isinstance(x, kind) and not isinstance(x, bool),
                                    str_from_instance=lambda x: [str(x)])  # fmt: skip


def IntRange(low: int | None = None, high: int | None = None) -> Any:  # noqa: N802 - a type factory
    """int within [low, high] (either bound may be open)."""
    if high is None:
        metavar = f"INT>={low}" if low is not None else "INT"
    else:
        metavar = f"INT{{{low}..{high}}}" if low is not None else f"INT<={high}"

    wanted = f">= {low}" if high is None else (f"<= {high}" if low is None else f"in {low}..{high}")

    def check(v: int) -> str | None:
        if (low is not None and v < low) or (high is not None and v > high):
            return f"is out of range: must be {wanted}"
        return None

    return Annotated[int, _spec(int, metavar, check)]


def FloatRange(low: float | None = None, high: float | None = None, open_low: bool = False) -> Any:  # noqa: N802
    """A finite float within [low, high] ((low, high] with open_low)."""
    lo = "" if low is None else (f">{low:g}" if open_low else f">={low:g}")
    hi = "" if high is None else f"<={high:g}"
    metavar = "FLOAT" + (lo + ("," if lo and hi else "") + hi)

    def check(v: float) -> str | None:
        if not math.isfinite(v):
            return "is not finite"
        if low is not None and (v <= low if open_low else v < low):
            return f"is out of range: must be {lo}"
        if high is not None and v > high:
            return f"is out of range: must be {hi}"
        return None

    return Annotated[float, _spec(float, metavar, check)]


PositiveInt = IntRange(1)
NonNegativeInt = IntRange(0)
Port = IntRange(0, 65535)  # 0: the system picks a free port
Probability = FloatRange(0.0, 1.0)
OpenUnit = FloatRange(0.0, 1.0, open_low=True)  # (0, 1]: a quantile, a fraction that cannot be 0
PositiveFloat = FloatRange(0.0, None, open_low=True)
NonNegativeFloat = FloatRange(0.0)
