"""`drive export`: the exported mean pass equals PyTorch's within 1e-5 (ONNX through onnxruntime, TorchScript),
the sampled pass draws from the same predictive, and a controller that cannot export says so in one line."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from agents.encoders import EncoderConfig
from agents.registry import CONTROLLERS
from drive import checkpoint
from drive.cli import main
from drive.learn import export
from tests.conftest import REPO

SHIPPED = REPO / "checkpoints" / "carracing_nsac.pt"


def _require(module: str):
    try:
        return __import__(module)
    except ImportError:
        extra = "minari" if module == "minari" else "export"
        msg = f"{module} is not installed (pip install -c constraints.txt -e '.[{extra}]')"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def _small(name: str):
    encoder = EncoderConfig(kind="features", in_dim=3, d_model=16)
    torch.manual_seed(0)
    model = CONTROLLERS[name](encoder=encoder, out_dim=2).build().eval()
    model.set_target_stats(torch.tensor([1.0, -2.0]), torch.tensor([2.0, 0.5]))  # the folded-in units are checked too
    return model, encoder


def _torch_mean_pass(model, x):
    with torch.no_grad():
        p = model.deterministic_pass(x)
    return p.mean * model.y_scale + model.y_loc, p.aleatoric_var * model.y_scale**2


def test_the_shipped_nsac_mean_pass_in_onnxruntime_matches_pytorch(tmp_path, one_thread):
    ort = _require("onnxruntime")
    _require("onnxscript")
    out = tmp_path / "nsac.onnx"
    assert main(["export", "--ckpt", str(SHIPPED), "--format", "onnx", "--out", str(out)]) == 0
    model, payload = checkpoint.load_controller(SHIPPED)
    x = export.example_input(EncoderConfig(**payload["config"]["encoder"]), batch=5, seed=11)  # uint8 frame stacks
    assert x.dtype == torch.uint8 and x.shape[1:] == (4, 84, 84)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got_mean, got_aleatoric, got_epistemic = session.run(list(export.OUTPUTS), {"x": x.numpy()})
    mean, aleatoric = _torch_mean_pass(model, x)
    assert got_mean.shape == (5, 3)
    np.testing.assert_allclose(got_mean, mean.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(got_aleatoric, aleatoric.numpy(), rtol=1e-5, atol=1e-7)
    assert np.all(got_epistemic == 0)  # the mean pass draws nothing


@pytest.mark.parametrize("name", ["gmle"])
def test_onnx_mean_pass_parity_on_other_controllers(name, tmp_path, one_thread):
    ort = _require("onnxruntime")
    _require("onnxscript")
    model, encoder = _small(name)
    export.export(model, encoder, "onnx", tmp_path / "m.onnx")
    x = export.example_input(encoder, batch=9, seed=3)
    [got, *_] = ort.InferenceSession(str(tmp_path / "m.onnx")).run(list(export.OUTPUTS), {"x": x.numpy()})
    np.testing.assert_allclose(got, _torch_mean_pass(model, x)[0].numpy(), rtol=0, atol=1e-5)


def test_torchscript_nsac_mean_pass_runs_the_real_kernels_equal(tmp_path, one_thread):
    model, encoder = _small("nsac")
    export.export(model, encoder, "torchscript", tmp_path / "m.pt")
    result = export.check(model, encoder, tmp_path / "m.pt", "torchscript")
    assert result.deterministic and result.max_abs_diff < 1e-5, result


def test_a_sampled_pass_draws_from_the_same_predictive(tmp_path, one_thread):
    model, encoder = _small("mcd")
    export.export(model, encoder, "torchscript", tmp_path / "m.pt", "samples", 64)
    result = export.check(model, encoder, tmp_path / "m.pt", "torchscript", "samples", 64)
    assert not result.deterministic and result.mean_gap_se < 5.0, result  # a wrong graph is many SE off


def test_a_controller_that_cannot_export_says_why(tmp_path, one_thread):
    model, encoder = _small("ft-swag")  # samples weights through torch.func.functional_call: no tracer takes it
    with pytest.raises(export.ExportError, match="TorchScript trace failed"):
        export.export(model, encoder, "torchscript", tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize("missing", ["onnx", "onnxscript", "onnxruntime"])
def test_onnx_without_the_export_extra_says_what_to_install(missing, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, missing, None)  # `import onnx` raises ImportError, as without the extra
    out = tmp_path / "nsac.onnx"
    assert main(["export", "--ckpt", str(SHIPPED), "--format", "onnx", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"drive export: error: --format onnx needs onnx, onnxscript and onnxruntime ({missing} is missing): "
                   "pip install -e '.[export]' (the `export` extra)"]  # fmt: skip
    assert not out.exists()


def test_minari_export_holds_the_recorded_episodes(tmp_path):
    _require("minari")
    from datasets.demonstrations import Demonstrations
    from drive.loop.collect import CollectOptions, collect
    from drive.observe.demonstrations import recorder_for

    data = tmp_path / "demos"
    collect(CollectOptions(out=data, env="fake-road", expert="pursuit", seeds="0-1", max_episode_steps=40,
                           min_return=0.0, action_noise=0.1, progress=False), recorder_for)  # fmt: skip
    args = ["export", "--format", "minari", "--data", str(data), "--out", str(tmp_path / "m"), "--dataset-id"]
    args.append("drive/fake-road/demos-v0")
    assert main(args) == 0
    assert main(args) == 2  # never over an existing dataset
    os.environ["MINARI_DATASETS_PATH"] = str(tmp_path / "m")
    try:
        import minari

        episodes = list(minari.load_dataset("drive/fake-road/demos-v0").iterate_episodes())
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    for got, mine in zip(episodes, Demonstrations(data), strict=True):
        np.testing.assert_array_equal(got.observations[:-1], mine.stacks())
        np.testing.assert_array_equal(got.actions, mine.action)
        np.testing.assert_allclose(got.infos["label"][:-1], mine.label)
        np.testing.assert_allclose(got.rewards, mine.reward, rtol=1e-6)
