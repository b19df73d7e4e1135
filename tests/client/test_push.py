"""Server-to-server push of inference steps (drift.wire.push) on real loopback servers: the
pushed chain gives the relayed chain's logits and tokens (and local transformers'), a server
refuses to push to a peer its swarm table does not hold, and the client relays then."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch

from drift.client import ClientConfig
from drift.client.routing import Hop
from drift.client.transport import SpanSocket
from drift.wire import messages as m
from drift.wire.errors import BadRequest, PushRefused
from drift.wire.push import NextHop
from tests.client.push_helpers import IDS, SPANS, decode, links, wait_all_know_each_other
from tests.server.reference import load_reference


async def test_pushed_chain_equals_relayed_and_local(tiny_dirs, swarms, sdk_models):
    model_dir = tiny_dirs("llama")
    swarm = await swarms.start(model_dir, SPANS)
    await wait_all_know_each_other(swarm)
    pushed = await sdk_models.open(model_dir, swarm.token, client_config=ClientConfig())
    relayed = await sdk_models.open(model_dir, swarm.token,
                                    client_config=ClientConfig(push=False))  # fmt: skip
    ids_r, logits_r = await asyncio.to_thread(decode, relayed)
    assert links(swarm) == [0, 0, 0]  # nothing was pushed
    ids_p, logits_p = await asyncio.to_thread(decode, pushed)
    assert links(swarm) == [1, 1, 0]  # first -> middle -> last
    assert torch.equal(ids_p, ids_r)
    assert (logits_p - logits_r).abs().max() < 1e-6
    local = load_reference(model_dir)
    with torch.no_grad():
        ref = local(ids_p[:, :-1]).logits[:, IDS.shape[1] - 1 :]
    assert (logits_p - ref).abs().max() < 1e-4
    gen = await asyncio.to_thread(pushed.generate, IDS, max_new_tokens=5, do_sample=False)
    assert torch.equal(gen, local.generate(IDS, max_new_tokens=5, do_sample=False))


async def test_server_refuses_to_push_to_a_non_member(tiny_dirs, swarms, sdk_models):
    model_dir = tiny_dirs("llama")
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    first, second = swarm.servers
    hop = Hop(first.node.peer_id, first.url, 0, 2)
    config = ClientConfig()
    async with aiohttp.ClientSession() as http:
        sock = await SpanSocket.open(
            http, hop, m.OpenSession(swarm.fingerprint, 0, 2, 16, 1, "float32"), config
        )
        try:
            width = first.server.backend.hidden_size
            hidden = torch.randn(1, 1, width)
            stranger = NextHop(second.url, "12D3KooWNotAMemberOfThisSwarmAtAll", "ab" * 8, 1)
            req = m.StepRequest(sock.next_step_id(), 0, hidden, next_hops=(stranger,))
            await sock.send(req)
            with pytest.raises(PushRefused, match="12D3KooWNotAMemberOfThisSwarmAtAll"):
                await sock.receive(req.step_id)
            # a member at an address its record does not announce: refused too
            elsewhere = NextHop("http://127.0.0.1:9", second.node.peer_id, "ab" * 8, 2)
            req = m.StepRequest(sock.next_step_id(), 0, hidden, next_hops=(elsewhere,))
            await sock.send(req)
            with pytest.raises(PushRefused, match="announces"):
                await sock.receive(req.step_id)
            # a step whose extras or block states the client must route is not pushed
            later = (NextHop(second.url, second.node.peer_id, "ab" * 8, 3),)
            req = m.StepRequest(sock.next_step_id(), 0, hidden, block_states=True,
                                next_hops=later)  # fmt: skip
            await sock.send(req)
            with pytest.raises(BadRequest, match="cannot be pushed"):
                await sock.receive(req.step_id, states=True)
            # the session still serves a plain step
            reply = await sock.step(hidden, 0)
            assert reply.hidden_states.shape == (1, 1, width)
        finally:
            await sock.close()
    # the servers keep serving: a client pushing through them gets local transformers' tokens
    model = await sdk_models.open(model_dir, swarm.token)
    local = load_reference(model_dir)
    gen = await asyncio.to_thread(model.generate, IDS, max_new_tokens=4, do_sample=False)
    assert torch.equal(gen, local.generate(IDS, max_new_tokens=4, do_sample=False))


async def test_push_in_a_private_swarm(tiny_dirs, swarms, sdk_models):
    """Push links prove the swarm key like every call; a /push without it is refused."""
    key = "push-test-key-0123456789abcdef"
    model_dir = tiny_dirs("llama")
    swarm = await swarms.start(model_dir, SPANS, swarm_key=key)
    await wait_all_know_each_other(swarm)
    model = await sdk_models.open(model_dir, swarm.token, swarm_key=key)
    local = load_reference(model_dir)
    gen = await asyncio.to_thread(model.generate, IDS, max_new_tokens=4, do_sample=False)
    assert torch.equal(gen, local.generate(IDS, max_new_tokens=4, do_sample=False))
    assert links(swarm) == [1, 1, 0]
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(f"{swarm.servers[1].url}/push")
    assert info.value.status == 401
