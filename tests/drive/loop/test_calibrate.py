"""The aleatoric temperature: it rescales only the noise std (actions and epistemic variance untouched), old files
load with T = 1, and `drive calibrate` fits it on nominal laps so the shadow expert is covered at the target rate."""

from __future__ import annotations

import pytest
import torch

from agents.encoders import EncoderConfig
from agents.nsac import NSACConfig
from agents.registry import config_to_dict
from drive import checkpoint
from drive.cli import main
from drive.loop.calibrate import fit_on_laps, nominal_predictions, store_temperature
from drive.loop.specs import controller_policy

pytestmark = pytest.mark.usefixtures("one_thread")


def _nsac(tmp_path, name="nsac.pt"):
    torch.manual_seed(0)
    cfg = NSACConfig(encoder=EncoderConfig(kind="frames", n_tokens=4, d_model=16), out_dim=3, n_heads=2)
    model = cfg.build().eval()
    path = tmp_path / name
    checkpoint.save(path, kind="controller", name="nsac", config=config_to_dict(cfg), module=model)
    return cfg, model, path


def test_temperature_scales_the_aleatoric_variance_only(tmp_path):
    _, model, _ = _nsac(tmp_path)
    x = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    before = model.predict(x, 6, torch.Generator().manual_seed(1))
    t = torch.tensor([2.0, 0.5, 3.0])
    model.set_aleatoric_temperature(t)
    after = model.predict(x, 6, torch.Generator().manual_seed(1))
    assert torch.equal(after.mean, before.mean) and torch.equal(after.epistemic_var, before.epistemic_var)
    assert torch.allclose(after.aleatoric_var, before.aleatoric_var * t**2)
    with pytest.raises(ValueError, match="finite and > 0"):
        model.set_aleatoric_temperature(torch.tensor(0.0))


def test_a_file_written_before_the_temperature_existed_loads_with_t_one(tmp_path):
    cfg, model, path = _nsac(tmp_path)
    payload = checkpoint.read(path)
    del payload["state_dict"]["aleatoric_temperature"]
    torch.save(payload, path)
    loaded, _ = checkpoint.load_controller(path)
    assert torch.equal(loaded.aleatoric_temperature, torch.ones(3))


def test_calibrate_fits_coverage_on_the_nominal_laps_and_refitting_does_not_compound(tmp_path):
    _, _, path = _nsac(tmp_path)
    env = {"name": "fake-road", "max_episode_steps": 60}
    first = store_temperature(path, [3, 4], "pursuit", 0.9, samples=4, env_kwargs=env, rule="pooled")
    assert first["n_steps"] == 120 and first["coverage90_steer_after"] >= 0.9
    loaded, payload = checkpoint.load_controller(path)
    assert torch.allclose(loaded.aleatoric_temperature, torch.tensor(first["temperature"]))
    assert payload["extra"]["calibration"]["seeds"] == [3, 4]
    # refitting starts from T = 1: the same laps give the same T, not T squared
    again = store_temperature(path, [3, 4], "pursuit", 0.9, samples=4, env_kwargs=env, rule="pooled")
    assert again["temperature"] == pytest.approx(first["temperature"])
    # the calibrated file drives the same laps identically, its steering intervals cover the expert as fitted
    policy = controller_policy(path, 4, 0, shadow="pursuit", env="fake-road")
    laps = nominal_predictions(policy, [3, 4], env)
    raw = controller_policy(path, 4, 0, shadow="pursuit", env="fake-road")
    raw.model.set_aleatoric_temperature(torch.ones(()))
    plain = nominal_predictions(raw, [3, 4], env)
    assert (laps["mean"] == plain["mean"]).all() and (laps["epistemic"] == plain["epistemic"]).all()
    z90 = 1.6448536269514722
    sd = (laps["aleatoric"] + laps["epistemic"])[:, 0] ** 0.5
    covered = abs(laps["expert"][:, 0] - laps["mean"][:, 0]) <= z90 * sd
    assert covered.mean() == pytest.approx(first["coverage90_steer_after"])


def test_lap_median_is_not_set_by_one_lap_off_the_road():
    """Four laps whose noise is 2x the predicted, one where the expert's action is unrelated (100x): pooled, the
    bad lap's steps widen every interval; the median over laps keeps T ~2."""
    g = torch.Generator().manual_seed(0)
    laps: dict = {k: [] for k in ("mean", "aleatoric", "epistemic", "expert", "seed")}
    for seed, factor in [(0, 2), (1, 2), (2, 2), (3, 2), (4, 100)]:
        n = 400
        laps["mean"].append(torch.zeros(n, 3))
        laps["aleatoric"].append(torch.ones(n, 3))
        laps["epistemic"].append(torch.zeros(n, 3))
        laps["expert"].append(torch.randn(n, 3, generator=g) * factor)
        laps["seed"].append(torch.full((n,), seed))
    arrays = {k: torch.cat(v).numpy() for k, v in laps.items()}
    median, per_lap = fit_on_laps(arrays, 0.9)
    pooled, _ = fit_on_laps(arrays, 0.9, rule="pooled")
    assert torch.allclose(median, torch.full((3,), 2.0), atol=0.25) and (pooled > 3).all()
    assert sorted(per_lap) == ["0", "1", "2", "3", "4"] and min(per_lap["4"]) > 50


def test_calibrate_command_writes_out_and_refuses_bad_input(tmp_path, capsys):
    _, _, path = _nsac(tmp_path)
    out = tmp_path / "calibrated.pt"
    code = main(["calibrate", "--ckpt", str(path), "--seeds", "2000", "--out", str(out), "--shadow", "pursuit",
                 "--max-episode-steps", "30", "--samples", "2"])  # fmt: skip
    assert code == 0 and "aleatoric temperature steer" in capsys.readouterr().out
    assert "calibration" in checkpoint.read(out)["extra"] and "calibration" not in checkpoint.read(path)["extra"]
    assert main(["calibrate", "--ckpt", str(path), "--coverage", "1.5"]) == 2
    assert "drive calibrate: error:" in capsys.readouterr().err
    assert main(["calibrate", "--ckpt", str(path), "--shadow", "none"]) == 2
    assert "--shadow" in capsys.readouterr().err
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    assert main(["calibrate", "--ckpt", str(tmp_path / "bad.pt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a readable drive checkpoint" in err
