"""`InferenceSession.idle()`: a session kept open for a later turn tells each of its servers
(drift.wire's `idle`), whose batcher then stops waiting for its steps until it steps again.
Against real servers on loopback: both servers hear it; a server that did not announce
`idles` (one that predates it) is sent nothing; the turn after is exact either way."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import torch

from tests.server.reference import load_reference

IDS = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(5))


async def _wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _two_turns(model, local, old_servers: bool = False) -> None:
    """Generate, idle, generate on: the whole equals local transformers' 10 greedy tokens."""
    want = local.generate(IDS, max_new_tokens=10, do_sample=False)
    with torch.no_grad(), model.inference_session(max_length=32) as session:
        first = model.generate(IDS, max_new_tokens=5, do_sample=False)
        if old_servers:
            for span in session.spans:
                span.socket.idles = False
        session.idle()
        time.sleep(0.2)  # the turn's gap
        rest = model.generate(first[:, -1:], max_new_tokens=5, do_sample=False)
    assert torch.equal(torch.cat([first, rest[:, 1:]], dim=1), want)


@pytest.mark.parametrize("old_servers", [False, True], ids=["idles", "older servers"])
async def test_an_idle_session_tells_its_servers(tiny_dirs, swarm_model, old_servers) -> None:
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4)])
    batchers = [running.server.sessions.batcher for running in swarm.servers]
    await asyncio.to_thread(_two_turns, model, local, old_servers)
    if old_servers:
        await asyncio.sleep(0.2)
        assert [b.idle_notices for b in batchers] == [0, 0]
    else:
        await _wait_for(lambda: [b.idle_notices for b in batchers] == [1, 1])
