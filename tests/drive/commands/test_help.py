"""`drive COMMAND --help` loads none of the heavy libraries its command runs on (drive/cli.py): a command module keeps
its Config on light imports and imports its engine when `run` starts. Checked by what is imported, not by a clock."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from drive.cli import COMMANDS, _parse, main, module_name
from tests.conftest import REPO

HEAVY = ("torch", "gymnasium", "matplotlib", "scipy", "cv2", "ray", "pandas", "pyarrow", "socketio", "pygame",
         "sklearn")  # fmt: skip
# commands whose --help may load something heavy, and why (none today: a new entry needs its reason)
EXEMPT: dict[tuple[str, ...], str] = {}

PROBE = """
import contextlib, io, json, sys
from drive.cli import COMMANDS, _parse, main, module_name
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
    for expected in ("  spiral (--task spiral; --data none: it makes its own data", "    task.n_obs=50",
                     "  nsac (NSAC controller: shared encoder -> NSAC stochastic attention -> pooled Gaussian",
                     "    encoder.d_model=64", "    reg_weight=0.5",
                     "  ft-hsa (Hierarchical stochastic attention (HSA) on the FT-Transformer; ft's fields and:)",
                     "    trainer.patience=10"):  # fmt: skip
        assert any(line.startswith(expected) for line in lines), expected
    patience = next(line for line in lines if line.startswith("    trainer.patience=10"))
    assert "stop after this many epochs without a better `select` score" in patience
    assert "(default: None)" not in out.split("--epochs")[1].split("--seed")[0]  # "(default: the task's)" once
    assert out.count("(default: the task's)") == 3


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    """Every command's `--help` output, by command words."""
    out = {}
    for words in COMMANDS:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as exit_:
            main([*words, "--help"])
        assert exit_.value.code == 0, words
        out[" ".join(words)] = buf.getvalue()
    return out


def option_helps(text: str) -> dict[str, str]:
    """tyro's option entries of one --help text, each joined onto one line: {"--out": "--out PATH results ..."}."""
    entries: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        line = line.strip(" │")
        if line.startswith("-"):
            current = line.split()[0].rstrip(",")
            entries[current] = line
        elif current and line:
            entries[current] += " " + line
        else:
            current = None  # a blank line ends the options (the epilog's --set keys follow one)
    return entries


def test_every_option_states_its_default_once(helps):
    # a docstring saying "default: print only" used to get tyro's "(default: None)" after it
    twice = {f"{command} {flag}": entry for command, text in helps.items()
             for flag, entry in option_helps(text).items() if entry.lower().count("default") > 1}  # fmt: skip
    assert not twice, twice
    eval_options = option_helps(helps["eval"])
    assert eval_options["--out"].endswith("default: print only")
    assert eval_options["--seeds"].endswith("(default: 1000-1019)")  # tyro's own hint stays where none is written


def test_no_help_names_a_source_file(helps):
    # users need what an option does; `module:function` (their own shift, say) carries no .py
    named = {command: re.findall(r"\b[\w/]+\.py\b", text) for command, text in helps.items()}
    assert not {c: files for c, files in named.items() if files}


def test_help_shows_shipped_checkpoints_relative_and_the_value_is_found_from_anywhere(helps, monkeypatch, tmp_path):
    assert not [command for command, text in helps.items() if str(REPO) in text]
    assert "checkpoints/carracing_nsac.pt" in helps["bench closedloop"]
    monkeypatch.chdir(tmp_path)
    for words in (("drive",), ("demo",), ("bench", "closedloop")):
        module = __import__(module_name(words), fromlist=["Config"])
        cfg = _parse(module, [], "drive " + " ".join(words), "")
        shipped = [str(getattr(cfg, f.name)) for f in fields(cfg) if "carracing_nsac.pt" in str(getattr(cfg, f.name))]
        assert shipped, words
        assert all(Path(value.removeprefix("ckpt:")).is_file() for value in shipped), shipped
