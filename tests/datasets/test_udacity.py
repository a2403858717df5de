"""Udacity logs: every format variant, clear errors, the shared preprocessing, augmentation, the training task."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from datasets.udacity import (
    UdacityLogError,
    decode_frame,
    load_frame,
    preprocess,
    read_log,
)
from datasets.udacity_augment import (
    AugmentConfig,
    augment,
    choose_camera,
    random_brightness,
    random_flip,
    random_shadow,
    random_translate,
    translate,
)
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "udacity"
STEERING = np.array([-0.4429371, -0.8052399, -0.5065781])  # rows 783-785 of the real recording


@pytest.fixture(scope="module")
def frames():
    log = read_log(FIXTURES)
    return [tuple(load_frame(p) for p in log.cameras(i)) for i in range(len(log))]


# -- loader ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["driving_log.csv", "header_relative.csv", "posix_nospace.csv"])
def test_every_log_variant_reads_the_same_frames(name):
    log = read_log(FIXTURES / name)
    assert len(log) == 3
    np.testing.assert_array_equal(log.steering, STEERING)
    for i, stamp in enumerate(["22_07_12_572", "22_07_12_679", "22_07_12_784"]):
        for cam, path in zip(("center", "left", "right"), log.cameras(i), strict=True):
            assert path == FIXTURES / "IMG" / f"{cam}_2024_01_31_{stamp}.jpg"
            assert path.is_file()


def test_windows_log_fields_and_exponent_speeds():
    log = read_log(FIXTURES)  # a directory means its driving_log.csv
    np.testing.assert_array_equal(log.throttle, [1, 1, 1])
    np.testing.assert_array_equal(log.speed, [30.15925, 30.11682, 30.18041])
    np.testing.assert_array_equal(log.line, [1, 2, 3])
    posix = read_log(FIXTURES / "posix_nospace.csv")
    np.testing.assert_array_equal(posix.speed, [1.600606e-05, 3.2e-05, 0.5170563])
    header = read_log(FIXTURES / "header_relative.csv")
    np.testing.assert_array_equal(header.line, [2, 3, 4])  # line numbers count the header


def _log_dir(tmp_path: Path, text: str, images: bool = True) -> Path:
    if images:
        shutil.copytree(FIXTURES / "IMG", tmp_path / "IMG")
    (tmp_path / "driving_log.csv").write_text(text)
    return tmp_path / "driving_log.csv"


def _rows(name="header_relative.csv") -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def test_crlf_bom_blank_lines_and_missing_side_cameras(tmp_path):
    rows = _rows()
    center_only = "IMG/center_2024_01_31_22_07_12_784.jpg, , , 0.25, 0, 0, 3"
    text = "\ufeff" + "\r\n".join(rows[:3]) + "\r\n\r\n" + center_only + "\r\n"
    log = read_log(_log_dir(tmp_path, text))
    assert len(log) == 3
    assert log.left[2] is None and log.right[2] is None
    np.testing.assert_array_equal(log.line, [2, 3, 5])
    frame, steering = augment((load_frame(log.center[2]), None, None), 0.25, np.random.default_rng(0))
    assert frame.shape == (160, 320, 3)


@pytest.mark.parametrize(
    "row, message",
    [
        ("IMG/center_2024_01_31_22_07_12_572.jpg, IMG/left_2024_01_31_22_07_12_572.jpg, 0.1, 0, 0, 3", "got 6"),
        ("IMG/center_2024_01_31_22_07_12_572.jpg, IMG/a.jpg, IMG/b.jpg, 0.1, 0, 0, 3, 4", "got 8"),
        ("IMG/center_x.jpg, IMG/left_2024_01_31_22_07_12_572.jpg, , 0.1, 0, 0, 3", "center image 'center_x.jpg'"),
        ("IMG/center_2024_01_31_22_07_12_572.jpg, IMG/left_gone.jpg, , 0.1, 0, 0, 3", "left image 'left_gone.jpg'"),
        (", , , 0.1, 0, 0, 3", "empty center image"),
        ("IMG/center_2024_01_31_22_07_12_572.jpg, , , abc, 0, 0, 3", "'steering' is not a number"),
        ("IMG/center_2024_01_31_22_07_12_572.jpg, , , 0.1, 0, 0, nan", "'speed' is not finite"),
        ("IMG/center_2024_01_31_22_07_12_572.jpg, , , 12.5, 0, 0, 3", "outside [-1, 1]"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, row, message):
    rows = _rows()
    path = _log_dir(tmp_path, "\n".join([*rows[:2], row, rows[3]]) + "\n")
    with pytest.raises(UdacityLogError) as err:
        read_log(path)
    assert f"{path}:3:" in str(err.value)
    assert message in str(err.value)


def test_missing_img_folder_bad_header_empty_log(tmp_path):
    with pytest.raises(UdacityLogError, match=r"driving_log.csv:1: center image .* not found"):
        read_log(_log_dir(tmp_path, (FIXTURES / "driving_log.csv").read_text(), images=False))
    with pytest.raises(UdacityLogError, match="header"):
        read_log(_log_dir(tmp_path / "h", "center,left,right,steer,throttle,brake,speed\n"))
    with pytest.raises(UdacityLogError, match="no data rows"):
        read_log(_log_dir(tmp_path / "e", "center,left,right,steering,throttle,brake,speed\n"))
    with pytest.raises(UdacityLogError, match="no such driving log"):
        read_log(tmp_path / "nowhere")


def test_corrupt_or_wrong_size_image_is_named(tmp_path):
    good = (FIXTURES / "IMG" / "center_2024_01_31_22_07_12_572.jpg").read_bytes()
    (tmp_path / "trunc.jpg").write_bytes(good[:200])
    with pytest.raises(UdacityLogError, match="trunc.jpg"):
        load_frame(tmp_path / "trunc.jpg")
    small = cv2.imencode(".jpg", np.zeros((80, 160, 3), np.uint8))[1].tobytes()
    with pytest.raises(UdacityLogError, match="160x80, expected 320x160"):
        decode_frame(small, "small.jpg")
    with pytest.raises(UdacityLogError, match="cannot read"):
        load_frame(tmp_path / "absent.jpg")


def test_load_frame_is_rgb(frames, tmp_path):
    rgb = frames[0][0]
    assert rgb.shape == (160, 320, 3) and rgb.dtype == np.uint8
    red = np.zeros((160, 320, 3), np.uint8)
    red[..., 2] = 200  # OpenCV writes BGR: channel 2 is red
    (tmp_path / "red.png").write_bytes(cv2.imencode(".png", red)[1].tobytes())
    np.testing.assert_array_equal(load_frame(tmp_path / "red.png")[0, 0], [200, 0, 0])


# -- preprocessing --------------------------------------------------------------------------------------------------
def test_preprocess_matches_an_independent_computation(frames):
    rgb = frames[1][0]
    out = preprocess(rgb)
    assert out.shape == (3, 66, 200) and out.dtype == np.uint8 and out.flags.c_contiguous
    # Independent: crop, bilinear resize, then the BT.601 RGB->YUV equations OpenCV documents.
    small = cv2.resize(rgb[60:135].astype(np.float32), (200, 66), interpolation=cv2.INTER_LINEAR)
    r, g, b = small[..., 0], small[..., 1], small[..., 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    u = 0.492 * (b - y) + 128
    v = 0.877 * (r - y) + 128
    expected = np.stack([y, u, v])
    assert np.abs(out.astype(np.float32) - expected).max() <= 2.0


def test_preprocess_crops_sky_and_hood(frames):
    rgb = frames[0][0]
    base = preprocess(rgb)
    changed = rgb.copy()
    changed[:60] = 255 - changed[:60]  # sky
    changed[-25:] = 0  # hood
    np.testing.assert_array_equal(preprocess(changed), base)
    road = rgb.copy()
    road[60:70] = 255 - road[60:70]
    assert np.abs(preprocess(road).astype(int) - base).max() > 50


@pytest.mark.parametrize(
    "bad", [np.zeros((160, 320, 3), np.float32), np.zeros((66, 200, 3), np.uint8), np.zeros((160, 320), np.uint8)]
)
def test_preprocess_rejects_wrong_input(bad):
    with pytest.raises(ValueError, match=r"\(160, 320, 3\) uint8"):
        preprocess(bad)


# -- augmentation ---------------------------------------------------------------------------------------------------
class FixedRng:
    """A stand-in Generator returning scripted draws, to pin one branch of an augmentation."""

    def __init__(self, random=(), integers=(), uniform=()):
        self._random, self._integers, self._uniform = list(random), list(integers), list(uniform)

    def random(self):
        return self._random.pop(0)

    def integers(self, n):
        value = self._integers.pop(0)
        assert 0 <= value < n
        return value

    def uniform(self, low, high):
        return low + (high - low) * self._uniform.pop(0)


def test_camera_choice_applies_the_correction(frames):
    center, left, right = frames[0]
    assert choose_camera(frames[0], 0.1, FixedRng(integers=[0]), 0.2) == (center, 0.1)
    img, steering = choose_camera(frames[0], 0.1, FixedRng(integers=[1]), 0.2)
    assert img is left and steering == pytest.approx(0.3)
    img, steering = choose_camera(frames[0], 0.1, FixedRng(integers=[2]), 0.2)
    assert img is right and steering == pytest.approx(-0.1)
    img, steering = choose_camera((center, None, None), 0.1, FixedRng(integers=[0]), 0.2)
    assert img is center and steering == 0.1


def test_flip_mirrors_and_negates(frames):
    rgb = frames[0][0]
    flipped, steering = random_flip(rgb, -0.44, FixedRng(random=[0.3]))
    np.testing.assert_array_equal(flipped, rgb[:, ::-1])
    assert steering == 0.44
    same, steering = random_flip(rgb, -0.44, FixedRng(random=[0.7]))
    assert same is rgb and steering == -0.44


def test_translate_shifts_pixels_and_steering(frames):
    rgb = frames[0][0]
    cfg = AugmentConfig()
    # draws 0.75 and 0.5 -> dx = 100 * 0.25 = 25 px right, dy = 0
    moved, steering = random_translate(rgb, 0.1, FixedRng(random=[0.75, 0.5]), cfg)
    assert steering == pytest.approx(0.1 + 25 * 0.002)
    np.testing.assert_array_equal(moved[:, 25:], rgb[:, :-25])
    assert moved[:, :25].max() == 0  # uncovered border is black
    np.testing.assert_array_equal(translate(rgb, 0, 3)[3:], rgb[:-3])


def test_shadow_darkens_one_side_of_a_line(frames):
    rgb = frames[0][0]
    cfg = AugmentConfig()
    # a vertical line at x = 160 (both ends at 0.5 * 320), shade side 1, ratio 0.2 + 0.3 * 0.5 = 0.35
    shaded = random_shadow(rgb, FixedRng(random=[0.5, 0.5], integers=[1], uniform=[0.5]), cfg)
    light = cv2.cvtColor(rgb, cv2.COLOR_RGB2HLS)[..., 1].astype(float)
    light_shaded = cv2.cvtColor(shaded, cv2.COLOR_RGB2HLS)[..., 1].astype(float)
    left_ratio = light_shaded[:, :159].sum() / light[:, :159].sum()
    right_ratio = light_shaded[:, 161:].sum() / light[:, 161:].sum()
    assert min(left_ratio, right_ratio) == pytest.approx(0.35, abs=0.05)
    assert max(left_ratio, right_ratio) == pytest.approx(1.0, abs=0.02)


def test_brightness_scales_value_channel(frames):
    rgb = frames[0][0]
    cfg = AugmentConfig()
    value = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)[..., 2].astype(float)
    for draw, ratio in [(0.0, 0.8), (1.0, 1.2)]:
        out = random_brightness(rgb, FixedRng(random=[draw]), cfg)
        out_value = cv2.cvtColor(out, cv2.COLOR_RGB2HSV)[..., 2].astype(float)
        expected = np.clip(value * ratio, 0, 255)
        assert np.abs(out_value - expected).mean() < 2.0
    bright = random_brightness(np.full((160, 320, 3), 250, np.uint8), FixedRng(random=[1.0]), cfg)
    assert bright.min() == 255  # clipped, not wrapped round to dark


def test_augment_is_deterministic_under_a_seed(frames):
    cams = frames[2]
    a = [augment(cams, -0.5, rng) for rng in [np.random.default_rng(7)] for _ in range(20)]
    b = [augment(cams, -0.5, rng) for rng in [np.random.default_rng(7)] for _ in range(20)]
    c = [augment(cams, -0.5, rng) for rng in [np.random.default_rng(8)] for _ in range(20)]
    for (img_a, s_a), (img_b, s_b) in zip(a, b, strict=True):
        np.testing.assert_array_equal(img_a, img_b)
        assert s_a == s_b
    assert any(s_a != s_c for (_, s_a), (_, s_c) in zip(a, c, strict=True))


def test_augment_statistics(frames):
    """Over many draws: ~40% untouched, steering offsets only from the camera, flip and translate terms."""
    cams = frames[0]
    rng = np.random.default_rng(0)
    n, untouched, offsets = 400, 0, []
    for _ in range(n):
        img, steering = augment(cams, -0.4429371, rng)
        if img is cams[0] and steering == -0.4429371:
            untouched += 1
        else:
            offsets.append(steering)
    assert 0.32 < untouched / n < 0.48
    offsets = np.array(offsets)
    # camera (+-0.2) then flip then translate (|dx| <= 50 px -> |delta| <= 0.1)
    bases = np.array([-0.4429371, -0.2429371, -0.6429371])
    candidates = np.concatenate([bases, -bases])
    nearest = np.abs(offsets[:, None] - candidates[None]).min(1)
    assert nearest.max() <= 0.1 + 1e-9
    assert (offsets > 0).mean() == pytest.approx(0.5, abs=0.12)  # flips make steering symmetric


# -- the real recording -------------------------------------------------------------------------------------------
def test_real_recording_reads_whole(shared_data):
    log = read_log(shared_data / "udacity_sim")
    assert len(log) == 1500
    # PROVENANCE.md: steering mean -0.008, std 0.403, 47% of frames non-zero; speed 0..30.5 mph
    assert log.steering.mean() == pytest.approx(-0.008, abs=5e-4)
    assert log.steering.std() == pytest.approx(0.403, abs=5e-4)
    assert (log.steering != 0).mean() == pytest.approx(0.47, abs=0.005)
    assert 0 < log.speed.min() and log.speed.max() < 30.5
    assert all(p is not None and p.parent.name == "IMG" for p in log.left + log.right)
    for i in (0, 749, 1499):
        for path in log.cameras(i):
            assert preprocess(load_frame(path)).shape == (3, 66, 200)


def test_augment_decodes_only_the_camera_it_uses(frames):
    calls = []

    def loader(i):
        def load():
            calls.append(i)
            return frames[0][i]

        return load

    for seed in range(30):
        calls.clear()
        augment([loader(0), loader(1), loader(2)], 0.0, np.random.default_rng(seed))
        assert len(calls) == 1


# -- the training task ----------------------------------------------------------------------------------------------
def test_block_split_is_contiguous_disjoint_and_gapped():
    from datasets.udacity_laps import block_split

    t = np.arange(1500) * 0.1  # 10 Hz, no gap
    split = block_split(t, 10, (2, 7), (9,), gap_s=1.0)
    np.testing.assert_array_equal(split["test"], np.r_[300:450, 1050:1200])
    np.testing.assert_array_equal(split["val"], np.arange(1350, 1500))
    held = np.r_[split["test"], split["val"]]
    assert not set(split["train"]) & set(held)
    distance = np.abs(t[split["train"]][:, None] - t[held][None]).min(1)
    assert distance.min() > 1.0  # nothing within 1 s of a held-out frame
    assert len(split["train"]) == 1500 - 450 - 50  # 10 dropped each side of 2 inner test blocks, 1 side of val
    uneven = block_split(np.arange(103) * 0.1, 10, (0,), (5,), gap_s=0)
    assert sum(map(len, uneven.values())) == 103 and set(map(len, (uneven["test"], uneven["val"]))) <= {10, 11}


def test_block_split_respects_a_gap_in_time():
    """The lake log's withheld laps: blocks are cut on active time, and no frame is 'near' across the gap."""
    from datasets.udacity_laps import active_time, block_split, segments

    t = np.r_[np.arange(500) * 0.1, 120.0 + np.arange(500) * 0.1]  # 50 s, a 70 s gap, 50 s
    assert list(np.bincount(segments(t))) == [500, 500] and active_time(t)[-1] == pytest.approx(99.9)
    split = block_split(t, 10, (5,), (9,), gap_s=1.0)  # block 5 starts right after the gap
    np.testing.assert_array_equal(split["test"], np.arange(500, 600))
    assert 499 in split["train"]  # 70 s before the first test frame in time, in another segment: kept


def test_blocks_of_the_lake_log_never_leak(shared_data):
    from datasets.udacity_laps import block_split, frame_times, segments

    log = read_log(shared_data / "udacity_lake")
    t = frame_times(log.center)
    assert t[1558] - t[1557] > 70 and list(np.bincount(segments(t))) == [1558, 1495]  # PROVENANCE.md: the gap
    split = block_split(t, 10, (2, 7), (9,), gap_s=1.0)
    train, held = split["train"], np.r_[split["test"], split["val"]]
    seg = segments(t)
    for h in held[::7]:
        same = train[seg[train] == seg[h]]
        assert np.abs(t[same] - t[h]).min() > 1.0  # no training frame within 1 s of a held-out one
    for part in ("test", "val"):
        rows = split[part]
        assert np.all(np.diff(t[rows])[np.diff(rows) == 1] < 1.0)  # whole stretches of driving, in time order


@pytest.mark.parametrize(
    "args, message",
    [((10, (2,), (2,), 0), "overlap"), ((10, (10,), (1,), 0), "outside"), ((2, (0,), (1,), 0), "training block")],
)
def test_block_split_rejects_bad_blocks(args, message):
    from datasets.udacity_laps import block_split

    with pytest.raises(ValueError, match=message):
        block_split(np.arange(100) * 0.1, *args)


def test_random_split_is_the_papers_and_disjoint():
    from datasets.udacity_laps import random_split

    split = random_split(1000, 0.1, 0.1, seed=0)
    assert (len(split["test"]), len(split["val"]), len(split["train"])) == (100, 100, 800)
    assert len(np.unique(np.concatenate(list(split.values())))) == 1000
    assert np.array_equal(random_split(1000, 0.1, 0.1, seed=0)["test"], split["test"])


def test_label_smoothing_keeps_the_mean_spreads_spikes_and_stops_at_gaps():
    from datasets.udacity_laps import smooth_labels

    t = np.r_[np.arange(100) * 0.1, 60 + np.arange(100) * 0.1]
    y = np.zeros(200)
    y[50] = 1.0  # a one-frame keyboard tap
    y[100:] = 0.5  # after the gap: a held key
    s = smooth_labels(y, t, sigma_s=0.2)
    assert s[50] < 0.5 and s[49] > 0 and s[51] > 0 and s[50 + 7] == 0  # spread over +-3 sigma (0.6 s), not beyond
    assert s[:100].sum() == pytest.approx(1.0, rel=1e-3)  # mass kept inside the segment (float edges of 3 sigma)
    np.testing.assert_allclose(s[100:], 0.5)  # renormalised at the segment edge: nothing leaks across the gap
    d = t[:100, None] - t[None, :100]
    w = np.exp(-0.5 * (d / 0.2) ** 2) * (np.abs(d) <= 3 * 0.2)
    np.testing.assert_allclose(s[:100], w[:, 50] / w.sum(1), atol=1e-12)  # a normalised Gaussian filter, by hand
    np.testing.assert_array_equal(smooth_labels(y, t, 0.0), y)


def test_frame_times_from_image_names():
    from datasets.udacity_laps import frame_times

    log = read_log(FIXTURES)
    np.testing.assert_allclose(frame_times(log.center), [0.0, 0.107, 0.212], atol=1e-9)
    np.testing.assert_allclose(frame_times(["a.jpg", "b.jpg"]), [0.0, 0.1])  # no stamp: 10 Hz by row


def _recording(log, smooth=0.0):
    from datasets.udacity_laps import frame_times, smooth_labels
    from drive.learn.tasks.udacity import Recording

    t = frame_times(log.center)
    history = np.arange(len(t))[:, None]  # one frame per input
    return Recording(log, log.steering, smooth_labels(log.steering, t, smooth), t, history)


def test_training_frames_are_deterministic_per_seed_and_epoch():
    from drive.learn.tasks.udacity import UdacityFrames

    log = read_log(FIXTURES)
    rows = np.stack([np.zeros(3, int), np.arange(3)], 1)
    a = UdacityFrames([_recording(log)], rows, AugmentConfig(p_augment=1.0), seed=3)
    b = UdacityFrames([_recording(log)], rows, AugmentConfig(p_augment=1.0), seed=3)
    a.set_epoch(1)
    b.set_epoch(1)
    first = [a[i] for i in range(3)]
    for i in (2, 0, 1):  # access order does not matter
        assert torch.equal(b[i][0], first[i][0]) and torch.equal(b[i][1], first[i][1])
    a.set_epoch(2)
    assert any(not torch.equal(a[i][1], first[i][1]) for i in range(3))
    x, y = first[0]
    assert x.shape == (3, 66, 200) and x.dtype == torch.uint8 and y.shape == (1,)
    plain = UdacityFrames([_recording(log)], rows)
    np.testing.assert_array_equal(plain.tensors[0][1].numpy(), preprocess(load_frame(log.center[1])))
    np.testing.assert_allclose(plain.tensors[1][:, 0].numpy(), STEERING, rtol=1e-6)


def test_smoothed_labels_train_and_raw_labels_evaluate():
    from drive.learn.tasks.udacity import UdacityFrames

    log = read_log(FIXTURES)
    rec = _recording(log, smooth=0.1)
    rows = np.stack([np.zeros(3, int), np.arange(3)], 1)
    train = UdacityFrames([rec], rows, AugmentConfig(p_augment=0.0))
    held = UdacityFrames([rec], rows)
    np.testing.assert_allclose(train.targets[:, 0].numpy(), rec.labels, rtol=1e-6)
    np.testing.assert_allclose(held.targets[:, 0].numpy(), STEERING, rtol=1e-6)
    assert not np.allclose(rec.labels, STEERING)
    assert torch.equal(train[1][0], held[1][0])  # p_augment 0: the center frame as recorded
    np.testing.assert_allclose(train[1][1].numpy(), rec.labels[1:2], rtol=1e-6)


def _task(shared_data, **options):
    from drive.learn import tasks

    return tasks.load("udacity", tasks.options("udacity", options), shared_data / "udacity_sim", 0)


def test_task_builds_on_the_real_recording(shared_data):
    from agents.gmle import GMLEConfig

    data = _task(shared_data, max_rows="200", gap_s="0.3")
    assert data.encoder.kind == "nvidia" and data.out_dim == 1 and data.target_names == ("steering",)
    split = data.fingerprint["split"]
    assert split["n_val"] + split["n_test"] == 60 and split["n_train"] < 140 - 4 * 2
    assert data.fingerprint["n_rows"] == 1500 and len(data.fingerprint["log_sha256"]) == 64
    log = read_log(shared_data / "udacity_sim")
    assert data.fingerprint["train_mean_steering"] == pytest.approx(data.train.targets.mean().item(), abs=1e-6)
    assert abs(data.fingerprint["train_mean_steering"] - log.steering[:200].mean()) < 0.1
    x, y = data.val.tensors
    assert x.shape == (split["n_val"], 3, 66, 200) and x.dtype == torch.uint8 and y.shape == (split["n_val"], 1)
    torch.manual_seed(0)
    model = GMLEConfig(encoder=data.encoder, out_dim=1).build()
    result = data.evaluate(model)["test"]
    assert result["n_frames"] == split["n_test"]
    blocks = result["per_block"]
    assert sorted(blocks) == ["2", "7"] and sum(b["n_frames"] for b in blocks.values()) == split["n_test"]
    pooled = sum(b["mse"] * b["n_frames"] for b in blocks.values()) / split["n_test"]
    assert result["mse"] == pytest.approx(pooled, rel=1e-6)
    for key in ("mse", "nll", "crps", "ece", "mse_train_mean"):
        assert np.isfinite(result[key])


def test_task_rejects_bad_options(shared_data, tmp_path):
    from drive.learn import tasks

    with pytest.raises(ValueError, match="no field 'n_block'"):
        _task(shared_data, n_block="4")
    with pytest.raises(ValueError, match="test_blocks"):
        _task(shared_data, test_blocks="two")
    with pytest.raises(ValueError, match="does not exist"):
        tasks.load("udacity", tasks.options("udacity", {}), tmp_path / "missing", 0)
    with pytest.raises(ValueError, match="does not exist"):
        tasks.load("udacity", tasks.options("udacity", {}), Path(f"{shared_data / 'udacity_sim'},{tmp_path / 'x'}"), 0)
    with pytest.raises(ValueError, match="smooth_s"):
        _task(shared_data, smooth_s="-1")


def test_several_recordings_train_together_and_report_apart(shared_data):
    from drive.learn import tasks

    both = Path(f"{shared_data / 'udacity_lake'},{shared_data / 'udacity_sim'}")
    opts = {"max_rows": "200", "gap_s": "0.3"}
    data = tasks.load("udacity", tasks.options("udacity", opts), both, 0)
    assert [r["n_rows"] for r in data.fingerprint["recordings"]] == [3053, 1500]
    assert set(data.test.index[:, 0]) == {0, 1} and set(data.train.index[:, 0]) == {0, 1}
    first = tasks.load("udacity", tasks.options("udacity", {**opts, "holdout": "first"}), both, 0)
    assert set(first.test.index[:, 0]) == set(first.val.index[:, 0]) == {0}  # lake laps held out, mountain trains
    assert (first.train.index[:, 0] == 1).sum() == 200
    alone = tasks.load("udacity", tasks.options("udacity", opts), shared_data / "udacity_lake", 0)
    assert np.array_equal(first.test.index[:, 1], alone.test.index[:, 1])  # adding a recording changes only training
    from agents.gmle import GMLEConfig

    torch.manual_seed(0)
    model = GMLEConfig(encoder=data.encoder, out_dim=1).build()
    result = data.evaluate(model)
    assert sorted(result["tests"]) == ["udacity_lake", "udacity_sim"]
    assert sum(r["n_frames"] for r in result["tests"].values()) == result["test"]["n_frames"]
    assert all(":" in key for key in result["test"]["per_block"])


def test_read_log_skips_rows_naming_missing_images_when_asked(tmp_path):
    shutil.copytree(FIXTURES / "IMG", tmp_path / "IMG")
    (tmp_path / "IMG" / "center_2024_01_31_22_07_12_679.jpg").unlink()
    shutil.copy(FIXTURES / "driving_log.csv", tmp_path / "driving_log.csv")
    with pytest.raises(UdacityLogError, match=r"driving_log.csv:2: center image 'center_2024_01_31_22_07_12_679"):
        read_log(tmp_path)
    log = read_log(tmp_path, skip_bad=True)
    assert len(log) == 2 and list(log.line) == [1, 3] and len(log.skipped) == 1 and ":2:" in log.skipped[0]


def test_corrupt_jpeg_names_the_row(tmp_path):
    from datasets.udacity import load_row_frame

    shutil.copytree(FIXTURES / "IMG", tmp_path / "IMG")
    shutil.copy(FIXTURES / "header_relative.csv", tmp_path / "driving_log.csv")
    (tmp_path / "IMG" / "center_2024_01_31_22_07_12_784.jpg").write_bytes(b"\xff\xd8\xff truncated")
    log = read_log(tmp_path)
    assert load_row_frame(log, 1).shape == (160, 320, 3)
    with pytest.raises(UdacityLogError, match=r"driving_log.csv:4: center image 'center_2024_01_31_22_07_12_784.jpg'"):
        load_row_frame(log, 2)


def test_drive_train_on_the_real_recording(shared_data, tmp_path):
    import json

    from drive.checkpoint import load_controller
    from drive.cli import main

    out = tmp_path / "run"
    argv = ["train", "--controller", "gmle", "--data", f"udacity:{shared_data / 'udacity_sim'}", "--out", str(out),
            "--epochs", "1", "--batch-size", "32", "--no-progress",
            "--set", "task.max_rows=160", "task.gap_s=0.2", "encoder.d_model=8", "n_heads=2",
            "trainer.tensorboard=false"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "metrics.json").read_text())
    assert report["task"] == "udacity" and report["test"]["n_frames"] == 32
    for key in ("mse", "nll", "crps", "ece"):
        assert np.isfinite(report["test"][key])
    model, payload = load_controller(out / "best.pt")
    assert payload["config"]["encoder"]["kind"] == "nvidia" and payload["data"]["task"] == "udacity"
    x = torch.from_numpy(preprocess(load_frame(read_log(shared_data / "udacity_sim").center[0])))[None]
    assert model.predict(x).mean.shape == (1, 1)
