"""Fuzzing a real block server on loopback: WebSocket messages and HTTP bodies.

One private-swarm server of a tiny llama runs on a background event loop for the module;
each example sends hostile messages over one proven WebSocket (or hostile bodies to every
POST route) and checks every answer is a clean error or a result, never a 5xx; afterwards a
bystander session still computes the right numbers and no cache is leaked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from drift.client.loop import LoopThread
from drift.wire import messages as m
from drift.wire.auth import auth_headers
from drift.wire.version import PROTOCOL_VERSION
from tests.fuzz.strategies import json_values
from tests.server.harness import RunningServer, start_block_server
from tests.tiny_models import save_tiny

KEY = "fuzz-key"
H = 64


@dataclass
class Live:
    loop: LoopThread
    running: RunningServer
    http: aiohttp.ClientSession
    bystander: aiohttp.ClientWebSocketResponse
    history: torch.Tensor

    def headers(self, method: str, path: str, body: bytes = b"") -> dict[str, str]:
        return auth_headers(KEY, method, path, body, peer_id=self.running.node.peer_id)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    model_dir = save_tiny("llama", Path(tmp_path_factory.mktemp("fuzz")) / "llama")
    loop = LoopThread()

    async def up() -> Live:
        running = await start_block_server(model_dir, 0, 2, swarm_key=KEY, max_body_bytes=1 << 20,
                                           attn_cache_tokens=4096, inference_max_length=64)  # fmt: skip
        http = aiohttp.ClientSession()
        path = "/inference"
        ws = await http.ws_connect(running.url + path, headers=auth_headers(
            KEY, "GET", path, peer_id=running.node.peer_id))  # fmt: skip
        fp = running.server.backend.fingerprint
        await ws.send_str(
            orjson.dumps(m.OpenSession(fp, 0, 2, 32, 1, "float32").to_wire()).decode()
        )
        assert orjson.loads((await ws.receive()).data)["type"] == "session_opened"
        history = torch.randn(1, 3, H)
        await ws.send_bytes(m.encode(m.StepRequest(1, 0, history)))
        await ws.receive()
        return Live(loop, running, http, ws, history)

    state = loop.run(up())
    try:
        yield state
        loop.run(_check_bystander(state))
    finally:

        async def down() -> None:
            await state.bystander.close()
            await state.http.close()
            await state.running.stop()

        loop.run(down())
        loop.close()


async def _check_bystander(live: Live) -> None:
    """The bystander's cache survived: a step after its prompt (rolled back there each time)
    matches the span run in one pass."""
    new = torch.randn(1, 1, H)
    pos = live.history.shape[1]
    await live.bystander.send_bytes(m.encode(m.StepRequest(99, pos, new)))
    reply = m.decode(m.StepResponse, (await live.bystander.receive()).data)
    want = live.running.server.backend.span.forward(torch.cat([live.history, new], 1))[:, -1:]
    assert torch.allclose(reply.hidden_states, want, atol=1e-5)


def _open_msg(fields: dict) -> str:
    base = {"type": "open", "version": PROTOCOL_VERSION, "model": "x", "start_block": 0,
            "end_block": 2, "max_length": 8, "batch_size": 1, "dtype": "float32"}  # fmt: skip
    return orjson.dumps({**base, **fields}, option=orjson.OPT_NON_STR_KEYS).decode()


def _step_frame(step_id: int, position: int, shape: tuple[int, ...], dtype: torch.dtype) -> bytes:
    return m.encode(m.StepRequest(step_id, position, torch.zeros(shape, dtype=dtype)))


small_ints = st.integers(-3, 80)
ws_messages = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=300),
    json_values.map(
        lambda v: orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS).decode() if _dumpable(v) else "{}"
    ),  # fmt: skip
    st.dictionaries(
        st.sampled_from(
            [
                "model",
                "start_block",
                "end_block",
                "max_length",
                "batch_size",
                "dtype",
                "type",
                "version",
            ]
        ),
        st.one_of(small_ints, st.text(max_size=8), st.none()),
        max_size=4,
    ).map(_open_msg),  # fmt: skip
    st.just(orjson.dumps({"type": "close", "version": PROTOCOL_VERSION}).decode()),
    st.builds(
        _step_frame,
        small_ints,
        small_ints,
        st.sampled_from([(1, 1, H), (1, 4, H), (2, 1, H), (1, 1, H + 1), (1, 70, H)]),
        st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    ),  # fmt: skip
)


def _dumpable(value: object) -> bool:
    try:
        orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return False
    return True


@given(st.lists(ws_messages, min_size=1, max_size=12), st.booleans())
def test_websocket_messages_get_clean_answers(live: Live, messages, use_real_model) -> None:
    fp = live.running.server.backend.fingerprint

    async def run() -> None:
        path = "/inference"
        ws = await live.http.ws_connect(live.running.url + path,
                                        headers=live.headers("GET", path))  # fmt: skip
        try:
            for msg in messages:
                if isinstance(msg, str):
                    await ws.send_str(msg.replace('"model":"x"', f'"model":"{fp}"')
                                      if use_real_model else msg)  # fmt: skip
                else:
                    await ws.send_bytes(msg)
                reply = await asyncio.wait_for(ws.receive(), 30)
                if reply.type == aiohttp.WSMsgType.TEXT:
                    obj = orjson.loads(reply.data)
                    assert obj["type"] in ("error", "session_opened", "session_closed"), obj
                    if obj["type"] == "error":
                        assert obj["code"] != "internal", obj
                else:
                    assert reply.type == aiohttp.WSMsgType.BINARY, reply
                    m.decode(m.StepResponse, reply.data)
        finally:
            await ws.close()
        for _ in range(100):  # the socket's session (if any) is freed once it closed
            if len(live.running.server.sessions.sessions) == 1:
                break
            await asyncio.sleep(0.01)
        assert len(live.running.server.sessions.sessions) == 1  # the bystander alone
        await _check_bystander(live)

    live.loop.run(run())


@given(st.sampled_from(["/forward", "/backward", "/swarm/gossip"]),
       st.binary(max_size=400) | json_values.filter(_dumpable).map(
           lambda v: orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS)),
       st.sampled_from(["application/json", "application/vnd.drift.tensors", "text/plain", ""]),
       st.sampled_from(["", "zstd", "gzip", "br", "x"]))  # fmt: skip
def test_http_bodies_get_4xx_not_5xx(live: Live, route, body, content_type, encoding) -> None:
    async def run() -> int:
        headers = {**live.headers("POST", route, body), "Content-Type": content_type}
        if encoding:
            headers["Content-Encoding"] = encoding
        async with aiohttp.ClientSession() as fresh:  # a refused body may close the connection
            async with fresh.post(live.running.url + route, data=body, headers=headers) as resp:
                payload = await resp.read()
                # aiohttp answers an encoding it cannot even start to decode (br without
                # brotli) in plain text before any route runs; everything else is our JSON
                if resp.status != 200 and resp.content_type == "application/json":
                    assert orjson.loads(payload)["error"]["code"]
                return resp.status

    status = live.loop.run(run())
    assert status < 500, status
