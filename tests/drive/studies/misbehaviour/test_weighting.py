"""Pooling over families, each family weighted equally (drive/studies/misbehaviour/protocol.py): with one family the
figures are the unweighted ones to the last digit; a small family weighs as much as a large one; a score without
information stays at its null levels whatever the families' sizes; the bootstrap keeps the weights; the records
path gives the run's figures."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from drive import metrics
from drive.cli import main
from drive.studies.misbehaviour.cells import Cell, RunSettings, cell_path, save_cell
from drive.studies.misbehaviour.grid import Plan, run_plan
from drive.studies.misbehaviour.nulls import with_nulls
from drive.studies.misbehaviour.protocol import (
    FIELD,
    Episode,
    ProtocolConfig,
    evaluate,
    family_weights,
    weighted_median,
)
from drive.studies.misbehaviour.text import family_table, headline, prediction_table
from tests.drive.studies.misbehaviour.test_protocol import _noise_episodes
from tests.drive.studies.misbehaviour.test_records import _canon, _record

QUANTILE = ProtocolConfig(threshold_fit="quantile")  # no optimiser: the figures are exact arithmetic


def _golden_episodes() -> list[Episode]:
    """6 nominal and 9 shifted runs, scores rounded to 0.1 (ties), a ramp of growing height before the onset, a
    second onset on every third run."""
    rng = np.random.default_rng(48)
    out = [Episode(np.round(rng.gamma(2.0, 1.0, 300), 1), nominal=True) for _ in range(6)]
    for k in range(9):
        s = np.round(rng.gamma(2.0, 1.0, 400), 1)
        s[200:300] += k * np.linspace(0.0, 1.0, 100)
        busy = np.zeros(400, bool)
        busy[300:320] = True
        out.append(Episode(s, (300,) if k % 3 else (300, 350), busy=busy))
    return out


def _digest(rows) -> str:
    text = repr([(r.level, r.ttm, *(float(x) for f in (r.value, r.low, r.high) for x in f)) for r in rows])
    return hashlib.sha256(text.encode()).hexdigest()


# What the protocol gave before families were weighted (one stratum, no weights), on _golden_episodes, QUANTILE,
# levels (0.9, 0.99), TTMs (1, 2), 40 replicates, seed 7: level 0.9, TTM 1 in full, every row by its digest.
BEFORE_VALUE = (8.7, 5.0, 4.0, 5.0, 25.0, 0.5, 0.5555555555555556, 0.16666666666666666, 0.7692307692307693,
                0.5263157894736842, 0.5494505494505495, 0.7444444444444445, 0.659861621599638, 1.04)  # fmt: skip
BEFORE_LOW = (8.5, 2.4875000000000003, 1.0, 2.0, 22.950000000000003, 0.3333333333333333, 0.27638888888888896,
              0.06666666666666667, 0.6913461538461538, 0.3321428571428572, 0.2909016727866177, 0.5787962962962964,
              0.5371545151040766, 0.24575000000000014)  # fmt: skip
BEFORE_HIGH = (9.522499999999999, 8.0, 6.512499999999999, 7.049999999999997, 28.0, 0.7506944444444444,
               0.8888888888888888, 0.2349999999999999, 0.8724358974358974, 0.7285353535353535, 0.851063829787234,
               0.9483333333333334, 0.9028692237128769, 1.9044999999999996)  # fmt: skip
BEFORE_DIGEST = "66c2fa9e5098ae86f1009d237caca11477cc699e1175f60699d06ebbdb0bdef0"


def test_with_one_family_the_figures_are_the_unweighted_ones_to_the_last_digit():
    episodes = _golden_episodes()
    args = {"levels": (0.9, 0.99), "ttms": (1, 2), "n_boot": 40, "seed": 7}
    rows = evaluate(episodes, QUANTILE, **args)
    first = rows[0]
    assert (first.level, first.ttm) == (0.9, 1)
    assert tuple(map(float, first.value)) == BEFORE_VALUE
    assert tuple(map(float, first.low)) == BEFORE_LOW and tuple(map(float, first.high)) == BEFORE_HIGH
    assert _digest(rows) == BEFORE_DIGEST
    one = [e if e.nominal else replace(e, family="fog") for e in episodes]
    assert evaluate(one, QUANTILE, **args) == rows  # a named family: weight 1 each
    assert evaluate(one, replace(QUANTILE, pooling="episodes"), **args) == rows
    assert (family_weights([e for e in one if not e.nominal]) == 1.0).all()


def test_the_weighted_rank_statistics_are_the_unweighted_ones_with_equal_weights():
    rng = np.random.default_rng(0)
    negative, positive = np.round(rng.normal(0, 1, 301), 1), np.round(rng.normal(0.5, 1, 97), 1)  # ties
    ones = np.ones(len(positive))
    assert metrics.weighted_auroc(negative, positive, ones) == metrics.auroc(negative, positive)
    assert metrics.average_precision(positive, negative, ones) == metrics.average_precision(positive, negative)
    w = rng.uniform(0.1, 3.0, len(positive))  # against the weighted Mann-Whitney by pairs
    pairs = (positive[:, None] > negative[None]) + 0.5 * (positive[:, None] == negative[None])
    assert metrics.weighted_auroc(negative, positive, w) == pytest.approx((w @ pairs).sum() / (w.sum() * len(negative)))
    # integer weights: the same as repeating each positive that many times
    k = rng.integers(1, 4, len(positive))
    repeated = np.repeat(positive, k)
    assert metrics.weighted_auroc(negative, positive, k) == pytest.approx(metrics.auroc(negative, repeated))
    assert metrics.average_precision(positive, negative, k) == pytest.approx(
        metrics.average_precision(repeated, negative)
    )
    for n in (1, 2, 7, 8):
        x = rng.integers(0, 50, n)
        assert weighted_median(x, np.ones(n)) == np.median(x)
    assert weighted_median([1, 2, 3], [1, 1, 5]) == 3 and weighted_median(np.repeat([1, 2, 3], [1, 1, 5]), [1] * 7) == 3


def _two_families(rng: np.random.Generator, small: int = 5, large: int = 45, onsets: int = 1) -> list[Episode]:
    """40 nominal runs of Gamma noise; `small` runs of family "spotted" with `onsets` misbehaviours (at 300, 420)
    whose second before each onset runs hot (every one detected), `large` runs of family "missed" of plain noise
    with one misbehaviour at 300 (none detected)."""
    episodes = [Episode(rng.gamma(2.0, 1.0, 500), nominal=True) for _ in range(40)]
    for k in range(small + large):
        at = (300, 420)[:onsets] if k < small else (300,)
        s = rng.gamma(2.0, 1.0, 500)
        if k < small:
            for o in at:
                s[o - 50 : o] += 50.0
        busy = np.zeros(500, bool)
        for o in at:
            busy[o : o + 10] = True
        episodes.append(Episode(s, at, busy=busy, family="spotted" if k < small else "missed"))
    return episodes


def test_a_small_family_weighs_as_much_as_a_large_one_and_the_bootstrap_keeps_its_weight():
    episodes = _two_families(np.random.default_rng(1))
    shifted = [e for e in episodes if not e.nominal]
    weights = family_weights(shifted)
    assert weights[:5] == pytest.approx([5.0] * 5) and weights[5:] == pytest.approx([25 / 45] * 45)
    assert weights.sum() == pytest.approx(50)
    row = evaluate(episodes, levels=(0.999,), ttms=(1,), n_boot=200, seed=0)[0]
    plain = evaluate(episodes, replace(ProtocolConfig(), pooling="episodes"), levels=(0.999,), ttms=(1,), n_boot=2)[0]
    assert row.value.recall == pytest.approx(0.5, abs=0.02) and plain.value.recall == pytest.approx(0.1, abs=0.02)
    assert row.value.tp + row.value.fn == pytest.approx(50)  # one window each: the weights sum to the runs
    assert row.value.auroc == pytest.approx(0.75, abs=0.03) and plain.value.auroc == pytest.approx(0.55, abs=0.03)
    # every replicate keeps 5 spotted and 45 missed runs with their weights: the recall stays near one half
    for figure in ("recall", "f3", "auroc", "tp", "fn"):
        assert getattr(row.low, figure) <= getattr(row.value, figure) <= getattr(row.high, figure), figure
    assert 0.45 <= row.low.recall and row.high.recall <= 0.55
    assert row.value.median_lead_s == pytest.approx(1.0)  # the spotted runs' leads weigh half: the crossing at 1 s


def test_the_nulls_carry_the_same_weights_and_an_information_free_score_stays_at_chance():
    episodes = _two_families(np.random.default_rng(2), onsets=2)  # 10 spotted windows, 45 missed ones at TTM 1
    got = with_nulls(episodes, levels=(0.999,), ttms=(1,), n_boot=50, seed=0)
    weighted = 10 * 5.0 + 45 * 25 / 45  # 75, where the windows number 55
    for rows in (got.rows, *got.nulls.values()):
        assert rows[0].value.tp + rows[0].value.fn == pytest.approx(weighted)
    # the weight is per episode: the spotted family's two windows per run weigh 50 of the 75
    assert got.rows[0].value.recall == pytest.approx(2 / 3, abs=0.03) and got.clears[0].auroc
    assert abs(got.nulls["information_free"][0].value.auroc - 0.5) < 0.1


def test_an_information_free_score_sits_at_chance_with_unequal_families():
    """test_protocol.py's information-free scores (i.i.d. Gamma noise, 40 nominal and 80 shifted runs, seeds 0-19),
    the shifted runs split 8 : 72 into two families: with the families weighted equally the mean F3 over seeds
    stays <= 0.1 from level 0.99 at every TTM and the mean AUROC within 0.5 +- 0.05, as without the split."""
    levels = (0.99, 0.999, 0.9999)
    rows = []
    for seed in range(20):
        episodes = _noise_episodes(np.random.default_rng(seed), 40, 80)
        split = [e if e.nominal else replace(e, family="small" if k < 48 else "large") for k, e in enumerate(episodes)]
        assert family_weights([e for e in split if not e.nominal])[0] == pytest.approx(5.0)
        rows.append(evaluate(split, levels=levels, n_boot=1))
    f3 = np.mean([[r.value.f3 for r in by_seed] for by_seed in rows], 0)
    auroc = np.mean([[r.value.auroc for r in by_seed] for by_seed in rows], 0)
    assert (f3 <= 0.1).all(), f3
    assert (np.abs(auroc - 0.5) <= 0.05).all(), auroc


def test_the_field_pools_episodes():
    episodes = _two_families(np.random.default_rng(3))
    field = evaluate(episodes, FIELD, levels=(0.999,), ttms=(1,), n_boot=2)[0]
    unnamed = [replace(e, family="") for e in episodes]
    assert field == evaluate(unnamed, FIELD, levels=(0.999,), ttms=(1,), n_boot=2)[0]


CONTROLLER = "runs/a.pt"
SHIFTS = ("blur:4", "fog:0.8", "noise:0.2")  # two held-out families, one surrogate


def test_records_give_the_runs_family_weighted_figures_and_the_counts_are_printed(tmp_path: Path, capsys):
    """blur: 6 misbehaving runs, fog: 2 (of 6): held_out weighs each blur run 8 / 2 / 6 and each fog run 8 / 2 / 2;
    --from-records gives the same tables; the scored windows per family and controller are printed."""
    rng = np.random.default_rng(0)
    out = tmp_path / "run"
    plan = Plan(controllers=(CONTROLLER,), shifts=SHIFTS, nominal_seeds=tuple(range(6)), seeds=tuple(range(10, 16)),
                fallback="off", n_boot=5, ttm=1)  # fmt: skip
    for condition in ("nominal", *SHIFTS):
        seeds = plan.nominal_seeds if condition == "nominal" else plan.seeds
        misbehaves = {"nominal": {3}, "fog:0.8": {10, 11}}.get(condition, set(seeds))
        records = [_record(rng, s, s in misbehaves) for s in seeds]
        for record in records if condition == "fog:0.8" else ():  # fog: only the misbehaviour at 300
            record["events"] = [e for e in record["events"] if e["t"] == 300]
            record["busy"][420:] = False
        save_cell(cell_path(out, Cell(CONTROLLER, condition, seeds)), Cell(CONTROLLER, condition, seeds), records, 1.0)
    results = run_plan(out, plan, RunSettings(progress=False), run_missing=False)
    held_out = results["controllers"][CONTROLLER]["prediction"]["groups"]["held_out"]
    assert held_out["weighting"] == "families equal"
    families = held_out["families"]
    assert {f: (v["misbehaving_episodes"], v["weight"]) for f, v in families.items()} == {
        "blur": (6, pytest.approx(8 / 2 / 6)), "fog": (2, pytest.approx(2.0))}  # fmt: skip
    # blur: onsets 300 and 420, whose TTM 2 and 3 windows overlap the first misbehaviour; fog: one onset at 300
    assert families["blur"]["scored_windows"] == {"1": 12, "2": 6, "3": 6}
    assert families["fog"]["scored_windows"] == {"1": 2, "2": 2, "3": 2}
    row = next(r for r in held_out["monitors"]["epistemic_sum"] if r["level"] == plan.level and r["ttm"] == 1)
    assert row["value"]["tp"] + row["value"]["fn"] == pytest.approx(12 * 8 / 12 + 2 * 2.0)  # weighted: 12, not 14
    lines = prediction_table(results, "held_out")
    assert lines[2].startswith("| a.pt | epistemic_steer | 14 (14) |")  # the windows counted, not weighted
    family = results["controllers"][CONTROLLER]["prediction"]["groups"]["family:fog"]
    assert family["weighting"] == "families equal" and family["families"]["fog"]["weight"] == 1.0
    text = headline(results)
    assert "each family weighted equally" in text and "\n".join(family_table(results)) in text
    assert "| a.pt | held_out | fog | 2 | 2 | 2 | 2 | 2 |" in text and "| a.pt | surrogate | noise | 6 | 1 |" in text

    args = ["bench", "misbehaviour", "--out", str(tmp_path / "again"), "--bootstrap", "5", "--fallback", "off",
            "--no-progress", "--ttm", "1", "--from-records", str(out)]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "Scored windows per family and controller" in printed and "| a.pt | held_out | blur | 6 |" in printed
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert _canon(again["controllers"][CONTROLLER]["prediction"]) == _canon(
        results["controllers"][CONTROLLER]["prediction"]
    )
