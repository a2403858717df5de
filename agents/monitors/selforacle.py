"""SelfOracle: a variational autoencoder's reconstruction error on camera frames as a misbehaviour score.

Stocco, Weiss, Calzana & Tonella, "Misbehaviour Prediction for Autonomous Driving Systems", ICSE 2020. A VAE is
trained on frames of nominal driving only; at run time the score of a frame x (pixels in [0, 1]) is

    score(x) = 1/P sum_p (x_p - x_hat_p)^2,        x_hat = decoder(z),   z from the encoder's q(z | x)

(their `test_on_batch(x)[1]`, the per-image mean squared error; models named "track1-MSE-latent2" in Grewal et al.'s
code, ast-fortiss-tum/misbehaviour-prediction-with-uncertainty-quantification). Training minimises, per batch,

    L = mean_p (x_p - x_hat_p)^2 + kl_weight * mean_j -1/2 (1 + log s_j^2 - m_j^2 - s_j^2)

(their `vae_loss`: the pixel mean of the squared error plus the latent mean of the KL divergence to N(0, I), "50 %
rec + 50 % KL"; kl_weight = 0 is their "MSE" compile, the loss Grewal et al.'s SelfOracle checkpoint trained on).
The alarm threshold is the ppf of a Gamma distribution fitted to nominal scores at a confidence level (their
`get_threshold`: zeros removed, scipy.stats.gamma.fit(floc=0)); it lives in the study
(`drive.studies.misbehaviour.protocol.gamma_threshold`), which agents/ may not import.

Departures, and why:
- Input: our coded frame, uint8 (84, 84) grayscale, the newest frame of the controller's stack, so the monitor sees
  exactly what the controller sees; theirs is the 80x160 RGB crop of the Udacity camera.
- A small convolutional VAE (3 strided convolutions, a linear latent of `latent_dim`, 3 transposed convolutions,
  sigmoid output) in place of their one-hidden-layer MLP (512 units) on flattened pixels: fewer parameters on our
  frames (7k pixels -> 512 x 7k weights), the same latent size (2) by default.
- The score decodes the posterior MEAN z = m(x); their score passes one sampled z, so it is stochastic. A mean gives
  a replayable score; training still samples z (reparameterisation) with the fit's seeded generator.
- Adam (their MSE compile; their VAE compile uses Adadelta).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FRAME = 84  # the coded frame's side (datasets/frames.py)


@dataclass(frozen=True)
class SelfOracleConfig:
    latent_dim: int = 2
    """latent dimensions (their 'latent2')"""
    width: int = 32
    """channels of the first convolution (then 2 x, 2 x)"""
    kl_weight: float = 1.0
    """weight of the KL term (1: their VAE loss; 0: their 'MSE' loss)"""
    init_seed: int = 0
    """seed of the weight initialisation (drawn apart from the global RNG)"""

    def __post_init__(self) -> None:
        if self.latent_dim < 1 or self.width < 1 or self.kl_weight < 0:
            raise ValueError(f"SelfOracleConfig needs latent_dim, width >= 1 and kl_weight >= 0, got {self}")


class SelfOracle(nn.Module):
    def __init__(self, cfg: SelfOracleConfig = SelfOracleConfig()):
        super().__init__()
        self.cfg = cfg
        c = cfg.width
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.init_seed)
            self.encoder = nn.Sequential(
                nn.Conv2d(1, c, 4, stride=2, padding=1),
                nn.ReLU(),  # 84 -> 42
                nn.Conv2d(c, 2 * c, 4, stride=2, padding=1),
                nn.ReLU(),  # 42 -> 21
                nn.Conv2d(2 * c, 2 * c, 3, stride=2, padding=1),
                nn.ReLU(),  # 21 -> 11
                nn.Flatten(),
            )
            self.posterior = nn.Linear(2 * c * 11 * 11, 2 * cfg.latent_dim)
            self.decoder = nn.Sequential(
                nn.Linear(cfg.latent_dim, 2 * c * 11 * 11),
                nn.ReLU(),
                nn.Unflatten(1, (2 * c, 11, 11)),
                nn.ConvTranspose2d(2 * c, 2 * c, 3, stride=2, padding=1),
                nn.ReLU(),  # 11 -> 21
                nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1),
                nn.ReLU(),  # 21 -> 42
                nn.ConvTranspose2d(c, 1, 4, stride=2, padding=1),
                nn.Sigmoid(),  # 42 -> 84
            )

    @staticmethod
    def pixels(frames: Tensor) -> Tensor:
        """uint8 (B, 84, 84), or a frame stack (B, T, 84, 84) whose newest frame is used -> float (B, 1, 84, 84)."""
        if frames.dim() == 4:
            frames = frames[:, -1]
        if frames.shape[-2:] != (FRAME, FRAME) or frames.dim() != 3:
            raise ValueError(f"SelfOracle takes coded frames (B, {FRAME}, {FRAME}), got {tuple(frames.shape)}")
        return frames.unsqueeze(1).float() / 255.0

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:  # (B, 1, 84, 84) -> mean, log variance (B, latent)
        mean, log_var = self.posterior(self.encoder(x)).chunk(2, dim=-1)
        return mean, log_var

    def loss(self, frames: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The training loss of a batch: pixel-mean squared error + kl_weight x latent-mean KL (scalar)."""
        x = self.pixels(frames)
        mean, log_var = self.encode(x)
        eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        x_hat = self.decoder(mean + torch.exp(0.5 * log_var) * eps)
        kl = -0.5 * (1 + log_var - mean**2 - log_var.exp()).mean()
        return F.mse_loss(x_hat, x) + self.cfg.kl_weight * kl

    @torch.no_grad()
    def score(self, frames: Tensor) -> Tensor:
        """(B,) reconstruction error per frame, the mean squared error over its pixels, decoded from z = m(x)."""
        x = self.pixels(frames)
        x_hat = self.decoder(self.encode(x)[0])
        return (x_hat - x).pow(2).flatten(1).mean(1)

    def fit(
        self,
        frames: Tensor,
        epochs: int = 10,
        batch_size: int = 64,
        lr: float = 1e-3,
        seed: int = 0,
        on_epoch: Callable[[int, float], None] | None = None,
    ) -> list[float]:
        """Train on nominal frames (N, 84, 84) uint8; shuffling and latent noise from a Generator(seed). Returns the
        mean loss of each epoch; `on_epoch(epoch, loss)` after each (progress)."""
        device = next(self.parameters()).device
        frames, generator = frames.to(device), torch.Generator(device=device).manual_seed(seed)
        optimizer = torch.optim.Adam(self.parameters(), lr=lr)
        history = []
        self.train()
        for _ in range(epochs):
            order = torch.randperm(len(frames), generator=generator, device=device)
            total = 0.0
            for batch in order.split(batch_size):
                loss = self.loss(frames[batch], generator)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += loss.item() * len(batch)
            history.append(total / len(frames))
            if on_epoch is not None:
                on_epoch(len(history), history[-1])
        self.eval()
        return history

    # -- save / load: plain tensors and primitives ---------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"config": dataclasses.asdict(self.cfg), "state_dict": self.state_dict()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SelfOracle:
        model = cls(SelfOracleConfig(**state["config"]))
        model.load_state_dict(state["state_dict"])
        return model.eval()

    def save(self, path: str | Path) -> None:
        torch.save(self.state(), path)

    @classmethod
    def load(cls, path: str | Path) -> SelfOracle:
        return cls.from_state(torch.load(path, weights_only=True, map_location="cpu"))
