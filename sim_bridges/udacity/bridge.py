"""The Udacity simulator (udacity/self-driving-car-sim) as a gymnasium.Env, over Socket.IO.

The simulator is the Socket.IO *client*; we are the server (127.0.0.1:4567 unless asked otherwise). It pushes a
telemetry frame, waits for our `steer` (or `manual`) and pushes the next one -- strictly one telemetry per answer,
twice on open (websocket open and engine.io open), so two answer chains are always in flight. The transport,
`sim_bridges.udacity.server.UdacityServer`, is Socket.IO (python-socketio, served by werkzeug threads or, with
`kind="eventlet"`, by eventlet; `udacity_transport`) with the compatibility layer of `udacity_compat` for the
simulator's CONNECT-less client. `UdacityEnv.step()` answers the
frame the last observation came from and blocks, with a timeout, for the next one.

Every frame is answered exactly once, whatever happens:
- empty telemetry (a person drives) -> `manual`, at once, by the transport;
- a frame that fails validation (see `udacity_protocol`) -> a logged warning, the counter `refused.<reason>` and the
  safe steer "0.0000"/"0.0000", at once;
- valid frames wait (at most `max_pending`) for the env; when the env takes the newest, older waiting ones are
  answered with the same command as the newest ("coalesced": the double telemetry on open, a reconnect);
- beyond `max_pending` waiting frames (a flood) the oldest is answered with the safe steer (`refused.flood`).
Engine.io closes a connection whose single message exceeds `max_packet_bytes` (16 MB): a guard against memory
exhaustion, far above any real frame; below it an oversized image field is refused and answered like any bad frame.

The env is registered `nondeterministic` (a real-time simulator: the same actions never give the same frames); it
has no reward (0.0) and never terminates by itself; `truncated` with info["timeout"] when no frame arrives in time.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec

from sim_bridges.udacity.protocol import IMAGE_SHAPE
from sim_bridges.udacity.server import Frame, UdacityServer

ENV_ID = "drive/Udacity-v0"
SPEC = EnvSpec(id=ENV_ID, entry_point="sim_bridges.udacity.bridge:UdacityEnv", nondeterministic=True)
INFO_KEYS = ("speed_mph", "steering", "throttle", "jpeg", "frame", "received_at", "timeout")
__all__ = ["ENV_ID", "SPEC", "Frame", "UdacityEnv", "UdacityServer", "check_bridge", "register"]


def register() -> None:
    """Make `gymnasium.make("drive/Udacity-v0", port=...)` work (idempotent; never done at import)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point=SPEC.entry_point, nondeterministic=True)


class UdacityEnv(gym.Env):
    """gymnasium.Env over `UdacityServer`.

    Observation: Dict(image=(160, 320, 3) uint8 RGB front camera, speed=(1,) float32 mph).
    Action: Box([-1, -1], [1, 1]) float32 = (steering normalised to +-25 degrees, throttle; negative brakes).
    info: speed_mph, steering and throttle (the car's own, normalised), jpeg (the frame's bytes as received),
    frame (index), received_at (perf_counter), timeout (bool).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 4567,
        timeout_s: float = 5.0,
        connect_timeout_s: float = 120.0,
        render_mode: str | None = None,
        server: UdacityServer | None = None,
        **server_kwargs,
    ):
        self.spec = SPEC
        self.render_mode = render_mode
        self.timeout_s, self.connect_timeout_s = float(timeout_s), float(connect_timeout_s)
        self.server = server if server is not None else UdacityServer(host, port, **server_kwargs)
        self._own_server = server is None
        self.observation_space = spaces.Dict(
            image=spaces.Box(0, 255, IMAGE_SHAPE, np.uint8),
            speed=spaces.Box(0.0, self.server.limits.max_speed_mph, (1,), np.float32),
        )
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._held: Frame | None = None
        self._last_obs = None

    def _observe(self, frame: Frame) -> tuple[dict, dict]:
        t = frame.telemetry
        obs = {"image": t.image, "speed": np.array([t.speed_mph], np.float32)}
        info = {
            "speed_mph": t.speed_mph,
            "steering": t.steering,
            "throttle": t.throttle,
            "jpeg": t.jpeg,
            "frame": frame.index,
            "received_at": frame.received_at,
            "timeout": False,
        }
        self._held, self._last_obs = frame, obs
        return obs, info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self._held is not None:  # a new episode does not act on the old episode's frame
            self.server.answer_safe(self._held)
            self._held = None
        frame = self.server.next_frame(self.connect_timeout_s)
        if frame is None:
            raise TimeoutError(
                f"no telemetry on ws://{self.server.host}:{self.server.port} within {self.connect_timeout_s:g} s: "
                "start the simulator and choose Autonomous Mode"
            )
        return self._observe(frame)

    def step(self, action):
        action = np.asarray(action, dtype=np.float64).reshape(2)
        if self._held is not None:
            self.server.answer(self._held, float(action[0]), float(action[1]))
            self._held = None
        frame = self.server.next_frame(self.timeout_s)
        if frame is None:
            info = {k: None for k in INFO_KEYS} | {"timeout": True}
            return self._last_obs, 0.0, False, True, info
        obs, info = self._observe(frame)
        return obs, 0.0, False, False, info

    def render(self):
        if self._last_obs is None:
            return np.zeros(IMAGE_SHAPE, np.uint8)
        return self._last_obs["image"].copy()

    def close(self):
        if self._held is not None and not self.server._closed:
            self.server.answer_safe(self._held)
            self._held = None
        if self._own_server:
            self.server.close()


def check_bridge(env: UdacityEnv) -> None:
    """Gymnasium's check_env (a client must be sending telemetry) plus our contract on spaces and info keys."""
    from gymnasium.utils.env_checker import check_env

    if env.unwrapped.spec is None or env.unwrapped.spec.nondeterministic is not True:
        raise AssertionError("the Udacity env must carry a spec flagged nondeterministic")
    check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)
    box = env.action_space
    if not (isinstance(box, spaces.Box) and box.shape == (2,) and box.dtype == np.float32):
        raise AssertionError(f"action space must be Box(2,) float32 (steering, throttle), got {box}")
    obs, info = env.reset()
    step = env.step(np.zeros(2, np.float32))
    for when, o, inf in (("reset", obs, info), ("step", step[0], step[4])):
        if o["image"].shape != IMAGE_SHAPE or o["image"].dtype != np.uint8:
            raise AssertionError(f"{when}: image {o['image'].shape} {o['image'].dtype}, expected {IMAGE_SHAPE} uint8")
        missing = [k for k in INFO_KEYS if k not in inf]
        if missing:
            raise AssertionError(f"{when}: info lacks {missing}")
