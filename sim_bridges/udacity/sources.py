"""What the Udacity stand-in sends: a recorded driving_log.csv, a closed loop over CarRacing, and malformed frames.

A source has `telemetry() -> dict[str, str]` (the fields of the next frame, C# N4 strings), `apply(steering,
throttle)` (a parsed `steer`), `done` and `reference_jpeg()` (a real frame the malformed variants are made from).

`CarRacingSource` is the closed loop: CarRacing's 96x96 view without its indicator bar (rows 0..83, all 96 columns)
resized to the simulator's 320x160 camera frame and sent as a JPEG; every parsed steer is applied for one physics
step (steering as is; throttle > 0 is gas, < 0 is brake, as the simulator's CarController.Move reads
acceleration and footbrake from one value); speed is CarRacing's m/s in mph; "steering_angle" is the applied
steering x 25 degrees and "throttle" its clamped gas (CurrentSteerAngle, AccelInput). The policy on the other end
sees only this -- never CarRacing's privileged state.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import cv2
import numpy as np

from sim_bridges.udacity.protocol import IMAGE_SHAPE, MAX_STEER_DEG, MPH_PER_MPS, encode_jpeg, n4

CAMERA_ROWS = 84  # CarRacing's state pixels above the 12-row indicator bar


def read_driving_log(path: str | Path) -> list[tuple[Path, float, float, float]]:
    """(center image, steering, throttle, speed) per row of a driving_log.csv, images found by basename in IMG/.

    A deliberately small reader (sim_bridges may not import datasets): header or not, Windows or POSIX paths,
    ", " or "," separators. datasets/udacity.py is the full loader with its error reporting.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "driving_log.csv"
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        parts = [p.strip() for p in line.split(",")]
        if not line.strip() or parts[0] == "center":
            continue
        if len(parts) != 7:
            raise ValueError(f"{path}:{n}: {len(parts)} fields, expected 7")
        image = path.parent / "IMG" / parts[0].replace("\\", "/").rsplit("/", 1)[-1]
        if not image.is_file():
            raise FileNotFoundError(f"{path}:{n}: {image} not found")
        rows.append((image, float(parts[3]), float(parts[4]), float(parts[6])))
    return rows


class ReplaySource:
    """Center frames of a recorded driving_log.csv in order (steering back in degrees); `loop` to cycle."""

    def __init__(self, log_path: str | Path, loop: bool = False, limit: int | None = None):
        self.rows = read_driving_log(log_path)[:limit]
        if not self.rows:
            raise ValueError(f"{log_path}: no rows")
        self.loop, self.i, self.applied = loop, 0, []
        self._b64: dict[Path, str] = {}

    @property
    def done(self) -> bool:
        return not self.loop and self.i >= len(self.rows)

    def reference_jpeg(self) -> bytes:
        return self.rows[0][0].read_bytes()

    def telemetry(self) -> dict[str, str]:
        image, steering, throttle, speed = self.rows[self.i % len(self.rows)]
        self.i += 1
        if image not in self._b64:
            self._b64[image] = base64.b64encode(image.read_bytes()).decode("ascii")
        return {
            "steering_angle": n4(steering * MAX_STEER_DEG),
            "throttle": n4(throttle),
            "speed": n4(speed),
            "image": self._b64[image],
        }

    def apply(self, steering: float, throttle: float) -> None:
        self.applied.append((steering, throttle))


def carracing_camera(raw96: np.ndarray) -> np.ndarray:
    """(96, 96, 3) CarRacing state pixels -> (160, 320, 3) uint8, the simulator's camera frame size."""
    road = raw96[:CAMERA_ROWS]  # (84, 96, 3)
    return cv2.resize(road, (IMAGE_SHAPE[1], IMAGE_SHAPE[0]), interpolation=cv2.INTER_LINEAR)  # (160, 320, 3)


class CarRacingSource:
    """Closed loop over `sim_bridges.carracing.bridge.make_carracing`; `result` holds the episode's outcome."""

    def __init__(self, seed: int = 0, max_steps: int = 3000, jpeg_quality: int = 75, fast_render: bool = True):
        from sim_bridges.carracing.bridge import make_carracing

        self.env = make_carracing("pixels", fast_render, max_episode_steps=max_steps)
        self.frame, self.info = self.env.reset(seed=seed)  # (96, 96, 3) RGB
        self.quality = jpeg_quality
        self.steering = self.throttle = 0.0
        self.result = {
            "seed": seed,
            "steps": 0,
            "return": 0.0,
            "lap_finished": False,
            "progress": 0.0,
            "off_track_steps": 0,
            "terminated": False,
            "truncated": False,
        }
        self.done = False

    def reference_jpeg(self) -> bytes:
        return encode_jpeg(carracing_camera(self.frame), self.quality)

    def telemetry(self) -> dict[str, str]:
        jpeg = encode_jpeg(carracing_camera(self.frame), self.quality)
        return {
            "steering_angle": n4(self.steering * MAX_STEER_DEG),
            "throttle": n4(max(self.throttle, 0.0)),
            "speed": n4(self.info["speed"] * MPH_PER_MPS),
            "image": base64.b64encode(jpeg).decode("ascii"),
        }

    def apply(self, steering: float, throttle: float) -> None:
        if self.done:
            return
        self.steering, self.throttle = steering, throttle
        action = np.array([steering, max(throttle, 0.0), max(-throttle, 0.0)], np.float32)
        self.frame, reward, terminated, truncated, self.info = self.env.step(action)
        r = self.result
        r["steps"] += 1
        r["return"] += float(reward)
        r["progress"] = float(self.info["progress"])
        r["off_track_steps"] += int(self.info["off_track"])
        r["lap_finished"] = r["lap_finished"] or bool(self.info["lap_finished"])
        r["terminated"], r["truncated"] = bool(terminated), bool(truncated)
        self.done = bool(terminated or truncated)

    def close(self) -> None:
        self.env.close()


def _fields(jpeg: bytes, **override) -> dict:
    fields = {"steering_angle": "1.2500", "throttle": "0.3000", "speed": "12.0000"}
    fields["image"] = base64.b64encode(jpeg).decode("ascii")
    fields.update(override)
    return {k: v for k, v in fields.items() if v is not _DROP}


_DROP = object()


def _reencode(jpeg: bytes, transform, ext: str = ".jpg") -> str:
    bgr = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    ok, buf = cv2.imencode(ext, transform(bgr))
    return base64.b64encode(buf.tobytes()).decode("ascii")


# kind -> (the server's refusal reason, a builder of the packet text from a real JPEG)
MALFORMED = {
    "bad_base64": ("bad_base64", lambda j: _fields(j, image="!!" + _fields(j)["image"][2:])),
    "bad_padding": ("bad_base64", lambda j: _fields(j, image=_fields(j)["image"][:-1])),
    "truncated_jpeg": ("truncated_jpeg", lambda j: _fields(j[: len(j) // 2])),
    "corrupt_jpeg": ("corrupt_jpeg", lambda j: _fields(j[:3] + bytes(range(256)) * 8 + b"\xff\xd9")),
    "wrong_size": ("wrong_image_size", lambda j: {**_fields(j), "image": _reencode(j, lambda b: b[:64, :128])}),
    "grayscale": ("wrong_image_size", lambda j: {**_fields(j), "image": _reencode(j, lambda b: b[..., 0])}),
    "png": ("not_jpeg", lambda j: {**_fields(j), "image": _reencode(j, lambda b: b, ".png")}),
    "missing_speed": ("missing", lambda j: _fields(j, speed=_DROP)),
    "missing_image": ("missing", lambda j: _fields(j, image=_DROP)),
    "number_not_string": ("non_string", lambda j: _fields(j, speed=12.0)),
    "null_field": ("non_string", lambda j: _fields(j, steering_angle=None)),
    "image_not_string": ("non_string", lambda j: _fields(j, image=123)),
    "non_numeric": ("non_numeric", lambda j: _fields(j, throttle="fast")),
    "nan": ("not_finite", lambda j: _fields(j, steering_angle="NaN")),
    "infinity": ("not_finite", lambda j: _fields(j, speed="Infinity")),
    "overflow": ("not_finite", lambda j: _fields(j, speed="1e999")),
    "out_of_range": ("out_of_range", lambda j: _fields(j, steering_angle="99.0000")),
    "oversized_image": ("oversized", lambda j: _fields(j, image="QUFB" * (300_000))),
    "not_an_object": ("not_an_object", lambda j: "hello"),
    "array_payload": ("not_an_object", lambda j: [1, 2]),
    "extra_argument": ("bad_arguments", lambda j: (_fields(j), {})),
    "no_payload": ("bad_arguments", lambda j: ()),
    "broken_json": ("undecodable", lambda j: '42["telemetry",{"steering_angle":"0.0'),
}
MALFORMED_KINDS = tuple(MALFORMED)


def malformed_packet(i: int, jpeg: bytes) -> tuple[str, str]:
    """The i-th malformed telemetry packet (cycling through MALFORMED_KINDS): (kind, packet text)."""
    kind = MALFORMED_KINDS[i % len(MALFORMED_KINDS)]
    payload = MALFORMED[kind][1](jpeg)
    if isinstance(payload, str) and payload.startswith("42"):
        return kind, payload
    args = list(payload) if isinstance(payload, tuple) else [payload]
    return kind, "42" + json.dumps(["telemetry", *args], separators=(",", ":"))
