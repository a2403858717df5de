"""NSAC attention: the stochastic attention layer of "Neuronal Stochastic Attention Circuit for Probabilistic
Representation Learning" (Razzaq et al.), built on Neural Circuit Policies wirings (Lechner et al. 2020, `ncps`).

Per head h (width d_h = d_model / H), query token i and selected key j:

    q, k, v  = NN_sensory(x)                      sparse linear maps (masks: sensory -> inter synapses of an NCP)
    u_ij     = [q_i ; k_j]                        only for the top-K keys j of query i by score q_i . k_j
    z_ij     = NN_backbone(u_ij)                  NCP-wired feed-forward pass inter -> command -> motor (3 motors)
    kappa    = softplus(z_0) + kappa_min  > 0     mean-reversion rate
    phi      = tanh(z_1)                          long-term mean
    psi      = softplus(z_2) + psi_min    > 0     noise
    t_h      = sigmoid(-t_a[h] * t_sample + t_b[h])      t_a, t_b learnable; t_sample = 1 unless the input has time
    da = kappa (phi - a) dt + psi dW,  a(0) = 0, gates frozen on [0, t_h], closed form (`ou_moments`):
        mu     = phi (1 - exp(-kappa t))
        sigma2 = psi^2 (1 - exp(-2 kappa t)) / (2 kappa)  * noise_scale^2
    a_ij = mu_ij + sigma_ij eps_ij,  eps ~ N(0, 1) iid per logit and sample;  alpha_i = softmax_j(a_i.)
    out_i = sum_j alpha_ij v_j;  heads concatenated and projected to 2 d_model = [mu_out ; s_out] (mean, log-std)

Departures from the authors' public code, and why:
- The backbone is a masked feed-forward pass (tanh units) through the inter, command and motor layers of an ncps
  AutoNCP wiring, masks held as buffers. The authors run it as one step of a recurrent cell from a zero state, which
  makes kappa, phi, psi input-independent constants; the paper describes input-dependent gates, which we implement.
  The command layer's recurrent synapses have no role in a single feed-forward pass and are left out.
- noise_scale defaults to 1, the paper's OU variance; the authors' code multiplies the noise by 0.1 (1e-4 in their
  CarRacing run) without saying so.
- kappa and psi carry small floors so they stay > 0 in float32, where softplus underflows to exactly 0.
- The OU integration time is one learnable scalar pair (t_a[h], t_b[h]) per head, shared by every (query, key) pair
  of that head. The authors' code computes t_a and t_b per pair (from the pair's backbone output, like the gates).
  Per head keeps t an interpretable per-head horizon (the recorder's `ou_time`) and costs nothing per pair; the
  paper's equations do not say which.
- The top-K keys are chosen exactly (the K highest q.k scores per query, `top_k_indices`). The authors' code finds
  them with an approximate block search; ours is exact so that K = n reproduces the dense layer bit for bit.
- Sizes are ours: the backbone has max(16, d_h) neurons by default (ncps AutoNCP: 40 % of the non-motor neurons are
  command neurons; Lechner et al.'s driving NCP had 19 neurons), shared by the heads; the sensory projections keep
  1 - sparsity of their d x d synapses (ncps NCP sensory -> inter wiring with d inter neurons).

Speed and memory (see `drive bench attention`; the CPU-lean kernels are in agents/layers/nsac_kernels.py):
- Top-K keys are chosen from q.k scores computed without autograd in query chunks (at most `score_chunk` scores
  at a time) by `top_k_indices` (exact, ties to the lower key index), so no n x n tensor is kept for the backward
  pass and the n x n pairwise inputs [q_i; k_j] are never built: the first backbone layer is split,
  W [q; k] = W_q q + W_k k, each term computed once per token and gathered per pair. Everything saved for the
  backward pass is O(n K). Key slots are ordered by score (highest first); with K >= n every key is taken in key
  order by the dense code path itself, so K = n is exactly (bit for bit) the dense computation.
- The wired layers run feature-major (neurons x pairs), where the products with a few neurons are fast and each
  gate is a contiguous row, as one autograd node (`PairGates`: in-place forward, hand-written backward).
- Per-pair tensors are laid out (B, H, S, K, n): the softmax over keys is a vectorised reduction over rows. The S
  samples share the gates; the noise for all S is drawn in one op in that layout (without autograd: in place).
- Per-token outputs mix the values one key slot at a time (`MixKeys`: K multiply-adds of gathered (dh, B H n)
  rows, hand-written backward), so the (dh, B, H, K, n) gathered values are never materialised.
- Everything after the softmax is linear. With `readout` (weight (P, 2d), bias (P,) of a linear map applied to the
  token-mean of the output) the token-mean is taken before the maps: per (batch, head) one (S, K n) x (K n, F)
  product, where F = P when the value, output and readout maps folded into one P-vector per key are narrower than
  a head (P <= d/H), else F = d/H and the folded (P, d) map follows. Exact, not an approximation.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from ncps.wirings import NCP, AutoNCP
from torch import Tensor, nn

from agents.lane_noise import lane_noise
from agents.layers.nsac_kernels import MixKeys, PairGates, top_k_indices


def ou_moments(kappa: Tensor, phi: Tensor, psi: Tensor, t: Tensor | float) -> tuple[Tensor, Tensor]:
    """Mean and variance at time t of da = kappa (phi - a) dt + psi dW, a(0) = 0 (expm1: exact for small kappa t)."""
    t = torch.as_tensor(t, dtype=kappa.dtype, device=kappa.device)
    decay = -torch.expm1(-kappa * t)  # 1 - e^{-kt}
    mu = phi * decay
    var = psi.square() * (decay * (2 - decay)) / (2 * kappa)  # 1 - e^{-2kt} = (1 - e^{-kt})(1 + e^{-kt})
    return mu, var


def sensory_mask(n_in: int, n_out: int, sparsity: float, seed: int) -> Tensor:
    """(n_out, n_in) 0/1 mask: the sensory -> inter synapses of an NCP wiring with n_out inter neurons."""
    fanout = max(1, round(n_out * (1 - sparsity)))
    wiring = NCP(n_out, 1, 1, fanout, 1, 0, 1, seed=seed)  # one command and one motor neuron: only the inputs matter
    wiring.build(n_in)
    inter = wiring.get_neurons_of_layer(0)
    return torch.tensor(wiring.sensory_adjacency_matrix[:, inter] != 0, dtype=torch.float32).T


def backbone_masks(n_in: int, units: int, n_motor: int, sparsity: float, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """Masks (out, in) of an AutoNCP wiring: sensory -> inter, inter -> command, command -> motor."""
    wiring = AutoNCP(units, n_motor, sparsity_level=sparsity, seed=seed)
    wiring.build(n_in)
    inter, command, motor = (wiring.get_neurons_of_layer(i) for i in range(3))
    adj, sens = wiring.adjacency_matrix != 0, wiring.sensory_adjacency_matrix != 0
    masks = sens[:, inter], adj[np.ix_(inter, command)], adj[np.ix_(command, motor)]
    return tuple(torch.tensor(m, dtype=torch.float32).T for m in masks)  # type: ignore[return-value]


class MaskedLinear(nn.Module):
    """y = x (W * mask)^T + b with a fixed wiring mask (a buffer); init uniform(+-1/sqrt(fan-in within the mask))."""

    def __init__(self, mask: Tensor, bias: bool = True):
        super().__init__()
        self.register_buffer("mask", mask)
        bound = mask.sum(1, keepdim=True).clamp_min(1).rsqrt()  # (out, 1)
        self.weight = nn.Parameter((torch.rand(mask.shape) * 2 - 1) * bound)
        self.bias = nn.Parameter(torch.zeros(mask.shape[0])) if bias else None

    def masked_weight(self) -> Tensor:
        return self.weight * self.mask

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.masked_weight(), self.bias)


def key_rows(idx: Tensor, n: int) -> Tensor:
    """Flat row of token-major (B, n, H, .) data for every selected key: idx (B, H, K, n) -> (B*H*K*n,)."""
    b, h = idx.shape[:2]
    offset = torch.arange(b, device=idx.device).view(b, 1, 1, 1) * (n * h)
    return (idx * h + offset + torch.arange(h, device=idx.device).view(1, h, 1, 1)).reshape(-1)


def gather_keys(per_key: Tensor, idx: Tensor) -> Tensor:
    """per_key (B, n, H, F) token-major and key indices idx (B, H, K, n) -> (B, H, K, n, F) = per_key[b, idx, h]."""
    b, n, h, f = per_key.shape
    return per_key.reshape(b * n * h, f).index_select(0, key_rows(idx, n)).view(*idx.shape, f)


class NSACAttention(nn.Module):
    """NSAC multi-head self-attention. (B, n, d) -> (S, B, n, 2d), or (S, B, P) with a folded pooled `readout`."""

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        top_k: int | None = 8,
        sparsity: float = 0.5,
        backbone_units: int = 0,
        noise_scale: float = 1.0,
        seed: int = 22222,
        kappa_min: float = 1e-3,
        psi_min: float = 1e-4,
        score_chunk: int = 1 << 18,
    ):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        if not 0.1 <= sparsity <= 0.9:
            raise ValueError(f"sparsity={sparsity} must be in [0.1, 0.9] (ncps AutoNCP sparsity_level)")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k={top_k} must be >= 1 (or None for all keys)")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.top_k, self.noise_scale, self.score_chunk = top_k, noise_scale, score_chunk
        self.kappa_min, self.psi_min = kappa_min, psi_min
        self.q_proj, self.k_proj, self.v_proj = (
            MaskedLinear(sensory_mask(d_model, d_model, sparsity, seed + i)) for i in range(3)
        )
        units = backbone_units or max(16, self.d_head)
        m1, m2, m3 = backbone_masks(2 * self.d_head, units, 3, sparsity, seed + 3)
        self.inter, self.command, self.motor = MaskedLinear(m1), MaskedLinear(m2), MaskedLinear(m3)
        self.t_a = nn.Parameter(torch.zeros(n_heads))
        self.t_b = nn.Parameter(torch.zeros(n_heads))
        self.out_proj = nn.Linear(d_model, 2 * d_model)
        #: set by `agents.layers.stochastic_attention` to resample the attention weights (SA); None = off
        self.sa_resample: Callable[[Tensor], Tensor] | None = None
        self._last: dict[str, Tensor] = {}

    # -- pieces ----------------------------------------------------------------------------------------------------
    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sensory projections in one product: x (B, n, d) -> q, k, v (B, n, H, dh) each, token-major."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([p.masked_weight() for p in projs])  # (3d, d)
        qkv = F.linear(x, weight, torch.cat([p.bias for p in projs]))  # (B, n, 3d)
        return qkv.unflatten(-1, (3, self.n_heads, self.d_head)).unbind(-3)

    @torch.no_grad()
    def select_keys(self, q: Tensor, k: Tensor) -> Tensor:
        """Top-K keys per query by q.k, highest score first (ties: lower key index). q, k (B, n, H, dh) -> idx
        (B, H, K, n). With K >= n every key is taken, in key order (so K = n is exactly the dense computation)."""
        b, n, h, _ = q.shape
        n_keys = min(self.top_k, k.shape[1])
        if n_keys == k.shape[1]:
            return torch.arange(n_keys, device=q.device).view(1, 1, n_keys, 1).expand(b, h, n_keys, n).contiguous()
        q, k_t = q.transpose(1, 2), k.permute(0, 2, 3, 1).contiguous()  # (B, H, n, dh), (B, H, dh, n)
        rows = max(1, self.score_chunk // (b * h * k.shape[1]))
        parts = [top_k_indices(q[:, :, s : s + rows] @ k_t, n_keys) for s in range(0, n, rows)]
        return torch.cat(parts, 2).transpose(-1, -2).contiguous()  # (B, H, K, n)

    def gates(self, q: Tensor, k: Tensor, idx: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """kappa, phi, psi (B, H, K, n) of the pairs (query i, key idx[.., k, i]); idx None = every key."""
        b, n, h, dh = q.shape
        w = self.inter.masked_weight()  # (I, 2 dh): [q; k] split, each half applied once per token
        queries = q.transpose(1, 2).reshape(-1, dh).T  # (dh, B*H*n)
        per_query = torch.addmm(self.inter.bias.unsqueeze(1), w[:, :dh], queries).view(-1, b, h, n)  # (I, B, H, n)
        per_key = w[:, dh:] @ k.reshape(-1, dh).T  # (I, B*n*H): token-major key rows
        rows = None if idx is None else key_rows(idx, n)
        weights = (self.command.masked_weight(), self.command.bias, self.motor.masked_weight(), self.motor.bias)
        return PairGates.apply(per_key, per_query, rows, *weights, self.kappa_min, self.psi_min)

    def time(self, t_sample: Tensor | None, b: int) -> Tensor:
        """t = sigmoid(-t_a t_sample + t_b) per head: (1, H, 1, 1), or (B, H, 1, n|1) from t_sample (B,), (B, n)."""
        t_a, t_b = self.t_a.view(1, -1, 1, 1), self.t_b.view(1, -1, 1, 1)
        if t_sample is None:
            return torch.sigmoid(t_b - t_a)
        if t_sample.shape[0] != b or t_sample.dim() > 2:
            raise ValueError(f"t_sample must be (B,) or (B, n) with B={b}, got {tuple(t_sample.shape)}")
        return torch.sigmoid(-t_a * t_sample.reshape(b, 1, 1, -1).to(t_a.dtype) + t_b)

    def sample_logits(self, mu: Tensor, var: Tensor, samples: int, generator: torch.Generator | None) -> Tensor:
        """a = mu + noise_scale sigma eps, eps ~ N(0, 1) iid. mu, var (B, H, ..) -> (B, H, S, ..), S in one draw."""
        eps = lane_noise((*mu.shape[:2], samples, *mu.shape[2:]), generator, 0, dtype=mu.dtype, device=mu.device)
        std = (var.sqrt() * self.noise_scale).unsqueeze(2)
        if torch.is_grad_enabled() and (mu.requires_grad or var.requires_grad):
            return torch.addcmul(mu.unsqueeze(2), std, eps)
        return torch.addcmul(mu.unsqueeze(2), std, eps, out=eps)  # no graph: in place, no second S-sized tensor

    # -- forward ---------------------------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        samples: int = 1,
        generator: torch.Generator | None = None,
        t_sample: Tensor | None = None,
        readout: tuple[Tensor, Tensor] | None = None,
        sample: bool = True,
    ) -> Tensor:
        """x (B, n, d) -> (S, B, n, 2d) = [mu_out ; s_out] per token; with readout (W (P, 2d), c (P,)): the map
        y = W mean_tokens(out) + c, (S, B, P). sample=False uses the mean logits mu (S = 1, no noise)."""
        b, n, _ = x.shape
        q, k, v = self.project(x)  # (B, n, H, dh) each
        every_key = self.top_k is None or self.top_k >= n  # K >= n: the dense computation itself
        idx = None if every_key else self.select_keys(q, k)  # (B, H, K, n); None: key slot k = key k
        kappa, phi, psi = self.gates(q, k, idx)  # (B, H, K, n)
        t = self.time(t_sample, b)
        mu, var = ou_moments(kappa, phi, psi, t)
        logits = self.sample_logits(mu, var, samples, generator) if sample else mu.unsqueeze(2)  # (B, H, S, K, n)
        alpha = torch.softmax(logits, dim=-2)  # over keys
        if self.sa_resample is not None:
            alpha = self.sa_resample(alpha.transpose(-1, -2)).transpose(-1, -2)
        keys = torch.arange(n, device=x.device).view(1, 1, n, 1).expand(b, self.n_heads, n, n) if idx is None else idx
        last = {"kappa": kappa, "phi": phi, "psi": psi, "mu": mu, "var": var, "attention": alpha, "keys": keys, "t": t}
        self._last = {name: value.detach() for name, value in last.items()}  # views: no copy, no graph kept
        if readout is None:
            return self._mix_tokens(alpha, v, idx)
        return self._mix_pooled(alpha, v, idx, *readout)

    @staticmethod
    def _pick(per_key: Tensor, idx: Tensor) -> Tensor:
        """per_key (B, n, H, F) token-major -> (F, B, H, K, n) = per_key[b, idx, h], feature-major (whole-row
        index_select forward, index_add backward: much faster than gathering F-wide token-major rows)."""
        b, n, h, f = per_key.shape
        return per_key.reshape(-1, f).T.contiguous().index_select(1, key_rows(idx, n)).view(f, *idx.shape)

    def _mix_tokens(self, alpha: Tensor, v: Tensor, idx: Tensor | None) -> Tensor:
        b, h, s, n_keys, n = alpha.shape
        if idx is None:  # key k is key k for every query: (S, n_k)^T x (n_k, dh) per (batch, head)
            heads = (alpha.transpose(-1, -2) @ v.permute(0, 2, 1, 3).unsqueeze(2)).permute(4, 0, 1, 2, 3)
        else:
            rows = key_rows(idx, n).view(b, h, n_keys, n).permute(2, 0, 1, 3).reshape(n_keys, -1)  # (K, B H n)
            heads = MixKeys.apply(alpha, v.reshape(-1, self.d_head).T.contiguous(), rows)
        # heads (dh, B, H, S, n) -> (S, B, n, H dh)
        return self.out_proj(heads.permute(3, 1, 4, 2, 0).reshape(s, b, n, self.d_model))  # (S, B, n, 2d)

    def _mix_pooled(self, alpha: Tensor, v: Tensor, idx: Tensor | None, weight: Tensor, bias: Tensor) -> Tensor:
        b, h, s, n_keys, n = alpha.shape
        p = weight.shape[0]
        folded = weight @ self.out_proj.weight  # (P, d): output and readout maps in one
        fold = p <= self.d_head  # mix P-vectors per key (values folded through the maps) or the dh-wide values
        per_key = (v.unsqueeze(-2) @ folded.view(p, h, self.d_head).permute(1, 2, 0)).squeeze(-2) if fold else v
        if idx is None:  # every query sees every key: the weight each key receives, summed over queries
            weights, values = alpha.sum(-1), per_key.transpose(1, 2)  # (B, H, S, n), (B, H, n, F)
        else:
            weights = alpha.reshape(b, h, s, n_keys * n)
            values = self._pick(per_key, idx).flatten(3).permute(1, 2, 3, 0)  # (B, H, K n, F), a view
        mixed = weights @ values  # (B, H, S, F): summed over queries and key slots
        pooled = mixed.sum(1) if fold else mixed.transpose(1, 2).reshape(b, s, self.d_model) @ folded.T  # (B, S, P)
        return pooled.transpose(0, 1) / n + (weight @ self.out_proj.bias + bias)  # (S, B, P)

    def internals(self) -> dict[str, Tensor]:
        """The last forward, detached: kappa, phi, psi, mu, sigma2 (logit mean/var), keys (B, H, n, K);
        attention (S, B, H, n, K); t (1|B, H, 1, 1|n). Key slot k of query i is key `keys[.., i, k]`."""
        last = dict(self._last)
        if not last:
            return {}
        last["sigma2"] = last.pop("var") * self.noise_scale**2
        attention = last.pop("attention").permute(2, 0, 1, 4, 3)  # (B, H, S, K, n) -> (S, B, H, n, K)
        out = {name: value if name == "t" else value.transpose(-1, -2) for name, value in last.items()}
        return {**out, "attention": attention}
