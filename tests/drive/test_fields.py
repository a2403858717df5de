"""drive/fields.py reads config dataclasses from source for `drive train --help`: every result is held against the
imported classes, so the help can never list a field, default or docstring the code does not have."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import typing

import pytest

from agents.registry import CONTROLLERS
from drive import fields
from drive.learn import tasks

CLASSES = [*((c.__module__, c.__name__) for c in CONTROLLERS.values()),
           *((path, "Options") for path in tasks.TASKS.values()),
           ("drive.learn.options", "TrainerConfig"), ("agents.encoders", "EncoderConfig")]  # fmt: skip


def _docs(cls: type) -> dict[str, str]:
    """Field docstrings of `cls` and its bases, read from each class's own source with inspect (not drive/fields)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        body = ast.parse(inspect.getsource(klass).lstrip()).body[0].body  # type: ignore[attr-defined]
        for stmt, after in zip(body, body[1:], strict=False):
            if isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr):
                docs[stmt.target.id] = " ".join(after.value.value.split())  # type: ignore[attr-defined]
    return docs


@pytest.mark.parametrize(("module", "name"), CLASSES, ids=lambda x: x)
def test_fields_read_from_source_match_the_imported_dataclass(module, name):
    cls = getattr(importlib.import_module(module), name)
    read = fields.dataclass_fields(module, name)
    real = dataclasses.fields(cls)
    assert [f.name for f in read] == [f.name for f in real]
    docs = _docs(cls)
    namespace = {k: v for klass in reversed(cls.__mro__) for k, v in vars(inspect.getmodule(klass)).items()}
    for got, field in zip(read, real, strict=True):
        assert got.doc == docs.get(field.name, ""), field.name
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            assert got.default == "", field.name
            continue
        wanted = field.default_factory() if field.default is dataclasses.MISSING else field.default
        assert eval(got.default, namespace) == wanted, field.name  # noqa: S307 - our own source text
    hints = typing.get_type_hints(cls)
    for got in read:
        if got.kind.startswith("Literal["):
            assert typing.get_origin(hints[got.name]) is typing.Literal, got.name


def test_registry_and_constants_read_from_source():
    assert fields.registry("agents.registry", "CONTROLLERS") == {
        name: (cls.__module__, cls.__name__) for name, cls in CONTROLLERS.items()
    }
    for path in tasks.TASKS.values():
        assert fields.constant(path, "DATA") == importlib.import_module(path).DATA
    assert fields.bases("agents.swag", "MultiSWAGConfig") == [("agents.swag", "SWAGConfig")]
    with pytest.raises(LookupError, match="no class 'Nope'"):
        fields.dataclass_fields("agents.nsac", "Nope")


def test_help_lines_are_one_per_field_with_the_default_as_typed():
    lines = fields.help_lines(fields.dataclass_fields("drive.learn.tasks.spiral", "Options"), "task.")
    assert lines[0].split() == ["task.n_freqs=6", "Fourier", "frequencies", "of", "the", "time", "encoding", "(1", "+",
                                "2", "n_freqs", "tokens)"]  # fmt: skip
    region = next(line for line in lines if "train_region" in line)
    assert "task.train_region=all " in region and region.endswith("(one of 'all', 'interpolation')")
