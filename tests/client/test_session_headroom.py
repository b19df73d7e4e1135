"""A session opened with headroom (`open_session(headroom=)`) and a way to make room
(`make_room=`), as `drift api` opens its sessions: with its first step, not waiting for the
opens. Real servers on loopback. Past a server's length limit the session opens without its
headroom; where no server has room, `make_room` is awaited first (the caller's idle sessions
closed) and then the headroom given up; tokens equal local transformers throughout."""

from __future__ import annotations

import asyncio

import pytest
import torch

from drift.wire.errors import CacheFull, LengthExceeded
from tests.client.push_helpers import record_sends
from tests.server.reference import load_reference

IDS = torch.tensor([[3, 1, 4, 1, 5]])
NEW = 4  # tokens generated: a session needs 9 tokens
SPANS = [(0, 2), (2, 4)]


def _generate(model, session):
    return model.generate(IDS, max_new_tokens=NEW, do_sample=False, session=session)


async def test_headroom_past_a_servers_limit_is_given_up(tiny_dirs, swarms, sdk_models,
                                                         monkeypatch):  # fmt: skip
    model_dir = tiny_dirs("llama")
    ref = load_reference(model_dir).generate(IDS, max_new_tokens=NEW, do_sample=False)
    swarm = await swarms.start(model_dir, SPANS, inference_max_length=32)
    model = await sdk_models.open(model_dir, swarm.token)
    sent = record_sends(monkeypatch)

    fits = model.open_session(max_length=12 + 20, headroom=20)  # 32: the limit, kept
    assert torch.equal(await asyncio.to_thread(_generate, model, fits), ref)
    assert (fits.max_length, fits.headroom) == (32, 0)
    assert sent[0][1]  # its first step went before the opens were answered
    await asyncio.to_thread(fits.close)  # off this loop: the servers answer the close on it

    sent.clear()
    past = model.open_session(max_length=12 + 40, headroom=40)  # 52: past the limit
    assert torch.equal(await asyncio.to_thread(_generate, model, past), ref)
    assert (past.max_length, past.headroom) == (12, 0)  # opened without the headroom
    assert sent[0][1] and not sent[-1][1]  # sent with the opens, refused, sent again
    assert not model.client.bans.banned()  # a length refused is no fault of the server's
    await asyncio.to_thread(past.close)  # off this loop: the servers answer the close on it

    without = model.open_session(max_length=52)  # no headroom to give up: the refusal rises
    with pytest.raises(LengthExceeded):
        await asyncio.to_thread(_generate, model, without)
    await asyncio.to_thread(without.close)  # off this loop: the servers answer the close on it


async def test_make_room_is_asked_before_the_headroom_goes(tiny_dirs, swarms, sdk_models):
    """Each server holds 160 tokens per block; beyond its first session a client holds at
    most half of that (client_cache_share): sessions of 50 + 50 tokens do not fit, 50 + 10
    do."""
    model_dir = tiny_dirs("llama")
    ref = load_reference(model_dir).generate(IDS, max_new_tokens=NEW, do_sample=False)
    swarm = await swarms.start(model_dir, SPANS, attn_cache_tokens=160)
    model = await sdk_models.open(model_dir, swarm.token)
    held = model.open_session(max_length=50)
    await asyncio.to_thread(_generate, model, held)  # opened, holding its 50 tokens
    asked: list[str] = []

    async def close_held() -> bool:
        asked.append("close_held")
        if held.closed:
            return False
        await held.aclose()
        return True

    second = model.open_session(max_length=50, make_room=close_held)
    assert torch.equal(await asyncio.to_thread(_generate, model, second), ref)
    assert asked == ["close_held"] and held.closed and second.max_length == 50

    async def nothing() -> bool:
        asked.append("nothing")
        return False

    asked.clear()
    third = model.open_session(max_length=10 + 40, headroom=40, make_room=nothing)
    assert torch.equal(await asyncio.to_thread(_generate, model, third), ref)
    assert asked == ["nothing"] and third.max_length == 10  # room made first, then headroom
    assert not model.client.bans.banned()
    await asyncio.to_thread(third.close)  # off this loop: the servers answer the close on it

    asked.clear()
    fourth = model.open_session(max_length=50, make_room=nothing)  # no headroom, no room
    with pytest.raises(CacheFull):
        await asyncio.to_thread(_generate, model, fourth)
    assert asked == ["nothing"]
    await asyncio.to_thread(fourth.close)  # off this loop: the servers answer the close on it
    await asyncio.to_thread(second.close)  # off this loop: the servers answer the close on it
