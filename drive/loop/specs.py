"""What a name on the command line means in the closed loop: experts (`ppo`, `pursuit`, PATH), policy specs
(`expert:NAME`, `ckpt:PATH`), shadow experts, and trained controllers as policies.

`load_expert("ppo")` rebuilds the shipped checkpoints/expert_ppo.pt (our checkpoint format, no SB3 needed);
`load_expert("pursuit")` builds the geometric pure-pursuit driver; any other string is read as a path to an expert
checkpoint. Every expert has `reset()` and `act(state) -> (3,) float32` with `state = info["state"]`.
`PolicySpec` is what a closed-loop run drives, carried whole from the command line to the worker that builds it (it
pickles): the kind and its argument plus every option a trained controller takes (`samples`, the stochastic samples
per step, under that one name down to `ControllerPolicy` and the controller's `predict`). `PolicySpec.parse(
"ckpt:PATH", samples=8).build()` is what `drive eval` runs (`make_policy` is the same in one call); `POLICY_KINDS`
maps each kind to its builder, so a new kind is one function and one line there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from datasets.frames import ObservationCoder
from datasets.root import REPO
from drive import checkpoint
from drive.errors import UserError
from drive.loop.fallback import FallbackConfig, FallbackGate, parse_fallback
from drive.loop.policies import ControllerPolicy, ExpertPolicy

log = logging.getLogger(__name__)


SHIPPED = {"ppo": REPO / "checkpoints" / "expert_ppo.pt"}


class Expert(Protocol):
    def reset(self) -> None: ...

    def act(self, state: np.ndarray) -> np.ndarray: ...


# -- experts -----------------------------------------------------------------------------------------------------------
def pursuit_expert(**overrides: Any) -> Expert:
    from agents.experts.pursuit import PurePursuit, PursuitConfig
    from sim_bridges.carracing.bridge import LOOKAHEAD_M, STATE_NAMES

    return PurePursuit(PursuitConfig(state_names=STATE_NAMES, lookahead_m=LOOKAHEAD_M, **overrides))


def load_ppo(path: str | Path) -> Expert:
    """Rebuild the PPO expert from one of our checkpoints; errors name the file and what does not match."""
    from agents.experts.ppo import PPOExpert, PPOPolicy, PPOPolicyConfig
    from sim_bridges.carracing.bridge import STATE_NAMES

    payload = checkpoint.read(path, kind="expert")
    if payload.get("name") != "ppo":
        raise checkpoint.CheckpointError(f"{path}: expert {payload.get('name')!r}, expected 'ppo'")
    cfg_dict = dict(payload["config"])
    names = tuple(cfg_dict.pop("state_names", ()))
    if names != STATE_NAMES:
        raise checkpoint.CheckpointError(
            f"{path}: trained on a state layout of {len(names)} features that differs from the bridge's "
            f"{len(STATE_NAMES)} (sim_bridges.carracing.bridge.STATE_NAMES); retrain with `drive expert train`"
        )
    try:
        policy = PPOPolicy(PPOPolicyConfig.from_dict(cfg_dict))
        policy.load_state_dict(payload["state_dict"])
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:
        raise checkpoint.CheckpointError(f"{path}: config/weights do not match the PPO expert: {exc}") from exc
    return PPOExpert(policy)


def load_expert(name_or_path: str | Path) -> Expert:
    """'ppo' (the shipped checkpoint), 'pursuit', or a path to an expert checkpoint."""
    key = str(name_or_path)
    if key == "pursuit":
        return pursuit_expert()
    if key in SHIPPED:
        return load_ppo(SHIPPED[key])
    if not Path(key).exists():
        raise UserError(f"{key}: not an expert name ({['pursuit', *SHIPPED]}) nor an existing file")
    return load_ppo(key)


def expert_policy(name: str, env: str = "carracing") -> ExpertPolicy:
    """The expert `name` (ppo, pursuit or a checkpoint path) for `env`, as a closed-loop policy."""
    if env == "fake-road":
        from sim_bridges.fake_road import FakeRoadDriver

        if name != "pursuit":
            raise UserError(f"the fake road has only its scripted driver: use expert 'pursuit', not {name!r}")
        return ExpertPolicy(FakeRoadDriver(), name="fake-road:pursuit")
    return ExpertPolicy(load_expert(name), name=name)


def default_shadow(shadow: str | None, env: str, path: str | Path | None = None) -> str | None:
    """None -> the expert that labelled the checkpoint's training demonstrations (recorded in its data fingerprint),
    else the env's reference expert (ppo on CarRacing, pursuit on the fake road); 'none' or '' -> no shadow.

    The shadow must be the labelling expert: on-policy calibration asks whether the controller's intervals cover the
    action it was taught to imitate. (The PPO expert's steering chatters between the locks while pursuit's is smooth,
    so a controller cloned from pursuit covers PPO's steering almost never, however well it drives.)"""
    if shadow is None:
        if path is not None and env == "carracing":
            expert = checkpoint.read(path, kind="controller").get("data", {}).get("expert")
            if isinstance(expert, str) and expert in ("ppo", "pursuit"):
                return expert
        return "pursuit" if env == "fake-road" else "ppo"
    return None if shadow.lower() in ("", "none", "off") else shadow


# -- trained controllers -----------------------------------------------------------------------------------------------
def controller_policy(
    path: str | Path,
    samples: int | None = None,
    seed: int = 0,
    shadow: str | None = "ppo",
    fallback: FallbackConfig | None = None,
    threshold: float | None = None,
    env: str = "carracing",
    device: str = "cpu",
) -> ControllerPolicy:
    """A CarRacing checkpoint as a policy, with the frame coder its training data used. With `fallback`, `threshold`
    must be given (drive/loop/thresholds.py `resolve_threshold`)."""
    model, payload = checkpoint.load_controller(path)
    encoder = payload["config"].get("encoder", {})
    if encoder.get("kind") != "frames":
        raise checkpoint.CheckpointError(
            f"{path}: controller encoder is {encoder.get('kind')!r} (trained on task "
            f"{payload.get('data', {}).get('task')!r}); CarRacing needs a frame-stack controller (kind 'frames')"
        )
    if payload["config"].get("out_dim") != 3:
        raise checkpoint.CheckpointError(
            f"{path}: controller predicts {payload['config'].get('out_dim')} outputs; "
            "CarRacing needs 3 (steer, gas, brake)"
        )
    gate = None
    if fallback is not None:
        if threshold is None:
            raise ValueError("a fallback needs a threshold: calibrate it on nominal laps (resolve_threshold)")
        gate = FallbackGate(threshold, fallback)
    coder = ObservationCoder.from_fingerprint(payload.get("data", {}), encoder.get("n_tokens", 4))
    expert = expert_policy(shadow, env).expert if shadow else None
    return ControllerPolicy(
        model, coder, samples, seed, expert, gate, name=f"{payload['name']}:{Path(path).name}", device=device
    )


def ckpt_policy(
    path: str,
    env: str = "carracing",
    samples: int | None = None,
    shadow: str | None = None,
    fallback: str = "off",
    threshold: float | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> ControllerPolicy:
    """A `ckpt:PATH` policy from primitives: shadow None is the checkpoint's labelling expert, 'none' no shadow;
    fallback a `parse_fallback` string (drive/loop/fallback.py), which then needs its threshold."""
    gate_cfg = parse_fallback(fallback)
    shadow = default_shadow(shadow, env, path)
    return controller_policy(path, samples, seed, shadow, gate_cfg, threshold, env, device)


# -- policy specs ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicySpec:
    """A closed-loop policy as data: `KIND:ARG` and the options of a trained controller. Frozen and picklable (eval
    workers and Ray tasks receive it, and cache their lanes by it); `build()` makes the policy in the worker."""

    kind: str
    """expert or ckpt (POLICY_KINDS)"""
    arg: str
    """the expert's name or path (expert), the checkpoint's path (ckpt)"""
    env: str = "carracing"
    """the simulator the policy drives"""
    samples: int | None = None
    """ckpt: stochastic samples per step (None: the controller's own default)"""
    seed: int = 0
    """ckpt: seed of the controller's sampling"""
    shadow: str | None = None
    """ckpt: shadow expert (None: the expert that labelled its data; 'none': off; drive/loop/specs.py default_shadow)"""
    fallback: str = "off"
    """ckpt: the uncertainty-gated fallback, a `parse_fallback` string (off, expert, slow, MODE:KEY=VALUE,...; the
    gate's signal and variance are among its keys)"""
    threshold: float | None = None
    """ckpt: the fallback's threshold (needed when fallback is on; drive/loop/thresholds.py resolve_threshold)"""
    device: str = "cpu"
    """ckpt: where the controller runs"""

    def __post_init__(self) -> None:
        parse_policy_spec(f"{self.kind}:{self.arg}")  # a one-line UserError for a bad kind or an empty arg
        if self.samples is not None and int(self.samples) < 1:
            raise UserError(f"policy {self}: samples must be >= 1, got {self.samples}")
        parse_fallback(self.fallback)  # a bad fallback fails here, not in every worker

    @classmethod
    def parse(cls, text: str, **options: Any) -> PolicySpec:
        """'ckpt:PATH' (or 'expert:NAME') and options (the other fields) -> the spec."""
        kind, arg = parse_policy_spec(text)
        return cls(kind, arg, **options)

    def __str__(self) -> str:
        return f"{self.kind}:{self.arg}"

    def build(self) -> Any:
        """The policy (an `ExpertPolicy`, a `ControllerPolicy`), built here: run it in the worker that drives it."""
        return POLICY_KINDS[self.kind](self)


def _expert_spec(spec: PolicySpec) -> ExpertPolicy:
    return expert_policy(spec.arg, spec.env)


def _ckpt_spec(spec: PolicySpec) -> ControllerPolicy:
    return ckpt_policy(
        spec.arg, spec.env, spec.samples, spec.shadow, spec.fallback, spec.threshold, spec.seed, spec.device
    )


#: spec kind -> builder(spec). Extend here.
POLICY_KINDS: dict[str, Callable[[PolicySpec], Any]] = {"expert": _expert_spec, "ckpt": _ckpt_spec}


def parse_policy_spec(spec: str) -> tuple[str, str]:
    """'expert:ppo' -> ('expert', 'ppo'); a clear error for anything else."""
    kind, sep, arg = str(spec).partition(":")
    if not sep or not arg or kind not in POLICY_KINDS:
        kinds = ", ".join(f"{k}:..." for k in POLICY_KINDS)
        raise UserError(f"policy spec {spec!r}: expected KIND:ARG with KIND one of ({kinds}), e.g. expert:ppo")
    return kind, arg


def make_policy(spec: str, env: str = "carracing", **options: Any) -> Any:
    """Build the policy a spec such as 'expert:ppo' names (options: PolicySpec's fields, e.g. samples for ckpt)."""
    return PolicySpec.parse(spec, env=env, **options).build()
