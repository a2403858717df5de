"""Encoders: the backbone every controller shares. Each maps an input batch to tokens (B, T, d_model).

One backbone for all methods, so a comparison between NSAC and a baseline changes exactly one thing: the head.

- `features`: a vector (B, F) -> one token per feature (feature tokenizer, as in FT-Transformer), (B, F, d).
- `sequence`: a sequence (B, T, F) -> a linear embedding per step plus a learned position embedding, (B, T, d).
- `frames`:   a frame stack (B, T, 84, 84), uint8 or float in [0, 255] -> a small CNN per frame, one token per
              frame, so the frame stack is the time axis (the NSAC CarRacing experiment), (B, T, d).
- `nvidia`:   a YUV image (B, 3, 66, 200) in [0, 255] -> the NVIDIA PilotNet convolution stack (Bojarski et al.
              2016); each column of the last feature map is one token, (B, 18, d). in_dim = F > 1 frames stacked on
              the channel axis (B, 3 F, 66, 200), oldest first (datasets/udacity_history.py): early fusion, the first
              convolution sees every frame.
- `patches`:  a look-back window (B, L, C), L = n_tokens steps -> PatchTST patches (Nie et al. 2023): patch length
              16, stride 8, the window end-padded by repeating its last step 8 times; each patch of all C = in_dim
              channels is one token (linear embedding + learned position), (B, (L - 16) // 8 + 2, d).
- `ft_features`: a vector (B, F) -> FT-Transformer's feature tokenizer (Gorishniy et al. 2021): x_j W_j + b_j,
              no activation, weights and biases ~ U(-1/sqrt(d), 1/sqrt(d)) as in their code, (B, F, d).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numba import njit
from torch import Tensor, nn

from agents.checks import at_least, one_of
from agents.lane_noise import MIN_ROWS


@dataclass(frozen=True)
class EncoderConfig:
    kind: str = "features"
    """one of: features, sequence, frames, nvidia, patches, ft_features"""
    in_dim: int = 1
    """features: number of input features; sequence/patches: features (channels) per step; nvidia: frames stacked
    (1: one image); frames: ignored"""
    n_tokens: int = 4
    """sequence/patches: number of steps; frames: frames in the stack; features: ignored (= in_dim)"""
    d_model: int = 64
    """token width"""

    def __post_init__(self) -> None:
        one_of(self, "kind", ENCODERS)
        at_least(self, 1, "in_dim", "n_tokens", "d_model")
        if self.kind == "patches":
            at_least(self, PatchTokens.patch_len, "n_tokens")  # the look-back must hold one patch


class FeatureTokens(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cfg.in_dim, cfg.d_model) / cfg.d_model**0.5)
        self.bias = nn.Parameter(torch.zeros(cfg.in_dim, cfg.d_model))

    def forward(self, x: Tensor) -> Tensor:  # (B, F) -> (B, F, d)
        return torch.relu(x.unsqueeze(-1) * self.weight + self.bias)


class SequenceTokens(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.embed = nn.Linear(cfg.in_dim, cfg.d_model)
        self.position = nn.Parameter(torch.zeros(cfg.n_tokens, cfg.d_model))

    def forward(self, x: Tensor) -> Tensor:  # (B, T, F) -> (B, T, d)
        return torch.relu(self.embed(x) + self.position[: x.shape[1]])


@njit(cache=True)
def _slide(words, prev, slid):  # pragma: no cover - compiled
    """slid[b]: row b's first T - 1 frames are the last T - 1 of the previous call's row b (prev); then prev takes
    this call's last T - 1. words (B, T, n), prev (B, T - 1, n): the frames' bytes as uint64 words, compared
    without a branch per word (vectorised)."""
    for b in range(words.shape[0]):
        diff = np.uint64(0)
        for i in range(prev.shape[1]):
            for w in range(words.shape[2]):
                diff |= words[b, i, w] ^ prev[b, i, w]
        slid[b] = diff == 0
        prev[b] = words[b, 1:]


class FrameTokens(nn.Module):
    """CNN per 84x84 frame -> one token per frame.

    In closed loop (`remember_frames(True)`, set by drive/loop/policies.py) a frame's token is computed once: a stack
    of k frames slides by one frame per step, so k - 1 of each step's frames were encoded before. A row whose first
    k - 1 frames are, byte for byte, the last k - 1 of the previous call's same row (a car's next step) takes their
    tokens from that call and encodes only its newest frame. Other rows (a car's first step, a batch of another
    shape) go through a memo keyed by the frame's bytes, which holds the FRAME_MEMO frames used last. Used only
    without autograd on uint8 input; the new frames are encoded in one batch of at least `agents.lane_noise.MIN_ROWS`
    rows, so every token equals the one the full stack computes (tests/drive/loop/test_lanes.py). Cuts the
    encoder's cost per step about k-fold; the slide, not the bytes keys, so that 32 cars do not hash 128 frames of
    7 KB per step.
    """

    FRAME_MEMO = 4096

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(1, 16, 8, stride=4),
            nn.ReLU(),  # 84 -> 20
            nn.Conv2d(16, 32, 4, stride=2),
            nn.ReLU(),  # 20 -> 9
            nn.Conv2d(32, 32, 3, stride=1),
            nn.ReLU(),  # 9 -> 7
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, cfg.d_model),
            nn.ReLU(),
        )
        self.position = nn.Parameter(torch.zeros(cfg.n_tokens, cfg.d_model))
        self.memo: dict[bytes, Tensor] | None = None
        self._last: tuple[np.ndarray, Tensor] | None = None  # the previous call's last k - 1 frames, its tokens

    def remember_frames(self, on: bool = True) -> None:
        self.memo = {} if on else None
        self._last = None

    def forward(self, x: Tensor) -> Tensor:  # (B, T, 84, 84) -> (B, T, d)
        b, t = x.shape[:2]
        if self.memo is not None and x.dtype == torch.uint8 and not torch.is_grad_enabled():
            return self._remembered(x) + self.position[:t]
        frames = x.reshape(b * t, 1, *x.shape[2:]).float() / 255.0  # (B*T, 1, 84, 84)
        tokens = self.cnn(frames).reshape(b, t, -1)  # (B, T, d)
        return tokens + self.position[:t]

    def _remembered(self, x: Tensor) -> Tensor:  # (B, T, 84, 84) uint8 -> (B, T, d) before the position term
        assert self.memo is not None
        host = np.ascontiguousarray(x.cpu().numpy())  # (B, T, 84, 84): no copy on the CPU
        b, t = host.shape[:2]
        slid = np.zeros(b, np.bool_)
        last = self._last
        size = host[0, 0].size
        if last is not None and t > 1 and size % 8 == 0 and last[0].shape == (b, t - 1, size // 8):
            _slide(host.reshape(b, t, size).view(np.uint64), last[0], slid)  # (B,)
            prev = last[0]
        else:
            prev = host[:, 1:].reshape(b, t - 1, size).copy()  # (B, T-1, 84*84) bytes
            prev = prev.view(np.uint64) if size % 8 == 0 else prev
        rows = np.flatnonzero(~slid)  # (R,) rows through the bytes memo
        keys = [host[r, i].tobytes() for r in rows for i in range(t)]  # (R*T,) numpy slices: cheaper than tensors
        new = {key: n for n, key in enumerate(keys) if key not in self.memo}  # first of each unseen frame
        for key in dict.fromkeys(k for k in keys if k not in new):  # a frame seen again is the newest again
            self.memo[key] = self.memo.pop(key)
        n_slid = int(slid.sum())
        slid_rows = slice(None) if n_slid == b else torch.from_numpy(np.flatnonzero(slid))  # (S,) all: a slice
        batch = [x[slid_rows, t - 1]] if n_slid else []  # (S, 84, 84) the slid rows' newest frames
        if new:
            picks = torch.as_tensor([[rows[n // t], n % t] for n in new.values()])  # (N, 2)
            batch.append(x[picks[:, 0], picks[:, 1]])  # (N, 84, 84)
        out = torch.empty(b, t, self.cnn[-2].out_features, device=x.device)  # (B, T, d)
        if batch:
            pad = max(0, MIN_ROWS - sum(len(part) for part in batch))
            batch += [batch[0][:1].expand(pad, *x.shape[2:])] if pad else []
            fresh = batch[0].float() if len(batch) == 1 else torch.cat(batch).float()  # (max(S + N, MIN_ROWS), 84, 84)
            tokens = self.cnn(fresh.unsqueeze(1).div_(255.0))  # the float copy divided in place: bits of `/ 255.0`
            if n_slid:
                out[slid_rows, t - 1] = tokens[:n_slid]
                out[slid_rows, : t - 1] = last[1][slid_rows, 1:]  # type: ignore[index]
            for key, token in zip(new, tokens[n_slid:], strict=False):
                self.memo[key] = token
        if len(rows):
            out[rows] = torch.stack([self.memo[key] for key in keys]).reshape(len(rows), t, -1)
        # least recently used first, after this call's tokens are taken: a frame of this very batch (a uniform
        # off-track view, seen long ago) is never evicted before it is read
        while len(self.memo) > self.FRAME_MEMO:
            del self.memo[next(iter(self.memo))]
        self._last = (prev, out)
        return out


class NvidiaTokens(nn.Module):
    """PilotNet convolutions on 66x200 YUV; the 1x18 output map gives 18 column tokens."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(3 * max(1, cfg.in_dim), 24, 5, stride=2),
            nn.ELU(),  # 66x200 -> 31x98
            nn.Conv2d(24, 36, 5, stride=2),
            nn.ELU(),  # -> 14x47
            nn.Conv2d(36, 48, 5, stride=2),
            nn.ELU(),  # -> 5x22
            nn.Conv2d(48, 64, 3),
            nn.ELU(),  # -> 3x20
            nn.Conv2d(64, 64, 3),
            nn.ELU(),  # -> 1x18
        )
        self.proj = nn.Linear(64, cfg.d_model)
        self.position = nn.Parameter(torch.zeros(18, cfg.d_model))

    def forward(self, x: Tensor) -> Tensor:  # (B, 3 F, 66, 200) -> (B, 18, d)
        fmap = self.cnn(x.float() / 127.5 - 1.0)  # (B, 64, 1, 18)
        tokens = fmap.flatten(2).transpose(1, 2)  # (B, 18, 64)
        return torch.relu(self.proj(tokens)) + self.position


class PatchTokens(nn.Module):
    """Look-back window -> one token per patch of 16 steps, stride 8 (PatchTST's defaults on every benchmark)."""

    patch_len, stride = 16, 8

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        if cfg.n_tokens < self.patch_len:
            raise ValueError(f"patches: look-back n_tokens={cfg.n_tokens} is shorter than one patch ({self.patch_len})")
        self.length = cfg.n_tokens
        self.n_patches = (cfg.n_tokens - self.patch_len) // self.stride + 2  # + 1 for the end padding
        self.embed = nn.Linear(self.patch_len * cfg.in_dim, cfg.d_model)
        self.position = nn.Parameter(torch.zeros(self.n_patches, cfg.d_model))

    def forward(self, x: Tensor) -> Tensor:  # (B, L, C) -> (B, N, d)
        if x.shape[1] != self.length:
            raise ValueError(f"patches: window of {x.shape[1]} steps, the encoder was built for n_tokens={self.length}")
        padded = torch.cat([x, x[:, -1:].expand(-1, self.stride, -1)], 1)  # (B, L + stride, C)
        patches = padded.unfold(1, self.patch_len, self.stride)  # (B, N, C, P)
        return self.embed(patches.transpose(2, 3).flatten(2)) + self.position  # (B, N, P*C) -> (B, N, d)


class FTFeatureTokens(nn.Module):
    """FT-Transformer's numerical feature tokenizer: token j = x_j * W_j + b_j (linear, no ReLU)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        bound = cfg.d_model**-0.5
        self.weight = nn.Parameter(torch.empty(cfg.in_dim, cfg.d_model).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(cfg.in_dim, cfg.d_model).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:  # (B, F) -> (B, F, d)
        return x.unsqueeze(-1) * self.weight + self.bias


ENCODERS: dict[str, type[nn.Module]] = {
    "features": FeatureTokens,
    "sequence": SequenceTokens,
    "frames": FrameTokens,
    "nvidia": NvidiaTokens,
    "patches": PatchTokens,
    "ft_features": FTFeatureTokens,
}


def input_frames(model: nn.Module) -> int:
    """How many camera frames an `nvidia`-encoder controller stacks per input (1 for every other encoder)."""
    encoder = getattr(getattr(model, "cfg", None), "encoder", None)
    return max(1, int(encoder.in_dim)) if isinstance(encoder, EncoderConfig) and encoder.kind == "nvidia" else 1


def build_encoder(cfg: EncoderConfig) -> nn.Module:
    if cfg.kind not in ENCODERS:
        raise ValueError(f"unknown encoder kind {cfg.kind!r}; choose one of {sorted(ENCODERS)}")
    return ENCODERS[cfg.kind](cfg)
