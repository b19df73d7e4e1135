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


def test_the_servers_event_loop_thread_holds_no_openmp_pool() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, timeout=180, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    busy, idle, again, same = done.stdout.split()[-4:]
    assert same == "True"
    # the reduction's worker exists, is gone after a housekeeping tick, and comes back for
    # the next reduction
    assert int(idle) == int(busy) - 1, (busy, idle, again)
    assert int(again) == int(busy), (busy, idle, again)
