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

Loss, as the paper's loss section states it and the authors' code (losses.py NSACLoss, NSAC.train_step) computes
it where the extracted text lost the equations; N = n_passes (5, the authors' default) passes on the clean batch
and N on its OOD surrogate, the encoder run once per input (it is deterministic, so this is exact):
    NLL   = Gaussian NLL of y under N(mean_n mu_n, mean_n (sigma_n^2 + var_eps))     the NLL of the mean prediction
    epi_i = mean over targets of Var_n[mu_n] (population variance) for input i, clean and surrogate
    L_reg = log(1 + (epi_id + eps_num) / (epi_ood + reg_eps))      paper: eps_num = 0, epi = batch means of epi_i
    L     = NLL + reg_weight * L_reg                              reg_weight = lambda = 0.5, reg_eps = 1e-3 (authors')

Two changes make the epistemic term mean something; each is one switch, `reg_form=paper reg_pairs=false` is the
paper's term:
1. `reg_form=anchored`: the same eps in the numerator. The paper's term is a ratio, and a ratio is satisfied by
   collapse: once epi_id -> 0 it is 0 whatever epi_ood is, and its push on epi_ood is proportional to epi_id; with
   the 1e-3 dominating a tiny epi_ood it is a pure penalty on the in-distribution variance. With eps on top the
   in-distribution variance is still penalised about as hard (dL/d epi_id = 1 / (epi_id + epi_ood + 2 eps): 500 at
   epi_id = epi_ood = 0, 333 at epi_ood = eps; the paper's ratio gives 1000 and 500 there). What changes is the pull
   on OOD variance: at epi_id = 1e-6, epi_ood = 0, dL/d epi_ood is -500.25 anchored against -1.0 for the ratio, and it
   stays -167 at epi_ood = eps (ratio: -0.25); it fades only once epi_ood clearly exceeds eps (targets are
   standardised: eps = 1e-3 is an epistemic std of 3 % of a target's std). These gradients come from
   `python -c "import torch; a, b = torch.tensor(1e-6, requires_grad=True), torch.tensor(0., requires_grad=True);
   torch.log1p((a + 1e-3) / (b + 1e-3)).backward(); print(a.grad, b.grad)"` (drop the first 1e-3: the ratio).
2. `reg_pairs=true`: the mean over inputs of L_reg of each (clean input, its surrogate) pair instead of L_reg of the
   batch means. The batch-mean ratio is met by a few surrogates with huge variance while most stay at the clean
   level; per pair, every surrogate must out-vary its own clean input.
Measured (docs/nsac_ablation.md, "Why the anchored, per-pair form", with its commands): on the spiral only the
anchored form lifts the extrapolation variance above the aleatoric scale; on CarRacing only the default (anchored,
per pair, input) lifts the epistemic AUROC over held-out camera shifts above the no-regulariser level.

The OOD surrogate (`ood_at=input`, as the authors' code: on the model input). Per input one of two Gaussian
perturbations: additive noise of std ood_scale = 0.3 x the batch's input std (on frames ~0.08 in [0, 1] pixel
units), or a Gaussian gain N(1, 0.5^2) and offset N(0, (0.5 std)^2) per token (per frame of a stack). The paper
says only "generated per head using Gaussian perturbations"; the authors' scripts add N(0, 5^2) to the spiral's raw
time (std 5.4) and N(0, 1e-4^2) to CarRacing pixels in [0, 1], which perturbs nothing. `ood_at=heads` perturbs
each head's slice of the attention input instead (std ood_scale x that head's feature std). What "unlike the
training data" means is set by the surrogate: a shift that neither perturbation resembles (a blur, a hue rotation)
need not raise the epistemic variance, so detection is to be judged on shift families the surrogate does not draw
from (additive noise and gain/offset are its own), reported apart from those it does.
`ood_valid` (default on) rounds and clamps the surrogate of uint8 frames to a valid frame: a float surrogate puts
pixels below 0 and above 255, which no real frame has, and a model can learn to flag those pixels instead of the
perturbation (docs/nsac_ablation.md says what an earlier model learnt instead).

`ood_fit = w` (default 0: the paper's loss) adds w x the Gaussian NLL of the surrogate's mean prediction against the
clean label. The paper's loss fits only the clean batch and asks the passes to disagree on the surrogate, so nothing
keeps their mean — the action — a good action there: on frames like the surrogate it moves with them.
Measured (docs/nsac_ablation.md, "ood_fit: the action under a shift against the signal", with its commands): w = 1 keeps
the action under pixel noise at the cost of the held-out signal; the default stays 0 (the paper's loss) and the shipped
checkpoints/carracing_nsac.pt uses w = 0.1 (its model card has the commands).

Other departures, and why:
- Targets are standardised (base class), so reg_eps and var_eps act in standardised units, not raw ones.
- The attention layer's own departures (input-dependent gates, noise scale 1) are in its docstring. With a single
  token the softmax has one key and every pass is the same: NSAC's epistemic variance needs at least two tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from agents.base import Controller, Prediction, gaussian_nll
from agents.checks import at_least, heads_divide, in_range, one_of, positive
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
    n_passes: int = 5
    """N, stochastic passes per loss evaluation on the clean batch and on its OOD surrogate (authors' default 5)"""
    reg_weight: float = 0.5
    """lambda, the weight of the epistemic regulariser L_reg (authors' 0.5; 0 = the ablation without it)"""
    reg_eps: float = 1e-3
    """epsilon of L_reg's denominator (authors' 1e-3; in standardised target units here)"""
    reg_form: Literal["anchored", "paper"] = "anchored"
    """paper: log(1 + epi_id / (epi_ood + eps)); anchored: eps in the numerator too (see the module docstring)"""
    reg_pairs: bool = True
    """False: L_reg of the batch means (paper); True: the mean over inputs of L_reg of each clean / surrogate pair"""
    var_eps: float = 1e-3
    """added to every pass's variance inside the NLL (authors' 1e-3)"""
    ood_at: Literal["heads", "input"] = "input"
    """where the OOD surrogate is built: on the model input (authors' code), or per head on the attention input"""
    ood_scale: float = 0.3
    """std of the additive Gaussian perturbation (OOD surrogate) in units of the perturbed features' std"""
    ood_gain: float = 0.5
    """input surrogate: std of a Gaussian gain N(1, ood_gain^2) per sample and token (a frame's contrast)"""
    ood_offset: float = 0.5
    """input surrogate: std of a Gaussian offset per sample and token, in units of the input std (its brightness)"""
    ood_noise_share: float = 0.5
    """input surrogate: share of the samples given additive noise (the others get gain/offset)"""
    ood_scale_min: float = 1.0
    """input surrogate: each noisy sample's std is ood_scale x U(ood_scale_min, 1) (1: always ood_scale)"""
    ood_valid: bool = True
    """input surrogate: keep it a valid input of x's dtype (uint8 frames: rounded, clamped to [0, 255]); False: the
    raw float surrogate, whose out-of-range pixels the network learns to flag instead of the perturbation"""
    ood_fit: float = 0.0
    """weight of the NLL of the surrogate's mean prediction against the clean label (0: the paper's loss, which
    fits the clean batch only): the passes may disagree off-distribution, their mean must still drive"""
    n_samples: int = 32
    """stochastic samples S of the attention head for a prediction (`predict` without a count); checkpoints saved
    before this field existed load with this default, the count they predicted with"""

    def __post_init__(self):
        heads_divide(self, self.encoder.d_model)
        at_least(self, 1, "out_dim", "n_samples")
        at_least(
            self, 0, "top_k", "noise_scale", "reg_weight", "var_eps", "ood_scale", "ood_gain", "ood_offset", "ood_fit"
        )
        at_least(self, -1, "time_feature")
        in_range(self, "wiring_seed", 0, 2**32 - 8)  # numpy seeds; each wiring adds up to 3
        positive(self, "reg_eps")
        in_range(self, "sparsity", 0.1, 0.9)
        in_range(self, "ood_noise_share", 0, 1)
        in_range(self, "ood_scale_min", 0, 1)
        if self.backbone_units and self.backbone_units < 6:  # AutoNCP: 3 motor neurons need units - 2 > 3
            raise ValueError(f"NSACConfig.backbone_units={self.backbone_units} must be 0 (auto) or >= 6")
        if self.n_passes < 1 or (self.reg_weight > 0 and self.n_passes < 2):
            raise ValueError(
                f"NSACConfig.n_passes={self.n_passes}: need >= 2 passes when reg_weight > 0 "
                "(with one pass the epistemic variances are 0 and L_reg vanishes)"
            )
        one_of(self, "ood_at", ("heads", "input"))
        one_of(self, "reg_form", ("anchored", "paper"))
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
    lane_sampling = True  # agents/lane_noise.py
    internal_batch_axes: ClassVar[dict[str, int]] = {"attention": 1}
    internal_head_axes: ClassVar[dict[str, int]] = {
        "kappa": 0,
        "phi": 0,
        "psi": 0,
        "mu": 0,
        "sigma2": 0,
        "attention": 1,
        "ou_time": 0,
        "keys": 0,
    }
    internal_indices: ClassVar[tuple[str, ...]] = ("keys",)

    def __init__(self, cfg: NSACConfig):
        super().__init__(cfg.out_dim)
        self.cfg = cfg
        self.default_samples = cfg.n_samples
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

    def _encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The encoder's tokens (B, T, d), computed once for all samples, and the attention's normalised input."""
        tokens = self.encoder(x)
        return tokens, self.norm(tokens)

    def _attend(
        self,
        x: Tensor,
        tokens: Tensor,
        normed: Tensor,
        samples: int,
        generator: torch.Generator | None,
        sample: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """Standardised per-sample moments (S, B, D) each from the attention over `normed` (B, T, d)."""
        readout = (self.pool_identity, self.pool_identity.new_zeros(len(self.pool_identity)))
        pooled = self.attention(normed, samples, generator, self._times(x), readout, sample)  # (S, B, 2d)
        mu_out, s_out = pooled.chunk(2, dim=-1)  # (S, B, d) each
        base = tokens.mean(1)  # (B, d): the residual path
        mu = self.mean_head(self.mean_readout.pooled(base + mu_out))  # (S, B, D)
        log_std = self.log_std_head(self.log_std_readout.pooled(base + s_out))  # (S, B, D)
        return mu, torch.exp(2 * log_std.clamp(LOG_STD_MIN, LOG_STD_MAX))

    def head(
        self, x: Tensor, samples: int, generator: torch.Generator | None = None, sample: bool = True
    ) -> tuple[Tensor, Tensor]:
        """Standardised per-sample moments (S, B, D) each; sample=False: the mean-logit pass (S = 1, no noise)."""
        tokens, normed = self._encode(x)
        return self._attend(x, tokens, normed, samples, generator, sample)

    def ood_inputs(self, x: Tensor) -> Tensor:
        """The OOD surrogate on the model input, per sample one of two Gaussian perturbations (ood_noise_share of the
        batch in expectation gets the first): x + s xi, xi ~ N(0, I) per element, s = ood_scale U(ood_scale_min, 1)
        std(x); or x g + o with a gain g ~ N(1, ood_gain^2) and an offset o ~ N(0, (ood_offset std(x))^2) per sample
        and token (each frame of a stack); uint8 inputs stay uint8-valid (rounded, clamped) unless ood_valid=False."""
        xf = x.float()
        std = xf.std()
        shape = (*xf.shape[:2], *([1] * (xf.dim() - 2))) if xf.dim() >= 3 else (xf.shape[0], 1)
        gain = 1 + self.cfg.ood_gain * torch.randn(shape, dtype=xf.dtype, device=xf.device)
        offset = self.cfg.ood_offset * std * torch.randn(shape, dtype=xf.dtype, device=xf.device)
        per_sample = (xf.shape[0], *([1] * (xf.dim() - 1)))  # (B, 1, ...)
        scale = self.cfg.ood_scale * std
        if self.cfg.ood_scale_min < 1:  # (drawn only then: the default keeps the random stream of earlier runs)
            low = self.cfg.ood_scale_min
            scale = scale * (low + (1 - low) * torch.rand(per_sample, device=xf.device))
        noisy = xf + scale * torch.randn_like(xf)
        pick = torch.rand(per_sample, device=xf.device) < 1 - self.cfg.ood_noise_share
        out = torch.where(pick, xf * gain + offset, noisy)
        if self.cfg.ood_valid and x.dtype == torch.uint8:
            out = out.round().clamp(0, 255)
        return out

    def ood_tokens(self, normed: Tensor) -> Tensor:
        """The OOD surrogate per head: each head's slice of the attention input (B, T, H, d/H) plus Gaussian noise
        of std ood_scale x that head's feature std over the batch."""
        heads = normed.unflatten(-1, (self.cfg.n_heads, -1))  # (B, T, H, dh)
        std = heads.detach().transpose(0, 2).flatten(1).std(1).view(1, 1, -1, 1)  # (1, 1, H, 1)
        return (heads + self.cfg.ood_scale * std * torch.randn_like(heads)).flatten(-2)  # (B, T, d)

    def _moments(self, x: Tensor, samples: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        return self.head(x, samples, generator)

    def deterministic_pass(self, x: Tensor) -> Prediction:
        """The mean-logit pass (no OU noise), standardised units: what SA resamples the attention of. Its noise
        variance carries the aleatoric temperature, as `predict`'s does (and every other method's pass)."""
        mu, var = self.head(x, 1, sample=False)  # (1, B, D) each
        return Prediction(mu[0], var[0] * self.aleatoric_temperature**2, torch.zeros_like(mu[0]))

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        cfg, n = self.cfg, self.cfg.n_passes
        tokens, normed = self._encode(x)  # the encoder is deterministic: once for all passes, clean and OOD
        mu, var = self._attend(x, tokens, normed, n, None)  # (N, B, D)
        nll = gaussian_nll(mu.mean(0), (var + cfg.var_eps).mean(0), y)  # the NLL of the N passes' mean prediction
        if cfg.reg_weight == 0:
            self.last_loss = {"nll": nll.item()}
            return nll
        if cfg.ood_at == "input":
            x_ood = self.ood_inputs(x)
            tokens_ood, normed_ood = self._encode(x_ood)
            mu_ood, var_ood = self._attend(x_ood, tokens_ood, normed_ood, n, None)
        else:
            mu_ood, var_ood = self._attend(x, tokens, self.ood_tokens(normed), n, None)
        epi_id, epi_ood = mu.var(0, unbiased=False).mean(-1), mu_ood.var(0, unbiased=False).mean(-1)  # (B,) each
        if not cfg.reg_pairs:
            epi_id, epi_ood = epi_id.mean(), epi_ood.mean()
        floor = cfg.reg_eps if cfg.reg_form == "anchored" else 0.0
        reg = torch.log1p((epi_id + floor) / (epi_ood + cfg.reg_eps)).mean()
        epi_id, epi_ood = epi_id.mean(), epi_ood.mean()
        parts = {"nll": nll, "reg": reg, "epi_id": epi_id, "epi_ood": epi_ood}
        loss = nll + cfg.reg_weight * reg
        if cfg.ood_fit > 0:  # the surrogate's mean prediction fitted to the clean label as well
            parts["nll_ood"] = gaussian_nll(mu_ood.mean(0), (var_ood + cfg.var_eps).mean(0), y)
            loss = loss + cfg.ood_fit * parts["nll_ood"]
        self.last_loss = {k: v.item() for k, v in parts.items()}
        return loss

    def internals(self) -> dict[str, Tensor]:
        """kappa, phi, psi, mu, sigma2 (logit mean/var), keys (B, H, n, K); attention (S, B, H, n, K); ou_time, the
        OU integration time t per head (1|B, H, 1, 1|n)."""
        out = self.attention.internals()
        if "t" in out:
            out["ou_time"] = out.pop("t")
        return out
