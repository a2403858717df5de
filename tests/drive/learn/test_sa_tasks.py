"""The SA study: post-hoc calibration reaches its target coverage on held-out data, the sample-based metrics, matched
coverage, and tasks sa-uci / sa-forecast run through `drive bench offline` for every method at tiny size (the real
UCI / ETT files; a tiny random TimesFM checkpoint stands in for the real weights)."""

from __future__ import annotations

import dataclasses
import json
import tarfile

import numpy as np
import pytest
import torch

from drive.cli import main
from drive.errors import UserError
from drive.learn import sa_study, sa_summary
from drive.learn.tasks import sa_forecast, sa_uci
from drive.studies.offline import grid as offline
from tests.agents.test_timesfm import TINY, tiny
from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("one_thread")
TINY_FT = ("encoder.d_model=8", "n_heads=2", "n_blocks=1", "task.n_samples=8", "task.sa_passes=2")


def _gaussian_predictive(n: int, spread: float, seed: int) -> tuple[sa_study.Predictive, torch.Tensor]:
    """y ~ N(mu, 1) and S = 64 samples from N(mu, spread^2): under-dispersed for spread < 1."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, 1, generator=g) * 3
    y = mu + torch.randn(n, 1, generator=g)
    samples = mu + spread * torch.randn(64, n, 1, generator=g)
    return sa_study.Predictive(samples, mu), y


def test_temperature_scaling_and_conformal_reach_their_target_coverage_on_held_out_data():
    (cal, y_cal), (test, y_test) = _gaussian_predictive(4000, 0.3, 0), _gaussian_predictive(4000, 0.3, 1)
    report = sa_study.study_report(cal, y_cal, test, y_test)
    assert report["native"]["coverage_95"] < 0.5  # 95 % of N(mu, 0.09) covers ~ 0.46 of N(mu, 1)
    assert report["temperature"]["T"] == pytest.approx(1 / 0.3, rel=0.05)
    assert report["temperature"]["coverage_95"] == pytest.approx(0.95, abs=0.015)
    assert report["temperature"]["pit_w1"] < 0.02 < report["native"]["pit_w1"]
    assert report["conformal_95"]["coverage"] >= 0.94  # >= 95 % in expectation; sd 0.0034 at n = 4000
    curve = report["curve"]
    np.testing.assert_allclose(curve["coverage"], curve["levels"], atol=0.025)  # every level reached on test
    assert curve["width"] == sorted(curve["width"])


def test_native_metrics_of_a_calibrated_sampled_predictive():
    pred, y = _gaussian_predictive(4000, 1.0, 2)
    report = sa_study.native_report(pred, y)
    assert report["coverage_95"] == pytest.approx(0.95, abs=0.015)
    assert 2 * 1.96 < report["width_95"] < 2 * 1.96 * 1.15  # 64 draws' 2.5 / 97.5 % order statistics: a bit wider
    assert report["pit_w1"] < 0.02  # empirical-CDF PIT, S = 64: discreteness floor ~ 1/(4 S)
    assert report["nrmse"] == pytest.approx(1.0, rel=0.05)
    assert report["crps"] == pytest.approx(1 / np.sqrt(np.pi), rel=0.05)  # E CRPS(N(0, 1), y ~ N(0, 1)) = 1 / sqrt(pi)


def test_width_at_matched_coverage_reads_the_conformal_curve():
    curve = {"coverage": [0.5, 0.8, 0.95], "width": [1.0, 2.0, 4.0]}
    assert sa_study.width_at(curve, 0.65) == pytest.approx(1.5)
    assert np.isnan(sa_study.width_at(curve, 0.3))
    rows = {
        "sa": {0: {"native": {"coverage_95": 0.8, "width_95": 1.0}, "curve": curve}},
        "mcd": {0: {"native": {"coverage_95": 0.4, "width_95": 0.2}, "curve": {**curve, "width": [2, 4, 8]}}},
    }
    assert sa_summary.matched_ratios(rows) == {"sa": pytest.approx(2.0), "mcd": pytest.approx(4.0)}
    # against SA's own conformal width at its coverage (2.0): SA 1, MC dropout 4 / 2
    alike = sa_summary.matched_ratios(rows, conformal_reference=True)
    assert alike == {"sa": pytest.approx(1.0), "mcd": pytest.approx(2.0)}


@pytest.fixture(scope="module")
def uci_bench(tmp_path_factory, shared_data):
    out = tmp_path_factory.mktemp("sa_uci")
    code = main(["bench", "offline", "--task", "sa-uci", "--datasets", "yacht", "--seeds", "1", "--epochs", "1",
                 "--data", str(shared_data), "--no-progress", "--out", str(out), "--set", *TINY_FT])  # fmt: skip
    assert code == 0
    return out


@pytest.mark.parametrize("controller", sa_uci.CONTROLLERS)
def test_every_method_runs_through_the_bench(uci_bench, controller):
    run = uci_bench / "runs" / "yacht" / controller / "seed0"
    metrics = json.loads((run / "metrics.json").read_text())
    study = metrics["study"]
    assert study["method"] == sa_uci.METHODS[controller]
    assert {"nrmse", "pit_w1", "coverage_95", "width_95", "nll", "crps"} <= set(metrics["test"])
    assert 0 <= metrics["test"]["pit_w1"] <= 0.5 and 0 <= study["conformal_95"]["coverage"] <= 1
    assert len(study["curve"]["levels"]) == len(sa_study.CURVE_LEVELS)
    with np.load(run / "sa_study.npz") as arrays:
        assert arrays[f"{study['method']}_pit"].shape == (metrics["test"]["n"],)
    if controller == "ft":  # SA: nu from the default BO, the published routine and the grid recorded beside it
        search = study["sa"]
        assert search["nu_bounds"][0] <= search["nu"] <= search["nu_bounds"][1] and search["wall_time_s"] > 0
        assert set(search["comparison"]) == {"default", "published", "grid"}
        assert study["cost"]["adaptation_s"] == search["wall_time_s"]


def test_the_report_has_the_table_the_claims_and_the_plots(uci_bench):
    results = json.loads((uci_bench / "results.json").read_text())
    assert results["rows"] == list(sa_uci.CONTROLLERS)  # a variant named as its controller is one row, not two
    assert len(results["cells"]) == len(sa_uci.CONTROLLERS)
    summary = results["summary"]
    table = summary["tables"][0]
    assert sorted(r[1] for r in table["rows"]) == sorted(sa_uci.METHODS.values())  # one row per method
    assert [c["id"] for c in summary["claims"]][:3] == ["pit_best", "sharpest", "sharpest_alike"]
    assert "/ SA conformal" in table["columns"]
    assert all(c["reproduced"] is None for c in summary["claims"] if c["id"] in ("pit_best", "sharpest"))  # 1 of 8
    text = (uci_bench / "results.md").read_text()
    assert "### The paper's claims" in text and "Table 2 analogue" in text
    assert {p.name for p in (uci_bench / "plots").glob("*.png")} >= {"yacht_sa_pit.png", "yacht_width_coverage.png",
                                                                     "yacht_nu_search.png"}  # fmt: skip


def test_sa_forecast_with_a_timesfm_checkpoint_adds_its_row(tmp_path, shared_data):
    ckpt, cfg = tmp_path / "torch_model.ckpt", tmp_path / "tiny.json"
    torch.save(tiny(seed=2).state_dict(), ckpt)
    cfg.write_text(json.dumps(dataclasses.asdict(TINY)))
    out = tmp_path / "bench"
    code = main(["bench", "offline", "--task", "sa-forecast", "--datasets", "etth1-96", "--epochs", "1", "--data",
                 str(shared_data), "--no-progress", "--out", str(out), "--set", "encoder.d_model=8", "n_layers=1",
                 "task.lookback=64", "task.train_stride=64", "task.eval_stride=200", "task.cal_windows=24",
                 "task.n_samples=4", "task.sa_passes=2", f"task.timesfm={ckpt}", f"task.timesfm_config={cfg}",
                 "task.timesfm_windows=5"])  # fmt: skip
    assert code == 0
    metrics = json.loads((out / "runs" / "etth1-96" / "patchtst" / "seed0" / "metrics.json").read_text())
    methods = metrics["study"]["methods"]
    assert set(methods) == {"sa", "mcd", "gaussian", "timesfm-sa"}
    assert methods["timesfm-sa"]["sa"]["timesfm"]["n_test_windows"] == 5
    assert methods["timesfm-sa"]["native"]["n"] == 5 * 96
    assert metrics["test"]["mae_all_windows"] > 0 and metrics["test"]["n_windows"] == methods["sa"]["native"]["n"] // 96
    claims = json.loads((out / "results.json").read_text())["summary"]["claims"]
    assert claims[0]["id"] == "etth1_coverage" and "sa" in claims[0]["ours"]


def test_timesfm_config_names_or_json_and_one_line_errors(tmp_path):
    assert sa_forecast.timesfm_config("2.0-500m").n_layers == 50
    bad = tmp_path / "bad.json"
    bad.write_text('{"n_layerz": 2}')
    for spec in (str(bad), str(tmp_path / "missing.json")):
        with pytest.raises(UserError) as info:
            sa_forecast.timesfm_config(spec)
        assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="unknown dataset"):
        sa_forecast.parse_dataset("etth1-48")


def test_the_uci_study_defaults_to_five_gal_splits_and_protein_has_five(tmp_path, shared_data):
    grid = offline.make_grid("sa-uci", datasets=("concrete", "protein"), out=tmp_path, data=str(shared_data))
    assert grid.seeds == tuple(range(5)) and grid.rows == sa_uci.CONTROLLERS
    full = offline.make_grid("sa-uci", datasets=("concrete", "protein"), seeds=20, out=tmp_path, data=str(shared_data))
    per_set = {d: len({c.seed for c in offline.cells(full) if c.dataset == d}) for d in ("concrete", "protein")}
    assert per_set == {"concrete": 20, "protein": 5}  # Gal's protocol: 20 splits, Protein 5


def _cells(line: str) -> list[str]:
    """The stripped cells of one markdown table row."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.mark.parametrize("archive", sorted((REPO / "docs" / "sa_study_runs").glob("*20.tar.gz")), ids=lambda p: p.name)
def test_an_archived_20_split_set_regenerates_its_documented_rows(tmp_path, monkeypatch, archive, shared_data):
    """docs/sa_study_runs/SET20.tar.gz (the cells' records, no weights) extracted into the grid's directory: the
    report reads them as 20 finished splits per method and its rows are the ones docs/sa_study.md shows. The grid
    takes each set's number of Gal splits from uci_gal/, so this needs the real data."""
    monkeypatch.setenv("DRIVE_DATA_ROOT", str(shared_data))
    dataset = archive.name.removesuffix("20.tar.gz")
    monkeypatch.chdir(tmp_path)  # the records name their run directories relative to the working directory
    out = tmp_path / "runs" / "sa-bench" / "uci"
    out.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    argv = ["bench", "offline", "--task", "sa-uci", "--datasets", dataset, "--seeds", "20", "--report-only", "--out",
            "runs/sa-bench/uci"]  # fmt: skip
    assert main(argv) == 0
    lines = [line for line in (out / "results.md").read_text().splitlines() if line.startswith(f"| {dataset} | ")]
    rows = [_cells(line) for line in lines]
    table = {r[1]: r for r in rows if len(r) >= 18}  # the main table: dataset, method, runs, nRMSE, MAE, PIT-W1, cov95
    assert set(table) == {"sa", "mcd", "swag", "multiswag", "ivon", "cdrop", "hsa"}
    assert {r[2] for r in table.values()} == {"20"}
    docs = (REPO / "docs" / "sa_study.md").read_text()
    section = docs[docs.index(f"**{dataset.capitalize()}**") :]
    for method, r in table.items():  # the 5 -> 20 table: nRMSE, PIT-W1 and cov95 at 20 splits
        assert f"| {method} | 5 → 20 | " in section
        documented = next(line for line in section.splitlines() if line.startswith(f"| {method} | 5 → 20 | "))
        assert [c.split("→")[1].strip() for c in _cells(documented)[2:5]] == [r[3], r[5], r[6]]


def test_the_summary_uci_table_shows_the_documented_20_split_rows():
    """The summary's Table-2 analogue (docs/sa_study.md, "In short": PIT-W1 · width ratio · adapt s per set and
    method) is the same page's 20-split tables (Protein: its full 5 splits), the best PIT-W1 of each set in bold."""
    methods = ["sa", "mcd", "swag", "multiswag", "ivon", "cdrop", "hsa"]
    docs = (REPO / "docs" / "sa_study.md").read_text()
    section = docs[docs.index("## All eight sets at 20 splits") : docs.index("**The paper's claims at 20 splits")]
    documented: dict[tuple[str, str], list[str]] = {}
    label = "yacht"  # the section's first table comes before any bold set name
    for line in section.splitlines():
        if line.startswith("**") and line[2:].split("**")[0].lower() in {"power", "concrete", "wine", "energy",
                                                                          "kin8nm", "naval"}:  # fmt: skip
            label = line[2:].split("**")[0].lower()
        cells = _cells(line)
        if len(cells) == 7 and cells[1] == "5 → 20":  # PIT-W1, width ratio, adapt s at 20 splits
            documented[label, cells[0]] = [cells[i].split("→")[1].split("[")[0].strip() for i in (3, 5, 6)]
    for line in docs[docs.index("## UCI (FT-Transformer") :].splitlines():
        cells = _cells(line)
        if len(cells) == 11 and cells[0] == "protein" and cells[1] in methods:
            documented["protein", cells[1]] = [cells[4], cells[7], cells[10]]
    summary = docs[docs.index("## In short") : docs.index("\n## ", docs.index("## In short") + 4)]
    rows = [line for line in summary.splitlines() if line.startswith("| ") and " · " in line]
    seen = set()
    for line in rows:
        cells = _cells(line)
        dataset = cells[0].removesuffix(" (5)")
        pits = {}
        for method, cell in zip(methods, cells[1:], strict=True):
            parts = cell.split(" · ")
            pit, adapt = parts[0].strip("*"), parts[-1].removesuffix(" s")
            want = documented[dataset, method]
            assert pit == want[0] and float(adapt) == pytest.approx(float(want[2]), abs=0.05)
            if method != "sa":
                assert parts[1] == want[1]
            pits[method] = (float(pit), parts[0].startswith("**"))
        assert min(pits, key=lambda m: pits[m][0]) == next(m for m, (_, bold) in pits.items() if bold)
        seen.add(dataset)
    assert seen == {"concrete", "energy", "naval", "yacht", "protein", "wine", "kin8nm", "power"}
