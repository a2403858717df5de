"""The README works as written: its pipeline block runs verbatim, counts shrunk only through options it shows."""

from __future__ import annotations

import json
import shlex

import pytest

from drive.cli import main
from drive.observe.trace import read_trace
from drive.observe.video import read_video
from tests.conftest import REPO

# option -> {value in the README: value in this test}; nothing else on a line may change
SHRINK = {
    "--seeds": {"0-59": "0-2", "100-129": "100", "1000-1019": "1000", "1000": "1000"},
    "--episodes": {"60": "3"},
    "--epochs": {"10": "1"},
    "--set": {"task.stride=2": "task.stride=10"},
}


def pipeline_block() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## The pipeline") :]
    block = section[section.index("```bash") + len("```bash") : section.index("```", section.index("```bash") + 7)]
    commands = []
    for line in block.strip().splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def shrink(words: list[str]) -> list[str]:
    out = list(words)
    for i, word in enumerate(words[:-1]):
        if word in SHRINK:
            value = words[i + 1]
            assert value in SHRINK[word], f"README shows {word} {value}: add how the test shrinks it"
            out[i + 1] = SHRINK[word][value]
    return out


def test_pipeline_block_is_what_the_test_runs():
    commands = pipeline_block()
    assert [c[:2] for c in commands] == [["drive", "collect"], ["drive", "data"], ["drive", "train"],
                                         ["drive", "dagger"], ["drive", "train"], ["drive", "eval"],
                                         ["drive", "replay"], ["drive", "drive"]]  # fmt: skip
    assert all("--max-episode-steps" not in c and "--env" not in c for c in commands)  # the real CarRacing, full laps


def test_ci_runs_exactly_the_readme_test_command():
    text = (REPO / "README.md").read_text()
    after = text[text.index("Set up and run the tests") :]
    command = after[after.index("```bash") + len("```bash") : after.index("```", after.index("```bash") + 7)].strip()
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == command, "`.ci/run` must call exactly the README's test command"
    assert all(step in command for step in ("ruff check", "ruff format --check", "mypy", "pytest"))


@pytest.mark.usefixtures("one_thread")
def test_readme_pipeline_runs_verbatim(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    for words in pipeline_block():
        argv = shrink(words)[1:]
        code = main(argv)
        assert code == 0, f"{' '.join(argv)} -> {code}: {capsys.readouterr().err}"
    runs = tmp_path / "runs"
    assert json.loads((runs / "bc-nsac-d1" / "metrics.json").read_text())["task"] == "demos"
    results = json.loads((runs / "bc-nsac-d1" / "eval.json").read_text())
    assert results["seeds"] == [1000] and results["episodes"][0]["steps"] > 0
    table, _ = read_trace(runs / "bc-nsac-d1" / "traces" / "trace_seed001000.parquet")
    assert table.num_rows == results["episodes"][0]["steps"]
    assert len(read_video(runs / "bc-nsac-d1" / "seed_1000.mp4")) == table.num_rows
    assert (tmp_path / "out" / "drive.mp4").stat().st_size > 10_000  # `drive drive` headless
    assert len(json.loads((runs / "demos-d1" / "manifest.json").read_text())["episodes"]) == 4  # 3 + 1 DAgger
