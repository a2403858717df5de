"""The simulator stand-in's own behaviour, the vision policy, and `drive udacity drive` in closed loop through it."""

from __future__ import annotations

import json
import socket
import time

import cv2
import numpy as np
import pytest
import torch

from agents.experts.road_follower import RoadFollower
from drive.cli import main
from drive.commands.udacity.drive import Config
from drive.loop.udacity import VISION_PRESETS, SpeedController
from sim_bridges.udacity.bridge import UdacityEnv, UdacityServer
from sim_bridges.udacity.protocol import MAX_STEER_DEG, telemetry_packet
from sim_bridges.udacity.sources import CarRacingSource, ReplaySource, carracing_camera, read_driving_log
from sim_bridges.udacity.standin import StandIn, StandInConfig
from tests.sim_bridges.udacity.test_bridge import (
    FAST_PINGS,
    assert_all_answered,
    drive_until_done,
    no_leaked_threads,
    real_log,
    running,
)

__all__ = ["no_leaked_threads", "real_log"]  # fixtures shared with the bridge tests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_telemetry_bytes_are_the_simulators():
    fields = {"steering_angle": "-1.2500", "throttle": "0.3000", "speed": "12.0000", "image": "/9j/AA=="}
    assert telemetry_packet(fields) == (
        '42["telemetry",{"steering_angle":"-1.2500","throttle":"0.3000","speed":"12.0000","image":"/9j/AA=="}]'
    )
    assert telemetry_packet(None) == '42["telemetry",{}]'


def test_replay_sends_the_recording_in_n4_strings(real_log):
    src = ReplaySource(real_log, limit=5)
    rows = read_driving_log(real_log)[:5]
    for _, steering, _, speed in rows:
        fields = src.telemetry()
        assert list(fields) == ["steering_angle", "throttle", "speed", "image"]
        assert fields["steering_angle"] == f"{steering * MAX_STEER_DEG:.4f}".replace("-0.0000", "0.0000")
        assert fields["speed"] == f"{speed:.4f}" and len(fields["throttle"].split(".")[1]) == 4
    assert src.done


def test_standin_rejects_numbers_in_steer_and_that_chain_dies(real_log):
    """A server that answers JSON numbers breaks the simulator (float.Parse(null)): the stand-in must show it."""
    server = UdacityServer(port=0, **FAST_PINGS)
    try:
        with running(server, ReplaySource(real_log, limit=50, loop=True), double_open=False) as standin:
            frame = server.next_frame(5)
            server.sio.emit("steer", {"steering_angle": 0.1, "throttle": 0.2}, to=frame.sid)  # numbers, not strings
            deadline = time.monotonic() + 5
            while not standin.report.rejected and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)
            assert len(standin.report.rejected) == 1 and "float.Parse(null)" in standin.report.rejected[0]
            assert server.next_frame(0.3) is None  # the only chain is dead: the simulator would stall here
        assert standin.report.telemetry_sent == 1
    finally:
        server.close()


def test_standin_answers_server_pings_and_sends_its_own(real_log):
    env = UdacityEnv(port=0, timeout_s=0.3, ping_interval=0.15, ping_timeout=0.4)
    try:
        with running(env, ReplaySource(real_log, limit=10, loop=True), ping_interval=0.1, duration_s=1.2) as standin:
            drive_until_done(env, standin, lambda obs: (time.sleep(0.01), np.zeros(2, np.float32))[1])
        r = standin.report
        assert r.server_pings >= 5 and r.pings_sent >= 3 and r.pongs_received >= r.pings_sent - 1
        assert r.connects == 1
    finally:
        env.close()


# -- the vision policy ---------------------------------------------------------------------------------------------
def _synthetic_road(offset_px: int) -> np.ndarray:
    """Grass with a grey road band whose centre is `offset_px` right of the frame centre, top-down."""
    rgb = np.zeros((160, 320, 3), np.uint8)
    rgb[:] = (102, 204, 102)
    c = 160 + offset_px
    rgb[:, c - 45 : c + 45] = (105, 105, 105)
    return rgb


def test_road_follower_steers_towards_the_road():
    follower = RoadFollower(VISION_PRESETS["carracing"])
    assert follower.steer(_synthetic_road(0), 30.0) == pytest.approx(0.0, abs=0.05)
    right, left = follower.steer(_synthetic_road(60), 30.0), follower.steer(_synthetic_road(-60), 30.0)
    assert right > 0.1 and left < -0.1 and right == pytest.approx(-left, abs=1e-6)
    steering, throttle = follower.act(_synthetic_road(0), 0.0)
    assert throttle > 0.5  # standing still on a straight: accelerate
    steering, throttle = RoadFollower(VISION_PRESETS["carracing"]).act(_synthetic_road(0), 200.0)
    assert throttle < 0  # far too fast: brake


def test_road_follower_on_real_frames_agrees_with_the_human(real_log):
    rows = read_driving_log(real_log)[::5]
    follower = RoadFollower(VISION_PRESETS["udacity"])
    ours = [follower.steer(cv2.imread(str(p))[..., ::-1], v) for p, s, t, v in rows]
    human = [s for p, s, t, v in rows]
    r = np.corrcoef(ours, human)[0, 1]
    assert r > 0.3, f"vision steering vs the human's: r = {r:.3f}"


def test_speed_controller_slows_for_steering_uncertainty_and_gate():
    ctl = SpeedController(Config(target_speed_mph=20, min_speed_mph=5, gate_std=0.2))
    _, straight, _ = ctl(10.0, 0.0)
    _, bend, _ = ctl(10.0, 0.8)
    _, unsure, _ = ctl(10.0, 0.0, epistemic_std=0.2)
    throttle, gated_target, gated = ctl(10.0, 0.0, total_std=0.3)
    assert straight == 20 and bend < straight and unsure == pytest.approx(20 * (1 - 2.0 * 0.2))
    assert gated and gated_target == 5 and throttle < 0  # above the gate: slow down to min speed


# -- closed loop -----------------------------------------------------------------------------------------------------
def test_carracing_closed_loop_through_the_protocol_smoke():
    """Short closed loop: CarRacing frames as JPEG telemetry, the vision policy's steer applied to the car."""
    env = UdacityEnv(port=0, timeout_s=0.3, **FAST_PINGS)
    src = CarRacingSource(seed=1, max_steps=120)
    follower = RoadFollower(VISION_PRESETS["carracing"])
    try:
        with running(env, src) as standin:
            speeds = []

            def policy(obs):
                speeds.append(float(obs["speed"][0]))
                return np.array(follower.act(obs["image"], speeds[-1]), np.float32)

            drive_until_done(env, standin, policy)
        assert_all_answered(standin.report, env.server.snapshot())
        assert src.result["steps"] == 120 and src.result["truncated"]
        assert src.result["off_track_steps"] == 0 and src.result["progress"] > 0.03
        assert max(speeds) > 20  # it drives (mph)
    finally:
        env.close()
        src.close()


def test_camera_is_the_simulators_frame_size():
    src = CarRacingSource(seed=0, max_steps=5)
    try:
        cam = carracing_camera(src.frame)
        assert cam.shape == (160, 320, 3) and cam.dtype == np.uint8
        assert (cam[:, :, 1].astype(int) - cam[:, :, 0] > 50).mean() > 0.2  # grass in view, no indicator bar
    finally:
        src.close()


def _drive(argv, source, port, timeout_s=3.0, **standin_cfg):
    """`drive udacity drive` in-process against a stand-in; runs end by --max-steps or when the source is done."""
    standin = StandIn(StandInConfig(port=port, ping_interval=0.3, **standin_cfg), source).start()
    try:
        code = main(["udacity", "drive", "--port", str(port), "--timeout-s", str(timeout_s), "--connect-timeout-s",
                     "20", "--ping-interval-s", "0.3", *argv])  # fmt: skip
    finally:
        standin.stop()
        report = standin.join(20)
    return code, report


def test_drive_command_logs_every_step_and_writes_the_overlay_video(real_log, tmp_path, monkeypatch):
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    port = free_port()
    code, report = _drive(["--driver", "vision", "--max-steps", "40", "--display", "auto", "--run-dir",
                           str(tmp_path)], ReplaySource(real_log, limit=300, loop=True), port)  # fmt: skip
    # every frame answered while the link was up; when the drive stops, the simulator's two chains are in flight
    assert code == 0 and report.rejected == [] and report.unsolicited == 0 and report.outstanding <= 2
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "steps.parquet").to_pydict()
    assert len(table["t"]) == 40 and table["t"] == list(range(40))
    assert all(-1 <= s <= 1 for s in table["steering"]) and all(v > 0 for v in table["speed_mph"])
    session = json.loads((tmp_path / "session.json").read_text())
    assert session["server"]["answered.steer"] >= 40 and session["server"]["refused"] == 0
    video = cv2.VideoCapture(str(tmp_path / "overlay.mp4"))
    assert int(video.get(cv2.CAP_PROP_FRAME_COUNT)) == 40
    ok, frame = video.read()
    video.release()
    assert ok and frame.shape == (450, 640, 3)


def test_drive_command_with_a_checkpoint_logs_uncertainty_and_gates(real_log, tmp_path):
    from agents.encoders import EncoderConfig
    from agents.registry import CONTROLLERS, config_to_dict
    from drive.checkpoint import save

    torch.manual_seed(0)
    cfg = CONTROLLERS["nsac"](encoder=EncoderConfig(kind="nvidia", d_model=16))
    ckpt = save(tmp_path / "nsac.pt", kind="controller", name="nsac", config=config_to_dict(cfg), module=cfg.build())
    port = free_port()
    argv = ["--ckpt", str(ckpt), "--max-steps", "15", "--display", "none", "--samples", "4",
            "--gate-std", "1e-9", "--min-speed-mph", "3", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    code, report = _drive(argv, ReplaySource(real_log, limit=100, loop=True), port)
    assert code == 0 and report.rejected == [] and report.unsolicited == 0 and report.outstanding <= 2
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "run" / "steps.parquet").to_pydict()
    assert len(t["t"]) == 15
    assert all(e > 0 for e in t["epistemic_std"]) and all(a > 0 for a in t["aleatoric_std"])
    assert all(t["gated"]) and set(t["target_mph"]) == {3.0}  # the gate held the car at min speed
    assert t["steering"] == pytest.approx(np.clip(t["mean"], -1, 1).tolist(), abs=1e-6)
    sent = [round(s, 4) for s, _ in report.steer_values]
    assert all(round(s, 4) in sent for s in t["steering"])  # what was logged is what the simulator received


@pytest.mark.slow
def test_carracing_lap_through_the_udacity_protocol_with_the_vision_policy(tmp_path, monkeypatch):
    """`drive udacity drive --driver vision:carracing` completes a CarRacing lap from JPEG + speed alone."""
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    src = CarRacingSource(seed=1, max_steps=3000)
    argv = ["--driver", "vision:carracing", "--target-speed-mph", "90", "--min-speed-mph", "30",
            "--steer-slowdown", "0", "--kp", "0.08", "--max-brake", "0.6", "--display", "none",
            "--run-dir", str(tmp_path)]  # fmt: skip
    code, report = _drive(argv, src, free_port(), timeout_s=5.0)
    assert code == 0
    assert src.result["lap_finished"], src.result
    assert src.result["off_track_steps"] < 20
    assert_all_answered(report)
