"""`Content-Encoding: zstd` bodies: compress, and decompress with a bound (no zip bombs).

No torch here, so membership nodes use it too. Knows nothing about what the bytes hold.
"""

from __future__ import annotations

import zstandard

from drift.wire.errors import BadFrame, PayloadTooLarge

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # every zstd frame starts with it; no frame nor JSON does


def compress(body: bytes, level: int = 3) -> bytes:
    """zstd-compress a body (for `Content-Encoding: zstd`)."""
    return zstandard.ZstdCompressor(level=level).compress(body)


def decompress(body: bytes, *, max_bytes: int) -> bytes:
    """Undo `Content-Encoding: zstd`, refusing output past max_bytes (no zip bombs)."""
    reader = zstandard.ZstdDecompressor().stream_reader(body)
    try:
        out = reader.read(max_bytes + 1)
        while len(out) <= max_bytes:
            more = reader.read(max_bytes + 1 - len(out))
            if not more:
                break
            out += more
    except zstandard.ZstdError as exc:
        raise BadFrame(f"body is not valid zstd: {exc}") from exc
    if len(out) > max_bytes:
        raise PayloadTooLarge(f"decompressed body exceeds the limit of {max_bytes} bytes")
    return out
