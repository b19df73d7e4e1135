"""Forks over the raw /inference protocol: `open` with `fork_of` + `fork_tokens` starts every
row of a new session with a one-row session's first tokens (copied by the server: `holds`
in the reply), and computes as if those tokens had been sent; what cannot be forked is an
error naming why, and the source session keeps its cache."""

from __future__ import annotations

import aiohttp
import orjson
import torch

from drift.wire import messages as m

H = 64


async def _open(http, url: str, msg: m.OpenSession) -> tuple[aiohttp.ClientWebSocketResponse, dict]:
    ws = await http.ws_connect(f"{url}/inference")
    await ws.send_str(orjson.dumps(msg.to_wire()).decode())
    return ws, orjson.loads((await ws.receive()).data)


async def _step(ws, step_id: int, position: int, hidden: torch.Tensor, **kw) -> torch.Tensor:
    await ws.send_bytes(m.encode(m.StepRequest(step_id, position, hidden, **kw)))
    msg = await ws.receive()
    assert msg.type == aiohttp.WSMsgType.BINARY, msg.data
    return m.decode(m.StepResponse, msg.data).hidden_states


async def test_a_fork_computes_as_the_tokens_sent_and_bad_forks_are_refused(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2)
    fp = running.server.backend.fingerprint
    span = running.server.backend.span
    gen = torch.Generator().manual_seed(0)
    prefix, more = torch.randn(1, 5, H, generator=gen), torch.randn(1, 2, H, generator=gen)
    rests = torch.randn(3, 2, H, generator=gen)
    async with aiohttp.ClientSession() as http:
        src, opened = await _open(http, running.url, m.OpenSession(fp, 0, 2, 32, 1, "float32"))
        assert "holds" not in opened  # a plain open
        source_id = opened["session_id"]
        await _step(src, 1, 0, torch.cat([prefix, more], 1))
        used = running.server.budget.used

        def fork(tokens: int, start: int = 0, batch: int = 3, of: str = source_id):
            return m.OpenSession(fp, start, 2, 32, batch, "float32", fork_of=of,
                                 fork_tokens=tokens)  # fmt: skip

        for msg, code, words in ((fork(6, of="0123456789abcdef"), "unknown_session", "unknown"),
                                 (fork(8), "bad_request", "holds 7"),
                                 (fork(3, start=1), "bad_request", "covers blocks [0, 2)")):  # fmt: skip
            ws, err = await _open(http, running.url, msg)
            assert err["type"] == "error" and err["code"] == code and words in err["message"]
            await ws.close()
        assert running.server.budget.used == used  # nothing held for a refused fork

        ws, opened = await _open(http, running.url, fork(5))
        assert opened["type"] == "session_opened" and opened["holds"] == 5
        assert running.server.budget.used == used + 3 * 32 * 2
        out = await _step(ws, 1, 5, rests)
        for r in range(3):
            whole = torch.cat([prefix, rests[r : r + 1]], 1)
            torch.testing.assert_close(out[r : r + 1], span.forward(whole)[:, 5:], atol=1e-5,
                                       rtol=0)  # fmt: skip
        # the source kept its 7 tokens
        nxt = torch.randn(1, 1, H, generator=gen)
        got = await _step(src, 2, 7, nxt)
        want = span.forward(torch.cat([prefix, more, nxt], 1))[:, -1:]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        await ws.close()
        await src.close()
