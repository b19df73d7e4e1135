"""A server's event loop thread gives back the OpenMP pool that loading or copying a prompt
left it (drift/openmp.py): with a second pool in the process, GNU OpenMP throttles the
compute thread's workers (they sleep between the kernels of a step)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="counts threads through /proc")  # fmt: skip

# A real server in a process with 2 compute threads. A parallel reduction on the event loop
# thread gives that thread a pool (one worker thread); the probe prints the thread counts
# (1) right after it, (2) after 1.5 s of the server's housekeeping, (3) after the next
# reduction, and whether the sums agree.
_PROBE = """
import asyncio, os, sys, tempfile
from pathlib import Path
import torch
from tests.server.harness import start_block_server
from tests.tiny_models import save_tiny

def threads(): return len(os.listdir("/proc/self/task"))

async def main():
    model_dir = save_tiny("llama", Path(tempfile.mkdtemp()) / "tiny")
    running = await start_block_server(model_dir, 0, 2, session_timeout_s=60.0)
    try:
        x = torch.ones(4_000_000)
        first = x.sum().item()
        busy = threads()
        await asyncio.sleep(1.5)
        idle = threads()
        again = x.sum().item()
        print(busy, idle, threads(), first == again == 4_000_000)
    finally:
        await running.stop()

asyncio.run(main())
"""


def _probe(source: str, words: int) -> list[str]:
    """The last `words` words a probe printed, run in a process with 2 compute threads."""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True,
                          text=True, timeout=180, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()[-words:]


def test_the_servers_event_loop_thread_holds_no_openmp_pool() -> None:
    busy, idle, again, same = _probe(_PROBE, 4)
    assert same == "True"
    # the reduction's worker exists, is gone after a housekeeping tick, and comes back for
    # the next reduction
    assert int(idle) == int(busy) - 1, (busy, idle, again)
    assert int(again) == int(busy), (busy, idle, again)


# A long step that the server runs as several units: the step path itself must leave the event
# loop thread no pool (joining the units' outputs was a parallel copy there). The housekeeping
# tick's release is switched off so that it cannot hide one; the probe prints the thread
# counts before and after the step and whether the output is whole.
_STEP_PROBE = """
import asyncio, os, tempfile
from pathlib import Path
import aiohttp, torch
import drift.server.state as state
state.worker_release = lambda: (lambda: None)  # no housekeeping release in this probe
from drift.openmp import worker_release
from tests.server.harness import start_block_server
from tests.server.wsclient import RawSession
from tests.tiny_models import save_tiny

def threads(): return len(os.listdir("/proc/self/task"))

async def main():
    # hidden 256: each unit's output (256 x 256) is past a parallel copy's grain (32,768)
    model_dir = save_tiny("llama", Path(tempfile.mkdtemp()) / "tiny", hidden_size=256)
    running = await start_block_server(model_dir, 0, 2, chunk_tokens=256,
                                       inference_max_length=1024, session_timeout_s=60.0)
    try:
        hidden = running.server.backend.hidden_size
        tokens = 1024  # 4 units of 256
        x = torch.randn(1, tokens, hidden)
        async with aiohttp.ClientSession() as http:
            session = await RawSession.open(http, running.url, running.server.backend.fingerprint,
                                            0, 2, max_length=tokens)
            worker_release()()  # this thread's own pool (randn, loading)
            before = threads()
            out = await session.step(x, 0)
            after = threads()
        print(before, after, tuple(out.shape) == (1, tokens, hidden))
    finally:
        await running.stop()

asyncio.run(main())
"""


def test_a_long_step_gives_the_event_loop_thread_no_openmp_pool() -> None:
    before, after, whole = _probe(_STEP_PROBE, 3)
    assert whole == "True"
    assert int(after) == int(before), (before, after)
