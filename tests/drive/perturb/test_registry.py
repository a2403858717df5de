"""drive/perturb/registry.py: one spec grammar for camera, world, actuation and user shifts, the wrappers it builds
(steering delay, action noise, a user's plug-in, severity escalation) and `drive eval --perturb` on the new kinds."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from drive.cli import main
from drive.loop.envs import make_env
from drive.perturb.camera import FramePerturber, Perturbation
from drive.perturb.registry import Shift, parse_shift, shifted_env
from drive.perturb.wrappers import PerturbedCamera

NSAC = Path(__file__).resolve().parents[3] / "checkpoints" / "carracing_nsac.pt"
PLUGIN = """
import numpy as np

def stripes(frame, level, rng):
    out = frame.copy()
    out[:, rng.integers(0, 96, int(level))] = 0
    return out

def flat(frame, level, rng):
    return frame[..., 0]

def floats(frame, level, rng):
    return frame / 255.0

def broken(frame, level, rng):
    raise RuntimeError("lens cap on")

not_a_function = 3
"""


class Executed(gym.Wrapper):
    """Records the action the simulator is finally given."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.actions: list[np.ndarray] = []

    def step(self, action):
        self.actions.append(np.array(action, np.float32))
        return self.env.step(action)


def _drive(env: gym.Env, actions: np.ndarray, seed: int = 1000) -> tuple[list[np.ndarray], list[dict]]:
    obs, info = env.reset(seed=seed)
    frames, infos = [obs], [info]
    for action in actions:
        obs, _, _, _, info = env.step(action)
        frames.append(obs)
        infos.append(info)
    return frames, infos


def _commands(n: int) -> np.ndarray:
    t = np.arange(n)
    return np.stack([0.8 * np.sin(t / 3.0), 0.3 + 0.2 * np.cos(t), 0.1 * (t % 2)], 1).astype(np.float32)


@pytest.mark.parametrize(
    ("spec", "family", "level", "domain", "surrogate"),
    [("noise:0.1", "noise", 0.1, "camera", True), ("brightness:0.6", "brightness", 0.6, "camera", True),
     ("fog:0.5", "fog", 0.5, "camera", False), ("motion_blur:7", "motion_blur", 7, "camera", False),
     ("jpeg:90", "jpeg", 90, "camera", False), ("hue:45", "hue", 45, "camera", False),
     ("domain_randomize", "domain_randomize", 1.0, "world", False),
     ("steer_delay:5", "steer_delay", 5, "actuation", False),
     ("action_noise:0.1", "action_noise", 0.1, "actuation", False),
     ("escalate:fog:0.2,0.4,0.6@4", "fog", 0.6, "camera", False),
     ("escalate:fog:0.1,0.2,0.3@1/3", "fog", 0.3, "camera", False)],
)  # fmt: skip
def test_specs_name_family_level_domain_and_surrogate(spec, family, level, domain, surrogate):
    shift = parse_shift(f" {spec} ")
    assert (shift.family, shift.level, shift.domain, shift.surrogate_family) == (family, level, domain, surrogate)
    assert str(shift) == spec and parse_shift(str(shift)) == shift


@pytest.mark.parametrize(
    ("spec", "says"),
    [("fog", "give KIND:LEVEL"), ("fog:1", "out of range"), ("steer_delay:2.5", "out of range"),
     ("steer_delay:-1", "out of range"), ("action_noise:3", "out of range"), ("domain_randomize:1", "no level"),
     ("wind:0.3", "unknown kind 'wind'"), ("no_such_lens_xyz:f:1", "cannot import module"),
     ("noise:x", "not a number"), ("noise:inf", "not a finite"),
     ("escalate:fog:0.2,0.4", "escalate:KIND"), ("escalate:fog:0.2,1.4@4", "out of range"),
     ("escalate:fog:0.2@0", "must be > 0"), ("escalate:domain_randomize:1@2", "no level to escalate"),
     ("escalate:fog:0.2@1/-1", "must be >= 0"), ("escalate:fog:0.2@1/x", "not a number")],
)  # fmt: skip
def test_bad_specs_are_one_line_value_errors(spec, says):
    with pytest.raises(ValueError, match=says) as err:
        parse_shift(spec)
    assert "\n" not in str(err.value)


def test_a_fixed_camera_shift_is_todays_perturbed_camera():
    actions = _commands(6)
    shifted, infos = _drive(shifted_env(make_env("carracing", max_episode_steps=20), parse_shift("noise:0.1")), actions)
    plain, _ = _drive(PerturbedCamera(make_env("carracing", max_episode_steps=20), Perturbation("noise", 0.1)), actions)
    assert all(np.array_equal(a, b) for a, b in zip(shifted, plain, strict=True))
    assert all(i["shift"] == "noise:0.1" and i["shift_level"] == 0.1 and i["shift_stage"] == 1 for i in infos)


def test_steering_reaches_the_car_exactly_n_steps_late():
    recorder = Executed(make_env("carracing", pixels=False, max_episode_steps=50))
    env = shifted_env(recorder, parse_shift("steer_delay:3"))
    actions = _commands(12)
    _, infos = _drive(env, actions)
    executed = np.stack(recorder.actions)
    np.testing.assert_array_equal(executed[:3, 0], 0.0)  # nothing commanded yet
    np.testing.assert_array_equal(executed[3:, 0], actions[:-3, 0])
    np.testing.assert_array_equal(executed[:, 1:], actions[:, 1:])  # gas and brake on time
    np.testing.assert_array_equal(np.stack([i["executed_action"] for i in infos[1:]]), executed)
    recorder.actions.clear()
    _drive(env, actions)  # a new episode starts with an empty delay line
    np.testing.assert_array_equal(np.stack(recorder.actions)[:3, 0], 0.0)


def test_action_noise_is_seeded_per_episode_and_stays_in_the_action_space():
    def run(seed: int, track: int) -> np.ndarray:
        recorder = Executed(make_env("carracing", pixels=False, max_episode_steps=300))
        _drive(shifted_env(recorder, parse_shift("action_noise:0.05"), seed=seed), actions, seed=track)
        return np.stack(recorder.actions)

    actions = np.tile(np.array([[0.0, 0.5, 0.5]], np.float32), (200, 1))
    first = run(0, 1000)
    np.testing.assert_array_equal(first, run(0, 1000))
    assert not np.array_equal(first, run(0, 1001)) and not np.array_equal(first, run(1, 1000))
    space = make_env("carracing", pixels=False).action_space
    assert ((first >= space.low) & (first <= space.high)).all()
    assert (first - actions).std(0) == pytest.approx([0.05] * 3, rel=0.15)


def _plugin(tmp_path, monkeypatch, name: str = "my_lens") -> str:
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_user_plugin_drives_an_episode_reproducibly(tmp_path, monkeypatch):
    module = _plugin(tmp_path, monkeypatch)
    shift = parse_shift(f"{module}:stripes:4")
    assert (shift.family, shift.level, shift.domain, shift.surrogate_family) == (f"user:{module}:stripes", 4.0,
                                                                                  "camera", False)  # fmt: skip
    assert str(shift) == f"{module}:stripes:4"
    actions = _commands(8)
    runs = [_drive(shifted_env(make_env("carracing", max_episode_steps=20), shift, seed=2), actions)[0]
            for _ in range(2)]  # fmt: skip
    clean, _ = _drive(make_env("carracing", max_episode_steps=20), actions)
    assert all(np.array_equal(a, b) for a, b in zip(*runs, strict=True))
    for frame, plain in zip(runs[0], clean, strict=True):
        dark_columns = (frame == 0).all((0, 2)) & ~(plain == 0).all((0, 2))
        assert 1 <= dark_columns.sum() <= 4 and np.array_equal(frame[:, ~dark_columns], plain[:, ~dark_columns])


@pytest.mark.parametrize(
    ("function", "says"),
    [("flat", r"shift plug-in my_lens:flat returned \(96, 96\) uint8"), ("floats", "returned .* float64"),
     ("broken", "my_lens:broken raised RuntimeError: lens cap on"), ("missing", "has no function 'missing'"),
     ("not_a_function", "has no function 'not_a_function'")],
)  # fmt: skip
def test_bad_plugins_are_one_line_errors(tmp_path, monkeypatch, function, says):
    module = _plugin(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match=says) as err:
        parse_shift(f"{module}:{function}:1")
    assert "\n" not in str(err.value)


def test_a_module_that_does_not_import_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "bad_lens.py").write_text("import nonexistent_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="cannot import module 'bad_lens' .*ModuleNotFoundError") as err:
        parse_shift("bad_lens:f:1")
    assert "\n" not in str(err.value)


def test_escalation_is_clean_first_then_steps_up_every_interval():
    shift = parse_shift("escalate:fog:0.2,0.4@0.1")  # 0.1 s = 5 steps at 50 steps/s
    assert shift.levels == (0.2, 0.4) and shift.interval_steps == 5
    actions = _commands(16)
    frames, infos = _drive(shifted_env(make_env("carracing", max_episode_steps=30), shift), actions)
    clean, _ = _drive(make_env("carracing", max_episode_steps=30), actions)
    levels = [i["shift_level"] for i in infos[1:]]  # the level of step t, with the frame step t returned
    assert levels == [0.0] * 5 + [0.2] * 5 + [0.4] * 6
    assert [i["shift_stage"] for i in infos[1:]] == [0] * 5 + [1] * 5 + [2] * 6
    assert infos[0]["shift_level"] == 0.0 and all(i["shift"] == str(shift) for i in infos)
    for frame, plain, level in zip(frames, clean, [0.0, *levels], strict=True):
        expected = FramePerturber(Perturbation("fog", level))(plain) if level else plain
        assert np.array_equal(frame, expected)


def test_a_ramp_has_its_own_clean_start_then_a_level_every_interval():
    shift = parse_shift("escalate:fog:0.2,0.4,0.6@0.04/0.1")  # 5 clean steps, then a level every 2 steps
    assert (shift.clean_steps, shift.interval_steps) == (5, 2)
    actions = _commands(12)
    _, infos = _drive(shifted_env(make_env("carracing", max_episode_steps=30), shift), actions)
    assert [i["shift_stage"] for i in infos[1:]] == [0] * 5 + [1] * 2 + [2] * 2 + [3] * 3
    assert parse_shift("escalate:fog:0.2@2").clean_steps == 100  # without /CLEAN: one interval, as before


def test_escalation_of_an_actuation_and_a_user_kind(tmp_path, monkeypatch):
    recorder = Executed(make_env("carracing", pixels=False, max_episode_steps=50))
    actions = _commands(15)
    _, infos = _drive(shifted_env(recorder, parse_shift("escalate:steer_delay:2,4@0.1")), actions)
    steer = np.stack(recorder.actions)[:, 0]
    np.testing.assert_array_equal(steer[:5], actions[:5, 0])  # clean: no delay
    np.testing.assert_array_equal(steer[5:10], actions[3:8, 0])  # 2 steps late
    np.testing.assert_array_equal(steer[10:], actions[6:11, 0])  # 4 steps late
    assert [i["shift_level"] for i in infos[1:]] == [0.0] * 5 + [2.0] * 5 + [4.0] * 5
    module = _plugin(tmp_path, monkeypatch)
    shift = parse_shift(f"escalate:{module}:stripes:3,6@0.04")  # 2 steps each
    frames, infos = _drive(shifted_env(make_env("carracing", max_episode_steps=20), shift), actions[:7])
    clean, _ = _drive(make_env("carracing", max_episode_steps=20), actions[:7])
    assert [i["shift_level"] for i in infos[1:]] == [0, 0, 3, 3, 6, 6, 6]
    assert all(np.array_equal(a, b) for a, b in zip(frames[:3], clean[:3], strict=True))  # reset + 2 clean steps
    assert all(not np.array_equal(a, b) for a, b in zip(frames[3:], clean[3:], strict=True))


def test_no_shift_is_the_env_itself():
    env = make_env("carracing", pixels=False)
    assert shifted_env(env, None) is env
    assert isinstance(parse_shift("domain_randomize"), Shift)


def test_drive_eval_perturb_runs_a_held_out_family(tmp_path, capsys):
    out = tmp_path / "fog.json"
    argv = ["eval", "--ckpt", str(NSAC), "--seeds", "1000", "--max-episode-steps", "20", "--perturb", "fog:0.5",
            "--no-progress", "--failure-horizon", "0", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["perturb"] == "fog:0.5" and result["episodes"][0]["steps"] == 20
    capsys.readouterr()
    assert main([("fog:1" if a == "fog:0.5" else a) for a in argv]) == 2
    assert "--perturb: shift 'fog:1': level out of range" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["color", "color3", "bar", "blob", "noise"])
def test_carracing_variants_are_world_shifts(kind):
    shift = parse_shift(f" carracing:{kind} ")
    assert (shift.family, shift.level, shift.domain) == (f"carracing:{kind}", 1.0, "world")
    assert not shift.surrogate_family and not shift.escalating
    assert str(shift) == f"carracing:{kind}" and parse_shift(str(shift)) == shift


@pytest.mark.parametrize(
    ("spec", "says"),
    [("carracing:color:1", "takes no level"), ("escalate:carracing:bar:1@2", "no level to escalate"),
     ("carracing:video", "folder of PNG"), ("carracing:video=/no/such/folder", "not a folder"),
     ("color3", "carracing:VARIANT"), ("color3:1", "'carracing:color3'")],
)  # fmt: skip
def test_bad_variant_specs_are_one_line_value_errors(spec, says):
    with pytest.raises(ValueError, match=says) as err:
        parse_shift(spec)
    assert "\n" not in str(err.value)


def test_a_variant_shift_is_the_registered_variant_env(tmp_path):
    from sim_bridges import registry

    registry.register()
    actions = _commands(8)
    for kind in ("blob", "noise"):
        env = shifted_env(make_env("carracing", max_episode_steps=50), parse_shift(f"carracing:{kind}"))
        frames, infos = _drive(env, actions)
        assert all(info["shift"] == f"carracing:{kind}" and info["shift_stage"] == 1 for info in infos)
        same, _ = _drive(gym.make(registry.VARIANT_IDS[kind], max_episode_steps=50), actions)
        np.testing.assert_array_equal(np.stack(frames), np.stack(same))
    cv2 = pytest.importorskip("cv2")
    cv2.imwrite(str(tmp_path / "1.png"), np.full((4, 4, 3), 200, np.uint8))
    env = shifted_env(make_env("carracing", max_episode_steps=50), parse_shift(f"carracing:video={tmp_path}"))
    assert str(env.unwrapped.variant) == f"video={tmp_path}"
    with pytest.raises(ValueError, match="needs the carracing env"):
        shifted_env(make_env("fake-road"), parse_shift("carracing:bar"))


def test_drive_eval_perturb_runs_a_carracing_variant(tmp_path):
    out = tmp_path / "color3.json"
    argv = ["eval", "--ckpt", str(NSAC), "--seeds", "1000", "--max-episode-steps", "20", "--perturb",
            "carracing:color3", "--no-progress", "--failure-horizon", "0", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["perturb"] == "carracing:color3" and result["episodes"][0]["steps"] == 20
