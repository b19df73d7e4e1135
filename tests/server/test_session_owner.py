"""A server `Session` owns its socket, step lock and last step id: closing it (a `close`
message, the reaper, the socket going) is one call that leaves nothing behind: no session,
no cache room, no socket a pushed step could still reach."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import torch

from drift.server.push import PUSH_PATH
from drift.wire import codec
from drift.wire.messages import CloseSession
from drift.wire.step import StepRequest
from tests.server.wsclient import RawSession


async def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_reap_and_close_leave_nothing_behind(servers, tiny_llama):
    a = await servers(tiny_llama, 0, 2, inference_max_length=16)
    server, fp = a.server, a.server.backend.fingerprint
    width = server.backend.hidden_size
    async with aiohttp.ClientSession() as http:
        raw = await RawSession.open(http, a.url, fp, 0, 2, max_length=8)
        await raw.step(torch.randn(1, 2, width), 0)
        ((sid, session),) = server.sessions.sessions.items()
        assert session.socket is not None and session.last_step == 1
        assert server.budget.used > 0
        server.sessions.reap(now=session.last_used + server.sessions.timeout_s + 1)
        assert not server.sessions.sessions and server.budget.used == 0
        assert session.socket is None  # the reaped session no longer holds its socket
        # a step pushed to it now, with its own push token, is refused on the link: no
        # registry still maps it to a socket (a closed session: the one push refusal)
        link = await http.ws_connect(f"{a.url}{PUSH_PATH}")
        pushed = StepRequest(5, 2, torch.randn(1, 1, width), session_id=sid,
                             push_token=session.push_token)  # fmt: skip
        await link.send_bytes(codec.encode(pushed))
        err = orjson.loads((await link.receive(timeout=10)).data)
        assert err["type"] == "error" and err["code"] == "push_forbidden", err
        await link.close()
        # the client's own next step hears that its session is gone
        err = await raw.step_error(torch.randn(1, 1, width), 2)
        assert err["code"] == "unknown_session"
        await raw.close()
        await _wait_for(lambda: not server.sockets)

        # a `close` message: one call frees it all
        raw = await RawSession.open(http, a.url, fp, 0, 2, max_length=8)
        await raw.step(torch.randn(1, 1, width), 0)
        ((_, session),) = server.sessions.sessions.items()
        await raw.ws.send_str(codec.encode_text(CloseSession()))
        assert orjson.loads((await raw.ws.receive()).data)["type"] == "session_closed"
        assert not server.sessions.sessions and server.budget.used == 0 and session.socket is None
        # the socket going: the same
        raw2 = await RawSession.open(http, a.url, fp, 0, 2, max_length=8)
        await raw.close()
        await raw2.step(torch.randn(1, 1, width), 0)
        await raw2.close()
        await _wait_for(lambda: not server.sessions.sessions and not server.sockets)
        assert server.budget.used == 0
