"""Routing's last resorts and its refusals: a span served only by a degraded server is still
served; "no live server covers" says why each known server of those blocks is left out."""

from __future__ import annotations

import asyncio

import pytest
import torch

from drift.client import ClientConfig
from drift.wire.errors import MissingBlocks
from tests.server.reference import load_reference


async def _until_the_client_reads(model, peer_id: str, check) -> None:
    """Re-read the swarm table until `check(record of peer_id)` holds (10 s at most)."""
    for _ in range(100):
        await asyncio.to_thread(model.client.run, model.client.swarm.refresh(force=True))
        record = model.client.swarm.table.get(peer_id)
        if record is not None and check(record):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the client never read the expected record of {peer_id}")


async def test_a_span_served_only_by_a_degraded_server_is_routed_to_it(
    tiny_dirs, swarm_model, monkeypatch
):
    """The watchdog of the only server of blocks 2-3 says its compute stalls: routing prefers
    other servers, but with none left it uses that one (tokens equal local transformers)
    rather than calling the blocks missing."""
    model_dir = tiny_dirs("llama")
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    ref = load_reference(model_dir).generate(ids, max_new_tokens=5, do_sample=False)
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4)])
    upper = swarm.servers[1]
    monkeypatch.setattr(upper.server.runtime.watchdog, "check", lambda now=None: 31.5)
    await _until_the_client_reads(model, upper.node.peer_id, lambda r: r.degraded)
    fp = model.client.model_fingerprint
    assert upper.node.peer_id not in {s.peer_id for s in model.client.swarm.servers(fp)}
    out = await asyncio.to_thread(model.generate, ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(out, ref)


async def test_missing_blocks_say_why_each_known_server_is_left_out(tiny_dirs, swarm_model):
    """Blocks 2-3's only server refused connections twice (banned, not worth waiting for):
    the error names it, its blocks and its ban; once it has stopped, the error says so."""
    model_dir = tiny_dirs("llama")
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    config = ClientConfig(ban_base_s=30.0, ban_max_s=60.0)
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4)], client_config=config)
    await asyncio.to_thread(model, ids)
    upper = swarm.servers[1].node.peer_id
    model.client.bans.ban(upper, unreachable=True)
    model.client.bans.ban(upper, unreachable=True)
    with pytest.raises(MissingBlocks) as banned:
        await asyncio.to_thread(model, ids)
    message = banned.value.message
    assert message.startswith("no live server covers blocks 2-3 of [0, 4)"), message
    assert f"{upper} (blocks 2-3) failed 2 time(s) in a row: not routed to for" in message
    assert swarm.servers[0].node.peer_id not in message  # blocks 0-1 are not missing
    assert banned.value.details["missing"] == [2, 3]
    model.client.bans.success(upper)
    await swarm.stop(swarm.servers[1])
    await _until_the_client_reads(model, upper, lambda r: r.state == "offline")
    with pytest.raises(MissingBlocks, match=rf"{upper} \(blocks 2-3\) has stopped"):
        await asyncio.to_thread(model, ids)


async def test_a_flood_of_records_at_dead_addresses_costs_a_refresh_nothing(
    tiny_dirs, swarm_model, monkeypatch
):
    """Anyone may sign a record: 20 live records of fresh identities at a port where nothing
    listens, whose peer ids sort before every real one. Re-reading the table asks a peer this
    client has heard back from first, so none of them is dialled."""
    import time

    import drift.client.swarm_view as swarm_view
    from drift.identity import Identity
    from drift.swarm import default_fields, sign_record
    from tests.faults.procs import free_port

    model_dir = tiny_dirs("llama")
    swarm, model = await swarm_model(model_dir, [(0, 4)])
    await asyncio.to_thread(model, torch.tensor([[1, 2, 3]]))
    view = model.client.swarm
    first_real = min(r.peer_id for r in view.table.records())
    dead = f"http://127.0.0.1:{free_port()}"
    forged = []
    while len(forged) < 20:
        ident = Identity.generate()
        if ident.peer_id < first_real:
            fields = default_fields(ident.peer_id, [dead], "0.1.0")
            fields.update(seq=1, expires_at=time.time() + 300)
            forged.append(sign_record(ident, fields))
    for record in forged:
        assert view.table.merge(record, time.time())
    dialled: list[str] = []
    real_fetch = swarm_view.fetch_table

    async def counting_fetch(http, url, **kw):
        dialled.append(url)
        return await real_fetch(http, url, **kw)

    monkeypatch.setattr(swarm_view, "fetch_table", counting_fetch)
    await asyncio.to_thread(model.client.run, view.refresh(force=True))
    assert dialled and dead not in dialled, dialled
