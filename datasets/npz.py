"""An .npz writer whose deflate runs on ISA-L (python-isal): numpy's archive format, `np.load` reads it as is.

An .npz is a zip file of .npy members. `zipfile` compresses with the zlib it was built against, where compressing
a demonstration shard's arrays at level 2 (the cheapest level that kept shards small) took 75-92 us per recorded
step; this module builds the whole archive in ~15 us, 1.6 % larger (the commands and figures are in docs/scale.md).
`zipfile` has no way to take another compressor, so this module lays out the zip itself: per member a local header,
the raw deflate stream and, at the end, the central directory (PKWARE's APPNOTE.TXT, the fields `zipfile` reads:
version 2.0, method 8, the CRC-32 and sizes in the local header, no data descriptor). Members past zip's 32-bit
sizes (ZIP64) are refused rather than written wrong; a shard is one episode, far below them.

Every member carries the same fixed timestamp (1980-01-01), so the archive is a pure function of its arrays: the same
episode gives the same bytes and sha256. Another level or ISA-L release may give other (equally valid) bytes.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping

import numpy as np
from isal import isal_zlib

LEVEL = 1  # ISA-L's levels run 0-3; 1 gives shards within 2 % of zlib level 2's size (docs/scale.md)
_STREAM = 1 << 16  # members from this many bytes on are compressed from the array's memory (`_npy_parts`)
_LIMIT = (1 << 31) - 1  # what `zipfile` itself writes without ZIP64
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01, the earliest date a zip can hold; time 00:00:00
_VERSION = 20  # 2.0: deflate
_MADE_BY = (3 << 8) | _VERSION  # on Unix: the external attributes are a file mode
_DEFLATE = 8
_EXTERNAL_ATTR = 0o600 << 16  # a regular file, rw for the owner (what zipfile.writestr gives a ZipInfo by default)


def _npy_parts(value: np.ndarray) -> list[bytes | memoryview]:
    """The .npy file of `value` (what `np.lib.format.write_array` writes) as the parts the compressor is fed: one
    buffer for a small or non-contiguous array; for a large C-contiguous one its header, then the array's own memory
    (no copy: `write_array` copied a 5 MB frame stack twice, and the fresh pages cost more than the deflate)."""
    if value.nbytes < _STREAM or not value.flags.c_contiguous or value.ndim == 0:
        member = io.BytesIO()
        np.lib.format.write_array(member, value, allow_pickle=False)  # any layout, 0-d too
        return [member.getvalue()]
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(value))
    return [header.getvalue(), memoryview(value).cast("B")]


def npz_bytes(arrays: Mapping[str, np.ndarray], level: int = LEVEL) -> bytes:
    """The .npz archive of `arrays` (member NAME.npy per key, in the mapping's order), deflated by ISA-L."""
    body, central = bytearray(), bytearray()
    for key, value in arrays.items():
        parts = _npy_parts(np.asarray(value))
        packer = isal_zlib.compressobj(level, isal_zlib.DEFLATED, -15)  # raw deflate: zip holds no zlib header
        packed = b"".join([packer.compress(part) for part in parts] + [packer.flush()])
        size, crc = sum(len(part) for part in parts), 0
        for part in parts:
            crc = isal_zlib.crc32(part, crc)
        if size > _LIMIT or len(body) + len(packed) > _LIMIT:
            raise ValueError(f"npz member {key!r}: {size} bytes, past what a zip without ZIP64 holds")
        name = f"{key}.npy".encode()
        fields = (_DEFLATE, 0, _DOS_DATE, crc, len(packed), size, len(name), 0)  # method ... extra length
        central += (
            struct.pack(
                "<4s6H3L5H2L", b"PK\x01\x02", _MADE_BY, _VERSION, 0, *fields, 0, 0, 0, _EXTERNAL_ATTR, len(body)
            )
            + name
        )
        body += struct.pack("<4s5H3L2H", b"PK\x03\x04", _VERSION, 0, *fields) + name + packed
    n = len(arrays)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, n, n, len(central), len(body), 0)
    return bytes(body + central + end)
