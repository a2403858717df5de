"""Encoder tokens computed once, the rest of a controller run on them: how SA's M passes (agents/sa_controller.py,
drive/learn/sa.py's nu search) run the attention and heads alone, M times, on one encoding.

`cached_encoders(model, batch_size)` swaps every `encoder` submodule for a lookup (`TakeTokens(i)`) and yields
tokens(x) -> (B, E, T, d), the outputs of the E original encoders; inside the block the model takes those tokens as
its input, outside it the model is the stock model again. Exact for every controller here: each runs its encoder(s)
first, on the raw input alone, and SA resamples only the attention after them. NSAC with a time feature also reads
time stamps from its raw input, which tokens cannot carry: refused (`check_cacheable`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from agents.base import Prediction


class TakeTokens(nn.Module):
    """Stands in for encoder i: (B, E, T, d) precomputed tokens of all E encoders -> (B, T, d) of this one."""

    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def forward(self, tokens: Tensor) -> Tensor:
        return tokens[:, self.index]


def _encoder_slots(model: nn.Module) -> list[tuple[nn.Module, str]]:
    slots = [(model.get_submodule(n.rpartition(".")[0]), n.rpartition(".")[2]) for n, _ in model.named_modules()]
    return [(parent, attr) for parent, attr in slots if attr == "encoder"]


def check_cacheable(model: nn.Module) -> None:
    """ValueError unless `cached_encoders` can stand in for the model's encoders."""
    if getattr(getattr(model, "cfg", None), "time_feature", -1) >= 0:
        raise ValueError("NSAC reads time stamps from its raw input (time_feature >= 0): tokens cannot stand in")
    if not _encoder_slots(model):
        raise ValueError(f"{type(model).__name__} has no `encoder` submodule")


@contextmanager
def cached_encoders(model: nn.Module, batch_size: int) -> Iterator[Callable[[Tensor], Tensor]]:
    """Swap each `encoder` submodule for `TakeTokens(i)`; yields tokens(x) -> (B, E, T, d) from the original encoders,
    run on `batch_size` inputs at a time. The encoders are put back on exit (also on error)."""
    check_cacheable(model)
    slots = _encoder_slots(model)
    encoders = [getattr(parent, attr) for parent, attr in slots]

    @torch.no_grad()
    def tokens(x: Tensor) -> Tensor:
        parts = [torch.stack([enc(x[s : s + batch_size]) for enc in encoders], 1) for s in range(0, len(x), batch_size)]
        return torch.cat(parts)  # (B, E, T, d)

    try:
        for i, (parent, attr) in enumerate(slots):
            setattr(parent, attr, TakeTokens(i))
        yield tokens
    finally:
        for (parent, attr), enc in zip(slots, encoders, strict=True):
            setattr(parent, attr, enc)


def chunked_pass(model: nn.Module, tokens: Tensor, batch_size: int) -> Prediction:
    """The model's `deterministic_pass` over (N, E, T, d) tokens, `batch_size` rows at a time (inside
    `cached_encoders`): each (N, D), standardised units."""
    parts = [model.deterministic_pass(tokens[s : s + batch_size]) for s in range(0, len(tokens), batch_size)]  # type: ignore[operator]
    return Prediction(*(torch.cat(ts) for ts in zip(*parts, strict=True)))
