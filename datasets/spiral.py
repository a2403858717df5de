"""The irregular-spiral toy data of the NSAC paper, regenerated from its recipe (no data file).

Recipe (B) in shared/data/spiral/PROVENANCE.md, from itxwaleedrazzaq/neuronal_stochastic_attention_circuit @ 867c8aa
`Spiral_exp/spiral.py`: t = linspace(0, 2 pi turns, steps), r = t / (2 pi turns), clean (x, y) = (r cos t, r sin t),
identical for every spiral; each spiral adds N(0, noise_std^2) noise drawn spiral by spiral from numpy's legacy RNG
seeded 42 (the paper seeds the global RNG; `RandomState(42)` is the same stream), then is cast to float32. The first
n_train spirals are the training set, the rest the test set; right after the noise, `n_obs` sorted observation
indices are drawn without replacement for the test spirals. Reference values (recorded in PROVENANCE.md and checked
by a test): first training point (0.0248357, -0.0069132), test_idx[:5] = [0, 9, 18, 34, 45].

The paper's evaluation splits the 300-step grid into interpolation (the first int(steps / 3.5) = 85 steps) and
extrapolation (the rest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True)
class SpiralRecipe:
    n_spirals: int = 500
    steps: int = 300
    turns: int = 3
    noise_std: float = 0.05
    n_train: int = 350
    n_obs: int = 50
    seed: int = 42

    @property
    def n_test(self) -> int:
        return self.n_spirals - self.n_train

    @property
    def n_interp(self) -> int:
        """Steps in the interpolation region: the paper's int(steps / 3.5)."""
        return int(self.steps / 3.5)


class Spirals(NamedTuple):
    t: np.ndarray  # (steps,) float64, the time grid
    clean: np.ndarray  # (steps, 2) float64, the noise-free trajectory
    noisy: np.ndarray  # (n_spirals, steps, 2) float32
    test_idx: np.ndarray  # (n_obs,) int64, sorted observation indices of the test spirals


def generate(recipe: SpiralRecipe = SpiralRecipe()) -> Spirals:
    if not 0 < recipe.n_train < recipe.n_spirals:
        raise ValueError(f"n_train={recipe.n_train} must lie strictly between 0 and n_spirals={recipe.n_spirals}")
    if not 0 < recipe.n_obs <= recipe.steps:
        raise ValueError(f"n_obs={recipe.n_obs} must lie in [1, steps={recipe.steps}]")
    rng = np.random.RandomState(recipe.seed)
    t = np.linspace(0, 2 * math.pi * recipe.turns, recipe.steps)
    r = t / (2 * math.pi * recipe.turns)
    clean = np.stack([r * np.cos(t), r * np.sin(t)], axis=-1)  # (steps, 2)
    noisy = np.stack([clean + rng.normal(scale=recipe.noise_std, size=clean.shape) for _ in range(recipe.n_spirals)])
    test_idx = np.array(sorted(rng.choice(recipe.steps, recipe.n_obs, replace=False).tolist()), dtype=np.int64)
    return Spirals(t, clean, noisy.astype(np.float32), test_idx)


def irregular_indices(rng: np.random.Generator, n_series: int, steps: int, n_obs: int, high: int | None = None):
    """Sorted observation indices drawn without replacement, independently per series: (n_series, n_obs).

    `high` restricts the draw to the first `high` steps (training on the interpolation region only).
    """
    high = steps if high is None else high
    if n_obs > high:
        raise ValueError(f"cannot draw {n_obs} distinct observation times from {high} steps")
    keys = rng.random((n_series, high))
    return np.sort(np.argsort(keys, axis=1)[:, :n_obs], axis=1)


def fourier_features(t: np.ndarray, t_max: float, n_freqs: int) -> np.ndarray:
    """u = t / t_max and sin/cos(2^k pi u), k = 0..n_freqs-1 (NeRF-style positional encoding): (N, 1 + 2 n_freqs)."""
    u = np.asarray(t, dtype=np.float64).reshape(-1, 1) / t_max
    freqs = (2.0 ** np.arange(n_freqs)) * math.pi  # (K,)
    return np.concatenate([u, np.sin(u * freqs), np.cos(u * freqs)], axis=1).astype(np.float32)
