"""datasets/npz.py: the hand-laid zip is an .npz that numpy and zipfile read back exactly, byte for byte stable."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

import datasets.npz as npz
from datasets.npz import npz_bytes


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (7, 84, 84), dtype=np.uint8)
    frames[:, :70] = 107  # a flat region, as road and grass give: deflate finds long matches
    return {
        "frames": frames,
        "label": rng.normal(size=(6, 3)).astype(np.float32),
        "off_track": rng.random(6) < 0.5,
        "reward": np.array([-0.1, np.nan, np.inf, -0.0, 1e-38, 3.0], np.float32),
        "empty": np.zeros((0, 3), np.float64),
        "scalar": np.array(5, np.int64),
        "strided": np.arange(24, dtype=np.int16).reshape(4, 6)[:, ::2],  # not contiguous
        "stack": rng.integers(0, 4, (12, 84, 84), dtype=np.uint8),  # past _STREAM: fed from the array's memory
        "fortran": np.asfortranarray(rng.normal(size=(300, 40))),  # past _STREAM, not C-contiguous: one buffer
    }


def test_numpy_reads_every_array_back_bit_for_bit() -> None:
    arrays = _arrays()
    with np.load(io.BytesIO(npz_bytes(arrays)), allow_pickle=False) as back:
        assert back.files == list(arrays)
        for key, value in arrays.items():
            assert back[key].dtype == value.dtype and back[key].shape == value.shape
            assert back[key].tobytes() == np.ascontiguousarray(value).tobytes(), key


def test_zipfile_checks_every_crc_and_sees_deflate_members() -> None:
    with zipfile.ZipFile(io.BytesIO(npz_bytes(_arrays()))) as archive:
        assert archive.testzip() is None  # every member decompresses and matches its CRC-32
        infos = archive.infolist()
    assert [i.filename for i in infos] == [f"{k}.npy" for k in _arrays()]
    assert {i.compress_type for i in infos} == {zipfile.ZIP_DEFLATED}
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    frames = infos[0]
    assert frames.compress_size < frames.file_size / 2  # compressed, not stored


def test_a_streamed_member_is_what_write_array_gives() -> None:
    """A member fed as header + the array's memory inflates to exactly the .npy `np.lib.format.write_array` writes."""
    arrays = _arrays()
    assert arrays["stack"].nbytes >= npz._STREAM and arrays["fortran"].nbytes >= npz._STREAM
    with zipfile.ZipFile(io.BytesIO(npz_bytes(arrays))) as archive:
        for key in ("stack", "fortran", "frames"):
            expected = io.BytesIO()
            np.lib.format.write_array(expected, arrays[key], allow_pickle=False)
            assert archive.read(f"{key}.npy") == expected.getvalue(), key


def test_same_arrays_same_bytes_and_a_flipped_byte_is_caught() -> None:
    data = npz_bytes(_arrays())
    assert npz_bytes(_arrays()) == data
    broken = bytearray(data)
    broken[200] ^= 0xFF  # inside the first member's deflate stream
    with zipfile.ZipFile(io.BytesIO(bytes(broken))) as archive, pytest.raises((zipfile.BadZipFile, OSError)):
        archive.read("frames.npy")


def test_a_member_past_zip32_sizes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(npz, "_LIMIT", 1000)
    with pytest.raises(ValueError, match="ZIP64"):
        npz_bytes({"frames": np.zeros((10, 84, 84), np.uint8)})
