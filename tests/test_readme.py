"""The README works as written: its pipeline block runs verbatim, counts shrunk only through options it shows; it
stays short, every report in docs/ is reachable from it, and its one results table is the report's."""

from __future__ import annotations

import importlib
import json
import lzma
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from drive import cli
from drive.cli import main
from drive.observe.trace import read_trace
from drive.observe.video import read_video
from tests.conftest import REPO

MAX_README_LINES = 200  # what to type and where to look; reports live in docs/ (STYLE.md, "Results and reports")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")

# option -> {value in the README: value in this test}; nothing else on a line may change
SHRINK = {
    "--seeds": {"0-59": "0-2", "100-129": "100", "1000-1019": "1000", "1000": "1000"},
    "--episodes": {"60": "3"},
    "--epochs": {"10": "1"},
    "--set": {"task.stride=2": "task.stride=10"},
}


ACTIVATE = ["source", ".venv/bin/activate"]  # the pipeline's first line: the install's environment, in a new shell


def pipeline_lines() -> list[list[str]]:
    """Every line of the README's pipeline block, as words (comments dropped)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## The pipeline") :]
    block = section[section.index("```bash") + len("```bash") : section.index("```", section.index("```bash") + 7)]
    return [words for line in block.strip().splitlines() if (words := shlex.split(line, comments=True))]


def pipeline_block() -> list[list[str]]:
    """The block's `drive` commands."""
    return [words for words in pipeline_lines() if words != ACTIVATE]


def shrink(words: list[str]) -> list[str]:
    out = list(words)
    for i, word in enumerate(words[:-1]):
        if word in SHRINK:
            value = words[i + 1]
            assert value in SHRINK[word], f"README shows {word} {value}: add how the test shrinks it"
            out[i + 1] = SHRINK[word][value]
    return out


def test_pipeline_block_is_what_the_test_runs():
    assert pipeline_lines()[0] == ACTIVATE  # `drive` is on PATH only once the venv is active
    commands = pipeline_block()
    assert [c[:2] for c in commands] == [["drive", "collect"], ["drive", "data"], ["drive", "train"],
                                         ["drive", "dagger"], ["drive", "train"], ["drive", "eval"],
                                         ["drive", "replay"], ["drive", "drive"]]  # fmt: skip
    assert all("--max-episode-steps" not in c and "--env" not in c for c in commands)  # the real CarRacing, full laps


def test_ci_runs_exactly_the_readme_test_command():
    text = (REPO / "README.md").read_text()
    after = text[text.index("Set up and run the checks") :]
    command = after[after.index("```bash") + len("```bash") : after.index("```", after.index("```bash") + 7)].strip()
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == command, "`.ci/run` must call exactly the README's test command"
    assert all(step in command for step in ("ruff check", "ruff format --check", "mypy", "pytest"))


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    in_code = False
    for line in page.read_text().splitlines():
        in_code ^= line.startswith("```")
        if in_code or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
    return {f"{slug}-{n}" if n else slug for slug, count in seen.items() for n in range(count + 1)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return [m for m in LINK.findall(text) if not re.match(r"[a-z]+:", m)]


def test_the_readme_stays_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README has {len(lines)} lines: move results into a docs/ page"


def test_every_report_is_in_the_docs_index():
    index = REPO / "docs" / "README.md"
    linked = {(index.parent / link.split("#")[0]).resolve() for link in _links(index)}
    pages = {p.resolve() for p in (REPO / "docs").glob("*.md") if p.name != "README.md"}
    assert not pages - linked, f"docs/README.md does not list: {sorted(p.name for p in pages - linked)}"
    assert "docs/README.md" in _links(REPO / "README.md")


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]
)
def test_relative_links_resolve(page):
    """Every relative link (and image) points at a file or folder that exists, and every #anchor at a heading."""
    path = REPO / page
    for link in _links(path):
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.exists(), f"{page}: {link} does not exist"
        if anchor:
            assert anchor in _anchors(file), f"{page}: {link}: no such heading in {file.name}"


def _table(text: str, header: str) -> list[str]:
    start = text.index(header)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return rows


def _sections(text: str) -> dict[str, list[str]]:
    """{'## heading': the first table under it} for every level-2 heading with a table."""
    return {line: _table(text, line) for line in text.splitlines() if line.startswith("## ") and _table(text, line)}


# archive in docs/controllers_runs/ -> (its page in docs/, the bench's --out, --controllers)
BENCHES = {
    "records.tar.gz": ("controllers.md", "runs/ref/bench", ["all", "nsac-fit-0.3", "nsac-fit-0.1"]),
    "ablation.tar.gz": ("nsac_ablation.md", "runs/ref/ablation",
                        ["nsac", "nsac-noreg", "nsac-paper-batch-input", "nsac-paper-batch-heads",
                         "nsac-paper-pairs-input", "nsac-paper-pairs-heads", "nsac-anchored-batch-input",
                         "nsac-anchored-batch-heads", "nsac-anchored-pairs-heads"]),
}  # fmt: skip


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


SUMMARY = "| controller | seeds | return, nominal runs |"  # docs/misbehaviour.md's five-seed summary table
SEEDS5 = REPO / "docs" / "misbehaviour_runs" / "seeds5_results.json.xz"
FIRST_RUN = "### The first run"  # docs/misbehaviour.md's section on the five-seed run before the plan's revision 2


def test_the_readme_results_table_is_the_misbehaviour_report():
    """The README's one table: some columns of docs/misbehaviour.md's five-seed summary, every row's cells as there."""
    readme = (REPO / "README.md").read_text()
    shown = _table(readme, "## Results")
    report = _table((REPO / "docs" / "misbehaviour.md").read_text(), "### Results")  # its first table: the summary
    columns, full = _cells(shown[0]), _cells(report[0])
    assert columns[0] == "controller" and set(columns) <= set(full), columns
    assert len(columns) <= 9, "one narrow table: the rest is in docs/misbehaviour.md"
    picked = [full.index(c) for c in columns]
    assert [_cells(r) for r in shown[2:]] == [[_cells(r)[i] for i in picked] for r in report[2:]]
    assert "docs/misbehaviour.md" in _links(REPO / "README.md")


def test_the_five_seed_misbehaviour_summary_is_what_its_archived_results_make():
    """docs/misbehaviour.md's headline summary: the rows `over_seeds` and `summary_table` make of the per-checkpoint
    figures of the run's results.json (archived, xz), and the run is what its plan says: five seeds per controller,
    the scored windows per family counted, every null and the field's rules beside the declared monitor."""
    from drive.studies.misbehaviour.seed_tables import summary_table
    from drive.studies.misbehaviour.seeds import over_seeds

    with lzma.open(SEEDS5) as f:
        results = json.load(f)
    shown = results.pop("over_seeds")
    results["over_seeds"] = over_seeds(results)
    assert json.dumps(results["over_seeds"], sort_keys=True) == json.dumps(shown, sort_keys=True)
    made = [re.sub(r"/seed\*/(best|sa_controller)\.pt", "", line) for line in summary_table(results)]
    assert _table((REPO / "docs" / "misbehaviour.md").read_text(), SUMMARY) == made[1:]  # _table skips the header
    declared = results["plan"]["gate_signal"]
    for group, entry in results["over_seeds"].items():
        assert len(entry["checkpoints"]) == 5 and not entry["not_run"], group
        assert set(entry["windows"]) == {"motion_blur", "fog", "darkness"}, (group, entry["windows"])
        assert min(entry["windows"].values()) >= 30, (group, entry["windows"])  # the plan's floor per family
        assert set(entry["nulls"][declared]) == {"block_permuted", "information_free"} and declared in entry["field"]


def test_the_first_five_seed_run_is_what_its_archive_makes_and_why_it_was_not_enough():
    """docs/misbehaviour.md keeps the first five-seed run (blur, motion blur, fog, JPEG), its summary what
    `summary_table` makes of its archive, and the reason the plan was revised: families where a controller gets
    fewer than 30 scored windows."""
    from drive.studies.misbehaviour.seed_tables import summary_table
    from drive.studies.misbehaviour.seeds import over_seeds

    with lzma.open(REPO / "docs" / "misbehaviour_runs" / "seeds5_first_results.json.xz") as f:
        results = json.load(f)
    shown = results.pop("over_seeds")
    results["over_seeds"] = over_seeds(results)
    assert json.dumps(results["over_seeds"], sort_keys=True) == json.dumps(shown, sort_keys=True)
    page = (REPO / "docs" / "misbehaviour.md").read_text()
    section = page[page.index(FIRST_RUN) :]
    made = [re.sub(r"/seed\*/best\.pt", "", line) for line in summary_table(results)]
    assert _table(section, SUMMARY) == made[1:]
    windows = [n for entry in results["over_seeds"].values() for n in entry["windows"].values()]
    assert min(windows) < 30 and {"blur", "jpeg"} <= set(next(iter(results["over_seeds"].values()))["windows"])


def test_the_cost_matched_nsac_row_is_what_its_archive_makes():
    """docs/misbehaviour.md's converged NSAC at 8 samples per step: the row `summary_table` makes of its archived
    results.json, on the headline's families with >= 30 scored windows each."""
    from drive.studies.misbehaviour.seed_tables import summary_table
    from drive.studies.misbehaviour.seeds import over_seeds

    with lzma.open(REPO / "docs" / "misbehaviour_runs" / "nsac_samples8_results.json.xz") as f:
        results = json.load(f)
    shown = results.pop("over_seeds")
    results["over_seeds"] = over_seeds(results)
    assert json.dumps(results["over_seeds"], sort_keys=True) == json.dumps(shown, sort_keys=True)
    assert results["settings"]["samples"] == 8
    row = summary_table(results)[2].replace("/seed*/best.pt", "").replace("| nsac |", "| nsac, 8 samples |")
    assert row in (REPO / "docs" / "misbehaviour.md").read_text().splitlines()
    (entry,) = results["over_seeds"].values()
    assert set(entry["windows"]) == {"motion_blur", "fog", "darkness"} and min(entry["windows"].values()) >= 30


def test_the_readme_is_for_a_newcomer():
    """One results table, one line per command (every command listed), no issue numbers or commit hashes."""
    readme = (REPO / "README.md").read_text()
    tables = [line for line in readme.splitlines() if re.match(r"\|\s*-+\s*\|", line)]
    assert len(tables) == 2, "the command table and one results table"
    commands = _table(readme, "| command | what it does |")[1:]  # the rows under the header's separator
    listed = " ".join(_cells(row)[0] for row in commands)
    for words in cli.COMMANDS:
        assert words[-1] in listed, f"drive {' '.join(words)} is not in the README's command table"
    assert all(len(row) <= 140 for row in commands), "one short line per command"
    prose = re.sub(r"```.*?```", "", readme, flags=re.DOTALL)
    assert not re.search(r"(?<![\w/])#\d+", prose), "no issue numbers in user-facing text"
    assert not re.search(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", prose), "no commit hashes"


@pytest.mark.parametrize("archive", sorted(BENCHES))
def test_a_bench_page_is_what_its_archived_records_make(tmp_path, monkeypatch, archive):
    """Every table of the page is what `drive bench controllers --report-only` makes of the archived records
    (docs/controllers_runs/ARCHIVE: metrics, configs, closed-loop and OOD results, no weights)."""
    page, out_dir, rows = BENCHES[archive]
    report = (REPO / "docs" / page).read_text()
    assert f"--out {out_dir} --controllers {' '.join(rows)}" in " ".join(report.split())  # the command it shows
    monkeypatch.chdir(tmp_path)  # the records name their run directories relative to the working directory
    out = tmp_path / out_dir
    out.mkdir(parents=True)
    with tarfile.open(REPO / "docs" / "controllers_runs" / archive) as tar:
        tar.extractall(out, filter="data")
    argv = ["bench", "controllers", "--data", "runs/ref/data", "--out", out_dir, "--report-only", "--controllers",
            *rows]  # fmt: skip
    assert main(argv) == 0
    made = _sections((out / "results.md").read_text())
    assert len(made) >= 5 and all(len(t) >= 2 + len(rows) for t in made.values())
    for heading, table in made.items():
        assert heading in report and _table(report, heading) == table, heading


def test_the_misbehaviour_headline_is_what_its_archived_results_make():
    """docs/misbehaviour.md's three-seed table: every row is what `over_seeds` and `seeds_table` make of the per-
    checkpoint figures of the run's results.json (archived, xz: docs/misbehaviour_runs/), recomputed here."""
    from drive.studies.misbehaviour.seed_tables import seeds_table
    from drive.studies.misbehaviour.seeds import over_seeds

    with lzma.open(REPO / "docs" / "misbehaviour_runs" / "seeds3_results.json.xz") as f:
        results = json.load(f)
    shown = results.pop("over_seeds")
    results["over_seeds"] = over_seeds(results)
    assert json.dumps(results["over_seeds"], sort_keys=True) == json.dumps(shown, sort_keys=True)
    made = {line.replace("/seed*/best.pt", "") for line in seeds_table(results)}
    page = (REPO / "docs" / "misbehaviour.md").read_text()
    section = page[
        page.index("## Six controllers over three training seeds") : page.index(
            "![F3 per monitor and share prevented over three"
        )
    ]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 30 and not [r for r in rows if r not in made]
    assert "--out runs/mb/seeds3 --ckpt $B/{nsac,nsac-fit-0.1,gmle,mcd,de,der,sdenet}/seed{0,1,2}/best.pt" in page
    # the page's summary table: each "mean [low, high]" is the archived figure, rounded as shown
    columns = [("monitors", "epistemic_sum", "f3"), ("monitors", "epistemic_sum", "auroc"),
               ("monitors", "thirdeye_avg_grad", "f3"), ("prevention", "prevented"),
               ("prevention", "handed_over_nominal")]  # fmt: skip
    table = _table(page, "| controller | F3, own summed epistemic variance |")[2:]
    checked = 0
    for line in table:
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        entry = results["over_seeds"][f"runs/ref/bench/runs/demos/{cells[0]}/seed*/best.pt"]
        for text, where in zip(cells[1:], columns, strict=True):
            stat = entry[where[0]].get(where[1]) if len(where) == 2 else entry[where[0]].get(where[1], {}).get(where[2])
            if "[" in text:
                mean, low, high = (float(t) for t in text.replace("[", ",").strip(" ]").split(","))
                ulp = 0.5 * 10.0 ** -len(text.split("[")[0].strip().split(".")[1]) + 1e-12
                shown = {"mean": mean, "low": low, "high": high}
                assert all(abs(v - stat[k]) <= ulp for k, v in shown.items()), (line, text)
                assert 0 <= low <= mean <= high <= 1, (line, text)  # fractions: the interval stays in [0, 1]
                checked += 1
    assert checked >= 20


def test_the_readme_commands_parse():
    """Every `drive ...` line of the README (the pipeline, the shown commands) is a line the parser accepts."""
    text = (REPO / "README.md").read_text()
    lines = [w for line in re.findall(r"^drive .*$", text, flags=re.M) if (w := shlex.split(line, comments=True))]
    assert len(lines) >= 8
    for words in lines:
        found = cli._find_command(words[1:])
        assert found is not None, words
        module = importlib.import_module(cli.module_name(found[0]))
        cli._parse(module, found[1], "drive", "")


def _new_shell(tmp_path: Path) -> dict[str, str]:
    """The environment of a new terminal after the README's install: the checkout's .venv exists (here: a link to
    the one running the tests) but nothing is activated, so a bare `drive` is not on PATH."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the README's install makes a venv (.venv); these tests run outside one")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    venv_bin = str(Path(sys.prefix) / "bin")
    path = [d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if d and d != venv_bin]
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "CI")}
    return {**keep, "PATH": os.pathsep.join(path), "SDL_VIDEODRIVER": "dummy", "OMP_NUM_THREADS": "1"}


def _bash(lines: list[list[str]], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = "set -e\n" + "\n".join(shlex.join(words) for words in lines) + "\n"
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)


def test_a_bare_drive_is_not_on_path_in_a_new_shell(tmp_path):
    """What the pipeline's first line is for: without it, `drive` is not found after the README's install."""
    env = _new_shell(tmp_path)
    done = _bash([["drive", "--version"]], tmp_path, env)
    assert done.returncode == 127 and "drive: command not found" in done.stderr, done.stderr
    done = _bash([ACTIVATE, ["drive", "--version"]], tmp_path, env)
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(300)  # the whole pipeline (install check, collect, train, eval) twice: ~35 s alone
def test_readme_pipeline_runs_verbatim_in_a_new_shell(tmp_path):
    """The README's pipeline block, pasted into a new shell after the install (counts shrunk through the options it
    shows), runs to the end; rerun as typed, it finds its finished work."""
    env = _new_shell(tmp_path)
    lines = [words if words == ACTIVATE else shrink(words) for words in pipeline_lines()]
    done = _bash(lines, tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = tmp_path / "runs"
    assert json.loads((runs / "bc-nsac-d1" / "metrics.json").read_text())["task"] == "demos"
    results = json.loads((runs / "bc-nsac-d1" / "eval.json").read_text())
    assert results["seeds"] == [1000] and results["episodes"][0]["steps"] > 0
    table, _ = read_trace(runs / "bc-nsac-d1" / "traces" / "trace_seed001000.parquet")
    assert table.num_rows == results["episodes"][0]["steps"]
    assert len(read_video(runs / "bc-nsac-d1" / "seed_1000.mp4")) == table.num_rows
    assert (tmp_path / "out" / "drive.mp4").stat().st_size > 10_000  # `drive drive` headless
    assert len(json.loads((runs / "demos-d1" / "manifest.json").read_text())["episodes"]) == 4  # 3 + 1 DAgger
    best = (runs / "bc-nsac-d1" / "best.pt").read_bytes()
    again = _bash(lines[:6], tmp_path, env)  # rerun as typed: collect, dagger and train find their finished work
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nan" not in again.stdout and "Warning" not in again.stderr, (again.stdout, again.stderr)
    assert (runs / "bc-nsac-d1" / "best.pt").read_bytes() == best  # nothing retrained
    assert len(json.loads((runs / "demos-d1" / "manifest.json").read_text())["episodes"]) == 4
