"""MC dropout on the FT-Transformer: the backbone's own dropout kept on at prediction time.

Gal & Ghahramani, "Dropout as a Bayesian approximation", ICML 2016. FT-Transformer (agents/ft_transformer.py) is
trained with dropout on the attention weights (p = 0.2), on the ReGLU hidden units (p = 0.1) and, if set, on the
residual branches; MC dropout draws fresh masks m_s in every prediction pass too and returns the S point predictions

    f_{m_s}(x), s = 1..S      mean = 1/S sum_s f_{m_s},   epistemic = 1/S sum_s (f_{m_s} - mean)^2

(aleatoric 0: the study's FT-Transformer is a point predictor, see agents/ft_transformer.py). The training loss is
the plain model's (MSE of one masked pass), so the weights are those of the deterministic model trained the same
way. Masks come from the `generator` (reproducible), in either module mode. Departures: Gal's length-scale prior
term is the optimizer's weight decay; the tokenizer is shared by all passes (it has no dropout, so it runs once).
With dropout on, attention runs as an explicit softmax (SDPA takes no generator), so SA does not apply on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agents.checks import at_least
from agents.ft_transformer import FTController, FTTransformerConfig, Noise


@dataclass(frozen=True)
class FTMCDropoutConfig(FTTransformerConfig):
    n_samples: int = 32
    """Monte-Carlo samples S for a prediction"""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "n_samples")

    def build(self) -> FTMCDropout:
        return FTMCDropout(self)


class FTMCDropout(FTController):
    def __init__(self, cfg: FTMCDropoutConfig):
        if max(cfg.attention_dropout, cfg.ffn_dropout, cfg.residual_dropout) <= 0:
            raise ValueError("MC dropout needs a dropout rate > 0 somewhere in the backbone")
        super().__init__(cfg)
        self.default_samples = cfg.n_samples

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        b = x.shape[0]
        tiled = x.repeat(samples, *([1] * (x.dim() - 1)))  # (S*B, ...): one mask per row
        mu = self.net(tiled, Noise(dropout=True, generator=generator))  # (S*B, D)
        return self.point_moments(mu.view(samples, b, -1))  # (S, B, D)
