"""A session's first step goes out right behind its opens (client-chosen session ids and
push tokens, drift.wire's OpenSession.session_id), not after their answers: one round trip
less before the first token. Real servers on loopback: the first span's first step is sent
while its open is unanswered, a later session's first step is pushed along the whole chain
(naming sessions whose opens the client has not heard back from), tokens equal local
transformers; a server that refuses the open for want of room is left out of the route, not
banned, and the step is sent again on a chain opened the long way."""

from __future__ import annotations

import asyncio

import torch

from drift.client import ClientConfig
from drift.wire.errors import CacheFull
from tests.client.push_helpers import SPANS, record_sends, wait_all_know_each_other
from tests.client.refusals import refuse_first_open
from tests.server.reference import load_reference

IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])


async def test_the_first_step_follows_the_opens_at_once(tiny_dirs, swarms, sdk_models,
                                                        monkeypatch):  # fmt: skip
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm = await swarms.start(model_dir, SPANS)
    await wait_all_know_each_other(swarm)
    model = await sdk_models.open(model_dir, swarm.token, client_config=ClientConfig())
    first = next(s.node.peer_id for s in swarm.servers if s.server.backend.start_block == 0)
    sent = record_sends(monkeypatch)
    ref = local.generate(IDS, max_new_tokens=4, do_sample=False)
    out = await asyncio.to_thread(model.generate, IDS, max_new_tokens=4, do_sample=False)
    assert torch.equal(out, ref)
    assert sent[0] == (first, True)  # sent before the first server answered its open
    # the links between servers are up now: a new session's prompt is pushed along the
    # whole chain, under the session ids the client chose, before any open is answered
    sent.clear()
    out = await asyncio.to_thread(model.generate, IDS, max_new_tokens=1, do_sample=False)
    assert torch.equal(out, ref[:, : IDS.shape[1] + 1])
    assert sent == [(first, True)]  # one send: the servers pushed it on


async def test_a_server_without_room_is_left_out_not_banned(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4), (2, 4)])
    full, opened = refuse_first_open(swarm, 2, CacheFull("no room for this test"))
    bans: list[str] = []
    ban = model.client.bans.ban
    model.client.bans.ban = lambda peer, **kw: bans.append(peer) or ban(peer, **kw)
    ref = local.generate(IDS, max_new_tokens=4, do_sample=False)
    out = await asyncio.to_thread(model.generate, IDS, max_new_tokens=4, do_sample=False)
    assert torch.equal(out, ref)
    (no_room,) = full
    assert no_room not in opened and not bans  # routed around, not banned
    first = next(s.node.peer_id for s in swarm.servers if s.server.backend.start_block == 0)
    assert opened[first] == 2  # the chain opened without waiting, then the long way
