"""What every wrapper of a trained controller shares (agents/registry.py WRAPPERS: SA at a fixed nu,
agents/sa_controller.py; the feature density, agents/density_controller.py): the base inside, its standardisation
and aleatoric temperature mirrored in the wrapper's own buffers (readers of `y_loc` etc.) while the predictive uses
the base's, its deterministic pass, no training of its own, and a config that derives `encoder` / `out_dim` from the
base's config."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from agents.base import Controller, Prediction
from agents.layers.token_cache import check_cacheable


def derive_from_base(cfg: Any) -> None:
    """A wrapper config's `encoder` and `out_dim` (init=False fields): its base's, for a checkpoint's readers."""
    object.__setattr__(cfg, "encoder", cfg.base_config.encoder)
    object.__setattr__(cfg, "out_dim", cfg.base_config.out_dim)


class Wrapper(Controller):
    #: how the wrapper is made from a trained controller (the error `loss` raises)
    made_by = "a wrapper"

    def __init__(self, base: Controller):
        """`base`: the trained controller; it must run its encoder(s) first, on the raw input alone
        (agents/layers/token_cache.py), as every wrapper runs the encoder once per call."""
        check_cacheable(base)
        super().__init__(base.out_dim)
        self.base = base
        super().set_target_stats(base.y_loc, base.y_scale)
        super().set_aleatoric_temperature(base.aleatoric_temperature)

    def set_target_stats(self, loc: Tensor, scale: Tensor) -> None:
        self.base.set_target_stats(loc, scale)
        super().set_target_stats(loc, scale)

    def set_aleatoric_temperature(self, temperature: Tensor) -> None:
        """The base's temperature (it scales the head's noise in its deterministic pass), mirrored here."""
        self.base.set_aleatoric_temperature(temperature)
        super().set_aleatoric_temperature(temperature)

    def deterministic_pass(self, x: Tensor) -> Prediction:
        """The base's deterministic pass, standardised units."""
        return self.base.deterministic_pass(x)

    def _loss(self, x: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} is made after training: train the base, then {self.made_by}")
