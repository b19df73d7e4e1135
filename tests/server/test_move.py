"""BlockServer.move_to on a real server: live sessions finish on the old span, new opens get
a retryable `busy` meanwhile, then /blocks, the record and /forward show the new span."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch

from drift.wire import messages as m
from drift.wire.errors import BadRequest, Busy
from drift.wire.frames import MEDIA_TYPE
from tests.node.node_helpers import wait_for
from tests.server.reference import head_logits, load_reference
from tests.server.wsclient import RawSession


async def forward(http, url, fp, start, end, hidden):
    async with http.post(f"{url}/forward", data=m.encode(m.ForwardRequest(fp, start, end, hidden)),
                         headers={"Content-Type": MEDIA_TYPE}) as resp:  # fmt: skip
        data = await resp.read()
        if resp.status != 200:
            return resp.status, data
        return resp.status, m.decode(m.ForwardResponse, data).hidden_states


async def own_record(http, running):
    async with http.get(f"{running.url}/swarm") as resp:
        payload = await resp.json()
    return next(r for r in payload["records"] if r["peer_id"] == running.node.peer_id)


@pytest.mark.timeout(120)
async def test_move_drains_live_session_then_serves_new_span(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2, decode_threads=1)
    server, url = running.server, running.url
    fp = server.backend.fingerprint
    ref = load_reference(tiny_llama)
    ids = torch.randint(0, 256, (1, 5))
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
    h0, h2 = out.hidden_states[0], out.hidden_states[2]  # embeddings; after blocks 0-1

    async with aiohttp.ClientSession() as http:
        old = await RawSession.open(http, url, fp, 0, 2, max_length=16)
        assert isinstance(old, RawSession), old
        first = await old.step(h0[:, :3], 0)
        assert torch.allclose(first, h2[:, :3], atol=1e-5, rtol=1e-4)

        move = asyncio.create_task(server.move_to(2, 4, drain_timeout_s=60))
        await wait_for(lambda: server.sessions.refusing is not None or move.done(), 60, "load")
        assert not move.done()  # the live session holds the old span
        for start, end in ((0, 2), (2, 4)):  # new sessions: refused, retryably
            refused = await RawSession.open(http, url, fp, start, end, max_length=16)
            assert isinstance(refused, dict) and refused["code"] == "busy", refused
            assert "moving to blocks [2, 4)" in refused["message"]
        async with http.get(f"{url}/blocks") as resp:
            assert (await resp.json())["start_block"] == 0
        # the live session keeps working on the old span, from its cache
        rest = await old.step(h0[:, 3:], 3)
        assert torch.allclose(rest, h2[:, 3:], atol=1e-5, rtol=1e-4)
        assert not move.done()
        await old.close()
        await asyncio.wait_for(move, 30)  # drained: the swap happens

        async with http.get(f"{url}/blocks") as resp:
            info = await resp.json()
        assert (info["start_block"], info["end_block"], info["active_sessions"]) == (2, 4, 0)
        assert server.backend.decode_threads == 1 == info["decode"]["threads"]  # kept
        assert info["cache_block_tokens_total"] == 2 * server.config.attn_cache_tokens
        record = await own_record(http, running)
        assert (record["start_block"], record["end_block"], record["state"]) == (2, 4, "online")

        status, hidden = await forward(http, url, fp, 2, 4, h2)
        assert status == 200
        with torch.no_grad():
            assert torch.allclose(head_logits(ref, hidden), out.logits, atol=1e-5, rtol=1e-4)
        status, body = await forward(http, url, fp, 0, 2, h0)
        assert status == 400 and b"span_not_served" in body
        new = await RawSession.open(http, url, fp, 2, 4, max_length=16)
        assert isinstance(new, RawSession), new
        got = await new.step(h2, 0)
        with torch.no_grad():
            assert torch.allclose(head_logits(ref, got), out.logits, atol=1e-5, rtol=1e-4)
        await new.close()


@pytest.mark.timeout(120)
async def test_drain_timeout_closes_sessions_and_bad_moves_are_refused(servers, tiny_llama):
    running = await servers(tiny_llama, 1, 3)
    server, url = running.server, running.url
    fp = server.backend.fingerprint
    with pytest.raises(BadRequest, match="model has 4 blocks"):
        await server.move_to(3, 9)
    with pytest.raises(BadRequest):
        await server.move_to(2, 2)
    hidden = torch.randn(1, 2, server.backend.hidden_size)
    async with aiohttp.ClientSession() as http:
        stuck = await RawSession.open(http, url, fp, 1, 3, max_length=8)
        assert isinstance(stuck, RawSession), stuck
        await stuck.step(hidden, 0)
        move = asyncio.create_task(server.move_to(0, 2, drain_timeout_s=0.3))
        await wait_for(lambda: server.moving_to is not None, 10, "move to start")
        with pytest.raises(Busy, match="already moving"):
            await server.move_to(2, 4)
        await asyncio.wait_for(move, 60)  # the idle session did not hold it past the timeout
        assert (server.backend.start_block, server.backend.end_block) == (0, 2)
        assert server.moving_to is None and server.sessions.refusing is None
        err = await stuck.step_error(hidden, 2)  # its cache went with the old span
        assert err["code"] == "unknown_session"
        await stuck.close()
        status, _ = await forward(http, url, fp, 0, 2, hidden)
        assert status == 200


@pytest.mark.timeout(120)
async def test_a_move_that_makes_room_frees_the_old_span_before_loading(servers, tiny_llama):
    """make_room (a machine with room for one span): the live session is let finish by the
    drain timeout, the old span's weights are freed (compute on it is refused retryably),
    then the new span loads and computes as transformers does; the record is `draining`
    while it holds nothing and not after."""
    from drift.models.quant import storage_bytes

    running = await servers(tiny_llama, 0, 2)
    server, url = running.server, running.url
    fp = server.backend.fingerprint
    ref = load_reference(tiny_llama)
    ids = torch.randint(0, 256, (1, 5))
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
    h0, h2 = out.hidden_states[0], out.hidden_states[2]
    old = server.backend
    assert storage_bytes(old.span) > 0
    draining: list[object] = []
    announce = server.announce
    assert announce is not None

    def watch(**fields):  # other announcements (the sessions' load) may come between
        if "draining" in fields:
            draining.append(fields["draining"])
        announce(**fields)

    server.announce = watch
    async with aiohttp.ClientSession() as http:
        live = await RawSession.open(http, url, fp, 0, 2, max_length=16)
        assert isinstance(live, RawSession), live
        await live.step(h0[:, :3], 0)
        await server.move_to(2, 4, drain_timeout_s=0.3, make_room=True)
        assert draining == [1, 0]
        assert storage_bytes(old.span) == 0 and old.unloaded is not None
        with pytest.raises(Busy, match="loading blocks \\[2, 4\\)"):
            await old.run(lambda: None)  # a request that still held the old runtime
        err = await live.step_error(h0[:, 3:], 3)  # closed when the drain timed out
        assert err["code"] == "unknown_session"
        await live.close()

        assert (server.backend.start_block, server.backend.end_block) == (2, 4)
        record = await own_record(http, running)
        assert (record["start_block"], record["end_block"]) == (2, 4)
        assert not record.get("draining")
        status, hidden = await forward(http, url, fp, 2, 4, h2)
        assert status == 200
        with torch.no_grad():
            assert torch.allclose(head_logits(ref, hidden), out.logits, atol=1e-5, rtol=1e-4)


@pytest.mark.timeout(120)
async def test_a_make_room_move_whose_load_fails_loads_the_old_blocks_back(
    servers, tiny_llama, monkeypatch
):
    from drift.server import move

    running = await servers(tiny_llama, 0, 2)
    server, url = running.server, running.url
    fp = server.backend.fingerprint
    real_load = move._load

    def load(config, old, ckpt, start, end):
        if (start, end) == (2, 4):
            raise OSError("disk on fire")
        return real_load(config, old, ckpt, start, end)

    monkeypatch.setattr(move, "_load", load)
    with pytest.raises(OSError, match="disk on fire"):
        await server.move_to(2, 4, drain_timeout_s=0, make_room=True)
    assert (server.backend.start_block, server.backend.end_block) == (0, 2)
    assert server.moving_to is None and server.backend.unloaded is None
    ref = load_reference(tiny_llama)
    ids = torch.randint(0, 256, (1, 4))
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
    async with aiohttp.ClientSession() as http:
        status, hidden = await forward(http, url, fp, 0, 2, out.hidden_states[0])
        assert status == 200
        assert torch.allclose(hidden, out.hidden_states[2], atol=1e-5, rtol=1e-4)
        record = await own_record(http, running)
        assert not record.get("draining") and record["start_block"] == 0
