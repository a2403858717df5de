"""NSAC controller: shared encoder -> NSAC stochastic attention -> pooled Gaussian readout.

Razzaq et al., "Neuronal Stochastic Attention Circuit for Probabilistic Representation Learning". The attention layer
(agents/layers/nsac_attention.py) turns every attention logit into the closed-form state of an Ornstein-Uhlenbeck
process with input-dependent gates kappa, phi, psi and samples it; its output per token is [mu_out ; s_out]
(mean and log-std features, 2 d wide). Around it the controller is the baselines' block with the attention swapped,
so a comparison changes exactly one thing:

    tokens = encoder(x)                                         (B, T, d), computed once for all S samples
    m_s, r_s = mean_tokens(NSACAttention_s(LN(tokens)))         (S, B, d) each: the mu_out and s_out halves
    mean_s   = W_m GELU(A_m LN(mean_tokens(tokens) + m_s))      residual + TokenReadout, as the baselines
    logstd_s = W_s GELU(A_s LN(mean_tokens(tokens) + r_s))      clamped to [-7, 7]; sigma_s^2 = exp(2 logstd_s)

so each stochastic pass s gives a Gaussian N(mean_s, sigma_s^2) per target; the base class turns S passes into mean,
aleatoric E_s[sigma_s^2] and epistemic Var_s[mean_s]. Everything between the softmax and the token mean is linear,
so the layer pools each sample in one batched matmul (its `readout` path); only the small readout runs per sample.
(An earlier version read mean and log-std out linearly: the prediction was then a convex combination of linear maps
of the frame tokens — it could not form differences between frames, cloned worse and drove far worse.)

Loss (exact form), with N = n_passes >= 2 stochastic passes on the clean batch x and N on a perturbed copy:
    NLL   = mean over passes, batch and targets of the Gaussian NLL of y under N(mu_s, sigma_s^2)
    x_ood = x + ood_scale * std(x) * xi,  xi ~ N(0, I)      (std over the whole batch: one setting suits standardised
                                                            features and raw pixels alike)
    epi   = mean over batch and targets of Var_s[mu_s]      (unbiased, over the N passes), on x and on x_ood
    L_reg = 0.5 * log(1 + epi_id / (epi_ood + 1e-3))        the authors' regulariser: small when the perturbed
                                                            inputs get more epistemic variance than the clean ones
    L     = NLL + reg_weight * L_reg
With N = 1 both variances are 0 and L_reg vanishes identically; the config refuses n_passes < 2 when reg_weight > 0.

Departures from the paper and the authors' code: see the attention layer's docstring (input-dependent gates, noise
scale 1 by default). The OOD surrogate scale is ours (the paper only says "Gaussian perturbations"). With a single
token (e.g. one scalar input with the `features` encoder) the softmax has one key and every pass is the same:
NSAC's epistemic variance needs at least two tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from agents.base import Controller, Prediction, gaussian_nll
from agents.encoders import EncoderConfig, build_encoder
from agents.layers.attention import TokenReadout
from agents.layers.nsac_attention import NSACAttention

LOG_STD_MIN, LOG_STD_MAX = -7.0, 7.0


@dataclass(frozen=True)
class NSACConfig:
    encoder: EncoderConfig = EncoderConfig()
    """input encoder (shared backbone)"""
    out_dim: int = 1
    """number of regression targets"""
    n_heads: int = 4
    """attention heads (d_model must be divisible by it)"""
    top_k: int = 8
    """keys per query in the sparse top-K pairwise scheme; 0 = every key (dense)"""
    sparsity: float = 0.5
    """NCP wiring sparsity (ncps AutoNCP sparsity_level, 0.1-0.9)"""
    backbone_units: int = 0
    """neurons of the NCP backbone (inter + command + 3 motor); 0 = the head width, at least 16"""
    wiring_seed: int = 22222
    """seed of the NCP wirings (the masks are part of the model)"""
    noise_scale: float = 1.0
    """factor on the OU noise std; 1 = the paper's variance (the authors' code used 0.1, 1e-4 on CarRacing)"""
    time_feature: int = -1
    """input feature holding each token's time stamp t_sample (features/sequence encoders); -1 = no time (t = 1)"""
    n_passes: int = 2
    """stochastic passes per loss evaluation (>= 2 when reg_weight > 0: the regulariser needs a variance)"""
    reg_weight: float = 0.1
    """lambda, the weight of the epistemic regulariser L_reg"""
    ood_scale: float = 0.5
    """std of the Gaussian input perturbation (OOD surrogate) in units of the batch's input std"""

    def __post_init__(self):
        d, h = self.encoder.d_model, self.n_heads
        if h < 1 or d % h:
            raise ValueError(f"NSACConfig.n_heads={h} must divide encoder.d_model={d}")
        if self.top_k < 0:
            raise ValueError(f"NSACConfig.top_k={self.top_k} must be >= 0 (0 = dense)")
        if not 0.1 <= self.sparsity <= 0.9:
            raise ValueError(f"NSACConfig.sparsity={self.sparsity} must be in [0.1, 0.9]")
        if self.n_passes < 1 or (self.reg_weight > 0 and self.n_passes < 2):
            raise ValueError(
                f"NSACConfig.n_passes={self.n_passes}: need >= 2 passes when reg_weight > 0 "
                "(with one pass the epistemic variances are 0 and L_reg vanishes)"
            )
        if self.noise_scale < 0 or self.ood_scale < 0 or self.reg_weight < 0:
            raise ValueError("NSACConfig.noise_scale, ood_scale and reg_weight must be >= 0")
        if self.time_feature >= 0:
            if self.encoder.kind not in ("features", "sequence"):
                raise ValueError(
                    f"NSACConfig.time_feature applies to features/sequence encoders, not {self.encoder.kind!r}"
                )
            if self.time_feature >= self.encoder.in_dim:
                raise ValueError(f"NSACConfig.time_feature={self.time_feature} >= encoder.in_dim={self.encoder.in_dim}")

    def build(self) -> NSAC:
        return NSAC(self)


class NSAC(Controller):
    default_samples = 32
    internal_batch_axes: ClassVar[dict[str, int]] = {"attention": 1}
    internal_head_axes: ClassVar[dict[str, int]] = {
        "kappa": 0, "phi": 0, "psi": 0, "mu": 0, "sigma2": 0, "attention": 1, "ou_time": 0, "keys": 0,
    }  # fmt: skip
    internal_indices: ClassVar[tuple[str, ...]] = ("keys",)

    def __init__(self, cfg: NSACConfig):
        super().__init__(cfg.out_dim)
        self.cfg = cfg
        d = cfg.encoder.d_model
        self.encoder = build_encoder(cfg.encoder)
        self.norm = nn.LayerNorm(d)
        self.attention = NSACAttention(
            d, cfg.n_heads, cfg.top_k or None, cfg.sparsity, cfg.backbone_units, cfg.noise_scale, cfg.wiring_seed
        )
        self.mean_readout, self.log_std_readout = TokenReadout(d), TokenReadout(d)
        self.mean_head = nn.Linear(d, cfg.out_dim)
        self.log_std_head = nn.Linear(d, cfg.out_dim)
        # the layer's pooled path with an identity readout: the token-mean of [mu_out ; s_out] per sample
        self.register_buffer("pool_identity", torch.eye(2 * d), persistent=False)
        self.last_loss: dict[str, float] = {}

    def _times(self, x: Tensor) -> Tensor | None:
        if self.cfg.time_feature < 0:
            return None
        return x[..., self.cfg.time_feature]  # features: (B,) for every token; sequence: (B, T)

    def head(
        self, x: Tensor, n_samples: int, generator: torch.Generator | None = None, sample: bool = True
    ) -> tuple[Tensor, Tensor]:
        """Standardised per-sample moments (S, B, D) each; sample=False: the mean-logit pass (S = 1, no noise)."""
        tokens = self.encoder(x)  # (B, T, d), once for all samples
        readout = (self.pool_identity, self.pool_identity.new_zeros(len(self.pool_identity)))
        pooled = self.attention(self.norm(tokens), n_samples, generator, self._times(x), readout, sample)  # (S, B, 2d)
        mu_out, s_out = pooled.chunk(2, dim=-1)  # (S, B, d) each
        base = tokens.mean(1)  # (B, d): the residual path
        mu = self.mean_head(self.mean_readout.pooled(base + mu_out))  # (S, B, D)
        log_std = self.log_std_head(self.log_std_readout.pooled(base + s_out))  # (S, B, D)
        return mu, torch.exp(2 * log_std.clamp(LOG_STD_MIN, LOG_STD_MAX))

    def _moments(self, x: Tensor, n_samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        return self.head(x, n_samples, generator)

    def deterministic_pass(self, x: Tensor) -> Prediction:
        """The mean-logit pass (no OU noise), standardised units: what SA resamples the attention of."""
        mu, var = self.head(x, 1, sample=False)  # (1, B, D) each
        return Prediction(mu[0], var[0], torch.zeros_like(mu[0]))

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        n = self.cfg.n_passes
        mu, var = self._moments(x, n, None)  # (N, B, D)
        nll = gaussian_nll(mu, var, y.expand_as(mu))
        if self.cfg.reg_weight == 0:
            self.last_loss = {"nll": nll.item()}
            return nll
        xf = x.float()
        x_ood = xf + self.cfg.ood_scale * xf.std() * torch.randn_like(xf)
        mu_ood, _ = self._moments(x_ood, n, None)
        epi_id, epi_ood = mu.var(0).mean(), mu_ood.var(0).mean()
        reg = 0.5 * torch.log1p(epi_id / (epi_ood + 1e-3))
        parts = {"nll": nll, "reg": reg, "epi_id": epi_id, "epi_ood": epi_ood}
        self.last_loss = {k: v.item() for k, v in parts.items()}
        return nll + self.cfg.reg_weight * reg

    def internals(self) -> dict[str, Tensor]:
        """kappa, phi, psi, mu, sigma2 (logit mean/var), keys (B, H, n, K); attention (S, B, H, n, K); ou_time, the
        OU integration time t per head (1|B, H, 1, 1|n)."""
        out = self.attention.internals()
        if "t" in out:
            out["ou_time"] = out.pop("t")
        return out
