"""`drive bench misbehaviour` end to end, tiny: a user's camera perturbation plugged in by spec, the field's table
and the prevention table written, and a benchmark killed half-way resumes to exactly the uninterrupted results."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drive.cli import main

ROOT = Path(__file__).resolve().parents[4]
NSAC = ROOT / "checkpoints" / "carracing_nsac.pt"
PLUGIN = '''
import numpy as np

def veil(frame, level, rng):
    """A user's perturbation: the camera fades to black as level goes to 1."""
    return (frame.astype(np.float64) * (1.0 - level)).astype(np.uint8)
'''
VOLATILE = {"seconds", "wall_s", "cpu_s", "ms_per_step", "cells_wall_s", "this_run", "latency_ms_p50", "latency_ms_p95"}

pytestmark = pytest.mark.skipif(not NSAC.exists(), reason="the shipped NSAC checkpoint is absent")


def _args(out: Path) -> list[str]:
    return ["bench", "misbehaviour", "--out", str(out), "--shifts", "userveil:veil:0.97",
            "--nominal-seeds", "7000-7001", "--seeds", "7100-7101", "--max-episode-steps", "150",
            "--bootstrap", "20", "--no-thirdeye", "--no-progress"]  # fmt: skip


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def test_a_plugged_in_shift_is_benchmarked_and_a_killed_run_resumes_to_the_same_results(tmp_path, monkeypatch):
    (tmp_path / "userveil.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    whole = tmp_path / "whole"
    assert main(_args(whole)) == 0
    results = json.loads((whole / "results.json").read_text())
    entry = results["controllers"][next(iter(results["controllers"]))]
    groups = entry["prediction"]["groups"]
    assert set(groups) >= {"held_out", "family:user:userveil:veil"} and "surrogate" not in groups
    held_out = groups["held_out"]
    assert held_out["misbehaviours"] > 0, "a camera faded to 3 % should put the car off the road"
    rows = held_out["monitors"]["epistemic_steer"]
    assert {(r["level"], r["ttm"]) for r in rows} == {(lv, t) for lv in results["plan"]["levels"] for t in (1, 2, 3)}
    for row in rows:
        assert (
            row["low"]["fpr"] <= row["value"]["fpr"] <= row["high"]["fpr"] or row["value"]["fpr"] != row["value"]["fpr"]
        )
    assert list(entry["fallbacks"]) == ["slow", "expert"]  # the headline mode first, the oracle bound after
    for mode in ("slow", "expert"):
        assert set(entry["fallbacks"][mode]["conditions"]) == {"nominal", "userveil:veil:0.97"}
    assert "| carracing_nsac.pt | slow | userveil:veil:0.97 |" in (whole / "results.md").read_text()
    assert "| carracing_nsac.pt | epistemic_steer |" in (whole / "results.md").read_text()

    # the same benchmark killed once its first cell is on disk, then rerun: the same results
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "drive", *_args(killed)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while not list(killed.glob("cells/*/*.npz")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list(killed.glob("cells/*/*.npz")))
    assert 1 <= done < 6 and not (killed / "results.json").exists(), done
    assert main(_args(killed)) == 0
    assert _stable(json.loads((killed / "results.json").read_text())) == _stable(results)


def test_every_default_condition_parses():
    """The benchmark's default conditions are valid specs (a level out of a family's range would stop the run)."""
    from drive.commands.bench.misbehaviour import DEFAULT_SHIFTS
    from drive.perturb.registry import parse_shift

    assert [str(parse_shift(spec)) for spec in DEFAULT_SHIFTS]


def test_a_group_without_a_misbehaviour_says_so_instead_of_an_empty_table():
    from drive.studies.misbehaviour.text import prediction_table

    results = {"plan": {"level": 0.999, "ttm": 2}, "controllers": {"a.pt": {"prediction": {"groups": {}}}}}
    assert prediction_table(results, "surrogate") == [
        "No misbehaviour in these families for any controller: nothing to predict."
    ]
    results["controllers"]["a.pt"]["prediction"] = {  # a controller that cannot drive: no nominal window
        "nominal_episodes": 0, "nominal_misbehaving": 20, "groups": {"held_out": {"misbehaviours": 9, "monitors": {}}}
    }  # fmt: skip
    assert "every nominal run misbehaved (20) | 9 |" in prediction_table(results, "held_out")[2]


def test_controllers_are_labelled_by_the_shortest_telling_part_of_their_path():
    from drive.studies.misbehaviour.text import labels

    paths = ["checkpoints/carracing_nsac.pt", "runs/b/de/seed0/best.pt", "runs/b/gmle/seed0/best.pt"]
    assert list(labels(paths).values()) == ["carracing_nsac.pt", "de/seed0/best.pt", "gmle/seed0/best.pt"]
    assert labels(["a/x.pt", "b/x.pt"]) == {"a/x.pt": "a/x.pt", "b/x.pt": "b/x.pt"}
    assert labels(["best.pt"]) == {"best.pt": "best.pt"}  # nothing more to show


def _controller(f3: float, prevented_with: int) -> dict:
    from drive.studies.misbehaviour.rows import Figures, Row

    figures = Figures(**{**dict.fromkeys(Figures._fields, math.nan), "recall": f3, "fpr": 0.01, "f3": f3, "auroc": 0.9})
    row = Row(0.999, 2, figures, figures, figures, 0, 0, 0, 0).to_dict()
    fallback = {"conditions": {
        "nominal": {"misbehaviours_without": 0, "misbehaviours_with": 0, "benign_episodes": 4,
                    "handed_over_benign": {"value": 0.02}, "interventions_per_km": {"value": 0.5},
                    "return_without": {"value": 500.0}, "return_with": {"value": 490.0}},
        "blur:4": {"misbehaviours_without": 10, "misbehaviours_with": prevented_with, "benign_episodes": 0,
                   "handed_over_benign": {"value": math.nan}, "interventions_per_km": {"value": 3.0},
                   "return_without": {"value": 300.0}, "return_with": {"value": 300.0 + 10 * (10 - prevented_with)}},
    }}  # fmt: skip
    return {"prediction": {"groups": {"held_out": {"conditions": ["blur:4"], "misbehaviours": 10,
                                                   "monitors": {"epistemic_steer": [row]}}}},
            "fallbacks": {"slow": fallback}}  # fmt: skip


def test_seeds_of_one_controller_become_a_mean_with_an_interval_and_differences_are_tested(tmp_path):
    from drive.studies.misbehaviour.seed_tables import seeds_table
    from drive.studies.misbehaviour.seeds import over_seeds, seed_groups

    assert seed_groups(["r/a/seed0/best.pt", "r/a/seed1/best.pt", "r/myseed1.pt", "r/b/seed0/best.pt"]) == {
        "r/a/seed*/best.pt": ["r/a/seed0/best.pt", "r/a/seed1/best.pt"]
    }  # one seed alone is not a group, and "myseed1" is not a seed part
    controllers = {f"r/a/seed{s}/best.pt": _controller(0.1 + 0.01 * s, 10) for s in range(3)}
    controllers |= {f"r/b/seed{s}/best.pt": _controller(0.9 + 0.01 * s, s) for s in range(3)}
    controllers["r/b/seed3/best.pt"] = {}  # its cells not run yet (--report-only): not a seed of the statistics
    results = {"plan": {"level": 0.999, "ttm": 2}, "controllers": controllers}
    out = over_seeds(results)
    a, b = out["r/a/seed*/best.pt"], out["r/b/seed*/best.pt"]
    assert b["not_run"] == ["r/b/seed3/best.pt"] and b["misbehaviours"] == [10, 10, 10]
    f3 = b["monitors"]["epistemic_steer"]["f3"]
    assert (
        f3["n"] == 3
        and f3["mean"] == pytest.approx(0.91)
        and (f3["low"], f3["high"]) == pytest.approx((0.90, 0.92))  # a bootstrap over 3 seeds: their range
    )
    assert f3["significant"] and "significant" not in a["monitors"]["epistemic_steer"]["f3"]  # a is the reference
    assert not b["monitors"]["epistemic_steer"]["auroc"]["significant"]  # equal on every seed: no test, no mark
    assert b["prevention"]["prevented"]["mean"] == pytest.approx(0.9) and a["prevention"]["prevented"]["mean"] == 0
    assert b["prevention"]["handed_over_nominal"]["mean"] == pytest.approx(0.02)
    assert b["prevention"]["return_gain"]["mean"] == pytest.approx(90.0) and a["prevention"]["return_gain"]["mean"] == 0
    assert b["prevention"]["return_gain"]["significant"] and b["prevention"]["return_gain"]["p_holm"] < 0.05
    results["over_seeds"] = out
    table = "\n".join(seeds_table(results))
    assert "| b/seed*/best.pt | 3 | 10, 10, 10 | epistemic_steer |" in table and "0.910 [0.900, 0.920] *" in table
    p = b["prevention"]["prevented"]["p_vs"]["r/a/seed*/best.pt"]
    assert p == a["prevention"]["prevented"]["p_vs"]["r/b/seed*/best.pt"] and p < 0.05  # every pair, both ways
    from drive.studies.misbehaviour.seed_tables import summary_table

    summary = summary_table({**results, "plan": {**results["plan"], "fallback": ["slow", "expert"]}})
    assert summary[0].startswith("| controller | seeds | return, nominal runs | return, shifted runs | scored")
    assert "episodes prevented, expert (oracle)" in summary[0] and len(summary) == 4  # header, rule, a, b
    assert all(line.count("|") == summary[0].count("|") for line in summary)
    assert "Welch's p, share of misbehaviours prevented" in table and f"| a/seed*/best.pt |  | {p:.3f} * |" in table
    from drive.studies.misbehaviour.figures import plot_seeds

    assert (
        plot_seeds(results, tmp_path / "seeds.png") == tmp_path / "seeds.png"
        and (tmp_path / "seeds.png").stat().st_size
    )
    assert plot_seeds({"over_seeds": {}}, tmp_path / "none.png") is None  # no seed groups: f3.png instead


def test_a_controller_that_misbehaves_on_every_nominal_run_gets_no_prevention_cells_and_stops_nothing(tmp_path):
    """DER at the reference budget leaves the road on every nominal track: no threshold can be fitted, so its
    prevention is reported as skipped (with the reason) while the other controllers' grid goes on."""
    import numpy as np

    from drive.studies.misbehaviour.cells import Cell, RunSettings, save_cell
    from drive.studies.misbehaviour.grid import Plan, run_plan
    from drive.studies.misbehaviour.text import prevention_table

    def record(seed: int) -> dict:
        return {"seed": seed, "return": 100.0, "events": [{"t": 120, "kind": "off_track"}],
                "signals": np.full((200, 4), 1e-3), "busy": np.arange(200) >= 120}  # fmt: skip

    plan = Plan(controllers=("runs/der.pt",), shifts=("blur:4",), nominal_seeds=(1, 2), seeds=(3, 4), n_boot=10)
    for condition, seeds in (("nominal", plan.nominal_seeds), ("blur:4", plan.seeds)):
        cell = Cell("runs/der.pt", condition, seeds)
        save_cell(tmp_path / "cells" / "runs_der.pt" / f"{condition.replace(':', '_')}.npz", cell,
                  [record(s) for s in seeds], 1.0)  # fmt: skip
    results = run_plan(tmp_path, plan, RunSettings(progress=False), run_missing=False)
    entry = results["controllers"]["runs/der.pt"]
    assert "fallbacks" not in entry
    assert "(1 of the 1 nominal runs it is fitted on misbehave)" in entry["fallback_skipped"]
    assert entry["prediction"]["nominal_misbehaving"] == 2
    assert "| der.pt | – | – | no prevention cells: too few nominal windows" in "\n".join(prevention_table(results))


def test_the_headline_level_and_ttm_are_scored_and_the_fields_rules_shown_beside_ours(tmp_path, capsys):
    """--level / --ttm outside the default grid are scored (not looked up and missed); a level of 1 is refused in
    one line; the default protocol keeps the field's rules' F3 and AUROC beside ours, --protocol field does not."""
    import numpy as np

    from drive.studies.misbehaviour.cells import Cell, RunSettings, save_cell
    from drive.studies.misbehaviour.grid import Plan, run_plan
    from drive.studies.misbehaviour.text import prediction_table

    assert main(["bench", "misbehaviour", "--out", str(tmp_path / "x"), "--level", "1"]) == 2
    assert "--level 1.0: a confidence level must be below 1" in capsys.readouterr().err
    rng = np.random.default_rng(0)

    def record(seed: int, shifted: bool) -> dict:
        signals = rng.gamma(2.0, 1.0, (500, 4))
        if shifted:
            signals[100:300] += np.linspace(0, 8, 200)[:, None]  # rises over the 4 s before the onset
        return {"seed": seed, "return": 1.0, "events": [{"t": 300, "kind": "off_track"}] if shifted else [],
                "signals": signals, "busy": np.arange(500) >= 300 if shifted else np.zeros(500, bool)}  # fmt: skip

    for protocol, beside in (("alike", True), ("field", False)):
        out = tmp_path / protocol
        plan = Plan(controllers=("runs/a.pt",), shifts=("blur:4",), nominal_seeds=tuple(range(6)),
                    seeds=tuple(range(10, 16)), fallback="off", level=0.97, ttm=4, n_boot=5,
                    protocol=protocol)  # fmt: skip
        assert plan.levels == (0.95, 0.97, 0.99, 0.999, 0.9999, 0.99999) and plan.ttms == (1, 2, 3, 4)
        for condition, seeds in (("nominal", plan.nominal_seeds), ("blur:4", plan.seeds)):
            save_cell(out / "cells" / "runs_a.pt" / f"{condition.replace(':', '_')}.npz", Cell("runs/a.pt", condition,
                      seeds), [record(s, condition != "nominal") for s in seeds], 1.0)  # fmt: skip
        results = run_plan(out, plan, RunSettings(progress=False), run_missing=False)
        table = results["controllers"]["runs/a.pt"]["prediction"]["groups"]["held_out"]
        rows = table["monitors"]["epistemic_steer"]
        assert any(r["level"] == 0.97 and r["ttm"] == 4 and r["value"]["tp"] + r["value"]["fn"] == 6 for r in rows)
        assert ("field" in table) == beside and results["protocol"]["scoring"] == protocol
        lines = prediction_table(results, "held_out")
        assert ("F3, field's rules" in lines[0]) == beside and lines[2].startswith("| a.pt | epistemic_steer | 6 (6) |")
        controls = table["nulls"]["epistemic_steer"]  # both null controls beside the monitor, at the headline
        assert controls["block_permuted"]["level"] == 0.97 and controls["information_free"]["ttm"] == 4
        assert set(controls["clears"]) == {"f3", "auroc"} and "clears its nulls" in lines[0]
        assert lines[2].count("|") == (14 if beside else 12)
        if beside:
            assert table["field"]["epistemic_steer"]["level"] == 0.97


def test_the_gate_reads_the_declared_monitor_fitted_on_half_the_nominal_seeds(tmp_path, monkeypatch):
    """One declared monitor (the summed epistemic variance by default) is the headline row and the gate's signal; the
    gate's threshold is fitted on every other nominal seed and its false alarms are driven on the others."""
    import numpy as np

    from drive.studies.misbehaviour import grid as misbehaviour
    from drive.studies.misbehaviour.cells import Cell, RunSettings, save_cell
    from drive.studies.misbehaviour.grid import Plan, run_plan
    from drive.studies.misbehaviour.report import nominal_threshold
    from drive.studies.misbehaviour.text import prediction_table

    rng = np.random.default_rng(3)

    def record(seed: int, shifted: bool) -> dict:
        signals = rng.gamma(2.0, 1.0, (400, 4)) * (1 + seed % 2)  # odd seeds score twice as high
        return {"seed": seed, "return": 1.0, "events": [{"t": 300, "kind": "off_track"}] if shifted else [],
                "signals": signals, "busy": np.arange(400) >= 300 if shifted else np.zeros(400, bool)}  # fmt: skip

    plan = Plan(controllers=("runs/a.pt",), shifts=("blur:4",), nominal_seeds=tuple(range(8)), seeds=(10, 11, 12),
                fallback="slow", n_boot=5, level=0.9)  # fmt: skip
    assert plan.fallback == ("slow",) and plan.calibration_seeds == (0, 2, 4, 6)
    assert plan.gate("slow") == "slow:signal=sum,variance=epistemic"
    cells = {}
    for condition, seeds in (("nominal", plan.nominal_seeds), ("blur:4", plan.seeds)):
        cells[condition] = [record(s, condition != "nominal") for s in seeds]
        save_cell(tmp_path / "cells" / "runs_a.pt" / f"{condition.replace(':', '_')}.npz",
                  Cell("runs/a.pt", condition, seeds), cells[condition], 1.0)  # fmt: skip
    asked: list[Cell] = []
    real = misbehaviour.cell_path
    monkeypatch.setattr(misbehaviour, "cell_path", lambda out, c: asked.append(c) or real(out, c))
    results = run_plan(tmp_path, plan, RunSettings(progress=False), run_missing=False)
    gate = results["controllers"]["runs/a.pt"]["fallbacks"]["slow"]
    nominal = {"episodes": cells["nominal"]}
    assert gate["signal"] == "epistemic_sum" and gate["calibrated_on"] == [0, 2, 4, 6]
    assert gate["threshold"] == nominal_threshold(nominal, 0.9, plan.protocol_config, "epistemic_sum", (0, 2, 4, 6))
    assert gate["threshold"] < nominal_threshold(nominal, 0.9, plan.protocol_config, "epistemic_sum")  # odd: higher
    gated = {c.condition: c for c in asked if c.fallback != "off"}
    assert gated["nominal"].seeds == (1, 3, 5, 7) and gated["blur:4"].seeds == plan.seeds
    assert {c.fallback for c in gated.values()} == {plan.gate("slow")}
    assert "**epistemic_sum** (declared)" in "\n".join(prediction_table(results, "held_out"))


def test_prevention_counts_a_stall_under_the_slow_gate_as_a_safe_stop_and_early_failures_apart():
    """Per episode, paired by seed: a stall that begins while the gate is engaged is the slow fallback stopping the
    car (a safe stop, not a misbehaviour); an episode whose first misbehaviour comes before its first scorable
    window is counted apart and left out of the per-episode share prevented."""
    from drive.studies.misbehaviour.report import prevention

    def ep(seed: int, events: list, interventions: list | None = None) -> dict:
        return {"seed": seed, "return": 100.0, "events": [{"kind": k, "t": t} for k, t in events], "tiles": 50,
                "n_interventions": len(interventions or []), "interventions": interventions or []}  # fmt: skip

    ungated = {"episodes": [ep(1, [("off_track", 400)]), ep(2, [("off_track", 500)]), ep(3, [("spin", 60)]),
                            ep(4, [])]}  # fmt: skip
    gated = {"episodes": [
        ep(1, [("stall", 380)], [{"start": 350, "end": None}]),  # stopped safely under the gate
        ep(2, [("off_track", 520)], [{"start": 300, "end": 320}]),  # engaged, released, then off the road
        ep(3, [("spin", 60)]),  # failed in its second second: before any scorable window at TTM 2
        ep(4, [("stall", 200)]),  # a stall without the gate: a misbehaviour the gate caused or missed
    ]}  # fmt: skip
    p = prevention(ungated, gated, n_boot=20, seed=0, early_steps=150)
    assert (p["misbehaviours_without"], p["misbehaviours_with"], p["safe_stops"]) == (3, 3, 1)
    assert p["prevented"]["value"] == 0.0
    assert (p["early_episodes"], p["misbehaving_episodes"]) == (1, 2)
    assert p["episodes_prevented"]["value"] == 0.5  # seed 1 of seeds 1 and 2
    assert p["benign_episodes"] == 1


def test_the_fallback_modes_are_checked_once_before_any_driving(capsys):
    from drive.cli import main
    from drive.studies.misbehaviour.grid import Plan

    plan = Plan(controllers=("a.pt",), shifts=(), nominal_seeds=(1,), seeds=(2,), fallback="off")
    assert plan.fallback == ()
    with pytest.raises(ValueError, match="fallback modes"):
        Plan(controllers=("a.pt",), shifts=(), nominal_seeds=(1,), seeds=(2,), fallback=("slow", "slow"))
    assert main(["bench", "misbehaviour", "--out", "x", "--fallback", "off", "slow"]) == 2
    assert "--fallback off slow: off alone, or slow and/or expert" in capsys.readouterr().err


def test_a_false_alarm_budget_sets_the_lowest_threshold_whose_replayed_gate_stays_within_it():
    """Nominal runs of 2.1 km each with three isolated spikes (heights 5, 7, 9) on a flat score of 1: a budget of
    1.5 hand-overs per km allows 6 engagements over 4.2 km, so every spike may engage (threshold just above the flat
    score); 0.5 per km allows 2 (the threshold at the two runs' height-7 spikes); a budget below any engagement
    puts it at the highest score, which no gate exceeds. Replayed with the gate's own hysteresis (2 steps above)."""
    import numpy as np

    from drive.loop.fallback import FallbackGate
    from drive.studies.misbehaviour.report import budget_threshold

    def run(seed: int) -> dict:
        score = np.ones(600)
        for start, height in ((100, 5.0), (300, 7.0), (500, 9.0)):
            score[start : start + 3] = height
        signals = np.zeros((600, 4))
        signals[:, 3] = score  # epistemic_sum is the fourth signal
        return {"seed": seed, "signals": signals, "busy": np.zeros(600, bool), "events": [],
                "tiles": 600}  # 2.1 km  # fmt: skip

    nominal = {"episodes": [run(0), run(1), run(2)]}
    assert budget_threshold(nominal, 1.5, seeds=(0, 1)) == 1.0  # 6 spikes allowed: every one engages above 1
    assert budget_threshold(nominal, 0.5, seeds=(0, 1)) == 7.0  # 2 allowed: only the 9s engage above 7
    assert budget_threshold(nominal, 0.01, seeds=(0, 1)) == 9.0  # none allowed
    gate = FallbackGate(7.0)
    for value in run(0)["signals"][:, 3]:
        gate.update(float(value))
    assert len(gate.interventions) == 1


def test_a_cell_driven_with_other_settings_is_refused_not_mixed_in(tmp_path):
    """A finished cell records what its episodes depend on (episode length, samples, seed, monitors); a rerun that
    asks for other values stops in one line instead of mixing cells of two settings in one table."""
    import numpy as np

    from drive.studies.misbehaviour.cells import Cell, RunSettings, cell_path, ensure_cell, save_cell

    cell = Cell("runs/a.pt", "nominal", (1,))
    record = {"seed": 1, "return": 1.0, "events": [], "signals": np.zeros((5, 4)), "busy": np.zeros(5, bool)}
    save_cell(cell_path(tmp_path, cell), cell, [record], 1.0, RunSettings(max_episode_steps=600, thirdeye=False))
    assert (
        ensure_cell(tmp_path, cell, RunSettings(max_episode_steps=600, thirdeye=False))["settings"]["max_episode_steps"]
        == 600
    )  # the same settings: the cell is read back, nothing driven
    with pytest.raises(ValueError, match=r"driven with other settings \(max_episode_steps=600\)"):
        ensure_cell(tmp_path, cell, RunSettings(max_episode_steps=750, thirdeye=False))
