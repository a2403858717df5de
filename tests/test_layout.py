"""Architecture rules (STYLE.md): one import direction, no cycle, layers that never reach up, small modules."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import warnings
from pathlib import Path

import pytest

from tests.conftest import REPO

LOWER = ("agents", "sim_bridges", "datasets")
PACKAGES = ("drive", *LOWER)
# Files are sized by cohesion (STYLE.md): a module or function past its soft budget is named in a warning, so a reader
# sees where a split may pay; only the hard stop, well above it, fails. A cohesive file is never cut to meet a count.
SOFT_MODULE_LINES, MAX_MODULE_LINES = 330, 600
SOFT_FUNCTION_LINES, MAX_FUNCTION_LINES = 60, 100


def _modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _imported(name: str, path: Path) -> set[str]:
    """Our modules that `name` imports anywhere in its file (functions included), resolved to module names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


GRAPH = {name: _imported(name, path) for name, path in MODULES.items()}


@pytest.mark.parametrize("package", LOWER)
def test_lower_packages_never_import_drive_or_each_other(package):
    forbidden = {"drive", *LOWER} - {package}
    offenders = {m: sorted(d for d in deps if d.split(".")[0] in forbidden) for m, deps in GRAPH.items()
                 if m.split(".")[0] == package}  # fmt: skip
    offenders = {m: d for m, d in offenders.items() if d}
    assert not offenders, f"import direction is drive -> agents, sim_bridges, datasets; violations: {offenders}"


def test_no_import_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def _is_command(m: str) -> bool:
    return m.startswith("drive.commands.") or m == "drive.cli"


def _is_task_plugin(m: str) -> bool:
    return m.startswith("drive.learn.tasks.")


def test_no_library_module_imports_a_command_or_a_task_plugin():
    offenders = {}
    for m, deps in GRAPH.items():
        if _is_command(m) or _is_task_plugin(m) or m == "drive.__main__":
            continue
        bad = sorted(d for d in deps if _is_command(d) or _is_task_plugin(d))
        if bad:
            offenders[m] = bad
    assert not offenders, f"library modules import commands or task plugins: {offenders}"


def test_commands_import_no_other_command_but_demo():
    offenders = {m: sorted(d for d in deps if _is_command(d) and d != "drive.cli") for m, deps in GRAPH.items()
                 if m.startswith("drive.commands.") and m != "drive.commands.demo"}  # fmt: skip
    offenders = {m: d for m, d in offenders.items() if d}
    assert not offenders, f"a command imports another command: {offenders}"


def test_layers_point_down():
    # observe draws what the loop produces; learn trains without the loop; the shared bottom imports no layer
    rules = {"drive.loop": ("drive.observe", "drive.learn"), "drive.learn": ("drive.observe", "drive.loop"),
             "drive.observe": ("drive.learn",),
             "drive.perturb": ("drive.loop", "drive.learn", "drive.observe"),
             "drive.checkpoint": ("drive.loop", "drive.learn", "drive.observe"),
             "drive.metrics": ("drive.loop", "drive.learn", "drive.observe", "drive.checkpoint")}  # fmt: skip
    offenders = {}
    for m, deps in GRAPH.items():
        for layer, banned in rules.items():
            if m == layer or m.startswith(layer + "."):
                bad = sorted(d for d in deps if any(d == b or d.startswith(b + ".") for b in banned))
                if bad:
                    offenders[m] = bad
    assert not offenders, f"layer violations: {offenders}"


def _lengths() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for name, path in MODULES.items():
        text = path.read_text()
        modules[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1  # type: ignore[operator]
    return modules, functions


def test_modules_and_functions_stay_within_their_budget():
    modules, functions = _lengths()
    over_soft = {m: n for m, n in {**modules, **functions}.items()
                 if n > (SOFT_FUNCTION_LINES if ":" in m else SOFT_MODULE_LINES)}  # fmt: skip
    if over_soft:
        warnings.warn(f"past the soft line budget ({SOFT_MODULE_LINES} per module, {SOFT_FUNCTION_LINES} per "
                      f"function; split only where the purpose divides): {over_soft}", stacklevel=1)  # fmt: skip
    long_modules = {m: n for m, n in modules.items() if n > MAX_MODULE_LINES}
    long_functions = {f: n for f, n in functions.items() if n > MAX_FUNCTION_LINES}
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"


def _is_study(m: str) -> bool:
    return m == "drive.studies" or m.startswith("drive.studies.")


def test_only_commands_import_a_study():
    offenders = {m: sorted(d for d in deps if _is_study(d)) for m, deps in GRAPH.items()
                 if not (_is_study(m) or _is_command(m))}  # fmt: skip
    offenders = {m: d for m, d in offenders.items() if d}
    assert not offenders, f"a study is imported by more than commands and studies: {offenders}"


def test_each_study_is_one_folder():
    """A study's modules live in drive/studies/<study>/ (shared statistics aside); none sits loose beside them."""
    shared = ("__init__.py", "over_seeds.py")
    loose = sorted(p.name for p in (REPO / "drive" / "studies").glob("*.py") if p.name not in shared)
    assert not loose, f"modules loose in drive/studies/ (give each study its folder): {loose}"


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_resolve_inside_the_repo(package):
    # `datasets` and `agents` are also names of PyPI packages: ours must win.
    module = importlib.import_module(package)
    assert Path(module.__file__).resolve().is_relative_to(REPO), module.__file__


def test_every_command_word_has_its_module_and_nothing_else_is_a_command(capsys):
    from drive.cli import COMMANDS, main, module_name

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for words in COMMANDS:
        assert " ".join(words) in out
        module = importlib.import_module(module_name(words))
        assert hasattr(module, "Config") and callable(module.run), module_name(words)
    commands = {m for m, p in MODULES.items() if m.startswith("drive.commands.") and p.name != "__init__.py"}
    assert commands == {module_name(w) for w in COMMANDS}, "a module in drive/commands is not in the table"
    tyro_free = [m for m, p in MODULES.items() if "argparse" in p.read_text() and "import argparse" in p.read_text()]
    assert not tyro_free, f"modules parsing arguments outside the command table: {tyro_free}"


def test_the_layout_page_names_every_folder():
    text = (REPO / "docs" / "layout.md").read_text()  # the README links it through docs/README.md
    layout = text[text.index("## Layout") :]
    layout = layout[: layout.index("\n## ", 4)]
    folders = {p.relative_to(REPO).as_posix() + "/" for pkg in PACKAGES for p in (REPO / pkg).rglob("*")
               if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))}  # fmt: skip
    missing = sorted(f for f in folders if f.rstrip("/").rsplit("/", 1)[-1] + "/" not in layout)
    assert not missing, f"docs/layout.md's layout section does not name: {missing}"
