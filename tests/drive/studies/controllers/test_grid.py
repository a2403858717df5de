"""`drive bench controllers`, tiny: two rows x two seeds on a few short CarRacing episodes, trained, driven clean and
under a shift, scored for OOD detection, and tabled with intervals over seeds; a rerun trains and drives nothing."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from drive.cli import main
from drive.studies.over_seeds import interval, welch


def test_interval_is_a_bootstrap_over_the_finite_values_and_welch_matches_scipy():
    out = interval([1.0, 2.0, 3.0, float("nan")])
    assert out["n"] == 3 and out["mean"] == 2.0 and out["sd"] == 1.0 and out["values"] == [1.0, 2.0, 3.0]
    assert 1.0 <= out["low"] < 2.0 < out["high"] <= 3.0  # tests/drive/studies/test_over_seeds.py has the rest
    assert interval([5.0])["low"] is None and interval([])["mean"] is None
    p = welch([1.0, 2.0, 3.0], [4.0, 5.0, 7.0])
    assert p == pytest.approx(stats.ttest_ind([1, 2, 3], [4, 5, 7], equal_var=False).pvalue)
    assert welch([1.0, 1.0], [1.0, 1.0]) is None and welch([1.0], [2.0, 3.0]) is None


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "demos"
    code = main(["collect", "--expert", "pursuit", "--seeds", "0-5", "--out", str(out), "--max-episode-steps", "80",
                 "--action-noise", "0.15", "--min-return", "-1000", "--no-progress"])  # fmt: skip
    assert code == 0
    return out


def test_two_rows_two_seeds_are_trained_driven_scored_and_tabled(demos, tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "controllers", "--data", str(demos), "--out", str(out), "--controllers", "nsac", "gmle",
            "--seeds", "2", "--epochs", "1", "--eval-seeds", "1000", "--max-episode-steps", "60",
            "--shifts", "noise:0.2", "--ood", "blur:2,noise:0.1", "--ood-episodes", "1", "--no-progress",
            "--set", "task.stride=8", "encoder.d_model=16", "n_heads=2", "task.val_fraction=0.2",
            "task.test_fraction=0.2"]  # fmt: skip
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["rows"]) == ["nsac", "gmle", "expert (pursuit)"] and results["reference"] == "nsac"
    expert = json.loads((out / "expert_clean.json").read_text())  # the labelling expert, same tracks, one run
    assert results["rows"]["expert (pursuit)"]["clean return"]["mean"] == expert["mean_return"]
    assert results["ood"] == {"held_out": ["blur:2"], "surrogate": ["noise:0.1"]}
    gmle, nsac = results["rows"]["gmle"], results["rows"]["nsac"]
    for key in ("test mse", "clean return", "noise:0.2 return", "noise:0.2 retained", "ood blur:2",
                "ood held-out mean", "ood noise:0.1", "train s"):  # fmt: skip
        assert gmle[key]["n"] == 2 and nsac[key]["n"] == 2, key
        assert "p_vs_reference" in gmle[key] and "p_vs_reference" not in nsac[key], key
    one = json.loads((out / "runs/demos/gmle/seed1/closed_loop/noise_0.2.json").read_text())
    assert one["perturb"] == "noise:0.2" and one["seeds"] == [1000] and one["episodes"][0]["steps"] == 60
    clean = json.loads((out / "runs/demos/gmle/seed1/closed_loop/clean.json").read_text())
    assert gmle["noise:0.2 retained"]["values"][1] == pytest.approx(one["mean_return"] / clean["mean_return"])
    text = (out / "results.md").read_text()
    assert "## Headline" in text and "## Closed loop under `noise:0.2`" in text
    assert "blur:2" in text and "(NSAC's surrogate)" in text
    assert "--controller gmle --seed 0" in text and (out / "returns.png").stat().st_size > 0
    costs = json.loads((out / "budget.json").read_text())["rows"]  # what each run took, a curve per row
    assert [r["seed"] for r in costs["gmle"]["runs"]] == [0, 1] and costs["nsac"]["runs"][1]["gradient_steps"] > 0
    assert (out / "curves" / "nsac.png").stat().st_size > 0 and "| nsac | 2 |" in (out / "budget.md").read_text()
    # a rerun finds everything done: nothing is trained or driven again, the results are the same
    made = [p for p in out.rglob("*.json") if "closed_loop" in p.parts or p.parent.name in ("ood", "seed0", "seed1")]
    stamps = {p: p.stat().st_mtime_ns for p in made}
    assert main(args) == 0
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    again = json.loads((out / "results.json").read_text())
    assert again["rows"] == results["rows"]
    # a row added later: trained, driven, and scored with its seed's rows (their OOD figures drawn the same again)
    grown = [*args[:7], "mcd", *args[7:]]
    assert main(grown) == 0
    more = json.loads((out / "results.json").read_text())
    assert more["rows"]["mcd"]["ood blur:2"]["n"] == 2 and more["rows"]["mcd"]["clean return"]["n"] == 2
    for key in ("ood blur:2", "ood noise:0.1", "clean return"):
        assert more["rows"]["gmle"][key]["values"] == results["rows"]["gmle"][key]["values"], key


def test_bad_inputs_stop_in_one_line_before_any_work(tmp_path, capsys):
    assert main(["bench", "controllers", "--data", str(tmp_path), "--out", str(tmp_path / "b")]) == 2
    assert "not a dataset" in capsys.readouterr().err
    demos_dir = tmp_path / "d"
    demos_dir.mkdir()
    (demos_dir / "manifest.json").write_text("{}")
    base = ["bench", "controllers", "--data", str(demos_dir), "--out", str(tmp_path / "b")]
    assert main([*base, "--ood", "hue:abc"]) == 2 and "--ood: " in capsys.readouterr().err
    assert main([*base, "--report-only"]) == 2 and "no finished training run" in capsys.readouterr().err
    assert not (tmp_path / "b" / "results.md").exists()


def test_the_loss_ablation_rows_run_only_when_named(tmp_path):
    from drive.studies.offline import grid as offline

    every = offline.make_grid("demos", data="d", out=tmp_path)
    assert every.rows == ("nsac", "gmle", "mcd", "de", "der", "sdenet", "nsac-fit")
    named = offline.make_grid("demos", data="d", out=tmp_path, controllers=("nsac-paper-batch-heads", "nsac-noreg"))
    first = [c for c in offline.cells(named) if c.seed == 0]
    assert [c.controller for c in first] == ["nsac", "nsac"]
    assert "reg_form=paper reg_pairs=false ood_at=heads" in first[0].command and "reg_weight=0" in first[1].command
    both = offline.make_grid("demos", data="d", out=tmp_path, controllers=("all", "nsac-fit-0.3", "gmle"))
    assert both.rows == (*every.rows, "nsac-fit-0.3")  # `all` and named rows together, each once
    fit = next(c for c in offline.cells(both) if c.row == "nsac-fit-0.3")
    assert "backbone_units=8 ood_fit=0.3" in fit.command
