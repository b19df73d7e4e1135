"""A client may choose its session's id and push token (OpenSession.session_id / push_token)
and send its first step right behind the open, before the answer: the server takes a socket's
messages in order, so the step runs on the session just opened, and a step pushed to that id
with that token is taken. An id already in use is refused and the session holding it is left
alone; a step behind an open that failed gets its own error (what the client reads before
opening again the long way)."""

from __future__ import annotations

import aiohttp
import orjson
import torch

from drift.models.checkpoint import Checkpoint
from drift.models.span import ModelSpan
from drift.server.push import PUSH_PATH
from drift.wire import codec
from drift.wire import messages as m
from drift.wire.step import StepRequest, StepResponse


async def _text(ws: aiohttp.ClientWebSocketResponse) -> dict:
    msg = await ws.receive(timeout=10)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    return orjson.loads(msg.data)


async def _reply(ws: aiohttp.ClientWebSocketResponse) -> StepResponse:
    msg = await ws.receive(timeout=10)
    assert msg.type == aiohttp.WSMsgType.BINARY, msg.data
    return m.decode(StepResponse, msg.data)


async def test_a_chosen_id_opens_and_takes_steps_sent_before_the_answer(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2)
    server, fp = running.server, running.server.backend.fingerprint
    width = server.backend.hidden_size
    local = ModelSpan.load(Checkpoint(tiny_llama), 0, 2).new_session(batch_size=1, max_length=8)
    session_id, push_token = m.new_session_ids()
    x, y = torch.randn(1, 3, width), torch.randn(1, 1, width)
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{running.url}/inference")
        opening = m.OpenSession(fp, 0, 2, 8, 1, "float32", session_id=session_id,
                                push_token=push_token)  # fmt: skip
        await ws.send_str(codec.encode_text(opening))
        await ws.send_bytes(codec.encode(StepRequest(1, 0, x)))  # no wait for the answer
        opened = m.SessionOpened.from_wire(await _text(ws))
        assert (opened.session_id, opened.push_token) == (session_id, push_token)
        first = await _reply(ws)
        assert first.step_id == 1
        torch.testing.assert_close(first.hidden_states, local.step(x), atol=1e-5, rtol=0)
        # a step pushed to the chosen id with the chosen token runs; its reply comes here
        link = await http.ws_connect(f"{running.url}{PUSH_PATH}")
        await link.send_bytes(codec.encode(StepRequest(2, 3, y, session_id=session_id,
                                                       push_token=push_token)))  # fmt: skip
        pushed = await _reply(ws)
        assert pushed.step_id == 2
        torch.testing.assert_close(pushed.hidden_states, local.step(y), atol=1e-5, rtol=0)
        await link.close()

        # the same id again, on another socket: refused; the first session keeps going
        other = await http.ws_connect(f"{running.url}/inference")
        await other.send_str(codec.encode_text(m.OpenSession(
            fp, 0, 2, 8, 1, "float32", session_id=session_id)))  # fmt: skip
        err = await _text(other)
        assert err["type"] == "error" and err["code"] == "bad_request", err
        assert "in use" in err["message"]
        await other.close()
        z = torch.randn(1, 1, width)
        await ws.send_bytes(codec.encode(StepRequest(3, 4, z)))
        torch.testing.assert_close((await _reply(ws)).hidden_states, local.step(z),
                                   atol=1e-5, rtol=0)  # fmt: skip
        assert list(server.sessions.sessions) == [session_id]
        await ws.close()


async def test_a_step_behind_a_refused_open_gets_its_own_error(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2, inference_max_length=16)
    fp, width = running.server.backend.fingerprint, running.server.backend.hidden_size
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{running.url}/inference")
        session_id, push_token = m.new_session_ids()
        too_long = m.OpenSession(fp, 0, 2, 64, 1, "float32", session_id=session_id,
                                 push_token=push_token)  # fmt: skip
        await ws.send_str(codec.encode_text(too_long))
        await ws.send_bytes(codec.encode(StepRequest(1, 0, torch.randn(1, 2, width))))
        refused = await _text(ws)
        assert refused["code"] == "length_exceeded", refused
        step_error = await _text(ws)
        assert step_error["step_id"] == 1 and "send 'open' first" in step_error["message"]
        assert not running.server.sessions.sessions
        await ws.close()
