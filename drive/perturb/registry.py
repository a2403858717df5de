"""Distribution shifts of the closed loop in one grammar: `parse_shift(text) -> Shift`, `shifted_env(env, shift)`.

A spec is one of
- `KIND:LEVEL`: a camera kind of drive/perturb/camera.py (noise, blur, occlusion, brightness, and the held-out
  motion_blur, fog, darkness, jpeg, rain, hue of drive/perturb/held_out.py) or an actuation kind of
  drive/perturb/wrappers.py (steer_delay, action_noise); each module's docstring gives the level's unit and range;
- `domain_randomize`: CarRacing's own colour randomisation, a change of the world (level 1 in reports);
- `carracing:VARIANT`: one of CarRacingExtension's generalisation variants (Tang, Nguyen & Ha, GECCO 2020), drawn
  into the world by our renderer: `carracing:color`, `carracing:color3`, `carracing:bar`, `carracing:blob`,
  `carracing:noise`, `carracing:video=DIR` (DIR a folder of PNG frames); world shifts, no level, seeded per episode
  from (shift seed, track seed) (sim_bridges/carracing/variants.py says what each draws and where it departs);
- `module.path:function:LEVEL`: a user's camera perturbation, a function `(frame (96, 96, 3) uint8, level float,
  rng numpy Generator) -> frame (96, 96, 3) uint8` importable from the PYTHONPATH, `rng` seeded per episode from
  (shift seed, track seed). `parse_shift` imports it and calls it once on a grey frame, so a missing module or
  function, or one that returns anything but a raw frame, fails at once with one line naming it;
- `escalate:KIND:L1,L2,...@SECONDS[/CLEAN]` (or `escalate:module:function:L1,...@SECONDS[/CLEAN]`): the
  perturbation benchmarks' severity escalation. One family per episode; the first CLEAN seconds of simulated time
  (CarRacing: 50 steps/s; default: SECONDS) are clean, then the level is L1 for SECONDS, L2 for SECONDS, ..., and
  stays at the last level until the episode ends (`@1/3`: 3 s clean, then a new level every second: a ramp).
  The clean start is a choice: every episode then has a nominal stretch of its own before the shift, from which a
  monitor's false alarms are counted and against which its reaction to the onset is measured, and the shift never
  coincides with CarRacing's zoom-in at the start of an episode.

`shifted_env` wraps the env so that every reset and step reports `info["shift"]` (the spec) and
`info["shift_level"]` (the level in force for that step's action and the frame it returned; 0.0 while clean,
`info["shift_stage"]` 0) so that observers and the benchmark can attribute each step. A fixed shift is in force
from the first frame on (stage 1).

Each Shift says which `domain` it changes ("camera", "world" or "actuation") and whether it is a
`surrogate_family`: one NSAC's training regulariser draws from (additive Gaussian pixel noise and a gain/offset,
agents/nsac.py `ood_inputs`: `noise` and `brightness`). A benchmark reports those apart from the held-out families.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from drive.perturb.camera import KINDS, RAW_SHAPE, WORLD_KINDS, FramePerturber, FunctionPerturber, Perturbation
from drive.perturb.held_out import FrameFn
from drive.perturb.wrappers import ACTUATION_KINDS, PerturbedCamera, ShiftedActuation
from sim_bridges.carracing import variants as carracing_variants
from sim_bridges.carracing.bridge import CarRacingBridge

STEPS_PER_S = 50  # CarRacing's FPS: one env step is 1/50 s of simulated time
SURROGATE_FAMILIES = ("noise", "brightness")
CAMERA_KINDS = tuple(k for k in KINDS if k not in WORLD_KINDS)
ESCALATE = "escalate:"
VARIANT = "carracing:"  # a CarRacingExtension variant: carracing:KIND, carracing:video=DIR
VARIANT_SPECS = (*(VARIANT + k for k in carracing_variants.KINDS if k != "video"), f"{VARIANT}video=DIR")


@dataclass(frozen=True)
class Shift:
    """One condition: `family` (a kind, or `user:module:function`), `level` (an escalation's last level), its
    `domain` and `surrogate_family` (see the module docstring); `levels` and `interval_s` for escalation."""

    family: str
    level: float
    domain: str  # "camera" | "world" | "actuation"
    surrogate_family: bool
    levels: tuple[float, ...] = ()  # escalation: L1, ..., Lk after a clean start; () for a fixed shift
    interval_s: float = 0.0
    clean_s: float | None = None  # escalation: the clean start (None: one interval)
    function: FrameFn | None = field(default=None, compare=False, repr=False)  # a user's plug-in

    @property
    def escalating(self) -> bool:
        return bool(self.levels)

    @property
    def interval_steps(self) -> int:
        return max(1, round(self.interval_s * STEPS_PER_S))

    @property
    def clean_steps(self) -> int:
        return self.interval_steps if self.clean_s is None else round(self.clean_s * STEPS_PER_S)

    def __str__(self) -> str:
        name = self.family.removeprefix("user:")
        if self.escalating:
            clean = "" if self.clean_s is None else f"/{self.clean_s:g}"
            return f"{ESCALATE}{name}:{','.join(f'{v:g}' for v in self.levels)}@{self.interval_s:g}{clean}"
        return name if self.domain == "world" else f"{name}:{self.level:g}"


def parse_shift(text: str) -> Shift:
    """The Shift a spec names (grammar in the module docstring); a ValueError with one line saying what is wrong."""
    spec = text.strip()
    if spec.startswith(ESCALATE):
        return _escalation(spec)
    if spec in WORLD_KINDS:
        return Shift(spec, 1.0, "world", False)
    variant = _variant(text, spec)
    if variant is not None:
        return variant
    head, sep, level = spec.rpartition(":")
    if not sep:
        known = sorted([*CAMERA_KINDS, *ACTUATION_KINDS, *WORLD_KINDS, *VARIANT_SPECS])
        raise ValueError(
            f"shift {text!r}: give KIND:LEVEL, domain_randomize, carracing:VARIANT or module:function:LEVEL ({known})"
        )
    base = _family(text, head)
    return _at(text, base, _number(text, level))


def _escalation(text: str) -> Shift:
    body, sep, seconds = text.removeprefix(ESCALATE).rpartition("@")
    head, _, levels = body.rpartition(":")
    if not sep or not head or not levels:
        raise ValueError(f"shift {text!r}: give escalate:KIND:L1,L2,...@SECONDS[/CLEAN]")
    seconds, slash, clean_text = seconds.partition("/")
    interval = _number(text, seconds)
    if interval <= 0:
        raise ValueError(f"shift {text!r}: the interval {seconds!r} must be > 0 seconds")
    clean = _number(text, clean_text) if slash else None
    if clean is not None and clean < 0:
        raise ValueError(f"shift {text!r}: the clean start {clean_text!r} must be >= 0 seconds")
    base = _family(text, head)
    if base.domain == "world":
        raise ValueError(f"shift {text!r}: {head} has no level to escalate")
    values = tuple(_at(text, base, _number(text, v)).level for v in levels.split(","))
    return Shift(base.family, values[-1], base.domain, base.surrogate_family, values, interval, clean, base.function)


def _variant(text: str, spec: str) -> Shift | None:
    """The world shift a `carracing:VARIANT` spec names; None where `spec` names no variant."""
    if not spec.startswith(VARIANT) or spec.removeprefix(VARIANT).partition("=")[0] not in carracing_variants.KINDS:
        return None
    try:
        variant = carracing_variants.parse_variant(spec.removeprefix(VARIANT))
    except ValueError as exc:
        raise ValueError(f"shift {text!r}: {exc}") from None
    return Shift(f"{VARIANT}{variant}", 1.0, "world", False)


def _family(text: str, head: str) -> Shift:
    """The shift `head` names (a kind, or module:function), its level still to be set."""
    if head in WORLD_KINDS:
        return Shift(head, 1.0, "world", False)
    variant = _variant(text, head)
    if variant is not None:
        return variant
    if head in CAMERA_KINDS:
        return Shift(head, 0.0, "camera", head in SURROGATE_FAMILIES)
    if head in ACTUATION_KINDS:
        return Shift(head, 0.0, "actuation", False)
    module, sep, name = head.rpartition(":")
    if not sep or not module or not name:
        known = sorted([*CAMERA_KINDS, *ACTUATION_KINDS, *WORLD_KINDS, *VARIANT_SPECS])
        raise ValueError(f"shift {text!r}: unknown kind {head!r} (choose one of {known} or module:function:LEVEL)")
    return Shift(f"user:{module}:{name}", 0.0, "camera", False, function=load_function(text, module, name))


def _at(text: str, base: Shift, level: float) -> Shift:
    """`base` at `level`, the level checked against the family's range."""
    if base.domain == "world":
        raise ValueError(f"shift {text!r}: {base.family} takes no level")
    if base.domain == "camera" and base.function is None:
        try:
            Perturbation(base.family, level)
        except ValueError as exc:
            raise ValueError(f"shift {text!r}: level out of range ({KINDS[base.family]})") from exc
    elif base.domain == "actuation":
        bad = {"steer_delay": not (0 <= level <= 250 and level.is_integer()), "action_noise": not 0 <= level <= 2}
        if bad[base.family]:
            raise ValueError(f"shift {text!r}: level out of range ({ACTUATION_KINDS[base.family]})")
    return Shift(base.family, level, base.domain, base.surrogate_family, function=base.function)


def _number(text: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"shift {text!r}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"shift {text!r}: {value!r} is not a finite number")
    return number


def load_function(text: str, module: str, name: str) -> FrameFn:
    """`module.name`, imported from the PYTHONPATH and tried once on a grey frame; ValueError in one line if not."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # any failure to import is the user's module, reported as one line
        raise ValueError(f"shift {text!r}: cannot import module {module!r} ({type(exc).__name__}: {exc})") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ValueError(f"shift {text!r}: module {module!r} has no function {name!r}")
    probe = FunctionPerturber(fn, 0.0, name=f"shift plug-in {module}:{name}")
    try:
        probe(np.full(RAW_SHAPE, 128, np.uint8))
    except ValueError as exc:
        raise ValueError(f"shift {text!r}: {exc}") from None
    except Exception as exc:
        raise ValueError(f"shift {text!r}: {module}:{name} raised {type(exc).__name__}: {exc}") from None
    return fn


class LevelledFrames:
    """A camera shift whose level may change mid-episode: one perturber per level met, each seeded per episode
    from (seed, track seed) as a fixed shift at that level would be; `level` None is the clean camera."""

    colours = None

    def __init__(self, make: Callable[[float], Any], level: float | None):
        self.make, self.level = make, level
        self.episode_seed: int | None = None
        self.perturbers: dict[float, Any] = {}

    def reset(self, episode_seed: int | None = None) -> None:
        self.episode_seed, self.perturbers = episode_seed, {}

    def __call__(self, rgb96: np.ndarray) -> np.ndarray:
        if self.level is None:
            return rgb96
        if self.level not in self.perturbers:
            self.perturbers[self.level] = self.make(self.level)
            self.perturbers[self.level].reset(self.episode_seed)
        return self.perturbers[self.level](rgb96)


class ShiftSchedule(gym.Wrapper):
    """Sets the level of `target` (None: a fixed shift such as domain_randomize) for every step and reports it in
    `info` (see the module docstring)."""

    def __init__(self, env: gym.Env, shift: Shift, target: Any | None):
        super().__init__(env)
        self.shift, self.target, self.shift_spec = shift, target, str(shift)
        self.t = 0

    def stage(self, t: int) -> int:
        """0 (clean) or the index from 1 of the level in force at step t of an episode."""
        if not self.shift.escalating:
            return 1
        clean = self.shift.clean_steps
        return 0 if t < clean else min(1 + (t - clean) // self.shift.interval_steps, len(self.shift.levels))

    def level(self, stage: int) -> float | None:
        if stage == 0:
            return None
        return self.shift.levels[stage - 1] if self.shift.escalating else self.shift.level

    def _report(self, info: dict[str, Any], stage: int) -> dict[str, Any]:
        level = self.level(stage)
        return {
            **info,
            "shift": self.shift_spec,
            "shift_level": 0.0 if level is None else float(level),
            "shift_stage": stage,
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.t = 0
        stage = self.stage(0)
        if self.target is not None:
            self.target.level = self.level(stage)
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, self._report(info, stage)

    def step(self, action):
        stage = self.stage(self.t)
        if self.target is not None:
            self.target.level = self.level(stage)
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return obs, reward, terminated, truncated, self._report(info, stage)


def shifted_env(env: gym.Env, shift: Shift | None, seed: int = 0) -> gym.Env:
    """`env` under `shift` (None: `env` itself), its randomness seeded per episode from (seed, track seed). A
    CarRacing variant is set on the simulator itself (`CarRacingBridge.set_variant`), which draws it."""
    if shift is None:
        return env
    target: Any | None
    if shift.domain == "world" and shift.family.startswith(VARIANT):  # drawn by the simulator from its next reset
        bridge = env.unwrapped
        if not isinstance(bridge, CarRacingBridge):
            raise ValueError(f"shift {shift}: a CarRacing variant needs the carracing env, not {type(bridge).__name__}")
        bridge.set_variant(carracing_variants.parse_variant(shift.family.removeprefix(VARIANT), seed))
        return ShiftSchedule(env, shift, None)
    if shift.domain == "world":
        return ShiftSchedule(PerturbedCamera(env, Perturbation(shift.family), seed), shift, None)
    if shift.domain == "actuation":
        target = ShiftedActuation(env, shift.family, None, seed)
        return ShiftSchedule(target, shift, target)
    function = shift.function
    if function is not None:
        name = f"shift plug-in {shift.family.removeprefix('user:')}"
        target = LevelledFrames(lambda level: FunctionPerturber(function, level, seed, name), None)
    else:
        target = LevelledFrames(lambda level: FramePerturber(Perturbation(shift.family, level), seed), None)
    return ShiftSchedule(PerturbedCamera(env, target, seed), shift, target)
