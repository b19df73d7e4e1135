"""Staying up: measured step latency steers routes; losing the first (seed) peer costs nothing."""

from __future__ import annotations

import asyncio

import torch

from drift.client import ClientConfig
from tests.client.refusals import refuse_first_open
from tests.server.reference import load_reference


async def test_session_steps_feed_latency_and_steer_routes(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    ids = torch.tensor([[9, 8, 7, 6]])
    swarm, model = await swarm_model(model_dir, [(0, 4), (0, 4)])
    lat = model.client.swarm.latency
    before = dict(lat.samples)
    first = await asyncio.to_thread(model.generate, ids, max_new_tokens=5, do_sample=False)
    stepped = {p: n - before.get(p, 0) for p, n in lat.samples.items()}
    used = [p for p, n in stepped.items() if n >= 5]  # prefill + 4 decode steps
    assert len(used) == 1, stepped
    other = next(s.node.peer_id for s in swarm.servers if s.node.peer_id != used[0])
    for _ in range(10):  # the used peer turns slow
        model.client.swarm.note_rtt(used[0], 5.0)
    before = dict(lat.samples)
    second = await asyncio.to_thread(model.generate, ids, max_new_tokens=5, do_sample=False)
    assert lat.samples.get(other, 0) - before.get(other, 0) >= 5
    assert lat.samples[used[0]] == before[used[0]]
    assert torch.equal(first, second)


async def test_client_survives_losing_its_initial_peer(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    ids = torch.tensor([[2, 7, 1, 8, 2, 8]])
    ref = local.generate(ids, max_new_tokens=8, do_sample=False)
    config = ClientConfig(swarm_refresh_s=0.2)
    swarm, model = await swarm_model(model_dir, [(0, 2), (0, 2), (2, 4)], client_config=config)
    out = await asyncio.to_thread(model.generate, ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(out, ref)
    seed_id = swarm.seed.node.peer_id
    await swarm.stop(swarm.seed)  # the only peer the client was given
    await asyncio.sleep(0.5)  # past swarm_refresh_s: the next route re-reads the table
    out = await asyncio.to_thread(model.generate, ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(out, ref)
    # the table now comes from the remaining servers, and the seed is not routed to
    await asyncio.to_thread(model.client.run, model.client.swarm.refresh(force=True))
    live = {s.peer_id for s in model.client.swarm.servers(model.client.model_fingerprint)}
    assert seed_id not in live and len(live) == 2


async def test_peers_banned_a_moment_ago_are_waited_for_not_missing(tiny_dirs, swarm_model):
    """Every server of a span just failed (a needless timeout under load, say), once or
    again and again: while their records are live, routing waits for the shortest way back
    rather than calling the blocks missing; once they are gone from the table, they are."""
    model_dir = tiny_dirs("llama")
    ids = torch.tensor([[9, 8, 7, 6]])
    config = ClientConfig(ban_base_s=0.3, ban_max_s=1.0)
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4), (2, 4)], client_config=config)
    ref = await asyncio.to_thread(model.generate, ids, max_new_tokens=4, do_sample=False)
    upper = [s.node.peer_id for s in swarm.servers[1:]]
    for peer in upper:
        model.client.bans.ban(peer)
    assert model.client.swarm.ban_wait(model.client.model_fingerprint, 2, 4) > 0
    assert model.client.swarm.ban_wait(model.client.model_fingerprint, 0, 2) == 0.0
    out = await asyncio.to_thread(model.generate, ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(out, ref)
    for peer in upper:  # failing again and again with a live record: slow, waited for
        model.client.bans.success(peer)  # (the run above forgot the one it used)
        model.client.bans.ban(peer)
        model.client.bans.ban(peer)  # banned 0.6 s
    model.client.bans.ban(upper[0])  # 1 s: the shortest way back is the other one's ban
    wait = model.client.swarm.ban_wait(model.client.model_fingerprint, 2, 4)
    assert wait is not None and 0 < wait < model.client.bans.remaining(upper[0])  # 0.6 vs 1 s
    out = await asyncio.to_thread(model.generate, ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(out, ref)
    for peer in upper:  # refusing connections again and again: gone, live record or not
        model.client.bans.ban(peer, unreachable=True)
    assert model.client.swarm.ban_wait(model.client.model_fingerprint, 2, 4) is None
    await swarm.stop(swarm.servers[2])
    await swarm.stop(swarm.servers[1])
    await asyncio.to_thread(model.client.run, model.client.swarm.refresh(force=True))
    assert model.client.swarm.ban_wait(model.client.model_fingerprint, 2, 4) is None


async def test_a_chain_whose_open_fails_on_one_hop_closes_the_others_and_routes_around(
    tiny_dirs, swarm_model
):
    """A chain's sockets open at once; when one server refuses (here: busy), the sockets
    that did open are closed again, that server is left for this try, and the next route
    opens on a replica: identical tokens, and no session left behind anywhere."""
    from drift.wire.errors import Busy

    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    ids = torch.tensor([[2, 7, 1, 8, 2, 8]])
    ref = local.generate(ids, max_new_tokens=6, do_sample=False)
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4), (2, 4)])
    refused, opened = refuse_first_open(swarm, 2, Busy("busy for this test"))
    out = await asyncio.to_thread(model.generate, ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, ref)
    (busy,) = refused
    first = next(s.node.peer_id for s in swarm.servers if s.server.backend.start_block == 0)
    assert opened[first] == 2  # opened with the refusing server, closed, opened again
    assert busy not in opened  # the route went around it
    for _ in range(100):  # every socket closed, each server's session freed
        if all(len(s.server.sessions.sessions) == 0 for s in swarm.servers):
            break
        await asyncio.sleep(0.05)
    assert [len(s.server.sessions.sessions) for s in swarm.servers] == [0, 0, 0]
