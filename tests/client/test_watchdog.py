"""The compute watchdog: a server whose compute thread is stalled with work queued announces
itself degraded (signed record field `degraded_s`), clients route around it, and it clears
once its compute advances again."""

from __future__ import annotations

import asyncio
import threading
import time

import torch

from drift.client import ClientConfig
from tests.server.reference import load_reference


async def _wait(predicate, timeout_s: float = 15.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.1)


async def test_stalled_server_is_announced_degraded_and_routed_around(
    tiny_dirs, swarms, sdk_models
) -> None:
    model_dir = tiny_dirs("llama")
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    ref = load_reference(model_dir).generate(ids, max_new_tokens=6, do_sample=False)
    swarm = await swarms.start(model_dir, [(0, 4), (0, 4)], watchdog_s=0.5)
    stuck, healthy = swarm.servers
    model = await sdk_models.open(model_dir, swarm.token,
                                  client_config=ClientConfig(swarm_refresh_s=0.2))  # fmt: skip
    release = threading.Event()
    stuck.server.backend.executor.submit(release.wait, 60)  # the test hook: compute stalls
    try:

        def degraded_in_healthy_table() -> bool:
            rec = healthy.node.table.get(stuck.node.peer_id)
            return rec is not None and rec.degraded and rec.verify()

        await _wait(degraded_in_healthy_table)  # signed, gossiped
        await asyncio.to_thread(model.client.run, model.client.swarm.refresh(force=True))
        live = {s.peer_id for s in model.client.swarm.servers(model.client.model_fingerprint)}
        assert live == {healthy.node.peer_id}
        out = await asyncio.to_thread(model.generate, ids, max_new_tokens=6, do_sample=False)
        assert torch.equal(out, ref)  # served by the healthy one while the other is wedged
    finally:
        release.set()
    await _wait(lambda: not stuck.node.record.degraded)  # its compute advances: cleared
