"""A package named `datasets` (Hugging Face's) or `agents` earlier on the path does not hijack drive's siblings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def _python(code: str, fake_root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_root), str(REPO)])}
    return subprocess.run([sys.executable, "-c", code], cwd=fake_root, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def _fake(tmp_path: Path) -> Path:
    for name in ("datasets", "agents"):  # what `pip install datasets agents` puts first on the path
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("IMPOSTOR = True\n")
    return tmp_path


def test_drive_binds_its_own_datasets_and_agents_before_another_package_of_that_name(tmp_path):
    fake = _fake(tmp_path)
    assert "IMPOSTOR" in _python("import datasets; print(dir(datasets))", fake).stdout  # the setting is real
    code = ("import drive, datasets, agents, datasets.demonstrations, agents.registry\n"
            "print(datasets.__file__, agents.__file__, datasets.demonstrations.__file__)\n"
            "print(hasattr(datasets, 'IMPOSTOR') or hasattr(agents, 'IMPOSTOR'))")  # fmt: skip
    done = _python(code, fake)
    assert done.returncode == 0, done.stderr
    files, impostor = done.stdout.splitlines()
    assert all(Path(f).resolve().is_relative_to(REPO) for f in files.split()), files
    assert impostor == "False"


def test_another_datasets_imported_first_is_one_line_that_says_what_to_do(tmp_path):
    done = _python("import datasets\nimport drive", _fake(tmp_path))
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("drive.SiblingConflict: drive needs its own top-level package 'datasets'"), last
    assert "import drive before it" in last
