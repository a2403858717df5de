"""The Udacity simulator's telemetry and steer messages: parsing, validation, the answers we send, and the raw
packets the simulator itself writes and reads (`telemetry_packet`, `decode_packet`: sim_bridges/udacity/standin.py).

Facts from the simulator's own source (udacity/self-driving-car-sim, Assets/1_SelfDrivingCar/Scripts/CommandServer.cs):
- telemetry is `42["telemetry",{"steering_angle":S,"throttle":T,"speed":V,"image":B64}]`, every value a string written
  with C#'s `ToString("N4")` (4 decimals): steering in degrees (the car's current wheel angle, +-25), throttle in
  [0, 1], speed in mph, and a base64 320x160 JPEG from the front camera; `42["telemetry",{}]` while a person drives.
- it reads `steer` with `float.Parse(json.GetField("steering_angle").str)` (and "throttle"): the values MUST be JSON
  strings (a JSON number has no `.str`, the parse throws, no telemetry follows and the car stalls for good).
  Steering is normalised to [-1, 1] (x 25 degrees), throttle in [-1, 1] (negative brakes/reverses).

Everything that can be wrong with a telemetry frame raises `TelemetryError(reason, field)`; the bridge turns it into a
logged warning, a counted reason and the safe answer `SAFE_STEER` -- never a crash, never an unanswered frame.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass

import cv2
import numpy as np

IMAGE_SHAPE = (160, 320, 3)  # the front camera: 320x160 RGB
MAX_STEER_DEG = 25.0  # CarController.m_MaximumSteerAngle: telemetry degrees / 25 = normalised steering
MPH_PER_MPS = 2.23693629  # CarController.CurrentSpeed: rigidbody speed (m/s) * 2.23693629
FIELDS = ("steering_angle", "throttle", "speed", "image")
SAFE_STEER = {"steering_angle": "0.0000", "throttle": "0.0000"}
# A number as C#'s N4 writes it (plus exponents, which float.Parse also reads). Thousands separators never occur
# in range (|value| < 1000); NaN/Infinity are refused on purpose.
_NUMBER = re.compile(r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$")
_NON_FINITE = re.compile(r"^\s*[+-]?(nan|inf|infinity|∞)\s*$", re.IGNORECASE)
_JPEG_SOI, _JPEG_EOI = b"\xff\xd8\xff", b"\xff\xd9"


@dataclass(frozen=True)
class Limits:
    """What a telemetry frame may look like before it is refused (values from the simulator's real range)."""

    max_image_b64: int = 1 << 20
    """largest accepted base64 image field in characters (a real 320x160 frame is ~12-40 KB)"""
    max_number_chars: int = 32
    """longest accepted numeric string"""
    max_speed_mph: float = 500.0
    """speeds above this are refused (the simulator tops out near 30 mph; the CarRacing stand-in near 200)"""


class TelemetryError(ValueError):
    """A telemetry frame that cannot be used; `reason` is the counter key, `field` the offending field."""

    def __init__(self, reason: str, field: str, detail: str = ""):
        self.reason, self.field = reason, field
        super().__init__(f"telemetry field {field!r}: {reason}" + (f" ({detail})" if detail else ""))


@dataclass(frozen=True)
class Telemetry:
    """One valid telemetry frame, in the units the rest of the project uses."""

    image: np.ndarray  # (160, 320, 3) uint8 RGB
    jpeg: bytes  # the camera frame exactly as received (recording writes these bytes)
    steering: float  # the car's current steering, normalised to [-1, 1]
    throttle: float  # the car's current throttle input
    speed_mph: float


def is_manual(data) -> bool:
    """`{}` (or `null`, which a JSONObject() with no fields may serialise to) is telemetry while a person drives."""
    return data is None or (isinstance(data, dict) and len(data) == 0)


def _number(data: dict, field: str, lo: float, hi: float, limits: Limits) -> float:
    if field not in data:
        raise TelemetryError("missing", field)
    raw = data[field]
    if not isinstance(raw, str):
        raise TelemetryError("non_string", field, f"got JSON {type(raw).__name__}")
    if len(raw) > limits.max_number_chars:
        raise TelemetryError("oversized", field, f"{len(raw)} characters")
    if _NON_FINITE.match(raw):
        raise TelemetryError("not_finite", field, repr(raw))
    if not _NUMBER.match(raw):
        raise TelemetryError("non_numeric", field, repr(raw[:16]))
    value = float(raw)
    if not math.isfinite(value):
        raise TelemetryError("not_finite", field, repr(raw))
    if not lo <= value <= hi:
        raise TelemetryError("out_of_range", field, f"{value} not in [{lo}, {hi}]")
    return value


def decode_jpeg(jpeg: bytes, field: str = "image") -> np.ndarray:
    """JPEG bytes -> (160, 320, 3) uint8 RGB, or TelemetryError naming what is wrong."""
    if not jpeg.startswith(_JPEG_SOI):
        raise TelemetryError("not_jpeg", field, f"starts with {jpeg[:4].hex() or 'nothing'}")
    if _JPEG_EOI not in jpeg[-16:]:  # libjpeg pads a truncated scan with grey and returns an image: refuse it first
        raise TelemetryError("truncated_jpeg", field, "no end-of-image marker")
    # libjpeg itself may print "Corrupt JPEG data: ..." to stderr for a damaged scan (not through OpenCV's logging,
    # so it cannot be silenced without redirecting the process's fd 2); our own warning follows it.
    bgr = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_UNCHANGED)
    if bgr is None:
        raise TelemetryError("corrupt_jpeg", field, f"{len(jpeg)} bytes do not decode")
    if bgr.shape != IMAGE_SHAPE or bgr.dtype != np.uint8:
        raise TelemetryError("wrong_image_size", field, f"decoded {bgr.shape} {bgr.dtype}, expected {IMAGE_SHAPE}")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def parse_telemetry(data, limits: Limits | None = None) -> Telemetry:
    """Validate a non-empty telemetry payload (the dict after `42["telemetry", ...]`)."""
    limits = limits or Limits()
    if not isinstance(data, dict):
        raise TelemetryError("not_an_object", "<payload>", f"got JSON {type(data).__name__}")
    steering_deg = _number(data, "steering_angle", -MAX_STEER_DEG * 1.0001, MAX_STEER_DEG * 1.0001, limits)
    throttle = _number(data, "throttle", -1.0001, 1.0001, limits)
    speed = _number(data, "speed", -0.5, limits.max_speed_mph, limits)
    if "image" not in data:
        raise TelemetryError("missing", "image")
    b64 = data["image"]
    if not isinstance(b64, str):
        raise TelemetryError("non_string", "image", f"got JSON {type(b64).__name__}")
    if len(b64) > limits.max_image_b64:
        raise TelemetryError("oversized", "image", f"{len(b64)} > {limits.max_image_b64} characters")
    try:
        jpeg = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TelemetryError("bad_base64", "image", str(exc)) from None
    image = decode_jpeg(jpeg)
    return Telemetry(image, jpeg, steering_deg / MAX_STEER_DEG, throttle, max(speed, 0.0))


def format_number(value: float) -> str:
    """C#-compatible 4-decimal string in [-1, 1]; NaN becomes 0 (never sent), -0.0000 becomes 0.0000."""
    value = float(value)
    if not math.isfinite(value):
        value = 0.0
    text = f"{min(max(value, -1.0), 1.0):.4f}"
    return "0.0000" if text == "-0.0000" else text


def n4(value: float) -> str:
    """C#'s `ToString("N4")` (invariant culture): 4 decimals with ',' thousands groups, as the simulator writes."""
    text = format(float(value), ",.4f")
    return "0.0000" if text == "-0.0000" else text


def steer_payload(steering: float, throttle: float) -> dict[str, str]:
    """The data of a `steer` answer: JSON strings, as float.Parse(... .str) needs."""
    return {"steering_angle": format_number(steering), "throttle": format_number(throttle)}


def csharp_float_parse(text) -> float:
    """What the simulator's `float.Parse(field.str)` accepts (invariant culture), for the stand-in.

    Raises TypeError for a non-string (`.str` is null for a JSON number: ArgumentNullException in C#) and
    ValueError for text float.Parse refuses (FormatException). NumberStyles.Float|AllowThousands: whitespace, sign,
    digits with ',' group separators, a decimal point, an exponent; "NaN"/"Infinity" are culture symbols it accepts.
    """
    if not isinstance(text, str):
        raise TypeError(f"float.Parse(null): the field is JSON {type(text).__name__}, not a string")
    stripped = text.strip()
    if stripped in ("NaN", "Infinity", "-Infinity"):
        return float(stripped.replace("Infinity", "inf"))
    if not re.fullmatch(r"[+-]?(\d[\d,]*(\.\d*)?|\.\d+)([eE][+-]?\d+)?", stripped):
        raise ValueError(f"float.Parse: input string {text!r} was not in a correct format")
    return float(stripped.replace(",", ""))


def encode_jpeg(rgb: np.ndarray, quality: int = 75) -> bytes:
    """(160, 320, 3) uint8 RGB -> JPEG bytes (Unity's Texture2D.EncodeToJPG default quality is 75)."""
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ValueError(f"cannot encode a {rgb.shape} frame as JPEG")
    return buf.tobytes()


def telemetry_packet(fields: dict[str, str] | None) -> str:
    """The simulator's exact bytes: JSONObject(Dictionary<string,string>) with no spaces, or `{}`."""
    if not fields:
        return '42["telemetry",{}]'
    body = ",".join(f'"{k}":"{v}"' for k, v in fields.items())
    return f'42["telemetry",{{{body}}}]'


def decode_packet(text: str):
    """The simulator's Decoder.cs, for the packets the stand-in acts on: (engine type, socket type, json or None)."""
    engine = int(text[0])
    socket_type = int(text[1]) if engine == 4 and len(text) > 1 else None
    rest = text[2:] if engine == 4 else text[1:]
    if rest.startswith("/"):
        rest = rest.split(",", 1)[1] if "," in rest else ""
    while rest[:1].isdigit():  # an ack id
        rest = rest[1:]
    return engine, socket_type, (json.loads(rest) if rest else None)
