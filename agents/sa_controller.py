"""A trained controller driven with inference-time stochastic attention (SA) at a fixed concentration nu.

Yadav, Adebiyi & Zhang, "Calibrating Scientific Foundation Models with Inference-Time Stochastic Attention" (2026):
the predictive of a trained attention model f is that of M stochastic passes f_nu^(m), each with every attention's
softmax weights pi replaced by c / nu, c ~ Multinomial(nu, pi) (agents/layers/stochastic_attention.py). nu comes from
`drive sa calibrate` (agents/sa.py `calibrate_nu` on the base's validation split), which writes this controller as
`sa_controller.pt`; `drive eval`, `drive bench ...` then drive it like any checkpoint (agents/registry.py WRAPPERS).

With f = the base's `deterministic_pass` (GMLE, DE, DER: their predictive; NSAC: its mean-logit pass), each pass m
gives (mean_m, aleatoric_m, epistemic_m) and `predict(x, M)` combines them by the law of total variance:

    mean          = E_m[mean_m]
    epistemic_var = Var_m[mean_m] + E_m[epistemic_m]      SA's spread + the pass's own (0 for GMLE and NSAC's pass,
                                                          the member disagreement for DE, the NIG closed form for DER)
    aleatoric_var = E_m[aleatoric_m]  (head_variance)     the head's predicted noise, base's temperature included
                  = 0                 (not head_variance)  SA's spread alone, the paper's predictive

The head's noise is kept by default: L_SA tunes the spread to the whole residual, so by the paper's argument it
counts the noise twice, but measured (docs/methods.md, GMLE on UCI Concrete, mean of 3 seeds) the spread alone
covers 54 % of a 90 % interval (NLL 2.61), the spread plus the head's noise 89 % (NLL 0.38; the base alone 82 %,
0.43); `drive sa calibrate` reports both (`test.with_sa`, `test.with_sa_plus_head`). `moments(x, M)` gives each
pass's (mean_m, aleatoric_m + epistemic_m), (M, B, D): the same mean and total variance as `predict`, but
`total_variance` would book the pass's own epistemic share E_m[epistemic_m] as aleatoric, so `predict` combines the
passes itself.

The encoder runs once per call (agents/layers/token_cache.py): the M passes, folded into one batch of M*B rows
(pass-major, in chunks of `batch_size` rows), run the attention and heads alone. Every draw comes from the
generator given, so a seed replays a closed-loop episode bit for bit; the draws are not per lane (`lane_sampling`
False: lanes run one call each). `deterministic_pass` is the base's (SA off); `internals()` is empty (the base's would
be one of M resampled passes). Not trainable: train the base, then calibrate it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agents.base import Controller, Prediction
from agents.checks import at_least
from agents.encoders import EncoderConfig
from agents.layers.stochastic_attention import stochastic_attention
from agents.layers.token_cache import cached_encoders, chunked_pass
from agents.wrapper import Wrapper, derive_from_base


@dataclass(frozen=True)
class SAControllerConfig:
    base: str
    """registry name of the trained controller SA resamples (agents/registry.py CONTROLLERS)"""
    base_config: Any
    """its config (the dataclass; a dict in the checkpoint, rebuilt by agents/registry.py)"""
    nu: int
    """SA's concentration: multinomial draws per attention row (1 = one-hot attention; larger = closer to f)"""
    passes: int = 8
    """stochastic passes M per prediction when the caller names no sample count"""
    head_variance: bool = True
    """aleatoric variance = the head's predicted noise E_m[aleatoric_m]; False: 0 (SA's spread alone)"""
    batch_size: int = 512
    """rows per encoder batch and per SA forward chunk (bounds memory; the draws follow the chunking)"""
    encoder: EncoderConfig = field(init=False)
    """the base's encoder (derived; written for readers of a checkpoint's config, as every controller's is)"""
    out_dim: int = field(init=False)
    """the base's number of targets (derived, as `encoder`)"""

    def __post_init__(self) -> None:
        at_least(self, 1, "nu", "passes", "batch_size")
        derive_from_base(self)

    def build(self) -> SAController:
        return SAController(self)


class SAController(Wrapper):
    #: SA of SA would resample the same attention twice: calibrate the base's checkpoint instead
    sa_refusal = "its predictions are already SA's passes at a fixed nu (calibrate its base controller's checkpoint)"
    made_by = "`drive sa calibrate` it"

    def __init__(self, cfg: SAControllerConfig, base: Controller | None = None):
        """`base`: the trained controller itself (else a fresh one is built from cfg.base_config, for load_state_dict
        to fill)."""
        base = cfg.base_config.build() if base is None else base
        if base.sa_refusal:
            raise ValueError(f"controller {cfg.base!r} refuses SA: {base.sa_refusal}")
        super().__init__(base)
        self.cfg = cfg
        self.default_samples = cfg.passes

    @torch.no_grad()
    def sa_passes(self, x: Tensor, samples: int, generator: torch.Generator | None = None) -> Prediction:
        """The M = samples SA passes of the base's deterministic pass, (M, B, D) each, standardised units."""
        b = len(x)
        with cached_encoders(self.base, self.cfg.batch_size) as tokens:
            t = tokens(x)  # (B, E, T, d): the encoder, once
            tiled = t.repeat(samples, *([1] * (t.dim() - 1)))  # (M*B, E, T, d), pass-major
            with stochastic_attention(self.base, self.cfg.nu, generator):
                p = chunked_pass(self.base, tiled, self.cfg.batch_size)  # (M*B, D) each
        return Prediction(*(v.view(samples, b, -1) for v in p))

    def predict(self, x: Tensor, samples: int | None = None, generator: torch.Generator | None = None) -> Prediction:
        m = self.sa_passes(x, samples or self.default_samples, generator)
        # reduce over a contiguous last axis, as `total_variance` does: a row's result is then batch-size independent
        mean, ale, epi = (v.movedim(0, -1).contiguous() for v in m)  # (B, D, M) each
        spread = mean.var(-1, unbiased=False) if mean.shape[-1] > 1 else torch.zeros_like(mean[..., 0])
        epistemic = spread + epi.mean(-1)
        aleatoric = ale.mean(-1) if self.cfg.head_variance else torch.zeros_like(epistemic)
        scale = self.base.y_scale
        return Prediction(mean.mean(-1) * scale + self.base.y_loc, aleatoric * scale**2, epistemic * scale**2)

    def moments(self, x: Tensor, samples: int = 1, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Each pass's (mean_m, aleatoric_m + epistemic_m), (S, B, D) each, original units (module docstring; without
        head_variance, epistemic_m alone)."""
        m = self.sa_passes(x, samples, generator)
        var = m.aleatoric_var + m.epistemic_var if self.cfg.head_variance else m.epistemic_var
        return m.mean * self.base.y_scale + self.base.y_loc, var * self.base.y_scale**2
