"""`drive eval --data udacity:DIR`: a checkpoint scored on every frame of a driving log, in every log variant, with
errors that name the row of a missing or corrupt image (or, with --skip-bad-rows, the row skipped and counted)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from agents.encoders import EncoderConfig
from agents.registry import CONTROLLERS, config_to_dict
from datasets.udacity import load_frame, preprocess, read_log
from drive.checkpoint import save
from drive.cli import main
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "udacity"
TRAIN_MEAN = 0.05


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    cfg = CONTROLLERS["gmle"](encoder=EncoderConfig(kind="nvidia", d_model=8))
    model = cfg.build()
    path = tmp_path_factory.mktemp("ckpt") / "gmle.pt"
    data = {"task": "udacity", "train_mean_steering": TRAIN_MEAN}
    save(path, kind="controller", name="gmle", config=config_to_dict(cfg), module=model, data=data)
    return path


def _log_dir(tmp_path, csv="header_relative.csv"):
    shutil.copytree(FIXTURES / "IMG", tmp_path / "IMG")
    shutil.copy(FIXTURES / csv, tmp_path / "driving_log.csv")
    return tmp_path


def _eval(ckpt, data, out, *extra):
    return main(["eval", "--ckpt", str(ckpt), "--data", f"udacity:{data}", "--out", str(out), "--samples", "2",
                 "--no-progress", *extra])  # fmt: skip


def test_scores_every_frame_of_a_header_relative_log(ckpt, tmp_path):
    data = _log_dir(tmp_path / "log")
    out = tmp_path / "scores.json"
    assert _eval(ckpt, data, out) == 0
    r = json.loads(out.read_text())
    log = read_log(data)
    y = log.steering
    assert r["n_frames"] == 3 and r["skipped_rows"] == 0 and r["train_mean_steering"] == TRAIN_MEAN
    from drive.checkpoint import load_controller

    model, _ = load_controller(ckpt)
    x = torch.from_numpy(np.stack([preprocess(load_frame(p)) for p in log.center]))
    with torch.no_grad():
        pred = model.predict(x, 2, torch.Generator().manual_seed(0))
    assert r["mse"] == pytest.approx(float(((pred.mean[:, 0].numpy() - y) ** 2).mean()), rel=1e-5)
    assert r["mse_mean_predictor"] == pytest.approx(float(((y - TRAIN_MEAN) ** 2).mean()), rel=1e-6)
    assert r["mse_ratio"] == pytest.approx(r["mse"] / r["mse_mean_predictor"])
    for key in ("mae", "nll", "crps", "coverage90", "width90", "ece"):
        assert np.isfinite(r[key])
    png = out.with_suffix(".png")
    assert r["plot"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("csv", ["driving_log.csv", "posix_nospace.csv"])
def test_every_log_variant_scores_alike(ckpt, tmp_path, csv):
    ref, other = tmp_path / "ref.json", tmp_path / "other.json"
    assert _eval(ckpt, _log_dir(tmp_path / "a"), ref) == 0
    assert _eval(ckpt, _log_dir(tmp_path / "b", csv), other) == 0
    a, b = json.loads(ref.read_text()), json.loads(other.read_text())
    for key in ("n_frames", "mse", "nll", "crps", "coverage90", "mse_mean_predictor"):
        assert a[key] == pytest.approx(b[key], rel=1e-6)


def test_missing_image_names_the_row_or_is_skipped_and_counted(ckpt, tmp_path, capsys):
    data = _log_dir(tmp_path / "log")
    (data / "IMG" / "center_2024_01_31_22_07_12_679.jpg").unlink()
    assert _eval(ckpt, data, tmp_path / "x.json") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "driving_log.csv:3: center image 'center_2024_01_31_22_07_12_679.jpg' not found" in err[0]
    out = tmp_path / "skip.json"
    assert _eval(ckpt, data, out, "--skip-bad-rows") == 0
    r = json.loads(out.read_text())
    assert r["n_frames"] == 2 and r["skipped_rows"] == 1 and "driving_log.csv:3" in r["skipped"][0]


def test_corrupt_jpeg_names_the_row_or_is_skipped_and_counted(ckpt, tmp_path, capsys):
    data = _log_dir(tmp_path / "log")
    (data / "IMG" / "center_2024_01_31_22_07_12_784.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a whole jpeg")
    assert _eval(ckpt, data, tmp_path / "x.json") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "driving_log.csv:4: center image 'center_2024_01_31_22_07_12_784.jpg'" in err[0]
    assert "not a decodable image" in err[0]
    out = tmp_path / "skip.json"
    assert _eval(ckpt, data, out, "--skip-bad-rows") == 0
    assert json.loads(out.read_text())["skipped_rows"] == 1


def test_bad_data_and_wrong_checkpoints_are_one_line_errors(ckpt, tmp_path, capsys):
    assert main(["eval", "--ckpt", str(ckpt), "--data", str(tmp_path)]) == 2
    assert "udacity:DIR" in capsys.readouterr().err
    assert main(["eval", "--expert", "ppo", "--data", f"udacity:{FIXTURES}"]) == 2
    assert "--ckpt PATH" in capsys.readouterr().err
    cfg = CONTROLLERS["gmle"](encoder=EncoderConfig(kind="features", in_dim=3))
    other = save(tmp_path / "f.pt", kind="controller", name="gmle", config=config_to_dict(cfg), module=cfg.build())
    assert main(["eval", "--ckpt", str(other), "--data", f"udacity:{FIXTURES}"]) == 2
    assert "Udacity frames" in capsys.readouterr().err


@pytest.mark.parametrize("name, n_frames", [("udacity_sim", 1500), ("udacity_lake", 3053)])
def test_every_frame_of_the_real_recordings(ckpt, shared_data, tmp_path, name, n_frames):
    out = tmp_path / f"{name}.json"
    assert _eval(ckpt, shared_data / name, out) == 0
    r = json.loads(out.read_text())
    y = read_log(shared_data / name).steering
    assert r["n_frames"] == n_frames and r["skipped_rows"] == 0
    assert r["mse_mean_predictor"] == pytest.approx(float(((y - TRAIN_MEAN) ** 2).mean()), rel=1e-6)


@pytest.mark.slow
def test_shipped_checkpoint_on_its_lake_recording(shared_data, tmp_path):
    out = tmp_path / "lake.json"
    assert _eval(REPO / "checkpoints" / "udacity_nsac.pt", shared_data / "udacity_lake", out) == 0
    r = json.loads(out.read_text())
    assert r["n_frames"] == 3053 and r["controller"] == "nsac"
    assert r["mse_ratio"] < 1 and 0.8 <= r["coverage90"] <= 0.97  # training laps included: better than the mean
