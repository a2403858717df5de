"""`drive bench misbehaviour` records and monitors: a run's per-step records exported as Parquet, scored again with
`--from-records` to the same prediction rows, a user's `--monitor` scored through the same protocol, a hand-made
records file scored, and bad monitor specs refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drive.cli import main
from drive.loop.failures import SIGNALS
from drive.studies.misbehaviour.cells import Cell, RunSettings, cell_path, save_cell
from drive.studies.misbehaviour.grid import Plan, run_plan

HERE = "tests.drive.studies.misbehaviour.test_records"
CONTROLLER = "runs/a.pt"
SHIFTS = ("blur:4", "noise:0.2")  # a held-out family and a surrogate one
N = 500
ONSET = 300


# -- monitors a user would write (`--monitor tests.drive.studies.misbehaviour.test_records:NAME`) --------------------
def trailing(record):
    """The summed epistemic variance's trailing mean over 25 steps: causal."""
    x = record["epistemic_sum"]
    total = np.r_[0.0, np.cumsum(x, dtype=np.float64)]
    t = np.arange(len(x))
    low = np.maximum(t - 24, 0)
    return (total[t + 1] - total[low]) / (t + 1 - low)


def same(record):
    return record["epistemic_steer"]


def doubled(record):
    return 2.0 * record["my_score"]


def short(record):
    return np.zeros(3)


def nonfinite(record):
    out = np.zeros(len(record["step"]))
    out[7:] = np.nan
    return out


def peeks(record):
    """Sums the future: knowledge no runtime monitor has."""
    return np.cumsum(record["my_score"][::-1])[::-1]


# -- a benchmark's cells, made by hand ---------------------------------------------------------------------------------
def _record(rng: np.random.Generator, seed: int, misbehaves: bool) -> dict:
    signals = rng.gamma(2.0, 1.0, (N, len(SIGNALS))).astype(np.float32)
    events, busy = [], np.zeros(N, bool)
    if misbehaves:
        signals[100:ONSET] += np.linspace(0, 8, ONSET - 100, dtype=np.float32)[:, None]
        events = [{"t": ONSET, "kind": "off_track"}, {"t": ONSET, "kind": "spin"}, {"t": 420, "kind": "stall"}]
        busy[ONSET:360] = busy[420:] = True
    return {"seed": seed, "return": 1.0, "events": events, "signals": signals, "busy": busy,
            "monitor_scores": rng.gamma(2.0, 1.0, (N, 1)).astype(np.float32),
            "monitor_names": ["thirdeye_avg"]}  # fmt: skip


def _bench(out: Path, monitors: tuple[str, ...] = ()) -> tuple[Plan, dict]:
    """Hand-made cells (one nominal run misbehaves too) and the results of the benchmark over them."""
    rng = np.random.default_rng(0)
    plan = Plan(controllers=(CONTROLLER,), shifts=SHIFTS, nominal_seeds=tuple(range(6)), seeds=tuple(range(10, 16)),
                fallback="off", n_boot=5, monitors=monitors)  # fmt: skip
    for condition in ("nominal", *SHIFTS):
        seeds = plan.nominal_seeds if condition == "nominal" else plan.seeds
        cell = Cell(CONTROLLER, condition, seeds)
        episodes = [_record(rng, s, condition != "nominal" or s == 3) for s in seeds]
        save_cell(cell_path(out, cell), cell, episodes, 1.0)
    return plan, run_plan(out, plan, RunSettings(progress=False), run_missing=False)


def _canon(value) -> str:
    return json.dumps(value, sort_keys=True, default=float)


def test_a_run_exports_one_row_per_step_with_its_labels_and_every_monitors_score(tmp_path):
    _, results = _bench(tmp_path, (f"{HERE}:trailing",))
    path = tmp_path / "records" / "runs_a.pt.parquet"
    assert results["records"] == ["records/runs_a.pt.parquet"]  # relative to the out dir
    table = pq.read_table(path)
    monitors = [*SIGNALS, "thirdeye_avg", "user:trailing"]
    assert table.column_names == ["controller", "condition", "family", "group", "seed", "step", "nominal", "busy",
                                  "onset", "misbehaviour", *monitors]  # fmt: skip
    assert table.num_rows == 18 * N  # 6 nominal + 2 x 6 shifted episodes of N steps
    assert [table.schema.field(m).type for m in monitors] == [pa.float32()] * 5 + [pa.float64()]
    meta = json.loads(table.schema.metadata[b"drive"])
    assert meta == {"format": 1, "controller": CONTROLLER, "position": 0, "monitors": monitors}
    rows = table.to_pylist()
    assert {(r["condition"], r["family"], r["group"], r["nominal"]) for r in rows} == {
        ("nominal", "nominal", "nominal", True), ("blur:4", "blur", "held_out", False),
        ("noise:0.2", "noise", "surrogate", False)}  # fmt: skip
    episode = [r for r in rows if r["condition"] == "blur:4" and r["seed"] == 12]
    assert [r["step"] for r in episode] == list(range(N))
    assert [r["step"] for r in episode if r["onset"]] == [ONSET, 420]
    assert episode[ONSET]["misbehaviour"] == "off_track+spin" and episode[420]["misbehaviour"] == "stall"
    assert [r["step"] for r in episode if r["busy"]] == [*range(ONSET, 360), *range(420, N)]
    nominal = [r for r in rows if r["condition"] == "nominal"]
    assert sum(r["onset"] for r in nominal) == 2 and sum(r["busy"] for r in nominal) == 60 + 80  # seed 3 misbehaves
    cells = pq.read_table(path, filters=[("condition", "=", "blur:4"), ("seed", "=", 12)])
    assert cells.column("user:trailing").to_numpy()[:25] == pytest.approx(
        np.cumsum(cells.column("epistemic_sum").to_numpy()[:25]) / np.arange(1, 26), rel=1e-6
    )


def test_scoring_the_records_gives_the_same_prediction_as_the_run_that_wrote_them(tmp_path, capsys):
    monitors = (f"{HERE}:trailing", f"{HERE}:same")
    _, results = _bench(tmp_path / "run", monitors)
    flags = [f for m in monitors for f in ("--monitor", m)]
    args = ["bench", "misbehaviour", "--out", str(tmp_path / "again"), "--bootstrap", "5", "--fallback", "off",
            "--no-progress", "--from-records", str(tmp_path / "run")]  # fmt: skip
    assert main([*args, *flags]) == 0
    assert "prevention skipped" in capsys.readouterr().out
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["plan"]["nominal_seeds"] == list(range(6)) and again["plan"]["shifts"] == list(SHIFTS)
    before, after = results["controllers"][CONTROLLER], again["controllers"][CONTROLLER]
    assert _canon(after["prediction"]) == _canon(before["prediction"])
    assert "scored from records" in after["fallback_skipped"]
    assert "scored from records" in (tmp_path / "again" / "results.md").read_text()

    # the user's monitors are rows of the same tables, through the same protocol and null controls
    held_out = before["prediction"]["groups"]["held_out"]
    assert list(held_out["monitors"]) == [*SIGNALS, "thirdeye_avg", "user:trailing", "user:same"]
    assert len(held_out["monitors"]["user:trailing"]) == len(held_out["monitors"]["epistemic_steer"])
    assert _canon(held_out["monitors"]["user:same"]) == _canon(held_out["monitors"]["epistemic_steer"])
    assert _canon(held_out["nulls"]["user:same"]) == _canon(held_out["nulls"]["epistemic_steer"])
    assert held_out["misbehaviours"] == 12 and before["prediction"]["nominal_misbehaving"] == 1
    assert main([*args[:-1], str(tmp_path / "run" / "records"), *flags]) == 0  # the records folder itself
    assert _canon(json.loads((tmp_path / "again" / "results.json").read_text())["controllers"]) == _canon(
        again["controllers"]
    )


def _hand_made(folder: Path) -> Path:
    """Records as another lab would share them: the required columns and one score, no controller or family."""
    rng = np.random.default_rng(1)
    columns: dict[str, list] = {k: [] for k in ("condition", "seed", "step", "busy", "onset", "my_score")}
    for condition, seeds in (("nominal", range(6)), ("blur:4", range(10, 16))):
        for seed in seeds:
            score = rng.gamma(2.0, 1.0, N)
            busy, onset = np.zeros(N, bool), np.zeros(N, bool)
            if condition != "nominal":
                score[100:ONSET] += np.linspace(0, 8, ONSET - 100)
                busy[ONSET:], onset[ONSET] = True, True
            for key, value in (("condition", [condition] * N), ("seed", [seed] * N), ("step", range(N)),
                               ("busy", busy), ("onset", onset), ("my_score", score)):  # fmt: skip
                columns[key].extend(value)
    folder.mkdir(parents=True)
    pq.write_table(pa.table(columns), folder / "field_lab.parquet")
    return folder


def test_a_hand_made_records_file_is_scored_with_a_users_monitor(tmp_path, capsys):
    folder = _hand_made(tmp_path / "shared")
    out = tmp_path / "out"
    assert main(["bench", "misbehaviour", "--out", str(out), "--from-records", str(folder), "--bootstrap", "5",
                 "--no-progress", "--monitor", f"{HERE}:doubled"]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    entry = results["controllers"]["field_lab"]  # no controller column: the file's name
    held_out = entry["prediction"]["groups"]["held_out"]
    assert held_out["conditions"] == ["blur:4"] and held_out["misbehaviours"] == 6
    assert list(held_out["monitors"]) == ["my_score", "user:doubled"]
    row = next(r for r in held_out["monitors"]["my_score"] if r["level"] == 0.999 and r["ttm"] == 2)
    assert row["value"]["tp"] + row["value"]["fn"] == 6 and row["value"]["auroc"] > 0.9  # the score rises before it
    scaled = held_out["monitors"]["user:doubled"]
    assert [r["value"]["auroc"] for r in scaled] == [r["value"]["auroc"] for r in held_out["monitors"]["my_score"]]
    assert "field_lab | my_score |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nocolon", "expected module:function"),
        ("no_such_module_for_drive:fn", "cannot import module 'no_such_module_for_drive' (ModuleNotFoundError"),
        (f"{HERE}:missing", f"module '{HERE}' has no function 'missing'"),
        (f"{HERE}:short", "returned shape (3,) for an episode of 500 steps"),
        (f"{HERE}:nonfinite", "score nan at step 7; scores must be finite"),
        (f"{HERE}:peeks", "changes when steps 250.. are withheld; a monitor's score at step t may use steps <= t only"),
    ],
)
def test_a_bad_monitor_is_refused_in_one_line_naming_it(tmp_path, capsys, spec, says):
    folder = _hand_made(tmp_path / "shared")
    args = ["bench", "misbehaviour", "--out", str(tmp_path / "out"), "--from-records", str(folder), "--monitor", spec]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"drive bench misbehaviour: error: --monitor {spec!r}: ") and "\n" not in err
    assert says in err


def test_records_that_are_not_there_or_lack_a_column_are_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    base = ["bench", "misbehaviour", "--out", str(tmp_path / "out"), "--from-records"]
    assert main([*base, str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no records there (expected" in err and "records/*.parquet" in err and "\n" not in err
    (tmp_path / "bad").mkdir()
    pq.write_table(pa.table({"condition": ["nominal"], "seed": [0], "step": [0], "score": [1.0]}),
                   tmp_path / "bad" / "x.parquet")  # fmt: skip
    assert main([*base, str(tmp_path / "bad")]) == 2
    assert "records lack column(s) ['busy', 'onset']" in capsys.readouterr().err
