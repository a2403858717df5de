"""The feature-density controller: Ledoit-Wolf against its textbook form, the score's scale and its rise off the
training features, the base's deterministic pass as the predictive, rows independent of their batch, a checkpoint
round trip through the normal loader, and `drive density fit` on a trained clone, driven like any checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from agents.density_controller import DensityController, DensityControllerConfig, ledoit_wolf, pooled_features
from agents.encoders import EncoderConfig
from agents.ensemble import EnsembleConfig
from agents.gmle import GMLEConfig
from agents.nsac import NSACConfig
from agents.registry import config_from_dict, config_to_dict
from drive import checkpoint
from drive.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

ENC = EncoderConfig(kind="features", in_dim=3, d_model=16)
BASES = {
    "gmle": GMLEConfig(encoder=ENC, out_dim=2, n_heads=2),
    "nsac": NSACConfig(encoder=ENC, out_dim=2, n_heads=2),
    "de": EnsembleConfig(encoder=ENC, out_dim=2, n_heads=2, n_members=2),
}


def fitted(name: str) -> tuple[DensityController, torch.Tensor]:
    torch.manual_seed(0)
    base = BASES[name].build().eval()
    features = DensityController(DensityControllerConfig(name, BASES[name], 1), base=base).features(inputs(2)).shape[1]
    model = DensityControllerConfig(name, BASES[name], features).build().eval()
    model.base.load_state_dict(base.state_dict())
    model.set_target_stats(torch.tensor([5.0, -1.0]), torch.tensor([2.0, 0.5]))
    model.set_aleatoric_temperature(torch.tensor([1.5, 0.8]))
    train, val = inputs(400, 1), inputs(200, 2)
    model.fit(model.features(train), model.features(val))
    return model, val


def inputs(n: int, seed: int = 3, shift: float = 0.0) -> torch.Tensor:
    return torch.randn(n, ENC.in_dim, generator=torch.Generator().manual_seed(seed)) + shift


def test_ledoit_wolf_is_the_textbook_shrinkage():
    x = torch.randn(120, 9, generator=torch.Generator().manual_seed(0)) @ torch.randn(9, 9)
    mu, cov, weight = ledoit_wolf(x)
    xc = (x - x.mean(0)).double()
    sample = xc.T @ xc / len(x)
    target = torch.trace(sample) / 9
    d2 = ((sample - target * torch.eye(9, dtype=torch.float64)) ** 2).sum()
    b2 = min(sum(((torch.outer(r, r) - sample) ** 2).sum() for r in xc) / len(x) ** 2, d2)
    assert weight == pytest.approx(float(b2 / d2), rel=1e-6) and 0 < weight < 1
    torch.testing.assert_close(cov, weight * target * torch.eye(9, dtype=torch.float64) + (1 - weight) * sample)
    torch.testing.assert_close(mu, x.double().mean(0))


@pytest.mark.parametrize("name", sorted(BASES))
def test_the_score_is_one_at_a_typical_frame_rises_off_the_data_and_the_predictive_is_the_base_pass(name):
    model, val = fitted(name)
    p = model.predict(val)
    assert p.epistemic_var[:, 0].double().quantile(0.5) == pytest.approx(1.0, rel=1e-4)
    assert torch.equal(p.epistemic_var[:, 0], p.epistemic_var[:, 1])  # one score for every target
    far = model.predict(inputs(200, 4, shift=4.0)).epistemic_var[:, 0]
    assert far.median() > 3 * p.epistemic_var[:, 0].median()
    base = model.base.deterministic_pass(val)  # standardised units, the temperature included
    torch.testing.assert_close(p.mean, base.mean * model.y_scale + model.y_loc)
    torch.testing.assert_close(p.aleatoric_var, base.aleatoric_var * model.y_scale**2)


def test_rows_do_not_depend_on_their_batch_and_features_pool_each_encoder():
    model, val = fitted("de")
    whole = model.predict(val[:16]).epistemic_var
    parts = torch.cat([model.predict(val[s : s + 4]).epistemic_var for s in range(0, 16, 4)])
    assert torch.equal(whole, parts)  # batches of 4 or more run the same kernels (agents/lane_noise.py MIN_ROWS)
    tokens = torch.randn(3, 2, 5, 4)
    assert pooled_features(tokens).shape == (3, 2 * 2 * 4)
    torch.testing.assert_close(pooled_features(tokens)[:, :4], tokens[:, 0].mean(1))


def test_a_checkpoint_round_trip_through_the_normal_loader(tmp_path):
    model, val = fitted("nsac")
    cfg = config_to_dict(model.cfg)
    assert config_from_dict("density", cfg) == model.cfg and cfg["out_dim"] == 2
    path = checkpoint.save(tmp_path / "d.pt", kind="controller", name="density", config=cfg, module=model)
    loaded, _ = checkpoint.load_controller(path)
    assert isinstance(loaded, DensityController) and not loaded.training and loaded.sa_refusal
    for u, v in zip(loaded.predict(val), model.predict(val), strict=True):
        assert torch.equal(u, v)


def test_drive_density_fit_on_a_trained_clone_then_drive_it(tmp_path, capsys):
    demos, run, out = tmp_path / "fake", tmp_path / "gmle", tmp_path / "dens"
    assert main(["collect", "--env", "fake-road", "--expert", "pursuit", "--seeds", "0-5", "--out", str(demos),
                 "--max-episode-steps", "40", "--action-noise", "0.2", "--min-return", "-1000", "--keep-raw",
                 "--no-progress"]) == 0  # fmt: skip
    assert main(["train", "--controller", "gmle", "--data", str(demos), "--out", str(run), "--epochs", "1",
                 "--batch-size", "32", "--no-progress", "--set", "encoder.d_model=16", "n_heads=2",
                 "task.val_fraction=0.2", "task.test_fraction=0.2"]) == 0  # fmt: skip
    assert main(["density", "fit", "--ckpt", str(run / "best.pt"), "--out", str(out), "--frames", "64"]) == 0
    report = json.loads((out / "density.json").read_text())
    assert report["controller"] == "gmle" and report["score_quantiles"]["val"]["q50"] == pytest.approx(1.0, rel=1e-4)
    payload = checkpoint.read(out / "density_controller.pt", kind="controller")
    assert not payload["extra"]["density"]["base_ckpt"].startswith("/") and payload["extra"]["density"]["n_train"] == 64
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(out / "density_controller.pt"), "--env", "fake-road", "--seeds", "7",
                 "--max-episode-steps", "20", "--failure-horizon", "0", "--no-progress", "--out",
                 str(tmp_path / "ev.json")]) == 0  # fmt: skip
    episode = json.loads((tmp_path / "ev.json").read_text())["episodes"][0]
    assert episode["epistemic_var_steer"] > 0
    assert main(["density", "fit", "--ckpt", str(out / "density_controller.pt"), "--out", str(tmp_path / "x")]) == 2
    assert "fit its base's checkpoint" in capsys.readouterr().err
