"""The SA controller: M passes of the base's deterministic pass at nu, combined by the law of total variance, against an
independent recomputation (no token cache); replayable per seed; the encoder once per call; a checkpoint round trip
through the normal loader; refused bases refused in one line."""

from __future__ import annotations

import pytest
import torch

from agents.encoders import EncoderConfig
from agents.ensemble import EnsembleConfig
from agents.evidential import EvidentialConfig
from agents.gmle import GMLEConfig
from agents.layers.stochastic_attention import stochastic_attention
from agents.mc_dropout import MCDropoutConfig
from agents.nsac import NSACConfig
from agents.registry import config_from_dict, config_to_dict
from agents.sa_controller import SAController, SAControllerConfig
from agents.sde_net import SDENetConfig
from drive import checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

ENC = EncoderConfig(kind="features", in_dim=3, d_model=16)
BASES = {
    "gmle": GMLEConfig(encoder=ENC, out_dim=2, n_heads=2),
    "nsac": NSACConfig(encoder=ENC, out_dim=2, n_heads=2),
    "de": EnsembleConfig(encoder=ENC, out_dim=2, n_heads=2, n_members=2),
    "der": EvidentialConfig(encoder=ENC, out_dim=2, n_heads=2),
}
B, M, NU = 5, 6, 3


def sa_controller(name: str, **options) -> SAController:
    torch.manual_seed(0)
    model = SAControllerConfig(name, BASES[name], NU, passes=M, **options).build().eval()
    model.set_target_stats(torch.tensor([5.0, -1.0]), torch.tensor([2.0, 0.5]))  # off-centre: units are checked
    model.set_aleatoric_temperature(torch.tensor([1.5, 0.8]))
    return model


def inputs(n: int = B) -> torch.Tensor:
    return torch.randn(n, ENC.in_dim, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", sorted(BASES))
def test_predict_is_the_law_of_total_variance_over_sa_passes(name):
    model, x = sa_controller(name), inputs()
    base = model.base
    with torch.no_grad(), stochastic_attention(base, NU, torch.Generator().manual_seed(11)):
        p = base.deterministic_pass(x.repeat(M, 1))  # the encoder on all M*B rows: no token cache
    mean, ale, epi = (v.view(M, B, -1) for v in p)  # (M, B, D) standardised
    scale, loc = base.y_scale, base.y_loc
    got = model.predict(x, None, torch.Generator().manual_seed(11))
    torch.testing.assert_close(got.mean, mean.mean(0) * scale + loc, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.epistemic_var, (mean.var(0, unbiased=False) + epi.mean(0)) * scale**2,
                               rtol=1e-4, atol=1e-9)  # fmt: skip
    torch.testing.assert_close(got.aleatoric_var, ale.mean(0) * scale**2, rtol=1e-5, atol=1e-9)
    # moments: per pass, the same mean and total variance
    mu, var = model.moments(x, M, torch.Generator().manual_seed(11))
    assert mu.shape == var.shape == (M, B, 2)
    torch.testing.assert_close(mu.mean(0), got.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(var.mean(0) + mu.var(0, unbiased=False), got.total_var, rtol=1e-4, atol=1e-9)
    spread = SAController(SAControllerConfig(name, BASES[name], NU, passes=M, head_variance=False), base=base)
    alone = spread.predict(x, None, torch.Generator().manual_seed(11))
    assert torch.equal(alone.mean, got.mean) and torch.equal(alone.epistemic_var, got.epistemic_var)
    assert (alone.aleatoric_var == 0).all()


def test_deterministic_per_seed_and_epistemic_where_the_nsac_pass_has_none():
    model, x = sa_controller("nsac"), inputs()
    a = model.predict(x, None, torch.Generator().manual_seed(7))
    b = model.predict(x, None, torch.Generator().manual_seed(7))
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    c = model.predict(x, None, torch.Generator().manual_seed(8))
    assert not torch.equal(a.mean, c.mean)
    with torch.no_grad():
        assert (model.base.deterministic_pass(x).epistemic_var == 0).all()  # the mean-logit pass
        assert (model.deterministic_pass(x).epistemic_var == 0).all()  # SA off
    assert (a.epistemic_var > 0).all()


@pytest.mark.parametrize("name", ["nsac", "de"])
def test_the_encoder_runs_once_per_call(name):
    model, x = sa_controller(name), inputs()
    encoders = [m for n, m in model.base.named_modules() if n.endswith("encoder")]
    calls = []
    for enc in encoders:
        enc.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    model.predict(x, 16, torch.Generator().manual_seed(0))
    assert calls == [B] * len(encoders)  # once per encoder, on the B inputs, not the 16 * B pass rows
    assert [m for n, m in model.base.named_modules() if n.endswith("encoder")] == encoders  # put back


def test_a_checkpoint_round_trip_through_the_normal_loader(tmp_path):
    model, x = sa_controller("nsac"), inputs()
    cfg = config_to_dict(model.cfg)
    assert cfg["encoder"] == config_to_dict(ENC) and cfg["out_dim"] == 2  # what readers of a checkpoint look up
    assert config_from_dict("sa", cfg) == model.cfg
    path = checkpoint.save(tmp_path / "sa.pt", kind="controller", name="sa", config=cfg, module=model)
    loaded, payload = checkpoint.load_controller(path)
    assert isinstance(loaded, SAController) and loaded.default_samples == M and not loaded.training
    for u, v in zip(loaded.predict(x, None, torch.Generator().manual_seed(2)),
                    model.predict(x, None, torch.Generator().manual_seed(2)), strict=True):  # fmt: skip
        assert torch.equal(u, v)
    assert torch.equal(loaded.base.aleatoric_temperature, torch.tensor([1.5, 0.8]))
    assert torch.equal(loaded.y_loc, loaded.base.y_loc)


@pytest.mark.parametrize(
    ("name", "cfg", "why"),
    [
        ("mcd", MCDropoutConfig(encoder=ENC, out_dim=2, n_heads=2), "MC dropout draws a dropout mask"),
        ("sdenet", SDENetConfig(encoder=ENC, out_dim=2, n_heads=2), "SDE-Net integrates"),
    ],
)
def test_controllers_that_refuse_sa_stay_refused(name, cfg, why, tmp_path):
    with pytest.raises(ValueError, match=f"controller '{name}' refuses SA: {why}") as err:
        SAControllerConfig(name, cfg, NU).build()
    assert "\n" not in str(err.value)
    # a hand-made SA checkpoint of one: the loader's one-line error
    config = {**config_to_dict(SAControllerConfig("gmle", BASES["gmle"], NU)), "base": name,
              "base_config": config_to_dict(cfg)}  # fmt: skip
    path = checkpoint.save(tmp_path / "x.pt", kind="controller", name="sa", config=config, module=cfg.build())
    with pytest.raises(checkpoint.CheckpointError, match="refuses SA") as err:
        checkpoint.load_controller(path)
    assert "\n" not in str(err.value)


def test_sa_of_sa_is_refused():
    inner = config_to_dict(SAControllerConfig("gmle", BASES["gmle"], NU))
    with pytest.raises(ValueError, match="base 'sa' is none of"):
        config_from_dict("sa", {**inner, "base": "sa", "base_config": inner})
    assert SAController.sa_refusal and "already SA" in SAController.sa_refusal
