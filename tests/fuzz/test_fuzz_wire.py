"""Fuzzing the wire edge: frames and typed messages only ever raise the 4xx errors they name.

Whatever bytes or JSON arrive, decoding a frame raises BadFrame / BadTensor /
PayloadTooLarge, and building a typed message raises a DriftError with a 4xx status: never
an IndexError, an OverflowError, a torch RuntimeError or a MemoryError (which the node would
turn into a 500). Explicit examples hold the cases of issue 16 (lying shapes, big dims).
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from drift.wire import messages as m
from drift.wire.errors import DriftError
from drift.wire.frames import WIRE_DTYPES, decode_frame
from drift.wire.version import PROTOCOL_VERSION
from drift.wire.zstd import compress, decompress
from tests.fuzz.strategies import json_values

H = 8
dims = st.integers(min_value=-2, max_value=2**64 - 1) | st.sampled_from([0, 1, 2, H, 2**31, 2**62])


def _client_error(exc: BaseException) -> bool:
    return isinstance(exc, DriftError) and 400 <= exc.status < 500


def _frame(header: dict[str, Any], data: bytes) -> bytes:
    """A frame written by hand (stdlib json: integers of any size, as an attacker may send)."""
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + data


def _params(**extra: Any) -> str:
    return json.dumps({"type": "forward", "version": PROTOCOL_VERSION, "model": "x",
                       "start_block": 0, "end_block": 1, **extra})  # fmt: skip


@given(st.binary(max_size=512))
def test_arbitrary_bytes_are_refused_cleanly(body: bytes) -> None:
    try:
        decode_frame(body)
    except Exception as exc:  # noqa: BLE001 -- the property: only client errors
        assert _client_error(exc), repr(exc)


@given(
    shape=st.lists(dims, max_size=10),
    tag=st.sampled_from([*WIRE_DTYPES, "F64", "I8", 7]),
    offsets=st.lists(st.integers(-4, 2**64), min_size=0, max_size=3),
    data=st.binary(max_size=256),
)
@example(shape=[2**62, 2**62, 0], tag="F32", offsets=[0, 0], data=b"")
@example(shape=[1, 2**64 - 1, 0], tag="F32", offsets=[0, 0], data=b"")
@example(shape=[0, 2**63 - 1, H], tag="F32", offsets=[0, 0], data=b"")
def test_lying_headers_are_refused_cleanly(shape, tag, offsets, data) -> None:
    frame = _frame({"__metadata__": {"drift": _params()},
                    "hidden_states": {"dtype": tag, "shape": shape, "data_offsets": offsets}},
                   data)  # fmt: skip
    try:
        params, tensors = decode_frame(frame)
        m.ForwardRequest.from_wire(params, tensors, hidden_size=H)
    except Exception as exc:  # noqa: BLE001
        assert _client_error(exc), repr(exc)


@given(st.data())
def test_mutated_valid_frames_are_refused_or_parsed(data) -> None:
    req = m.ForwardRequest("x", 0, 1, torch.randn(2, 3, H), torch.ones(2, 3, dtype=torch.int64))
    body = bytearray(m.encode(req))
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    try:
        m.decode(m.ForwardRequest, bytes(body), hidden_size=H)
    except Exception as exc:  # noqa: BLE001
        assert _client_error(exc), repr(exc)


@given(json_values)
@example({"start_block": 0, "end_block": 1, "hidden_states": [[[1e308] * H]] * 2})
@example({"start_block": 2**64, "end_block": -1, "hidden_states": [[[]]]})
@example({"start_block": 0, "end_block": 1, "hidden_states": [[[0.0] * H], [[0.0]]]})
def test_plain_json_requests_are_refused_cleanly(obj) -> None:
    for kind in (m.ForwardRequest, m.BackwardRequest):
        try:
            kind.from_json(obj, default_model="x", hidden_size=H)
        except Exception as exc:  # noqa: BLE001
            assert _client_error(exc), repr(exc)


@given(json_values)
@example({"type": "open", "version": PROTOCOL_VERSION, "model": "x", "start_block": 0,
          "end_block": 2**64, "max_length": 2**70, "batch_size": 0, "dtype": "float32"})  # fmt: skip
def test_json_messages_are_refused_cleanly(obj) -> None:
    for kind in (m.OpenSession, m.CloseSession, m.IdleSession, m.SessionOpened, m.ErrorMessage):
        try:
            kind.from_wire(obj)
        except Exception as exc:  # noqa: BLE001
            assert _client_error(exc), repr(exc)


@given(params=st.dictionaries(st.text(max_size=10), json_values, max_size=6),
       hidden=st.sampled_from([(1, 1, H), (2, 3, H), (1, 1, H + 1), (0, 1, H)]))  # fmt: skip
def test_step_params_are_refused_cleanly(params, hidden) -> None:
    base = {"type": "step", "version": PROTOCOL_VERSION, "step_id": 1, "position": 0}
    tensor = torch.zeros(hidden)
    frame = _frame({"__metadata__": {"drift": json.dumps({**base, **params})},
                    "hidden_states": {"dtype": "F32", "shape": list(hidden),
                                      "data_offsets": [0, tensor.numel() * 4]}},
                   tensor.numpy().tobytes())  # fmt: skip
    try:
        p, tensors = decode_frame(frame)
        m.StepRequest.from_wire(p, tensors, hidden_size=H)
    except Exception as exc:  # noqa: BLE001
        assert _client_error(exc), repr(exc)


@given(st.binary(max_size=256), st.integers(0, 4096))
def test_zstd_bodies_are_bounded(body, limit) -> None:
    for data in (body, compress(body), b"\x28\xb5\x2f\xfd" + body):
        try:
            out = decompress(data, max_bytes=limit)
            assert len(out) <= limit
        except Exception as exc:  # noqa: BLE001
            assert _client_error(exc), repr(exc)
