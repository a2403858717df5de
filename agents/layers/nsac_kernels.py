"""CPU-lean pieces of NSAC attention (agents/layers/nsac_attention.py): the same functions, computed with fewer passes.

- `tanh_`: tanh(x) = 2 sigmoid(2x) - 1, in place. An exact identity; torch's CPU tanh is about ten times slower than
  its sigmoid on this machine (1.05 ms vs 0.11 ms for 0.5 M floats), so the wired layers use this form. The result
  differs from torch.tanh only by float rounding (absolute error < 3e-7 in float32).
- `top_k_indices`: the K largest scores per row, largest first, ties to the lower index. Each float32 score is mapped
  to an int64 whose order is the float order, with the column index in the low bits, so one `amax` per slot finds
  both the best remaining score and where it is; the slot is then knocked out. K vectorised passes over the row
  beat torch.topk's per-row partial sort for the small rows here (~1.5 ms vs 5.4 ms at B=32, H=4, n=64, K=8) and
  select exactly the same scores. Long rows, many slots or other dtypes use torch.topk.
- `PairGates`: the wired backbone over the selected (query, key) pairs as one autograd node: inter = tanh(W_k k_j +
  W_q q_i + b), command = tanh(W_c inter + b_c), z = W_m command + b_m, kappa = softplus(z_0) + kappa_min,
  phi = tanh(z_1), psi = softplus(z_2) + psi_min. The forward works in place on the per-pair tensors and keeps only
  inter, command, z and phi (O(n K) each) for the backward, which is written out by hand (see `backward`);
  tests/test_nsac.py checks it with torch.autograd.gradcheck in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def tanh_(x: Tensor) -> Tensor:
    """tanh in place, as 2 sigmoid(2x) - 1 (see the module docstring)."""
    return x.mul_(2).sigmoid_().mul_(2).sub_(1)


#: rows longer than this, more slots than `TOPK_MAX_SLOTS` or non-float32-exact dtypes use torch.topk
TOPK_MAX_KEYS, TOPK_MAX_SLOTS = 512, 32


def top_k_indices(scores: Tensor, k: int) -> Tensor:
    """Indices (.., k) of the k largest scores (.., n) along the last axis: largest first, ties to the lower index."""
    n = scores.shape[-1]
    if n > TOPK_MAX_KEYS or k > TOPK_MAX_SLOTS or scores.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return scores.topk(k, -1).indices
    bits = (scores.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0: equal scores, equal keys
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # two's-complement order = float order (negatives mirrored)
    shift = max(1, (n - 1).bit_length())
    low = (1 << shift) - 1
    flipped = torch.arange(n, device=scores.device) ^ low  # low bits: low - column, so a lower column wins a tie
    keys = torch.add(flipped, ordered.long(), alpha=1 << shift)  # (.., n) int64: score high, column low
    out = torch.empty((*scores.shape[:-1], k), dtype=torch.long, device=scores.device)
    gone = torch.iinfo(torch.int64).min
    for slot in range(k):  # (int64 amax is vectorised; amin is not, on CPU)
        pos = torch.bitwise_and(keys.amax(-1, keepdim=True), low, out=out[..., slot : slot + 1]).bitwise_xor_(low)
        keys.scatter_(-1, pos, gone)
    return out


class PairGates(torch.autograd.Function):
    """kappa, phi, psi (B, H, K, n) of the pairs (query i, key rows[.., k, i]) through the wired backbone.

    per_key (I, M): inter-layer input from every key token (M = B n H token-major rows, as `key_rows` indexes them);
    per_query (I, B, H, n): from every query token, bias included; rows (B H K n,) the key row of every pair, or None
    for every key (K = n, key slot k = key k). Weights are already masked: w_c (C, I), w_m (3, C).
    """

    @staticmethod
    def forward(ctx, per_key, per_query, rows, w_c, b_c, w_m, b_m, kappa_min: float, psi_min: float):
        n_inter, b, h, n = per_query.shape
        if rows is None:  # (I, B, H, K = n, n): key k for every query
            keys = per_key.view(n_inter, b, n, h).permute(0, 1, 3, 2).unsqueeze(-1)
            pre = torch.add(keys, per_query.unsqueeze(3), out=per_query.new_empty((n_inter, b, h, n, n)))
        else:
            pre = per_key.index_select(1, rows).view(n_inter, b, h, -1, n)  # (I, B, H, K, n)
            pre += per_query.unsqueeze(3)
        shape = pre.shape[1:]
        inter = tanh_(pre).view(n_inter, -1)  # (I, pairs)
        command = tanh_(torch.addmm(b_c.unsqueeze(1), w_c, inter))  # (C, pairs)
        z = torch.addmm(b_m.unsqueeze(1), w_m, command)  # (3, pairs)
        kappa = F.softplus(z[0]).add_(kappa_min).view(shape)
        phi = tanh_(z[1].clone()).view(shape)
        psi = F.softplus(z[2]).add_(psi_min).view(shape)
        ctx.save_for_backward(rows, w_c, w_m, inter, command, z, phi)
        ctx.per_key_shape = per_key.shape
        return kappa, phi, psi

    @staticmethod
    def backward(ctx, g_kappa, g_phi, g_psi):
        """z -> motor -> command -> inter -> (per_key, per_query), each step its chain rule on whole rows with
        autograd's own fused derivative kernels (softplus' = sigmoid, tanh' = 1 - tanh^2, one pass, no temporary)
        and d(W x + b) = (W^T g, g x^T, sum g)."""
        rows, w_c, w_m, inter, command, z, phi = ctx.saved_tensors
        n_inter, pairs = inter.shape
        aten = torch.ops.aten
        g_z = torch.zeros_like(z)  # (3, pairs)
        if g_kappa is not None:
            g_z[0] = aten.softplus_backward(g_kappa.reshape(-1), z[0], 1, 20)  # F.softplus defaults
        if g_phi is not None:
            g_z[1] = aten.tanh_backward(g_phi.reshape(-1), phi.reshape(-1))
        if g_psi is not None:
            g_z[2] = aten.softplus_backward(g_psi.reshape(-1), z[2], 1, 20)
        g_w_m, g_b_m = g_z @ command.T, g_z.sum(1)
        g_command = aten.tanh_backward(w_m.T @ g_z, command)  # (C, pairs)
        g_w_c, g_b_c = g_command @ inter.T, g_command.sum(1)
        g_pre = aten.tanh_backward(w_c.T @ g_command, inter)  # (I, pairs)
        b, h = phi.shape[:2]
        g_pre = g_pre.view(n_inter, b, h, -1, phi.shape[-1])  # (I, B, H, K, n)
        g_per_query = g_pre.sum(3)  # (I, B, H, n)
        if rows is None:  # key k of every query: sum over queries, back to token-major key rows
            g_per_key = g_pre.sum(4).permute(0, 1, 3, 2).reshape(ctx.per_key_shape)
        else:
            g_per_key = g_pre.new_zeros(ctx.per_key_shape).index_add_(1, rows, g_pre.view(n_inter, pairs))
        return g_per_key, g_per_query, None, g_w_c, g_b_c, g_w_m, g_b_m, None, None


class MixKeys(torch.autograd.Function):
    """out[f, b, h, s, i] = sum_k alpha[b, h, s, k, i] values[f, rows[k, b, h, i]]: the attention-weighted sum of the
    selected keys' values, one key slot at a time, forward and backward.

    alpha (B, H, S, K, n); values (F, M) feature-major (one column per token-major key row); rows (K, B H n).
    Only (F, B, H, S, n)-sized temporaries: the gathered (F, pairs) values are never materialised, which keeps the
    CPU allocator from fetching fresh pages for them on every call (a measurable cost on small problems).
    """

    @staticmethod
    def forward(ctx, alpha: Tensor, values: Tensor, rows: Tensor) -> Tensor:
        b, h, s, n_keys, n = alpha.shape
        out = values.new_zeros((values.shape[0], b, h, s, n))
        for slot in range(n_keys):
            picked = values.index_select(1, rows[slot]).view(-1, b, h, 1, n)  # (F, B, H, 1, n)
            out.addcmul_(picked, alpha[:, :, :, slot])
        ctx.save_for_backward(alpha, values, rows)
        return out

    @staticmethod
    def backward(ctx, g_out: Tensor):
        alpha, values, rows = ctx.saved_tensors
        b, h, s, n_keys, n = alpha.shape
        g_out = g_out.contiguous()  # (F, B, H, S, n)
        g_alpha = torch.empty_like(alpha) if ctx.needs_input_grad[0] else None
        g_values = torch.zeros_like(values) if ctx.needs_input_grad[1] else None
        for slot in range(n_keys):
            if g_alpha is not None:  # d/d alpha: the slot's value against the output gradient, summed over F
                picked = values.index_select(1, rows[slot]).view(-1, b, h, 1, n)
                torch.sum(g_out * picked, 0, out=g_alpha[:, :, :, slot])
            if g_values is not None:  # d/d values: the output gradient times the weight, back to the key's column
                weighted = g_out * alpha[:, :, :, slot]  # (F, B, H, S, n)
                weighted = weighted.sum(3) if s > 1 else weighted  # (F, B, H, n)
                g_values.index_add_(1, rows[slot], weighted.view(values.shape[0], -1))
        return g_alpha, g_values, None
