"""Bad input, one test each: a clear 4xx JSON error (or WebSocket error), the node keeps
serving, and a bystander session keeps its cache."""

from __future__ import annotations

import asyncio
import io
import pickle
import struct

import aiohttp
import orjson
import pytest
import torch

from drift import PROTOCOL_VERSION
from drift.wire import messages as m
from drift.wire.frames import MEDIA_TYPE, encode_frame
from tests.server.wsclient import RawSession

H = 64


class Bystander:
    """An open session whose cache must survive everyone else's mistakes."""

    def __init__(self, running, session: RawSession) -> None:
        self.running, self.session, self.history = running, session, torch.randn(1, 3, H)

    @classmethod
    async def start(cls, http, running):
        fp = running.server.backend.fingerprint
        sess = await RawSession.open(http, running.url, fp, 0, 2, max_length=16)
        me = cls(running, sess)
        await sess.step(me.history, 0)
        return me

    async def check(self, http) -> None:
        new = torch.randn(1, 1, H)
        out = await self.session.step(new, self.history.shape[1])
        self.history = torch.cat([self.history, new], dim=1)
        expected = self.running.server.backend.span.forward(self.history)[:, -1:]
        assert torch.allclose(out, expected, atol=1e-5)
        async with http.get(f"{self.running.url}/blocks") as resp:
            assert resp.status == 200
            assert (await resp.json())["active_sessions"] >= 1


@pytest.fixture
async def env(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2, max_body_bytes=200_000, attn_cache_tokens=256,
                            inference_max_length=64)  # fmt: skip
    async with aiohttp.ClientSession() as http:
        bystander = await Bystander.start(http, running)
        yield running, http, bystander
        await bystander.check(http)
        await bystander.session.close()


async def _post_raw(http, url, body, content_type=MEDIA_TYPE):
    async with http.post(url, data=body, headers={"Content-Type": content_type}) as resp:
        payload = await resp.json(content_type=None)
        return resp.status, payload["error"]


def _fwd(fp, hidden, start=0, end=2):
    return m.encode(m.ForwardRequest(fp, start, end, hidden))


async def test_not_safetensors(env):
    running, http, _ = env
    status, err = await _post_raw(http, f"{running.url}/forward", b"hello, this is not a frame")
    assert status == 400 and err["code"] == "bad_frame" and "safetensors" in err["message"]


async def test_pickle(env):
    running, http, _ = env
    buf = io.BytesIO()
    torch.save({"hidden_states": torch.zeros(1, 1, H)}, buf)
    for body in (buf.getvalue(), pickle.dumps({"hidden_states": [0.0]})):
        status, err = await _post_raw(http, f"{running.url}/forward", body)
        assert status == 400 and err["code"] == "bad_frame" and "pickle" in err["message"]


async def test_wrong_dtype(env):
    running, http, _ = env
    fp = running.server.backend.fingerprint
    params = m.ForwardRequest(fp, 0, 2, torch.zeros(1, 1, H)).to_wire()[0]
    body = encode_frame(params, {"hidden_states": torch.zeros(1, 1, H, dtype=torch.int64)})
    status, err = await _post_raw(http, f"{running.url}/forward", body)
    assert status == 400 and err["code"] == "bad_tensor" and "dtype" in err["message"]


async def test_wrong_hidden_size(env):
    running, http, _ = env
    body = _fwd(running.server.backend.fingerprint, torch.zeros(1, 2, H + 1))
    status, err = await _post_raw(http, f"{running.url}/forward", body)
    assert status == 400 and err["code"] == "bad_tensor" and "hidden size 65" in err["message"]


async def test_wrong_rank(env):
    running, http, _ = env
    fp = running.server.backend.fingerprint
    params = m.ForwardRequest(fp, 0, 2, torch.zeros(1, 1, H)).to_wire()[0]
    body = encode_frame(params, {"hidden_states": torch.zeros(2, H)})
    status, err = await _post_raw(http, f"{running.url}/forward", body)
    assert status == 400 and err["code"] == "bad_tensor" and "rank 3" in err["message"]


async def test_header_shapes_do_not_match_data(env):
    running, http, _ = env
    params = orjson.dumps({"type": "forward", "version": PROTOCOL_VERSION, "model": "x",
                           "start_block": 0, "end_block": 2}).decode()  # fmt: skip
    header = orjson.dumps({"__metadata__": {"drift": params}, "hidden_states":
                           {"dtype": "F32", "shape": [1000, 1000, H], "data_offsets": [0, 256]}})  # fmt: skip
    body = struct.pack("<Q", len(header)) + header + b"\0" * 256
    status, err = await _post_raw(http, f"{running.url}/forward", body)
    assert status == 400 and err["code"] == "bad_frame" and "needs" in err["message"]


async def test_span_not_held_and_other_model(env):
    running, http, _ = env
    fp = running.server.backend.fingerprint
    status, err = await _post_raw(
        http, f"{running.url}/forward", _fwd(fp, torch.zeros(1, 1, H), 1, 3)
    )
    assert status == 400 and err["code"] == "span_not_served" and "[0, 2)" in err["message"]
    status, err = await _post_raw(
        http, f"{running.url}/forward", _fwd("0" * 64, torch.zeros(1, 1, H))
    )
    assert status == 400 and err["code"] == "model_mismatch"
    fp_session = await RawSession.open(http, running.url, fp, 1, 3)
    assert fp_session["code"] == "span_not_served"


async def test_step_past_max_length(env):
    running, http, _ = env
    fp = running.server.backend.fingerprint
    sess = await RawSession.open(http, running.url, fp, 0, 2, max_length=4)
    await sess.step(torch.randn(1, 3, H), 0)
    err = await sess.step_error(torch.randn(1, 2, H), 3)
    assert err["code"] == "length_exceeded" and "max_length 4" in err["message"]
    err = await sess.step_error(torch.randn(1, 1, H), 5)  # skipping ahead
    assert err["code"] == "length_exceeded"
    await sess.step(torch.randn(1, 1, H), 3)  # the session itself still works
    too_long = await RawSession.open(http, running.url, fp, 0, 2, max_length=65)
    assert too_long["code"] == "length_exceeded"
    await sess.close()


async def test_body_over_the_limit(env):
    running, http, _ = env
    body = _fwd(running.server.backend.fingerprint, torch.zeros(1, 1000, H))  # 256 KB
    status, err = await _post_raw(http, f"{running.url}/forward", body)
    assert status == 413 and err["code"] == "payload_too_large"


async def test_session_beyond_cache_budget(env):
    running, http, _ = env
    fp = running.server.backend.fingerprint
    err = await RawSession.open(http, running.url, fp, 0, 2, max_length=64, batch_size=4)
    assert err["type"] == "error" and err["code"] == "cache_full"
    async with http.get(f"{running.url}/blocks") as resp:
        info = await resp.json()
    assert info["cache_block_tokens_left"] == 512 - 16 * 2  # only the bystander's room


async def test_websocket_message_of_wrong_type(env):
    running, http, _ = env
    fp = running.server.backend.fingerprint
    ws = await http.ws_connect(f"{running.url}/inference")
    await ws.send_bytes(_fwd(fp, torch.zeros(1, 1, H)))  # a forward frame, not a step
    err = orjson.loads((await ws.receive()).data)
    assert err["type"] == "error" and err["code"] == "bad_request" and "step" in err["message"]
    await ws.send_str('{"type": "hello"}')
    err = orjson.loads((await ws.receive()).data)
    assert err["code"] == "bad_request" and "'open'" in err["message"]
    await ws.send_str("not json")
    assert orjson.loads((await ws.receive()).data)["code"] == "bad_request"
    step = m.encode(m.StepRequest(1, 0, torch.zeros(1, 1, H)))
    await ws.send_bytes(step)  # a step before open
    err = orjson.loads((await ws.receive()).data)
    assert err["code"] == "bad_request" and "open" in err["message"]
    await ws.close()


async def test_unknown_session_after_timeout(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2, session_timeout_s=0.2)
    fp = running.server.backend.fingerprint
    async with aiohttp.ClientSession() as http:
        sess = await RawSession.open(http, running.url, fp, 0, 2)
        await sess.step(torch.randn(1, 2, H), 0)
        await asyncio.sleep(0.6)
        err = await sess.step_error(torch.randn(1, 1, H), 2)
        assert err["code"] == "unknown_session" and "timed out" in err["message"]
        assert running.server.budget.used == 0
        await sess.close()


async def test_client_vanishes_mid_step(env):
    running, http, _ = env
    fp = running.server.backend.fingerprint
    sess = await RawSession.open(http, running.url, fp, 0, 2, max_length=64)
    assert running.server.budget.used == 2 * 16 + 2 * 64
    await sess.send_step(torch.randn(1, 60, H), 0)
    sess.ws._response.connection.transport.abort()  # gone, without a close frame
    for _ in range(100):
        if running.server.budget.used == 2 * 16:
            break
        await asyncio.sleep(0.05)
    assert running.server.budget.used == 2 * 16
    assert len(running.server.sessions.sessions) == 1
