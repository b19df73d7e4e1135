"""Issue 16, findings 3 and 9: compute limits on every route, checked before compute, with a
JSON error naming the limit; long work is cut into chunks so a short request is not stuck
behind it; lying shapes and bodies that are not what they claim are 400s, not 500s."""

from __future__ import annotations

import asyncio
import struct

import aiohttp
import orjson
import torch

from drift.wire import messages as m
from drift.wire.frames import MEDIA_TYPE
from drift.wire.version import PROTOCOL_VERSION
from tests.server.wsclient import RawSession

H = 64


async def _post(http, url, body, headers=None):
    headers = {"Content-Type": MEDIA_TYPE, **(headers or {})}
    async with http.post(url, data=body, headers=headers) as resp:
        return resp.status, await resp.read()


def _error(raw: bytes) -> dict:
    return orjson.loads(raw)["error"]


async def test_tokens_per_request_are_limited_before_compute(servers, tiny_llama):
    """Finding 3: B x T past max_request_tokens is a 413 naming the limit, on both routes."""
    running = await servers(tiny_llama, 0, 2, max_request_tokens=256)
    fp = running.server.backend.fingerprint
    hidden = torch.randn(2, 129, H)  # 258 tokens
    async with aiohttp.ClientSession() as http:
        for route, body in (("forward", m.encode(m.ForwardRequest(fp, 0, 2, hidden))),
                            ("backward", m.encode(m.BackwardRequest(fp, 0, 2, hidden, hidden)))):  # fmt: skip
            status, raw = await _post(http, f"{running.url}/{route}", body)
            assert status == 413, (route, raw)
            assert (
                "max_request_tokens" in _error(raw)["message"] and "258" in _error(raw)["message"]
            )
        # plain JSON bodies have their own, smaller byte limit (checked before parsing)
        status, raw = await _post(http, f"{running.url}/forward", b"{" + b" " * (9 << 20) + b"}",
                                  {"Content-Type": "application/json"})  # fmt: skip
        assert status == 413 and "max_json_bytes" in _error(raw)["message"]
        ok = torch.randn(2, 128, H)
        status, _ = await _post(http, f"{running.url}/forward",
                                m.encode(m.ForwardRequest(fp, 0, 2, ok)))  # fmt: skip
        assert status == 200


async def test_long_work_is_chunked_and_exact(servers, tiny_llama):
    """Finding 3: a long forward runs in chunks (rows, then tokens through a temporary cache)
    with the same numbers as one pass, and a prefill step in chunks too."""
    running = await servers(tiny_llama, 0, 2, chunk_tokens=64)
    span, fp = running.server.backend.span, running.server.backend.fingerprint
    hidden = torch.randn(3, 150, H)
    mask = torch.ones(3, 150, dtype=torch.int64)
    mask[1, :7] = 0  # left padding
    with torch.no_grad():
        want = span.forward(hidden, attention_mask=mask)
    async with aiohttp.ClientSession() as http:
        status, raw = await _post(http, f"{running.url}/forward",
                                  m.encode(m.ForwardRequest(fp, 0, 2, hidden, mask)))  # fmt: skip
        assert status == 200
        got = m.decode(m.ForwardResponse, raw).hidden_states
        assert (got - want)[mask.bool()].abs().max() < 1e-5
        grad = torch.randn_like(hidden)
        status, raw = await _post(http, f"{running.url}/backward",
                                  m.encode(m.BackwardRequest(fp, 0, 2, hidden, grad, mask)))  # fmt: skip
        assert status == 200
        want_grad, _ = span.backward(hidden, grad, attention_mask=mask)
        got_grad = m.decode(m.BackwardResponse, raw).grad_inputs
        assert (got_grad - want_grad).abs().max() < 1e-5
        # a long prefill step runs in chunks through the session's own cache
        before = running.server.backend.chunks_run
        sess = await RawSession.open(http, running.url, fp, 0, 2, max_length=200, batch_size=3)
        got = await sess.step(hidden, 0, attention_mask=mask)
        assert (got - want)[mask.bool()].abs().max() < 1e-5
        assert running.server.backend.chunks_run - before == 3  # 150 tokens, 64 per chunk
        nxt = torch.randn(3, 1, H)
        got = await sess.step(nxt, 150)
        with torch.no_grad():
            full = span.forward(torch.cat([hidden, nxt], 1),
                                attention_mask=torch.cat([mask, torch.ones(3, 1).long()], 1))  # fmt: skip
        assert (got - full[:, -1:]).abs().max() < 1e-5
        await sess.close()
    assert running.server.backend.chunks_run >= 3 + 3


async def test_short_request_is_not_stuck_behind_a_long_one(servers, tiny_llama):
    """Finding 3: a one-token forward sent while a long forward runs is computed between the
    long one's chunks, not after all of it."""
    running = await servers(tiny_llama, 0, 2, chunk_tokens=256, max_request_tokens=1 << 16,
                            max_batch_size=128)  # fmt: skip
    fp = running.server.backend.fingerprint
    span = running.server.backend.span
    calls: list[int] = []  # tokens of each pass the compute thread runs, in order
    run_forward = span.run_forward

    def traced(start, end, hidden, *rest):
        calls.append(hidden.shape[1])
        return run_forward(start, end, hidden, *rest)

    span.run_forward = traced
    long_body = m.encode(m.ForwardRequest(fp, 0, 2, torch.randn(128, 256, H)))
    short_body = m.encode(m.ForwardRequest(fp, 0, 2, torch.randn(1, 1, H)))
    async with aiohttp.ClientSession() as http:
        long_task = asyncio.create_task(_post(http, f"{running.url}/forward", long_body))
        while not calls:  # the long forward is on the compute thread
            await asyncio.sleep(0.001)
        assert (await _post(http, f"{running.url}/forward", short_body))[0] == 200
        assert (await long_task)[0] == 200
    short_at = calls.index(1)
    assert 256 in calls[short_at + 1 :], f"the short pass ran after the whole long one: {calls}"


def _lying_frame(shape: list[int]) -> bytes:
    params = orjson.dumps({"type": "forward", "version": PROTOCOL_VERSION, "model": "x",
                           "start_block": 0, "end_block": 2}).decode()  # fmt: skip
    header = orjson.dumps({"__metadata__": {"drift": params},
                           "hidden_states": {"dtype": "F32", "shape": shape,
                                             "data_offsets": [0, 0]}})  # fmt: skip
    return struct.pack("<Q", len(header)) + header


async def test_lying_shapes_and_encodings_are_400(servers, tiny_llama):
    """Finding 9: [2**62, 2**62, 0], a dim of 2**64-1, a non-zstd 'zstd' body: 400, not 500."""
    running = await servers(tiny_llama, 0, 2)
    async with aiohttp.ClientSession() as http:
        for shape in ([2**62, 2**62, 0], [1, 2**64 - 1, 0], [0, 2**63 - 1, H]):
            status, raw = await _post(http, f"{running.url}/forward", _lying_frame(shape))
            assert status == 400, (shape, raw)
            assert _error(raw)["code"] in ("bad_frame", "bad_tensor")
        fp = running.server.backend.fingerprint
        plain = m.encode(m.ForwardRequest(fp, 0, 2, torch.randn(1, 2, H)))
        for body in (plain, b"\x28\xb5\x2f\xfd" + b"garbage"):
            # the server closes a connection whose body it cannot decode: a fresh one each
            async with aiohttp.ClientSession() as fresh:
                status, raw = await _post(fresh, f"{running.url}/forward", body,
                                          {"Content-Encoding": "zstd"})  # fmt: skip
            assert status == 400 and "Content-Encoding" in _error(raw)["message"], raw
        status, _ = await _post(http, f"{running.url}/forward", plain)
        assert status == 200  # the node keeps serving


def test_units_of_work_are_sized_to_the_measured_pace():
    """A decode step waits behind at most one unit of another request's work: units take
    about CHUNK_TARGET_S at the span's measured pace, in powers of two within bounds."""
    from drift.server.chunks import CHUNK_TARGET_S, MAX_CHUNK_TOKENS, MIN_CHUNK_TOKENS
    from drift.server.chunks import chunk_tokens_for as size

    assert size(5684.0, 15) == 256  # SmolLM2 float32 [0, 15) on one core of this CPU
    assert size(1e7, 40) == MAX_CHUNK_TOKENS  # an accelerator: as before
    assert size(50.0, 28) == MIN_CHUNK_TOKENS  # a slow CPU with a big span: the floor
    for pace, blocks in ((3000.0, 10), (20_000.0, 30), (900.0, 3)):
        tokens = size(pace, blocks)
        assert tokens & (tokens - 1) == 0
        assert tokens * blocks / pace <= CHUNK_TARGET_S or tokens == MIN_CHUNK_TOKENS
        assert tokens == MAX_CHUNK_TOKENS or 2 * tokens * blocks / pace > CHUNK_TARGET_S


async def test_a_server_sizes_its_units_unless_told(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2)  # no chunk_tokens: sized from the pace
    backend = running.server.backend
    assert backend.pace is not None and backend.pace > 0
    from drift.server.chunks import chunk_tokens_for

    assert backend.chunk_tokens == chunk_tokens_for(backend.pace, 2)
    told = await servers(tiny_llama, 2, 4, chunk_tokens=64)
    assert told.server.backend.chunk_tokens == 64


async def test_prompt_units_grow_to_the_pace_prompts_run_at(servers, tiny_llama):
    """Units of a prompt are sized by the 16-token pace at start, then by how fast prompt units
    are seen to run; an operator's `chunk_tokens` stays as set. Results stay exact across
    steps cut into units of different sizes."""
    running = await servers(tiny_llama, 0, 2)
    fixed = await servers(tiny_llama, 0, 2, chunk_tokens=64)
    backend = running.server.backend
    assert backend.sized_by_pace and not fixed.server.backend.sized_by_pace
    # as if measured slow: one 64-token unit a second (a tiny model runs one in milliseconds)
    backend.pace, backend.chunk_tokens, backend.prompt_pace = 64.0 * 2, 64, None
    x = torch.randn(1, 384, H)
    async with aiohttp.ClientSession() as http:
        for r in (running, fixed):
            with torch.no_grad():
                want = r.server.backend.span.forward(x)
            sess = await RawSession.open(http, r.url, r.server.backend.fingerprint, 0, 2,
                                         max_length=384)  # fmt: skip
            before = r.server.backend.chunks_run
            first = await sess.step(x[:, :256], 0)
            units = r.server.backend.chunks_run - before
            got = torch.cat([first, await sess.step(x[:, 256:], 256)], dim=1)
            assert (got - want).abs().max() < 1e-5
            await sess.ws.close()
            if r is fixed:
                assert r.server.backend.chunk_tokens == 64
    assert backend.prompt_pace is not None and backend.prompt_pace > backend.pace
    assert backend.chunk_tokens > 64
    assert units == 4  # the fixed server: 256 tokens in 64-token units
