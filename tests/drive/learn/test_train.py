"""`drive train`, the generic trainer (exact resume), task plugins and the spiral task."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from agents.encoders import EncoderConfig
from agents.gmle import GMLEConfig
from agents.mc_dropout import MCDropoutConfig
from agents.registry import config_to_dict
from datasets.spiral import SpiralRecipe, fourier_features, generate, irregular_indices
from drive import checkpoint
from drive.errors import UserError
from drive.learn import tasks, trainer
from drive.learn.overrides import apply_overrides, parse_overrides


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- spiral data (recipe B of shared/data/spiral/PROVENANCE.md) --------------------------------------------------------
def test_spiral_generator_reproduces_the_recorded_reference_values():
    data = generate()
    np.testing.assert_allclose(data.noisy[0, 0], [0.0248357, -0.0069132], atol=5e-8)
    assert data.test_idx[:5].tolist() == [0, 9, 18, 34, 45]
    assert data.noisy.shape == (500, 300, 2) and data.noisy.dtype == np.float32
    assert SpiralRecipe().n_interp == 85
    r = np.linalg.norm(data.clean, axis=1)
    np.testing.assert_allclose(r, data.t / data.t[-1], atol=1e-12)  # r grows linearly from 0 to 1
    np.testing.assert_allclose(np.std(data.noisy - data.clean), 0.05, rtol=0.01)


def test_irregular_indices_are_sorted_distinct_in_range_and_seeded():
    a = irregular_indices(np.random.default_rng([0, 3]), 20, 300, 50)
    b = irregular_indices(np.random.default_rng([0, 3]), 20, 300, 50)
    assert np.array_equal(a, b) and a.shape == (20, 50)
    assert all(len(set(row)) == 50 and np.all(np.diff(row) > 0) for row in a)
    assert not np.array_equal(a[0], a[1])  # irregular per series
    assert irregular_indices(np.random.default_rng(1), 5, 300, 10, high=85).max() < 85
    with pytest.raises(ValueError, match="cannot draw"):
        irregular_indices(np.random.default_rng(1), 1, 300, 90, high=85)


def test_fourier_features_give_one_token_per_feature():
    f = fourier_features(np.array([0.0, np.pi]), t_max=2 * np.pi, n_freqs=3)
    assert f.shape == (2, 7)
    np.testing.assert_allclose(f[1], [0.5, 1.0, 0.0, 0.0, 0.0, -1.0, 1.0], atol=1e-6)  # sin, cos(2^k pi / 2)


# -- overrides and task resolution -------------------------------------------------------------------------------------
def test_parse_and_apply_overrides_cast_types_and_name_bad_fields():
    ctrl, task, train = parse_overrides(("n_heads=2", "encoder.d_model=8", "task.n_obs=5", "trainer.patience=3"))
    assert task == {"n_obs": "5"} and train == {"patience": "3"}
    cfg = apply_overrides(GMLEConfig(), ctrl)
    assert cfg.n_heads == 2 and cfg.encoder.d_model == 8 and isinstance(cfg.encoder.d_model, int)
    tcfg = apply_overrides(trainer.TrainerConfig(), {"patience": "3", "progress": "false", "lr": "1e-2"})
    assert tcfg.patience == 3 and tcfg.progress is False and tcfg.lr == pytest.approx(0.01)
    with pytest.raises(ValueError, match="no field 'n_head'"):
        apply_overrides(GMLEConfig(), {"n_head": "2"})
    with pytest.raises(ValueError, match=r"encoder.d_model='x': not a valid int"):
        apply_overrides(GMLEConfig(), {"encoder.d_model": "x"})
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides(("n_heads",))


def test_task_resolution_from_data_argument(tmp_path):
    assert tasks.resolve(None, None) == ("spiral", None)
    assert tasks.resolve(None, str(tmp_path)) == ("demos", tmp_path)
    assert tasks.resolve(None, f"udacity:{tmp_path}") == ("udacity", tmp_path)
    assert tasks.resolve("udacity", f"udacity:{tmp_path}") == ("udacity", tmp_path)
    with pytest.raises(ValueError, match="unknown task"):
        tasks.resolve("mnist", None)
    with pytest.raises(ValueError, match="conflicts"):
        tasks.resolve("spiral", f"udacity:{tmp_path}")


def test_task_options_are_typed_and_named():
    opts = tasks.options("spiral", {"n_obs": "7", "train_region": "interpolation"})
    assert opts.n_obs == 7 and opts.train_region == "interpolation" and opts.noise_std == 0.05
    with pytest.raises(ValueError, match=r"task 'spiral': --set task.n_ob: Options has no field 'n_ob'"):
        tasks.options("spiral", {"n_ob": "10"})
    with pytest.raises(ValueError, match=r"task.n_obs='x': not a valid int"):
        tasks.options("spiral", {"n_obs": "x"})
    with pytest.raises(ValueError, match=r"task.train_region='outer'"):
        tasks.options("spiral", {"train_region": "outer"})
    text = tasks.help_text()
    for name in tasks.TASKS:
        assert f"  {name} (--task {name}; --data " in text
    assert "    task.stride=1  " in text and "use every stride-th step" in text


def test_spiral_task_builds_irregular_epochs():
    data = tasks.load("spiral", tasks.options("spiral", {"n_obs": "10", "n_freqs": "2"}), None, 0)
    assert data.encoder == EncoderConfig(kind="features", in_dim=5, d_model=32) and data.out_dim == 2
    x0, y0 = data.train.tensors
    assert x0.shape == (350 * 10, 5) and y0.shape == (350 * 10, 2)
    data.train.set_epoch(1)
    x1, _ = data.train.tensors
    assert not torch.equal(x0, x1)  # fresh observation times every epoch
    data.train.set_epoch(0)
    assert torch.equal(data.train.tensors[0], x0)  # ... deterministic in (seed, epoch)
    assert len(data.val) == 150 * 10 and data.train.targets.shape == (350 * 300, 2)
    assert len(data.test) == 300 and data.fingerprint["options"]["n_obs"] == 10
    rebuilt = tasks.rebuild(data.fingerprint)
    assert torch.equal(rebuilt.train.tensors[0], x0) and rebuilt.fingerprint == data.fingerprint


# -- the trainer -------------------------------------------------------------------------------------------------------
def _toy(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    y = torch.stack([x[:, 0] - 2 * x[:, 1], x[:, 2] ** 2], -1) * 3 + 10 + 0.1 * torch.randn(n, 2, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _fit(run_dir, epochs=4, resume=False, cfg_cls=MCDropoutConfig, **trainer_kw):
    torch.manual_seed(0)
    model_cfg = cfg_cls(encoder=EncoderConfig(kind="features", in_dim=3, d_model=8), out_dim=2, n_heads=2)
    model = model_cfg.build()
    cfg = trainer.TrainerConfig(epochs=epochs, batch_size=32, lr=3e-3, seed=3, resume=resume, progress=False,
                                tensorboard=True, **{"patience": 0, **trainer_kw})  # fmt: skip
    info = trainer.CheckpointInfo("mcd" if cfg_cls is MCDropoutConfig else "gmle", config_to_dict(model_cfg),
                                  data={"task": "toy"}, target_names=("a", "b"))  # fmt: skip
    return model, trainer.fit(model, _toy(160, 0), _toy(64, 1), cfg, run_dir, info)


def test_trainer_writes_run_directory_and_standardises_targets(tmp_path):
    model, result = _fit(tmp_path / "run", epochs=3)
    run = tmp_path / "run"
    for name in ("config.json", "metrics.jsonl", "best.pt", "last.pt", "resume.pt"):
        assert (run / name).is_file(), name
    assert list((run / "tb").glob("events.out.tfevents.*"))
    lines = [json.loads(s) for s in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in lines] == [1, 2, 3] and result.epochs_run == 3
    assert result.best_val_nll == min(row["val_nll"] for row in lines)
    y = _toy(160, 0).tensors[1]
    torch.testing.assert_close(model.y_loc, y.mean(0))
    torch.testing.assert_close(model.y_scale, y.std(0, unbiased=False))
    loaded, payload = checkpoint.load_controller(result.best_path)
    assert payload["normalisation"]["target_names"] == ["a", "b"] and payload["data"] == {"task": "toy"}
    assert payload["metrics"]["epoch"] == result.best_epoch
    assert json.loads((run / "config.json").read_text())["controller"] == "mcd"
    with pytest.raises(UserError, match="--resume"):
        _fit(run, epochs=3)
    # --resume where no epoch ever finished (killed early): the run starts from the beginning, as if new
    _, fresh = _fit(tmp_path / "empty", resume=True)
    assert fresh.epochs_run == 4 and (tmp_path / "empty" / "resume.pt").is_file()


def test_select_val_mse_keeps_the_epoch_of_the_lowest_validation_mse(tmp_path, monkeypatch):
    """As on CarRacing demonstrations: the validation NLL is lowest after epoch 1 and then jumps while the MSE falls."""
    from drive import metrics

    nll = iter([-1.0, 5.0, 4.0, 3.0] * 2)
    monkeypatch.setattr(metrics, "gaussian_nll", lambda mean, var, y: next(nll))
    _, by_nll = _fit(tmp_path / "nll", epochs=4)
    _, by_mse = _fit(tmp_path / "mse", epochs=4, select="val_mse", patience=2)
    mse = [row["val_mse"] for row in by_mse.history]
    assert by_nll.best_epoch == 1 and by_nll.best_val_nll == -1.0
    assert by_mse.best_epoch == 1 + int(np.argmin(mse)) != 1 and not by_mse.stopped_early
    assert by_mse.best_val_nll == by_mse.history[by_mse.best_epoch - 1]["val_nll"]
    payload = checkpoint.read(by_mse.best_path, kind="controller")
    assert payload["metrics"]["epoch"] == by_mse.best_epoch and payload["metrics"]["val_mse"] == min(mse)
    with pytest.raises(ValueError, match="trainer.select='val_crps' must be one of val_nll, val_mse"):
        _fit(tmp_path / "bad", epochs=1, select="val_crps")  # refused by the config itself, before any fitting
    assert not (tmp_path / "bad").exists()


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    import random

    from drive.learn import rng

    rng.seed_everything(7)
    torch.save(rng.get_state(), tmp_path / "s.pt")
    draws = (torch.rand(3), np.random.rand(3), random.random())
    rng.seed_everything(8)
    rng.set_state(torch.load(tmp_path / "s.pt", weights_only=True))
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(draws[0], again[0]) and np.array_equal(draws[1], again[1]) and draws[2] == again[2]


def test_resume_after_an_interruption_continues_exactly(tmp_path, monkeypatch):
    reference, _ = _fit(tmp_path / "straight", epochs=4)

    # Kill the second run in the middle of epoch 3 (after 2 full epochs = 10 steps, plus 2 more).
    from agents.mc_dropout import MCDropout

    original, calls = MCDropout.loss, {"n": 0}

    def dying_loss(self, x, y):
        calls["n"] += 1
        if calls["n"] == 13:
            raise KeyboardInterrupt
        return original(self, x, y)

    monkeypatch.setattr(MCDropout, "loss", dying_loss)
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path / "killed", epochs=4)
    monkeypatch.setattr(MCDropout, "loss", original)
    state = torch.load(tmp_path / "killed" / "resume.pt", weights_only=True)
    assert state["epoch"] == 2

    # The global RNG now holds the state after building a fresh model, not the one after epoch 2: resume restores it.
    resumed, result = _fit(tmp_path / "killed", epochs=4, resume=True)
    for (k, a), b in zip(reference.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    strip = lambda p: [{k: v for k, v in json.loads(s).items() if k != "seconds"} for s in p.read_text().splitlines()]  # noqa: E731
    assert strip(tmp_path / "killed" / "metrics.jsonl") == strip(tmp_path / "straight" / "metrics.jsonl")
    assert result.epochs_run == 4


# -- the command, in-process -------------------------------------------------------------------------------------------
def test_drive_train_spiral_tiny_run_writes_split_metrics(tmp_path):
    from drive.cli import main

    out = tmp_path / "run"
    argv = ["train", "--controller", "gmle", "--task", "spiral", "--out", str(out), "--epochs", "1",
            "--no-progress", "--set", "encoder.d_model=8", "n_heads=2", "task.n_obs=4", "task.n_freqs=2"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "metrics.json").read_text())
    for split in ("interpolation", "extrapolation"):
        for key in ("mse", "nll", "crps", "ece", "crps_samples", "coverage_90"):
            assert np.isfinite(report[split][key]), (split, key)
        for key in ("mse", "nll", "crps", "ece"):
            assert np.isfinite(report[split]["noisy"][key])
        assert report[split]["noisy"]["mse"] > report[split]["mse"]  # the noisy points carry the 0.05 noise
    assert report["fit"]["epochs_run"] == 1 and report["controller"] == "gmle"
    assert report["ood"]["auroc_epistemic"] == 0.5  # GMLE has no epistemic variance: all ties
    model, payload = checkpoint.load_controller(out / "best.pt")
    assert payload["config"]["encoder"]["d_model"] == 8 and payload["data"]["task"] == "spiral"
    assert dataclasses.asdict(model.cfg.encoder)["in_dim"] == 5

    # The first step of the spiral: 85 interpolation points, 215 extrapolation points of the 300-step grid
    assert report["interpolation"]["n"] == 85 * 2 and report["extrapolation"]["n"] == 215 * 2


def test_resume_refuses_other_settings_and_records_accepted_changes(tmp_path, capsys):
    from drive.cli import main

    run = tmp_path / "run"
    base = ["train", "--controller", "gmle", "--task", "spiral", "--out", str(run), "--epochs", "1", "--no-progress",
            "--set", "task.n_obs=5", "encoder.d_model=8", "n_heads=2", "trainer.tensorboard=false"]  # fmt: skip
    assert main(base) == 0
    best = (run / "best.pt").read_bytes()
    other = [a.replace("task.n_obs=5", "task.n_obs=7") for a in base]
    assert main([*other, "--resume", "--epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert "holds a run with other settings than this command (data.options.n_obs" in err and "Traceback" not in err
    assert (run / "best.pt").read_bytes() == best  # nothing trained, nothing overwritten
    assert main([*other, "--resume", "--epochs", "2", "--resume-with-changes"]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["resumed_with_changes"][0]["changed"] == ["data.options.n_obs", "data.recipe.n_obs"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and rows[-1]["lr"] > 0  # more epochs: the schedule goes on
    assert main([*base, "--resume", "--epochs", "1"]) == 2  # fewer epochs than already planned
    assert "fewer than the run already planned" in capsys.readouterr().err
    resume, best = run / "resume.pt", (run / "best.pt").read_bytes()
    data = bytearray(resume.read_bytes())
    data[len(data) // 3] ^= 0x10  # one changed byte anywhere: refused by the seal, the run left as it was
    resume.write_bytes(bytes(data))
    assert main([*base, "--resume", "--epochs", "3", "--resume-with-changes"]) == 2
    err = capsys.readouterr().err
    assert "resume.pt: not a readable drive checkpoint: corrupt" in err and err.count("\n") == 1
    assert (run / "best.pt").read_bytes() == best and resume.read_bytes() == bytes(data)


def test_a_resume_does_not_count_a_config_field_added_since_as_a_change():
    """A run stored before NSAC's sample count became a config field resumes: the new field at its default is what
    that run used."""
    from agents.nsac import NSACConfig
    from drive.learn.experiment import _stored_config

    now = config_to_dict(NSACConfig())
    then = {k: v for k, v in now.items() if k != "n_samples"}
    assert _stored_config("nsac", then) == now
    assert _stored_config("nsac", {**then, "n_samples": 8})["n_samples"] == 8
    assert _stored_config("no-such", then) == then
