"""drift up's re-balance step (_up_loops.balance_once) on three real servers in one swarm:
the redundant server moves to the weak blocks through BlockServer.move_to, then stays."""

from __future__ import annotations

import pytest

from drift.cli._up_loops import balance_once, rebalance_target
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
