"""Architecture rules from STYLE.md: one import direction, and our packages resolve inside the repo."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.conftest import REPO

LOWER = ("agents", "sim_bridges", "datasets")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", LOWER)
def test_lower_packages_never_import_drive_or_each_other(package):
    forbidden = {"drive", *LOWER} - {package}
    offenders = {}
    for path in sorted((REPO / package).rglob("*.py")):
        bad = _imports(path) & forbidden
        if bad:
            offenders[str(path.relative_to(REPO))] = sorted(bad)
    assert not offenders, f"import direction is drive -> agents, sim_bridges, datasets; violations: {offenders}"


@pytest.mark.parametrize("package", ["drive", *LOWER])
def test_packages_resolve_inside_the_repo(package):
    # `datasets` and `agents` are also names of PyPI packages: ours must win.
    module = importlib.import_module(package)
    assert Path(module.__file__).resolve().is_relative_to(REPO), module.__file__


def test_cli_lists_commands_and_every_module_exists(capsys):
    from drive.cli import COMMANDS, main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    missing = [name for name, _ in COMMANDS.values() if importlib.util.find_spec(name) is None]
    assert not missing, f"commands without a module: {missing}"
    for words in COMMANDS:
        assert " ".join(words) in out
