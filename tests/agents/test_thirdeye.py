"""ThirdEye: Grad-CAM on the shared frame CNN of every frames controller, and the per-frame summaries."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from agents.base import Prediction
from agents.encoders import EncoderConfig, FrameTokens
from agents.monitors.thirdeye import gradcam, mean_prediction_path, thirdeye_scores
from agents.registry import CONTROLLERS
from agents.sa_controller import SAControllerConfig

FRAMES = EncoderConfig(kind="frames", n_tokens=4, d_model=16)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class BrightnessSteer(nn.Module):
    """Steering = the sum of a FrameTokens encoder with constant positive weights: it grows with brightness
    everywhere alike, so Grad-CAM's map is the last feature map, bright where the frame is bright."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = FrameTokens(EncoderConfig(kind="frames", n_tokens=2, d_model=4))
        for m in self.encoder.cnn:
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.constant_(m.weight, 0.01)
                nn.init.zeros_(m.bias)

    def predict(self, x: Tensor, samples: int | None = None, generator: torch.Generator | None = None) -> Prediction:
        steer = self.encoder(x).sum((1, 2))[:, None]  # (B, 1)
        return Prediction(steer, torch.zeros_like(steer), torch.zeros_like(steer))


def _patch(top: int, left: int) -> Tensor:
    frame = torch.zeros(84, 84, dtype=torch.uint8)
    frame[top : top + 16, left : left + 16] = 255
    return frame


def test_the_map_peaks_at_the_bright_patch_of_the_newest_frame():
    # a final cell (i, j) sees input rows and columns [8i, 8i + 36): a patch at the top right lights cells (0..1, 5..6)
    x = torch.stack([torch.stack([_patch(68, 0), _patch(0, 68)]), torch.stack([_patch(0, 68), _patch(68, 0)])])
    maps = gradcam(BrightnessSteer(), x)  # (2, 7, 7); stack 0's newest frame: top right; stack 1's: bottom left
    assert maps.shape == (2, 7, 7) and bool((maps >= 0).all())
    (r0, c0), (r1, c1) = (divmod(int(m.argmax()), 7) for m in maps)
    assert r0 <= 1 and c0 >= 5, (r0, c0)
    assert r1 >= 5 and c1 <= 1, (r1, c1)
    assert float(gradcam(BrightnessSteer(), x, sign=-1.0).max()) == 0.0  # nothing lowers this steering


@pytest.mark.parametrize("name", ["nsac", "gmle", "mcd", "de", "der", "sdenet"])
def test_gradcam_on_every_frames_controller(name):
    torch.manual_seed(0)
    model = CONTROLLERS[name](encoder=FRAMES, out_dim=3, n_heads=2).build().eval()
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    maps = gradcam(model, x)
    assert maps.shape == (3, 7, 7) and bool((maps >= 0).all()) and bool(torch.isfinite(maps).all())
    assert maps.sum() > 0 or gradcam(model, x, sign=-1.0).sum() > 0  # one direction of the steering has support
    torch.testing.assert_close(gradcam(model, x), maps, rtol=0, atol=0)  # replayable, sampling methods included
    assert all(p.grad is None for p in model.parameters())
    encoder, _ = mean_prediction_path(model)
    assert isinstance(encoder, FrameTokens)


def test_an_sa_controller_gets_its_base_map():
    torch.manual_seed(0)
    model = SAControllerConfig("nsac", CONTROLLERS["nsac"](encoder=FRAMES, out_dim=3, n_heads=2), nu=2).build().eval()
    x = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(gradcam(model, x), gradcam(model.base, x), rtol=0, atol=0)
    assert mean_prediction_path(model)[0] is model.base.encoder


def test_a_controller_without_frames_is_refused():
    model = CONTROLLERS["gmle"](encoder=EncoderConfig(kind="features", in_dim=3, d_model=16), out_dim=3).build()
    with pytest.raises(ValueError, match="frames encoder"):
        gradcam(model, torch.zeros(2, 3))


def test_scores_average_and_average_change():
    maps = np.stack([np.zeros((7, 7)), np.ones((7, 7)), np.full((7, 7), 3.0)])  # (T, 7, 7)
    scores = thirdeye_scores(torch.as_tensor(maps))
    np.testing.assert_allclose(scores["avg"], [0.0, 1.0, 3.0])
    np.testing.assert_allclose(scores["avg_grad"], [0.0, 1.0, 2.0])  # 0 at the first frame, as ThirdEye
    assert thirdeye_scores(maps[:1])["avg_grad"].tolist() == [0.0]
