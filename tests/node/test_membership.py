"""Real nodes on loopback: join through a seed, convergence, leave, expiry, seed loss."""

from __future__ import annotations

import base64
import dataclasses

import aiohttp
import pytest

from drift.identity import Identity, JoinToken, load_or_create_identity
from drift.swarm import canonical_bytes
from drift.wire.errors import Forbidden, PeerUnavailable
from tests.node.node_helpers import Nodes, live_ids, wait_for


async def test_six_nodes_converge_seed_loss_leave_and_expiry(nodes: Nodes) -> None:
    seed, _ = await nodes.start()
    members = [await nodes.start(seed.join_token()) for _ in range(5)]
    everyone = [seed] + [n for n, _ in members]
    ids = {n.peer_id for n in everyone}
    await wait_for(lambda: all(live_ids(n) == ids for n in everyone), 10, "6 nodes to converge")

    # the seed dies hard (no offline record); a 7th node joins through another node
    await nodes.kill(seed)
    seventh, _ = await nodes.start(members[2][0].join_token())
    rest = [n for n, _ in members] + [seventh]
    want = {n.peer_id for n in rest}
    await wait_for(lambda: all(want <= live_ids(n) for n in rest), 10, "7th node to be seen")
    # the killed seed sent no offline record: it disappears once its record expires
    await wait_for(lambda: all(seed.peer_id not in live_ids(n) for n in rest), 5, "seed expiry")

    # a graceful leave publishes a signed offline record to everyone (an expired record
    # would still read "online", or be forgotten)
    leaver = members[0][0]
    await nodes.stop(leaver)
    await wait_for(
        lambda: all(leaver.peer_id not in live_ids(n) for n in rest[1:]), 5, "offline record"
    )
    held = [n.table.get(leaver.peer_id) for n in rest[1:]]
    assert all(r is not None and r.state == "offline" for r in held), held


async def test_silent_peer_expires(nodes: Nodes) -> None:
    a, _ = await nodes.start()
    b, _ = await nodes.start(a.join_token())
    await wait_for(lambda: b.peer_id in live_ids(a), 5, "b to join")
    await nodes.kill(b)
    assert b.peer_id in live_ids(a)
    await wait_for(lambda: b.peer_id not in live_ids(a), 6, "b to expire")
    gone = a.table.get(b.peer_id)
    assert gone is None or gone.state == "online"  # it expired; no offline record came


async def test_join_checks_the_seed_holds_the_peer_id(nodes: Nodes) -> None:
    seed, _ = await nodes.start()
    impostor_token = JoinToken(Identity.generate().peer_id, "127.0.0.1", seed.port or 0, tls=False)
    joiner, _ = await nodes.start()
    with pytest.raises(Forbidden, match="is not peer"):
        await joiner.join(impostor_token)
    assert seed.peer_id not in live_ids(joiner)
    with pytest.raises(PeerUnavailable):
        await joiner.join(JoinToken(seed.peer_id, "127.0.0.1", 1, tls=False))
    await joiner.join(seed.join_token())
    assert seed.peer_id in live_ids(joiner)


async def test_restart_with_same_identity_keeps_peer_id_and_token(nodes: Nodes, tmp_path) -> None:
    path = tmp_path / "id.key"
    first, run1 = await nodes.start(identity=load_or_create_identity(path))
    token1 = first.join_token()
    await nodes.stop(first)
    again, _ = await nodes.start(identity=load_or_create_identity(path), port=0)
    assert again.peer_id == first.peer_id
    assert again.join_token().peer_id == token1.peer_id
    # seq keeps rising across restarts, so the new record beats the old offline one
    assert again.record is not None and first.record is not None
    assert again.record.seq > first.record.seq


async def test_forged_gossip_never_reaches_any_table(nodes: Nodes) -> None:
    a, _ = await nodes.start()
    b, _ = await nodes.start(a.join_token())
    await wait_for(lambda: b.peer_id in live_ids(a), 5, "b to join")
    first = a.table.get(b.peer_id)
    assert first is not None
    await wait_for(lambda: a.table.get(b.peer_id).seq > first.seq, 5, "b to re-sign")  # type: ignore[union-attr]
    real = a.table.get(b.peer_id)
    assert real is not None
    # altered field under the genuine signature
    altered = dataclasses.replace(real, seq=real.seq + 10**9, throughput=1e9).to_wire()
    # signed by another key while claiming b's peer id
    attacker = Identity.generate()
    fields = altered | {"throughput": 5e8}
    fields.pop("signature")
    wrong_key = fields | {
        "signature": base64.b64encode(attacker.sign(canonical_bytes(fields))).decode()
    }
    # b's own, genuinely signed, older record replayed
    replayed = first.to_wire()
    url = f"http://127.0.0.1:{a.port}/swarm/gossip"
    async with aiohttp.ClientSession() as http:
        for bad in (altered, wrong_key, replayed):
            async with http.post(url, json={"records": [bad]}) as resp:
                assert resp.status == 200
    assert a.table.rejected["bad_signature"] == 2 and a.table.rejected["stale"] >= 1
    await wait_for(lambda: b.rounds >= 3, 5, "more gossip rounds")
    for node in (a, b):
        assert all(r.throughput < 1e8 and r.verify() for r in node.all_records())
