"""ThirdEye: the driving model's attention map, summarised per frame, as a misbehaviour score.

Stocco, Nunes, d'Amorim & Tonella, "ThirdEye: Attention Maps for Safe Autonomous Driving Systems", 37th IEEE/ACM
International Conference on Automated Software Engineering (ASE 2022), doi 10.1145/3551349.3556968. The paper
computes an attention map of the driving model per frame (SmoothGrad, Grad-CAM++, Faster-ScoreCAM) and turns the
stream of maps into a confidence score, either by a summary of each map or by an autoencoder trained on the maps
of nominal driving. We implement the SUMMARY variants, as in their scripts/heatmap.py (in Grewal et al.'s public
code, ast-fortiss-tum/misbehaviour-prediction-with-uncertainty-quantification):

    avg_t      = 1/P sum_p M_t[p]                      the mean attention of frame t ("-avg")
    avg_grad_t = 1/P sum_p |M_t[p] - M_{t-1}[p]|       its change from the previous frame, 0 at t = 0 ("-avg-grad")

(their ICST 2024 runs use SmoothGrad with "-avg-grad", aggregated by max over a window;
drive/studies/misbehaviour/protocol.py applies the windows and the Gamma threshold). The attention map M is Grad-CAM
(Selvaraju et al., ICCV 2017):

    alpha_k = 1/Z sum_ij d y / d A^k_ij,       M = ReLU(sum_k alpha_k A^k)                       (B, 7, 7)

with y the controller's mean steering prediction (action 0) and A the rectified output of the last convolution of
the shared frame CNN (agents/encoders.py FrameTokens.cnn: convolutions at indices 0, 2, 4; A is the ReLU at index 5,
(32, 7, 7) per frame), for the NEWEST frame of the stack. The mean prediction is `model.predict(x)` with a seeded
generator, so sampling methods (MC dropout, SDE-Net, NSAC) give a replayable map; a deep ensemble's first member
(each member has its own encoder, and Grad-CAM reads one); a trained controller driven with SA
(agents/sa_controller.py) its base's map: SA resamples only the attention after the encoder, and its mean is the
base's prediction in expectation (a Grad-CAM through its M resampled passes would be one noisy draw of it).

Departures, and why:
- Grad-CAM instead of their SmoothGrad: it reads the controller's own last convolution (7 x 7 cells of our 84 x 84
  frame) at one backward pass per frame, cheap enough for every step of every run; SmoothGrad needs 20 noisy passes.
- Their saliency target is -steering ("score_when_decrease") with absolute gradients (tf-keras-vis's default
  gradient modifier), which makes the sign irrelevant there; Grad-CAM is signed, so `sign` chooses: +1 (default)
  attends to what raises the steering, -1 to what lowers it (their target).
- Raw Grad-CAM magnitudes, not a map rescaled to [0, 1] per frame: a per-frame rescaling would erase the intensity
  that `avg` measures.
- Steering of a batch: every example's steering depends on its own input only (no batch statistics in our
  controllers), so one backward pass of the summed steering gives each example's gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from agents.encoders import FrameTokens

LAST_CONV, ITS_RELU = 4, 5  # FrameTokens.cnn: Conv2d at 0, 2, 4, each followed by a ReLU


def mean_prediction_path(model: nn.Module, seed: int = 0) -> tuple[FrameTokens, Callable[[Tensor], Tensor]]:
    """The controller's FrameTokens encoder and its mean prediction x -> (B, D) through that encoder."""
    controller: Any = model  # an agents.base.Controller; typed loosely so a stand-in with `predict` works too
    base = getattr(controller, "base", None)
    if isinstance(base, nn.Module) and hasattr(base, "predict"):  # a wrapper of a trained controller (SA)
        return mean_prediction_path(base, seed)
    members = getattr(controller, "members", None)
    if members is not None:  # a deep ensemble: the first member, through its own encoder
        member = members[0]
        encoder = member.backbone.encoder

        def mean(x: Tensor) -> Tensor:
            return member(x)[0] * controller.y_scale + controller.y_loc

    else:
        encoder = getattr(model, "encoder", None)
        if encoder is None:
            encoder = getattr(getattr(model, "backbone", None), "encoder", None)

        def mean(x: Tensor) -> Tensor:
            return controller.predict(x, generator=torch.Generator(device=x.device).manual_seed(seed)).mean

    if not isinstance(encoder, FrameTokens):
        raise ValueError(f"ThirdEye's Grad-CAM needs a controller with a frames encoder, got {type(encoder).__name__}")
    return encoder, mean


def gradcam(model: nn.Module, x: Tensor, output: int = 0, sign: float = 1.0) -> Tensor:
    """(B, 7, 7) Grad-CAM of the mean prediction's `output` (0: steering) x sign on the newest frame of the stack
    x (B, T, 84, 84). Non-negative; parameters' .grad are left untouched."""
    encoder, mean = mean_prediction_path(model)
    conv, relu = encoder.cnn[LAST_CONV], encoder.cnn[ITS_RELU]
    if not (isinstance(conv, nn.Conv2d) and isinstance(relu, nn.ReLU)):
        raise ValueError("FrameTokens.cnn changed: Grad-CAM expects its last Conv2d at index 4, a ReLU at 5")
    captured: list[Tensor] = []
    handle = relu.register_forward_hook(lambda _module, _inputs, out: captured.append(out))
    try:
        with torch.enable_grad():
            y = mean(x)[:, output]  # (B,)
            activation = captured[-1]  # (B*T, C, 7, 7), the last forward through this encoder
            (grads,) = torch.autograd.grad(sign * y.sum(), activation)
    finally:
        handle.remove()
    b, t = x.shape[:2]
    a = activation.detach().unflatten(0, (b, t))[:, -1]  # (B, C, 7, 7), the newest frame
    alpha = grads.unflatten(0, (b, t))[:, -1].mean((-2, -1))  # (B, C)
    return torch.relu((alpha[..., None, None] * a).sum(1))  # (B, 7, 7)


def thirdeye_scores(maps: Tensor | np.ndarray) -> dict[str, np.ndarray]:
    """Per-frame scores of one episode's maps (T, h, w) in time order: "avg" (T,) and "avg_grad" (T,)."""
    m = maps.detach().cpu().numpy() if isinstance(maps, Tensor) else np.asarray(maps)
    m = m.astype(np.float64).reshape(len(m), -1)  # (T, P)
    change = np.abs(np.diff(m, axis=0)).mean(1) if len(m) > 1 else np.zeros(0)  # (T - 1,)
    return {"avg": m.mean(1), "avg_grad": np.concatenate([np.zeros(min(len(m), 1)), change])}
