"""`--set KEY=VALUE` overrides: dotted keys into frozen dataclasses, string values cast to the field types.

`parse_overrides(("n_heads=2", "encoder.d_model=32", "task.stride=2", "trainer.patience=5"))` splits them into the
controller's, the task's and the trainer's; `apply_overrides(cfg, {...})` is `dataclasses.replace` with dotted keys
(`encoder.d_model`) and typed casting (bools accept 1/0, true/false, yes/no, on/off; tuples take comma lists;
`none` for optional fields). An unknown field is an error naming the known ones.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from drive.errors import UserError

GROUPS = ("task", "trainer")  # prefixes routed away from the controller


def parse_overrides(items: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Split `--set` items into (controller, task, trainer) overrides."""
    groups: dict[str, dict[str, str]] = {"controller": {}, "task": {}, "trainer": {}}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected KEY=VALUE")
        prefix, dot, rest = key.partition(".")
        if dot and prefix in GROUPS:
            groups[prefix][rest] = value
        else:
            groups["controller"][key] = value
    return groups["controller"], groups["task"], groups["trainer"]


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def cast(value: Any, hint: Any, where: str) -> Any:
    """A string `value` cast to the type `hint` (a non-string passes unchanged)."""
    if not isinstance(value, str):
        return tuple(value) if isinstance(value, list) else value
    target = hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value.lower() == "none":
            return None
        target = args[0] if args else str
    try:
        if target is bool:
            return _bool(value)
        if typing.get_origin(target) is typing.Literal:
            if value not in typing.get_args(target):
                raise ValueError(value)
            return value
        if typing.get_origin(target) is tuple:
            inner = typing.get_args(target)[0]
            return tuple(inner(v) for v in value.split(",") if v)
        return target(value)
    except (TypeError, ValueError):
        name = getattr(target, "__name__", str(target))
        raise UserError(f"--set {where}={value!r}: not a valid {name}") from None


def apply_overrides(cfg: Any, overrides: dict[str, Any], where: str = "") -> Any:
    """dataclasses.replace with dotted keys (encoder.d_model) and string values cast to the field types."""
    hints = typing.get_type_hints(type(cfg))
    fields = {f.name for f in dataclasses.fields(cfg)}
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        head, dot, rest = key.partition(".")
        if head not in fields:
            raise UserError(f"--set {where}{key}: {type(cfg).__name__} has no field {head!r}; fields: {sorted(fields)}")
        if dot:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[head] = cast(value, hints[head], f"{where}{key}")
    for head, sub in nested.items():
        flat[head] = apply_overrides(getattr(cfg, head), sub, f"{where}{head}.")
    try:
        return dataclasses.replace(cfg, **flat)
    except (TypeError, ValueError) as exc:  # a config's own validation (__post_init__) refused the values
        name = getattr(cfg, "LABEL", type(cfg).__name__)
        message = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"  # the checks name their config
        raise UserError(message) from None
