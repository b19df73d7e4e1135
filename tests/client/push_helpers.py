"""Helpers shared by the push, speculative and wire-compression client tests: a three-span
chain, a greedy decode that keeps every step's logits, the wait until every server's
table holds the others (a push needs it), and a record of the steps a client sends."""

from __future__ import annotations

import asyncio
import time

import torch

from drift.client.transport import SpanSocket
from tests.client.swarms import Swarm

SPANS = [(0, 1), (1, 3), (3, 4)]
IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]])


async def wait_all_know_each_other(swarm: Swarm, timeout_s: float = 20.0) -> None:
    """Until every server's table holds every other server live (a push needs it)."""
    ids = {s.node.peer_id for s in swarm.servers}
    deadline = time.monotonic() + timeout_s
    while True:
        if all(ids - {s.node.peer_id} <= {r.peer_id for r in s.node.live_records()}
               for s in swarm.servers):  # fmt: skip
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the servers do not all list each other")
        await asyncio.sleep(0.05)


def links(swarm: Swarm) -> list[int]:
    """How many push links each server holds open."""
    return [len(s.server.links._links) for s in swarm.servers]


def decode(model, steps: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tokens and every step's logits, one token per step in one session."""
    logits = []
    with torch.no_grad(), model.inference_session(max_length=32, batch_size=IDS.shape[0]):
        out = model(IDS, use_cache=True)
        ids = IDS
        for _ in range(steps):
            logits.append(out.logits[:, -1])
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            out = model(nxt, cache=out.cache, use_cache=True)
    return ids, torch.stack(logits, 1)


def record_sends(monkeypatch) -> list[tuple[str, bool]]:
    """(server, whether that socket's open was still unanswered) for every step the client
    sends itself, from now on."""
    sent: list[tuple[str, bool]] = []
    send = SpanSocket.send

    async def recorded(self, req):
        sent.append((self.hop.peer_id, self._opening))
        return await send(self, req)

    monkeypatch.setattr(SpanSocket, "send", recorded)
    return sent
