"""Config dataclasses read from their source, not imported: what `drive train --help` lists (every task's options,
every controller's fields, the trainer's keys) without loading torch, which the modules that hold them import.

    dataclass_fields("agents.nsac", "NSACConfig")  -> [FieldDoc("encoder", "EncoderConfig", "EncoderConfig()", ...),
                                                        FieldDoc("n_heads", "int", "4", "attention heads ..."), ...]
    registry("agents.registry", "CONTROLLERS")     -> {"nsac": ("agents.nsac", "NSACConfig"), ...}

Fields follow dataclass rules: a base class's fields first (bases found through the module's imports), a field
redefined by a subclass keeps its place and takes the new default; ClassVars are not fields. A default is shown as
Python would print it where it is a literal (or a module constant bound to one), else as written (`EncoderConfig()`
for an instance or a `default_factory`). tests/drive/test_fields.py holds every result against the imported classes.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from typing import NamedTuple


class FieldDoc(NamedTuple):
    name: str
    kind: str
    """the annotation as written"""
    default: str
    """the default as Python prints it (a literal) or as written; "" for a required field"""
    doc: str
    """the field's docstring (the string after it), on one line"""


@functools.cache
def _tree(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)  # imports the parent packages only, which hold no heavy imports
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module named {module!r}")
    return ast.parse(Path(spec.origin).read_text())


def _imports(module: str) -> dict[str, tuple[str, str]]:
    """Names bound by `from X import Y [as Z]` at module level: {Z: (X, Y)}."""
    names = {}
    for node in _tree(module).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, alias.name)
    return names


def _constant(module: str, name: str, depth: int = 0) -> ast.expr | None:
    """The expression a module-level name is bound to, followed through `from X import NAME` (None: not found)."""
    for node in _tree(module).body:
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        targets, value = node.targets if isinstance(node, ast.Assign) else [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name) and target.id == name:
                return value
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):  # `LOOKBACK, HORIZON = 48, 24`
                for t, v in zip(target.elts, value.elts, strict=False):
                    if isinstance(t, ast.Name) and t.id == name:
                        return v
    source = _imports(module).get(name)
    return _constant(source[0], source[1], depth + 1) if source and depth < 4 else None


def _shown(module: str, value: ast.expr) -> str:
    """A default as Python prints it where it is a literal (or names a module constant bound to one)."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
        keywords = {k.arg: k.value for k in value.keywords}
        if "default" in keywords:
            return _shown(module, keywords["default"])
        factory = keywords.get("default_factory")
        return "" if factory is None else f"{ast.unparse(factory)}()"
    if isinstance(value, ast.Name) and (bound := _constant(module, value.id)) is not None:
        value = bound
    elif isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):  # `fc.LOOKBACK`, fc a module
        source = _imports(module).get(value.value.id)
        if source and importlib.util.find_spec(".".join(source)) and (bound := _constant(".".join(source), value.attr)):
            value = bound
    try:
        return repr(ast.literal_eval(value))
    except ValueError:
        return ast.unparse(value)


def _class(module: str, name: str) -> tuple[str, ast.ClassDef]:
    """The module defining `name` as seen from `module` (through its imports) and the class definition."""
    for node in _tree(module).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    source = _imports(module).get(name)
    if source is None:
        raise LookupError(f"{module}: no class {name!r}")
    return _class(*source)


def dataclass_fields(module: str, name: str) -> list[FieldDoc]:
    """The fields of dataclass `name` of `module`, bases first, each with its default and docstring."""
    where, node = _class(module, name)
    fields: dict[str, FieldDoc] = {}
    for base in node.bases:
        if isinstance(base, ast.Name):
            fields.update((f.name, f) for f in dataclass_fields(where, base.id))
    body = node.body
    for stmt, after in zip(body, [*body[1:], None], strict=True):
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        kind = ast.unparse(stmt.annotation)
        if kind.startswith(("ClassVar", "typing.ClassVar")):
            continue
        doc = ""
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            doc = " ".join(after.value.value.split())
        default = "" if stmt.value is None else _shown(where, stmt.value)
        fields[stmt.target.id] = FieldDoc(stmt.target.id, kind, default, doc)
    return list(fields.values())


def bases(module: str, name: str) -> list[tuple[str, str]]:
    """The classes `name` derives from, as (module, class name) where each is defined."""
    where, node = _class(module, name)
    return [_class(where, b.id)[0:1] + (b.id,) for b in node.bases if isinstance(b, ast.Name)]


def registry(module: str, name: str) -> dict[str, tuple[str, str]]:
    """A module-level dict of classes (`CONTROLLERS = {"nsac": NSACConfig, ...}`) as {key: (module, class name)}."""
    value = _constant(module, name)
    if not isinstance(value, ast.Dict):
        raise LookupError(f"{module}.{name} is not a dict written out in its module")
    imports, found = _imports(module), {}
    for key, cls in zip(value.keys, value.values, strict=True):
        if key is None or not isinstance(cls, ast.Name):
            raise LookupError(f'{module}.{name}: every entry must be written out as "key": ClassName')
        found[ast.literal_eval(key)] = imports.get(cls.id, (module, cls.id))
    return found


def summary(module: str) -> str:
    """The first line of a module's docstring, without its full stop ("" where it has none): what it holds."""
    return (ast.get_docstring(_tree(module)) or "").split("\n", 1)[0].rstrip(".")


def constant(module: str, name: str) -> object:
    """The literal a module-level name is bound to (`DATA = "DIR: ..."`)."""
    value = _constant(module, name)
    if value is None:
        raise LookupError(f"{module}: no module-level {name!r}")
    return ast.literal_eval(value)


def help_lines(fields: list[FieldDoc], prefix: str = "", indent: str = "    ") -> list[str]:
    """One line per field, `PREFIXNAME=DEFAULT  doc` in aligned columns (a Literal's choices after the doc)."""
    keys = [f"{prefix}{f.name}={_typed(f.default)}" for f in fields]
    width = min(max((len(k) for k in keys), default=0), 40)
    lines = []
    for key, f in zip(keys, fields, strict=True):
        choices = f" (one of {f.kind[f.kind.index('[') + 1 : -1]})" if f.kind.startswith("Literal[") else ""
        lines.append(f"{indent}{key:<{width}}  {f.doc}{choices}".rstrip())
    return lines


def _typed(default: str) -> str:
    """A default as typed after `--set KEY=`: a string without its quotes (an empty one stays '')."""
    return default[1:-1] if len(default) > 2 and default[0] == default[-1] == "'" else default
