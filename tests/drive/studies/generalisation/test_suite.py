"""`drive bench generalisation`: the suite's figures from hand-made eval results, and a tiny run end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from drive.cli import main
from drive.studies.generalisation import suite as gen
from tests.conftest import REPO


def _episode(
    seed: int,
    ret: float,
    off: int,
    epi: float,
    handed: float = 0.0,
    first_off: int = -1,
    starts: tuple[int, ...] = (),
    steps: int = 1000,
) -> dict:
    return {"seed": seed, "return": ret, "completion": 0.5, "off_track_events": off, "epistemic_var_steer": epi,
            "fallback_fraction": handed, "first_off_track": first_off, "steps": steps,
            "interventions": [{"start": t, "end": t + 10, "peak_score": 1.0} for t in starts]}  # fmt: skip


def test_a_gated_point_counts_the_failures_its_gate_kept_on_the_road_and_those_it_engaged_before():
    gated = [_episode(0, 100, 0, 1e-4, 0.3, starts=(40,)), _episode(1, 50, 1, 1e-4, 0.1, 300, starts=(350,)),
             _episode(2, 900, 0, 1e-5)]  # fmt: skip
    twins = [_episode(0, 20, 2, 1e-4, first_off=50), _episode(1, 30, 3, 1e-4, first_off=200),
             _episode(2, 900, 0, 1e-5)]  # fmt: skip
    point = gen.summarise({"episodes": gated, "fallback": {"threshold": 2e-5}}, twins)
    assert point["failures_ungated"] == 2 and point["failures_prevented"] == 0.5  # seed 0 kept on, seed 1 not
    assert point["mean_return"] == 350 and math.isclose(point["std_return"], np.std([100, 50, 900]))
    assert math.isclose(point["handed_over"], 0.4 / 3) and point["off_track_per_episode"] == 1 / 3
    before = point["engaged_before"]  # seed 0's gate engaged at 40, before its twin left at 50; seed 1's at 350 > 200
    assert before["misbehaviours"] == 2 and before["engaged"] == 1 and before["share"] == 0.5
    rate = 2 / 3000  # two engagements in 3000 steps: a gate firing at random at that rate
    assert math.isclose(before["null"], ((1 - (1 - rate) ** 51) + (1 - (1 - rate) ** 201)) / 2)
    assert point["raw"] == gated and "engaged_before" not in gen.summarise({"episodes": twins})


def test_the_engaged_before_null_of_a_gate_that_fires_everywhere_is_one_and_of_a_silent_one_zero():
    twins = {s: _episode(s, 0, 1, 0, first_off=100) for s in range(4)}
    always = [_episode(s, 0, 0, 0, starts=tuple(range(0, 1000, 2))) for s in range(4)]
    never = [_episode(s, 0, 1, 0) for s in range(4)]
    assert gen.engaged_before(always, twins) == {"misbehaviours": 4, "engaged": 4, "share": 1.0,
                                                 "null": pytest.approx(1.0)}  # fmt: skip
    assert gen.engaged_before(never, twins) == {"misbehaviours": 4, "engaged": 0, "share": 0.0, "null": 0.0}


def test_the_signal_is_the_per_episode_epistemic_mean_against_the_clean_runs():
    clean = [1.0 + k / 10 for k in range(10)]  # 1.0 .. 1.9, mean 1.45
    grid = {"clean": {"off": {"epistemic": clean}},
            "carracing:noise": {"off": {"epistemic": [3 * v for v in clean]}},
            "carracing:bar": {"off": {"epistemic": clean}}}  # fmt: skip
    noise, bar = gen.signal(grid, "carracing:noise"), gen.signal(grid, "carracing:bar")
    assert noise["auroc"] == 1.0 and math.isclose(noise["ratio"], 3.0)  # it knows it is lost under noise
    assert bar["auroc"] == 0.5 and bar["ratio"] == 1.0  # and not under the bars
    assert noise["clears"] and not bar["clears"] and bar["null"][0] < 0.5 < bar["null"][1]


def test_a_score_without_information_stays_inside_its_null():
    """The null the signal table prints beside each AUROC: the same episodes with their labels shuffled. Scores drawn
    alike for clean and variant episodes clear it about as often as its 5 % says, and far less than a real shift."""
    rng = np.random.default_rng(1)
    cleared = [gen.signal({"clean": {"off": {"epistemic": rng.gamma(2, 1, 20).tolist()}},
                           "v": {"off": {"epistemic": rng.gamma(2, 1, 20).tolist()}}}, "v", 200)["clears"]
               for _ in range(60)]  # fmt: skip
    assert sum(cleared) <= 8  # one-sided 2.5 % per draw: ~1.5 of 60 expected


def test_a_tiny_run_writes_the_leaderboard_beside_the_published_rows(tmp_path, capsys):
    out = tmp_path / "gen"
    argv = ["bench", "generalisation", "--out", str(out), "--ckpt", str(REPO / "checkpoints" / "carracing_nsac.pt"),
            "--variants", "carracing:bar", "carracing:noise", "--gates", "slow", "--seeds", "1000",
            "--max-episode-steps", "30"]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    (point,) = results["points"].values()
    assert set(point) == {"clean", "carracing:bar", "carracing:noise"} and set(point["clean"]) == {"off", "slow"}
    text = (out / "results.md").read_text()
    assert "| AttentionAgent (published: v0, RL / evolution from pixels) | 914 ± 15 | 900 ± 35 | -58 ± 12 |" in text
    assert "carracing_nsac.pt, ungated (ours: v3, cloned) |" in text and "carracing_nsac.pt, gate slow" in text
    assert (out / "variants.png").stat().st_size > 1000 and len(list((out / "points").glob("*.json"))) == 6
    capsys.readouterr()
    assert main(argv) == 0  # rerun: every point read back, the same tables
    assert (out / "results.md").read_text() == text


def test_bad_variants_and_gates_are_one_line_errors(tmp_path, capsys):
    base = ["bench", "generalisation", "--out", str(tmp_path / "g")]
    assert main([*base, "--variants", "blur:2"]) == 2
    assert "not a CarRacingExtension variant" in capsys.readouterr().err
    assert main([*base, "--gates", "off"]) == 2
    assert "--gates 'off'" in capsys.readouterr().err
    assert main([*base, "--calibrate-seeds", "x"]) == 2
    assert "--calibrate-seeds: bad seed spec" in capsys.readouterr().err
    assert main([*base, "--report-only"]) == 2
    assert "--report-only:" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()


def test_the_docs_tables_are_what_the_archived_run_makes():
    """docs/generalisation.md's tables are `tables` of the run's results.json (archived, xz, without the raw
    episodes), recomputed here; the run is every controller over five training seeds, 100 episodes per variant."""
    import lzma

    from drive.studies.generalisation.tables import tables

    results = json.loads(lzma.decompress((REPO / "docs" / "generalisation_runs" / "results.json.xz").read_bytes()))
    made = [line for line in tables(results) if line.startswith("|")]
    page = (REPO / "docs" / "generalisation.md").read_text()
    shown = [line for line in page.splitlines() if line.startswith("|")]
    assert made == shown and len(made) > 40
    assert "--seeds 9000-9019 --calibrate-seeds 2000-2002 --workers 2" in page
    assert results["suite"]["seeds"] == "9000-9019" and not any(c.startswith("/") for c in results["points"])
    groups = gen.groups(results["suite"]["controllers"])
    assert sum(len(m) == 5 for m in groups.values()) >= 7  # seven controllers over five training seeds
    ungated = [p["clean"]["off"]["episodes"] for p in results["points"].values()]
    assert len(ungated) == 36 and set(ungated) == {20}  # 5 seeds x 20 tracks: the leaderboard's 100 per variant


def test_points_run_gate_by_gate_pair_their_twins_and_skip_a_gate_that_cannot_fire(tmp_path, monkeypatch):
    """Ungated points of every controller first; a gated point drives only its gated episodes and takes the ungated
    point's as twins; a controller whose gate could never fire (GMLE) gets no gated point, thresholds.json says why
    and the tables say so; a rerun drives nothing; --report-only on a half-finished run shows what is there."""
    from drive.errors import UserError
    from drive.loop import evaluate as evaluate_module
    from drive.loop import thresholds
    from drive.studies.generalisation import figures
    from drive.studies.generalisation.tables import tables

    calls = []

    def fake_evaluate(opts):
        calls.append((opts.policy, opts.perturb, opts.fallback, opts.fallback_twin, opts.fallback_threshold))
        gated = opts.fallback != "off"
        return {"episodes": [_episode(s, 900 - 400 * gated, int(not gated), 1e-4 * (1 + s), first_off=5,
                                      starts=(3,) * gated) for s in (0, 1)], "wall_s": 1.0}  # fmt: skip

    def fake_threshold(path, fb, threshold, seeds, samples, seed, env):
        if "gmle" in str(path):
            raise UserError(f"{path}: controller gmle has no epistemic variance")
        return 1e-4, f"calibrated on seeds {list(seeds)}"

    monkeypatch.setattr(evaluate_module, "evaluate", fake_evaluate)
    monkeypatch.setattr(thresholds, "resolve_threshold", fake_threshold)
    controllers = ("runs/a/nsac/seed0/best.pt", "runs/a/nsac/seed1/best.pt", "runs/a/gmle/seed0/best.pt")
    suite = gen.Suite(controllers=controllers, variants=("clean", "carracing:noise"), gates=("slow",), seeds="0-1")
    results = gen.run(tmp_path, suite)
    assert [c[2] for c in calls] == ["off"] * 6 + ["slow"] * 4  # every ungated point before any gated one
    assert all(c[3] is False and c[4] == 1e-4 for c in calls if c[2] == "slow")
    assert set(results["points"]["runs/a/gmle/seed0/best.pt"]["clean"]) == {"off"}
    why = json.loads((tmp_path / "thresholds.json").read_text())
    assert [v["threshold"] for v in why.values()] == [1e-4, 1e-4, None] and "no epistemic" in str(why)
    point = results["points"]["runs/a/nsac/seed1/best.pt"]["carracing:noise"]["slow"]
    assert point["failures_ungated"] == 2 and point["engaged_before"]["share"] == 1.0  # engaged at 3, left at 5
    text = "\n".join(tables(results))
    assert text.startswith("10 of 10 points driven\n") and "no epistemic variance" in text
    assert "| nsac (2 seeds), ungated (ours: v3, cloned) | 900 ± 0 | 900 ± 0 |" in text
    assert "| nsac (2 seeds), gate slow | 4 of 4 (100%; null" in text
    assert (
        "| gmle | 900 < 914 ✗; ≥ 850 ✓ | 900 ≥ -58 ✓; ≥ 850 ✓ |" in text
        and "- gmle: no gate (1 of 1 checkpoints): controller" in text
    )
    assert figures.returns_figure(tmp_path / "returns.png", results).stat().st_size > 10_000
    calls.clear()
    assert gen.run(tmp_path, suite) == results and calls == []  # resumed: nothing driven again
    (tmp_path / "points" / "1_seed1__noise__slow.json").unlink()
    partial = gen.run(tmp_path, suite, drive=False)
    assert calls == [] and "9 of 10 points driven (the run is not finished)" in "\n".join(tables(partial))
