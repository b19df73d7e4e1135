"""drift up's re-balance step (_up_loops.balance_once) on three real servers in one swarm:
the redundant server moves to the weak blocks through BlockServer.move_to, then stays."""

from __future__ import annotations

import functools

import pytest

from drift.cli._up_loops import balance_once, rebalance_target
from drift.wire.errors import Busy
from tests.node.node_helpers import wait_for
from tests.tiny_models import save_tiny


def spans(node) -> dict[str, tuple[int, int] | None]:
    return {r.peer_id: r.span for r in node.live_records() if r.role == "server"}


@pytest.mark.timeout(120)
async def test_redundant_server_moves_to_weak_blocks(tmp_path, servers):
    model = save_tiny("llama", tmp_path / "llama")  # 4 blocks
    a = await servers(model, 0, 2, throughput=100.0)
    token = (a.node.join_token(),)
    b = await servers(model, 0, 2, throughput=100.0, initial_peers=token)
    await servers(model, 2, 4, throughput=50.0, initial_peers=token)
    await wait_for(lambda: len(spans(a.node)) == 3, 20, "three servers in a's table")

    # blocks 0-1 run at 200, 2-3 at 50: unbalanced for min_ratio 0.9, but not for 0.2
    assert rebalance_target(a.node, a.server, min_ratio=0.2) is None
    assert await balance_once(a.node, a.server, None, min_ratio=0.2) is None
    assert (a.server.backend.start_block, a.server.backend.end_block) == (0, 2)

    moved = await balance_once(a.node, a.server, None, min_ratio=0.9, drain_timeout_s=5)
    assert moved == (2, 4)
    assert (a.server.backend.start_block, a.server.backend.end_block) == (2, 4)
    assert spans(a.node)[a.node.peer_id] == (2, 4)  # re-announced
    await wait_for(lambda: spans(b.node).get(a.node.peer_id) == (2, 4), 20, "gossip")
    # a already sits where the swarm is weakest without it: it stays
    assert await balance_once(a.node, a.server, None, min_ratio=0.9) is None


@pytest.mark.timeout(120)
async def test_a_full_machine_moves_by_unloading_its_old_blocks_first(tmp_path, servers):
    """No room for both spans (a machine drift up filled, nothing free): the balancer frees
    the old span before it loads the new one of the same size, since others serve the old
    blocks."""
    from drift.cli._up_loops import move_shortfall_now
    from drift.models.quant import storage_bytes

    model = save_tiny("llama", tmp_path / "llama")
    a = await servers(model, 0, 2, throughput=100.0)
    token = (a.node.join_token(),)
    b = await servers(model, 0, 2, throughput=100.0, initial_peers=token)
    await servers(model, 2, 4, throughput=50.0, initial_peers=token)
    await wait_for(lambda: len(spans(a.node)) == 3, 20, "three servers in a's table")
    old = a.server.backend
    assert move_shortfall_now(a.server, (2, 4), max_memory=None, free_bytes=0) > 0  # no room
    moved = await balance_once(a.node, a.server, None, min_ratio=0.9, drain_timeout_s=5,
                               free_bytes=0, settle_s=0.2)  # fmt: skip
    assert moved == (2, 4)
    assert old.unloaded is not None and storage_bytes(old.span) == 0  # freed, then loaded
    assert (a.server.backend.start_block, a.server.backend.end_block) == (2, 4)
    await wait_for(lambda: spans(b.node).get(a.node.peer_id) == (2, 4), 20, "gossip")
    mine = next(r for r in b.node.live_records() if r.peer_id == a.node.peer_id)
    assert mine.serves(2) and mine.serves(3)  # not left draining


@pytest.mark.timeout(120)
async def test_a_make_room_move_is_called_off_when_the_old_blocks_lose_their_other_server(
    tmp_path, servers
):
    """Two servers of the same blocks deciding at once: after announcing `draining`, the mover
    looks again (others_serve) and stays when no one else serves its blocks any more."""
    from drift.cli._up_loops import others_serve

    model = save_tiny("llama", tmp_path / "llama")
    a = await servers(model, 0, 2, throughput=100.0)
    token = (a.node.join_token(),)
    b = await servers(model, 0, 2, throughput=100.0, initial_peers=token)
    await servers(model, 2, 4, throughput=50.0, initial_peers=token)
    await wait_for(lambda: len(spans(a.node)) == 3, 20, "three servers in a's table")
    assert await others_serve(a.node, a.server, 0)
    b.node.announce(draining=1)  # b leaves blocks 0-1 too
    await wait_for(lambda: not any(r.serves(0) for r in a.node.live_records()
                                   if r.peer_id == b.node.peer_id), 20, "b draining")  # fmt: skip
    assert not await others_serve(a.node, a.server, 0)
    old = a.server.backend
    confirm = functools.partial(others_serve, a.node, a.server, 0)
    with pytest.raises(Busy, match="no longer served by others"):
        await a.server.move_to(2, 4, make_room=True, drain_timeout_s=0, confirm=confirm)
    assert a.server.backend is old and old.unloaded is None and a.server.moving_to is None
    assert spans(a.node)[a.node.peer_id] == (0, 2)
    mine = next(r for r in a.node.live_records() if r.peer_id == a.node.peer_id)
    assert mine.serves(0)  # not left draining
