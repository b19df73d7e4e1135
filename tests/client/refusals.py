"""A test helper: the first server of a block range asked to open a session refuses it, once;
every open is counted per server (tests/client/test_resilience.py, test_open_with_first_step)."""

from __future__ import annotations

from tests.client.swarms import Swarm


def refuse_first_open(swarm: Swarm, start_block: int,
                      error: Exception) -> tuple[list[str], dict[str, int]]:  # fmt: skip
    """Patch every server's `sessions.open`: the first server starting at `start_block` asked
    raises `error` once. Returns (the refusing peer, once it refused; opens per peer)."""
    refused: list[str] = []
    opened: dict[str, int] = {}
    for s in swarm.servers:
        sessions, peer = s.server.sessions, s.node.peer_id
        open_session = sessions.open

        async def counted(
            *args, _open=open_session, _peer=peer, _start=s.server.backend.start_block, **kwargs
        ):
            if _start == start_block and not refused:
                refused.append(_peer)
                raise error
            opened[_peer] = opened.get(_peer, 0) + 1
            return await _open(*args, **kwargs)

        sessions.open = counted
    return refused, opened
