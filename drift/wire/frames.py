"""Tensor frames: named tensors plus JSON parameters in one safetensors blob.

A frame is safetensors bytes whose `__metadata__` holds `{"drift": "<orjson of params>"}`.
Bodies may be zstd-compressed. Decoding checks the header against the data before anything
is allocated and never unpickles. Knows nothing about what the tensors mean (messages.py).
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import orjson
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from drift.wire.errors import BadFrame, BadTensor, PayloadTooLarge
from drift.wire.zstd import compress, decompress  # noqa: F401  (re-exported)

MEDIA_TYPE = "application/vnd.drift.tensors"
METADATA_KEY = "drift"
MAX_HEADER_BYTES = 1 << 20  # a frame header (JSON) larger than 1 MiB is refused
MAX_RANK = 8  # dimensions of one tensor
MAX_DIM = (1 << 31) - 1  # largest size of one dimension (a shape that lies is refused)

# safetensors dtype tag -> (torch dtype, bytes per element); only these travel.
WIRE_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
_TORCH_TO_TAG = {dtype: tag for tag, (dtype, _) in WIRE_DTYPES.items()}

_ZIP_MAGIC = b"PK\x03\x04"  # torch.save archives (a pickle inside)
_LITTLE_ENDIAN = sys.byteorder == "little"  # safetensors data is little-endian


def encode_frame(params: dict[str, Any], tensors: dict[str, torch.Tensor]) -> bytes:
    """Serialise params (JSON-able) and tensors into one safetensors frame.

    Written directly (header JSON padded to 8 bytes, then each tensor's little-endian bytes,
    widest dtype first), as safetensors' own save lays it out, without its per-call overhead.
    """
    for name, tensor in tensors.items():
        if tensor.dtype not in _TORCH_TO_TAG:
            raise BadTensor(f"tensor {name!r} has dtype {tensor.dtype}, which cannot travel")
    meta = {METADATA_KEY: orjson.dumps(params).decode()}
    if not _LITTLE_ENDIAN:
        plain = {name: t.detach().contiguous().cpu() for name, t in tensors.items()}
        return st_save(plain, metadata=meta)
    header: dict[str, Any] = {"__metadata__": meta}
    chunks: list[bytes] = []
    offset = 0
    # widest dtypes first, as safetensors orders them: every tensor's data stays aligned
    for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):
        tensor = tensors[name]
        data = _tensor_bytes(tensor)
        header[name] = {"dtype": _TORCH_TO_TAG[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}  # fmt: skip
        chunks.append(data)
        offset += len(data)
    head = orjson.dumps(header)
    head += b" " * (-len(head) % 8)
    return b"".join([struct.pack("<Q", len(head)), head, *chunks])


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    elif flat.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    return flat.numpy().tobytes()


def decode_frame(body: bytes, *, max_bytes: int | None = None) -> tuple[dict[str, Any], dict]:
    """Parse a frame into (params, tensors), refusing anything that is not a sound frame."""
    if max_bytes is not None and len(body) > max_bytes:
        raise PayloadTooLarge(f"frame of {len(body)} bytes exceeds the limit of {max_bytes}")
    _reject_foreign(body)
    header = _read_header(body)
    params = _read_params(header)
    start = 8 + _header_len(body)
    _check_entries(header, len(body) - start)
    if not _LITTLE_ENDIAN:
        try:
            return params, st_load(bytes(body))
        except Exception as exc:  # noqa: BLE001 -- safetensors raises several types
            raise BadFrame(f"not a valid safetensors frame: {exc}") from exc
    return params, _read_tensors(header, bytearray(memoryview(body)[start:]))


def _read_tensors(header: dict[str, Any], data: bytearray) -> dict[str, torch.Tensor]:
    """Tensors over one private copy of the data bytes (entries already checked)."""
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, size = WIRE_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        count = (end - begin) // size
        if count == 0:
            flat = torch.empty(0, dtype=dtype)
        elif begin % size:  # a misaligned tensor (another writer's layout): its own copy
            flat = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype)
        else:
            flat = torch.frombuffer(data, dtype=dtype, count=count, offset=begin)
        tensors[name] = flat.reshape(entry["shape"])
    return tensors


def _reject_foreign(body: bytes) -> None:
    # a pickle starts 0x80 <protocol>; so does a safetensors header of 640, 896, 1152 or 1408
    # bytes (its little-endian length), whose JSON then opens at byte 8
    if len(body) >= 2 and body[0] == 0x80 and 2 <= body[1] <= 5 and body[8:9] != b"{":
        raise BadFrame("body is a pickle; DRIFT never unpickles: send a safetensors frame")
    if body.startswith(_ZIP_MAGIC):
        raise BadFrame(
            "body is a torch.save archive (pickle inside); DRIFT never unpickles: "
            "send a safetensors frame"
        )
    if len(body) < 8:
        raise BadFrame(f"not a safetensors frame: {len(body)} bytes is shorter than its header")


def _header_len(body: bytes) -> int:
    return int(struct.unpack("<Q", body[:8])[0])


def _read_header(body: bytes) -> dict[str, Any]:
    n = _header_len(body)
    if n > MAX_HEADER_BYTES or n > len(body) - 8:
        raise BadFrame(
            f"not a safetensors frame: header length {n} does not fit a body of {len(body)} bytes"
        )
    try:
        header = orjson.loads(body[8 : 8 + n])
    except orjson.JSONDecodeError as exc:
        raise BadFrame(f"not a safetensors frame: header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise BadFrame("not a safetensors frame: header is not a JSON object")
    return header


def _read_params(header: dict[str, Any]) -> dict[str, Any]:
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or not isinstance(meta.get(METADATA_KEY), str):
        raise BadFrame(f"frame has no __metadata__[{METADATA_KEY!r}] with the request parameters")
    try:
        params = orjson.loads(meta[METADATA_KEY])
    except orjson.JSONDecodeError as exc:
        raise BadFrame(f"frame parameters are not JSON: {exc}") from exc
    if not isinstance(params, dict):
        raise BadFrame("frame parameters must be a JSON object")
    return params


def _check_entries(header: dict[str, Any], data_len: int) -> None:
    """Every tensor's dtype is allowed and its shape matches its byte range exactly."""
    ranges = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise BadFrame(f"frame header entry {name!r} is not an object")
        tag = entry.get("dtype")
        shape: Any = entry.get("shape")
        offsets: Any = entry.get("data_offsets")
        if tag not in WIRE_DTYPES:
            allowed = ", ".join(WIRE_DTYPES)
            raise BadTensor(f"tensor {name!r} has unsupported dtype {tag!r} (allowed: {allowed})")
        if not _int_list(shape) or not _int_list(offsets) or len(offsets) != 2:
            raise BadFrame(f"tensor {name!r} has a malformed shape or data_offsets")
        begin, end = offsets
        if len(shape) > MAX_RANK or any(not 0 <= dim <= MAX_DIM for dim in shape):
            raise BadFrame(f"tensor {name!r} has shape {shape[:MAX_RANK + 1]}: at most "
                           f"{MAX_RANK} dimensions, each in [0, {MAX_DIM}]")  # fmt: skip
        count = 1
        for dim in shape:
            count *= dim
        if not 0 <= begin <= end <= data_len:
            raise BadFrame(
                f"tensor {name!r} data_offsets {offsets} fall outside the {data_len} data bytes"
            )
        if count * WIRE_DTYPES[tag][1] != end - begin:
            raise BadFrame(
                f"tensor {name!r}: shape {shape} of {tag} needs {count * WIRE_DTYPES[tag][1]} "
                f"bytes but its data holds {end - begin}"
            )
        ranges.append((begin, end))
    ranges.sort()
    cursor = 0
    for begin, end in ranges:
        if begin != cursor:
            raise BadFrame("frame tensors overlap or leave gaps in the data")
        cursor = end
    if cursor != data_len:
        raise BadFrame(f"frame data holds {data_len} bytes but its tensors cover {cursor}")


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )
