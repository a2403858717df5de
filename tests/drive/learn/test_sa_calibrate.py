"""`drive sa calibrate`: SA's nu chosen on a trained clone's validation episodes, test report without / with SA, and
the SA controller it saves, loaded and driven like any checkpoint.

A tiny GMLE is behaviour-cloned on the fake road (as tests/test_bc.py does) through the real CLI, in-process.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from agents.encoders import EncoderConfig
from agents.ensemble import EnsembleConfig
from agents.layers.token_cache import cached_encoders
from agents.mc_dropout import MCDropoutConfig
from agents.sa_controller import SAController
from drive import checkpoint
from drive.cli import main
from drive.commands.bench.latency import time_steps
from drive.learn import sa as sa_lib
from drive.learn import tasks
from drive.loop.specs import controller_policy

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gmle_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sa")
    demos, run = root / "fake", root / "gmle"
    code = main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-5", "--out", str(demos),
                 "--max-episode-steps", "40", "--action-noise", "0.2", "--min-return", "-1000", "--keep-raw",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    code = main(["train", "--controller", "gmle", "--data", str(demos), "--out", str(run), "--epochs", "1",
                 "--batch-size", "32", "--no-progress", "--set", "encoder.d_model=16", "n_heads=2",
                 "task.val_fraction=0.2", "task.test_fraction=0.2"])  # fmt: skip
    assert code == 0
    return run / "best.pt"


@pytest.fixture(scope="module")
def calibrated(gmle_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("sa") / "sa"
    code = main(["sa", "calibrate", "--ckpt", str(gmle_run), "--frames", "24", "--passes", "4", "--out", str(out),
                 "--no-progress"])  # fmt: skip
    assert code == 0
    return out


def test_calibrate_a_trained_gmle(gmle_run, calibrated):
    out = calibrated
    result = json.loads((out / "sa.json").read_text())
    low, high = result["nu_bounds"]
    assert result["controller"] == "gmle" and low <= result["nu"] <= high and result["task"] == "demos"
    assert result["at_bound"] in (None, "low", "high") and (result["at_bound"] is None) == (low < result["nu"] < high)
    nus = [c[0] for c in result["curve"]]
    assert len(nus) >= 3 and nus == sorted(nus) and len(nus) == result["n_evals"]
    assert result["curve"][0][2] > result["curve"][-1][2] > 0  # dispersion falls with nu
    assert result["wall_time_s"] > 0 and result["n_calibration"] == 24
    without, with_sa = result["test"]["without_sa"], result["test"]["with_sa"]
    assert without["epistemic_var"] == 0.0  # one deterministic network cannot disagree with itself
    assert with_sa["epistemic_var"] > 0  # SA's passes do
    assert without["n"] == with_sa["n"] == 3 * result["n_test"]
    # SA's spread alone (the paper: it is tuned to the whole residual), and with the head's noise added on top
    plus = result["test"]["with_sa_plus_head"]
    assert with_sa["aleatoric_var"] == 0.0 and plus["aleatoric_var"] > 0 and plus["mse"] == with_sa["mse"]
    assert plus["epistemic_var"] == with_sa["epistemic_var"] and plus["width_90"] > with_sa["width_90"]
    # the report without SA is the controller's own offline test report (what `drive train` writes)
    assert without["nll"] == pytest.approx(json.loads((gmle_run.parent / "metrics.json").read_text())["test"]["nll"],
                                           rel=1e-6)  # fmt: skip
    assert without["per_target"]["steer"]["mse"] >= 0
    assert (out / "sa_curve.png").stat().st_size > 1000


def test_cached_encoders_give_the_plain_deterministic_pass(gmle_run):
    model, payload = checkpoint.load_controller(gmle_run)
    x = tasks.rebuild(payload["data"]).val.stacks(torch.arange(5))  # (5, 4, 84, 84)
    ens = EnsembleConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2,
                         n_members=2).build().eval()  # fmt: skip
    ens.set_target_stats(torch.tensor([0.1, 0.5, 0.0]), torch.tensor([0.3, 0.2, 0.1]))
    for m in (model, ens):
        with torch.no_grad():
            plain = m.deterministic_pass(x)
            encoders = [mod for n, mod in m.named_modules() if n.endswith("encoder")]
            with cached_encoders(m, batch_size=2) as tokens:
                t = tokens(x)
                assert t.shape == (5, len(encoders), 4, 16)
                cached = m.deterministic_pass(t)
            assert [mod for n, mod in m.named_modules() if n.endswith("encoder")] == encoders  # put back
        for a, b in zip(plain, cached, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        expected = m.predict(x)
        torch.testing.assert_close(plain.mean * m.y_scale + m.y_loc, expected.mean, rtol=1e-5, atol=1e-6)
    assert (plain.epistemic_var > 0).all()  # DE: the member disagreement of the deterministic pass


def test_refuses_stochastic_controllers_and_foreign_files(gmle_run, tmp_path, capsys):
    payload = checkpoint.read(gmle_run)
    cfg = MCDropoutConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    mcd = checkpoint.save(tmp_path / "mcd.pt", kind="controller", name="mcd", config=cfg.__dict__ | {
        "encoder": cfg.encoder.__dict__}, module=cfg.build(), data=payload["data"])  # fmt: skip
    assert main(["sa", "calibrate", "--ckpt", str(mcd), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(mcd) in err and "'mcd'" in err and "deterministic" in err
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    assert main(["sa", "calibrate", "--ckpt", str(junk), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert str(junk) in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _strings(value):
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (str(k), *_strings(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_the_saved_sa_controller_loads_and_gives_the_reported_predictive(gmle_run, calibrated):
    result = json.loads((calibrated / "sa.json").read_text())
    model, payload = checkpoint.load_controller(calibrated / "sa_controller.pt")
    base = checkpoint.read(gmle_run)
    assert isinstance(model, SAController) and payload["name"] == "sa" and model.cfg.base == "gmle"
    assert model.cfg.nu == result["nu"] and model.default_samples == 4 and model.cfg.head_variance
    # what readers of a controller checkpoint look up is the base's: coder, targets, labelling expert
    assert payload["data"] == base["data"] and payload["normalisation"] == base["normalisation"]
    assert payload["config"]["encoder"] == base["config"]["encoder"] and payload["config"]["out_dim"] == 3
    assert payload["config"]["base_config"] == base["config"]
    for key, value in base["state_dict"].items():
        assert torch.equal(payload["state_dict"][f"base.{key}"], value), key
    assert "fallback" not in payload["extra"] and payload["extra"]["sa"]["nu"] == result["nu"]
    assert not [s for s in _strings(payload) if os.path.isabs(s)]  # no absolute path of this machine
    # the same seed and batches: the test report sa.json holds, bit for bit
    data = tasks.rebuild(payload["data"])
    assert sa_lib.test_report(model, data.test, data.target_names, 512, 0) == result["test"]["with_sa_plus_head"]
    assert json.loads(json.dumps(payload["metrics"]["test"])) == result["test"]["with_sa_plus_head"]


def test_the_sa_controller_drives_the_fake_road_replayably(calibrated, tmp_path, capsys):
    ckpt = calibrated / "sa_controller.pt"
    policy = controller_policy(ckpt, shadow=None, env="fake-road")
    assert policy.samples == 4
    frame = np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    outs = []
    for _ in range(2):
        policy.reset(seed=5)
        outs.append([policy.predict(frame)[0] for _ in range(3)])
    for a, b in zip(*outs, strict=True):  # same seed: the same actions and variances, bit for bit
        assert all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("mean", "aleatoric_var", "epistemic_var"))
    assert all((p.epistemic_var > 0).all() for p in outs[0])  # a GMLE alone has none
    assert not np.array_equal(outs[0][0].mean, outs[0][1].mean)  # fresh draws each step
    runs = []
    for i in range(2):
        out = tmp_path / f"eval{i}.json"
        assert main(["eval", "--ckpt", str(ckpt), "--env", "fake-road", "--seeds", "100", "--max-episode-steps", "12",
                     "--out", str(out), "--no-progress"]) == 0  # fmt: skip
        (episode,) = json.loads(out.read_text())["episodes"]
        runs.append({k: v for k, v in episode.items() if not k.startswith(("latency", "wall"))})  # timings aside
    assert runs[0] == runs[1] and runs[0]["steps"] == 12 and runs[0]["epistemic_var_steer"] > 0
    for deterministic in (False, True):  # `drive bench latency --ckpt`'s two timed steps (moments; SA off)
        assert len(time_steps(policy.model, [frame], 4, deterministic, 2, 1, policy.coder)) == 2
    # SA of SA: refused in one line
    assert main(["sa", "calibrate", "--ckpt", str(ckpt), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "already SA" in capsys.readouterr().err
