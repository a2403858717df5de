"""`drive bench generalisation`: the suite's figures from hand-made eval results, and a tiny run end to end."""

from __future__ import annotations

import json
import math

import numpy as np

from drive.cli import main
from drive.studies.generalisation import suite as gen
from tests.conftest import REPO


def _episode(seed: int, ret: float, off: int, epi: float, handed: float = 0.0) -> dict:
    return {"seed": seed, "return": ret, "completion": 0.5, "off_track_events": off, "epistemic_var_steer": epi,
            "fallback_fraction": handed}  # fmt: skip


def test_a_gated_point_counts_the_failures_its_gate_kept_on_the_road():
    result = {"episodes": [_episode(0, 100, 0, 1e-4, 0.3), _episode(1, 50, 1, 1e-4, 0.1), _episode(2, 900, 0, 1e-5)],
              "episodes_no_fallback": [_episode(0, 20, 2, 1e-4), _episode(1, 30, 3, 1e-4), _episode(2, 900, 0, 1e-5)],
              "fallback": {"threshold": 2e-5}}  # fmt: skip
    point = gen.summarise(result, gated=True)
    assert point["failures_ungated"] == 2 and point["failures_prevented"] == 0.5  # seed 0 kept on, seed 1 not
    assert point["mean_return"] == 350 and math.isclose(point["std_return"], np.std([100, 50, 900]))
    assert math.isclose(point["handed_over"], 0.4 / 3) and point["off_track_per_episode"] == 1 / 3


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
    assert not (tmp_path / "g").exists()


def test_the_docs_tables_are_what_the_archived_run_makes():
    """docs/generalisation.md's tables are `tables` of the run's results.json (archived, xz), recomputed here."""
    import lzma

    results = json.loads(lzma.decompress((REPO / "docs" / "generalisation_runs" / "results.json.xz").read_bytes()))
    made = [line for line in gen.tables(results) if line.startswith("|")]
    page = (REPO / "docs" / "generalisation.md").read_text()
    shown = [line for line in page.splitlines() if line.startswith("|")]
    assert made == shown and len(made) > 20
    assert "drive bench generalisation --out runs/gen --seeds 9000-9019 --workers 2" in page
    assert results["suite"]["seeds"] == "9000-9019" and not any("/work/" in c for c in results["points"])
