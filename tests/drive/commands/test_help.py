"""`drive COMMAND --help` loads none of the heavy libraries its command runs on (drive/cli.py): a command module keeps
its Config on light imports and imports its engine when `run` starts. Checked by what is imported, not by a clock."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from drive.cli import COMMANDS, main
from tests.conftest import REPO

HEAVY = ("torch", "gymnasium", "matplotlib", "scipy", "cv2", "ray", "pandas", "pyarrow", "socketio", "pygame",
         "sklearn")  # fmt: skip
# commands whose --help may load something heavy, and why (none today: a new entry needs its reason)
EXEMPT: dict[tuple[str, ...], str] = {}

PROBE = """
import contextlib, io, json, sys
from drive.cli import COMMANDS, main
heavy, loaded = {heavy!r}, {{}}
order = [w for w in COMMANDS if w not in {exempt!r}] + list({exempt!r})
for words in order:
    before = {{m for m in heavy if m in sys.modules}}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main([*words, "--help"])
    loaded[" ".join(words)] = sorted(m for m in heavy if m in sys.modules and m not in before)
print(json.dumps(loaded))
"""


def test_no_command_help_imports_torch_or_the_simulator():
    code = PROBE.format(heavy=HEAVY, exempt=list(EXEMPT))
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout.splitlines()[-1])
    assert loaded["train"] == [] and loaded["eval"] == []  # the two the issue measured at ~5 s
    offenders = {c: mods for c, mods in loaded.items() if mods and tuple(c.split()) not in EXEMPT}
    assert not offenders, f"--help imports heavy modules (move them into run): {offenders}"
    assert set(loaded) == {" ".join(w) for w in COMMANDS}


def test_train_help_lists_its_options_then_every_set_key(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    sections = ["--controller", "--threads", "task options (--set task.KEY=VALUE)", "controller fields (--set KEY",
                "trainer keys (--set trainer.KEY"]  # fmt: skip
    at = [out.index(s) for s in sections]
    assert at == sorted(at), "the command's options first, then tasks, controllers, trainer"
    lines = out.splitlines()
    for expected in ("  spiral (--task spiral; --data none: it makes its own data)", "    task.n_obs=50",
                     "  nsac (agents/nsac.py NSACConfig)", "    encoder.d_model=64", "    reg_weight=0.5",
                     "  ft-hsa (agents/hsa.py HSAConfig; ft's fields and:)", "    trainer.patience=10"):  # fmt: skip
        assert any(line.startswith(expected) for line in lines), expected
    patience = next(line for line in lines if line.startswith("    trainer.patience=10"))
    assert "stop after this many epochs without a better `select` score" in patience
    assert "(default: None)" not in out.split("--epochs")[1].split("--seed")[0]  # "(default: the task's)" once
    assert out.count("(default: the task's)") == 3
