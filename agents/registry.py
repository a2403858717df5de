"""The controller registry: one explicit dict that drives CLI choices, checkpoint reloading and test parametrisation.

Each value is a frozen config dataclass with fields `encoder: EncoderConfig` and `out_dim: int` and a `build()`
method returning the `Controller`. No import-time side effects: adding a method means adding a line here.
`CONTROLLERS` are trained (`drive train --controller NAME`); `WRAPPERS` are made from a trained one after training (SA
at a calibrated nu, `drive sa calibrate`; a feature density, `drive density fit`) and only loaded: their config names
the trained controller (`base`, a CONTROLLERS name) and holds its config (`base_config`), and derives `encoder` /
`out_dim` from it (init=False fields, written to a checkpoint for its readers, recomputed on loading).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from agents.contextual_dropout import ContextualDropoutConfig
from agents.density_controller import DensityControllerConfig
from agents.encoders import EncoderConfig
from agents.ensemble import EnsembleConfig
from agents.evidential import EvidentialConfig
from agents.ft_mc_dropout import FTMCDropoutConfig
from agents.ft_transformer import FTTransformerConfig
from agents.gmle import GMLEConfig
from agents.hsa import HSAConfig
from agents.ivon_vi import IVONConfig
from agents.mc_dropout import MCDropoutConfig
from agents.nsac import NSACConfig
from agents.patch_forecaster import PatchTSTConfig
from agents.sa_controller import SAControllerConfig
from agents.sde_net import SDENetConfig
from agents.swag import MultiSWAGConfig, SWAGConfig

CONTROLLERS: dict[str, type] = {
    "nsac": NSACConfig,
    "gmle": GMLEConfig,
    "mcd": MCDropoutConfig,
    "de": EnsembleConfig,
    "der": EvidentialConfig,
    "sdenet": SDENetConfig,
    "patchtst": PatchTSTConfig,
    # FT-Transformer and the SA paper's baselines on it (SA itself calibrates "ft" post hoc: agents/sa.py)
    "ft": FTTransformerConfig,
    "ft-mcd": FTMCDropoutConfig,
    "ft-swag": SWAGConfig,
    "ft-multiswag": MultiSWAGConfig,
    "ft-ivon": IVONConfig,
    "ft-cdrop": ContextualDropoutConfig,
    "ft-hsa": HSAConfig,
}

WRAPPERS: dict[str, type] = {
    "sa": SAControllerConfig,  # a trained controller with inference-time stochastic attention at a fixed nu
    "density": DensityControllerConfig,  # a trained controller whose signal is its encoder features' density
}


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Primitives only (tuples become lists), safe for torch.load(weights_only=True)."""
    return dataclasses.asdict(cfg)


def loadable() -> dict[str, type]:
    """Every controller a checkpoint may hold: the trained ones and the wrappers."""
    return {**CONTROLLERS, **WRAPPERS}


def config_from_dict(name: str, data: dict[str, Any]) -> Any:
    """Rebuild a registered controller config (nested EncoderConfig and a wrapper's base config included) from
    `config_to_dict` output."""
    registered = loadable()
    if name not in registered:
        raise ValueError(f"unknown controller {name!r}; registered: {sorted(registered)}")
    cls = registered[name]
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ValueError(f"config for {name!r} has unknown fields {sorted(unknown)}")
    kwargs = {}
    for key, value in data.items():
        if not fields[key].init:  # derived (a wrapper's encoder / out_dim): recomputed from what it derives from
            continue
        if name in WRAPPERS and key == "base_config":
            if data.get("base") not in CONTROLLERS:
                raise ValueError(
                    f"{name!r} wraps a trained controller; base {data.get('base')!r} is none of {sorted(CONTROLLERS)}"
                )
            value = config_from_dict(data["base"], value)
        elif hints.get(key) is EncoderConfig and isinstance(value, dict):
            value = EncoderConfig(**value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


def build_controller(name: str, cfg: Any):
    if name not in loadable():
        raise ValueError(f"unknown controller {name!r}; registered: {sorted(loadable())}")
    return cfg.build()
