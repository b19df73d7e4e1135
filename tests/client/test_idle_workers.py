"""The client lets its OpenMP workers sleep while it waits for the servers
(drift/openmp.py): the pool of the thread that waits is ended before each wait,
so no core of a machine the servers share spins through their step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from drift.openmp import _loaded_runtime

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="counts threads through /proc")  # fmt: skip

# A process with 2 compute threads: after a parallel reduction its OpenMP pool holds a worker
# thread; it prints the thread counts (1) after the reduction, (2) inside a coroutine run
# through the client's LoopThread, 50 ms into the wait, (3) after the next reduction, and
# whether the sums agree.
_PROBE = """
import asyncio, os, torch
from drift.client.loop import LoopThread
def threads(): return len(os.listdir("/proc/self/task"))
loop = LoopThread()
x = torch.ones(4_000_000)
first = x.sum().item()
busy = threads()
async def later():
    await asyncio.sleep(0.05)
    return threads()
waiting = loop.run(later())
again = x.sum().item()
print(busy, waiting, threads(), first == again == 4_000_000)
loop.close()
"""


def _probe(env_extra: dict[str, str]) -> list[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "2", **env_extra}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_the_waiting_thread_has_no_openmp_worker_during_the_wait() -> None:
    busy, waiting, after, same = _probe({})
    assert same == "True"
    # the reduction's worker exists, is gone while the thread waits, and comes back for the
    # next reduction
    assert int(waiting) == int(busy) - 1, (busy, waiting, after)
    assert int(after) == int(busy), (busy, waiting, after)


def test_the_runtime_is_found_in_the_process_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /opt/venv/torch/lib/libgomp.so.1\n"
        "7f04-7f05 rw-p 00000000 00:00 0 \n"
    )
    assert _loaded_runtime(maps) == "/opt/venv/torch/lib/libgomp.so.1"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n")
    assert _loaded_runtime(maps) is None
    assert _loaded_runtime(tmp_path / "missing") is None


def test_a_runtime_that_cannot_be_opened_leaves_a_no_op(tmp_path: Path) -> None:
    from drift.openmp import _nothing, worker_release

    maps = tmp_path / "maps"
    maps.write_text("7f02-7f03 r-xp 00000000 08:01 2 /nonexistent/lib/libgomp.so.1\n")
    release = worker_release(maps)
    assert release is _nothing
    release()


# A coroutine run through the LoopThread makes a parallel reduction on the loop thread (as
# decoding a prompt's hidden states may): the probe prints the thread counts before, inside
# the coroutine, and 50 ms after it returned, and whether the sum is right.
_LOOP_PROBE = """
import asyncio, os, time, torch
from drift.client.loop import LoopThread
def threads(): return len(os.listdir("/proc/self/task"))
loop = LoopThread()
before = threads()
async def reduce():
    return torch.ones(4_000_000).sum().item(), threads()
total, inside = loop.run(reduce())
time.sleep(0.05)
print(before, inside, threads(), total == 4_000_000)
loop.close()
"""


def test_the_loop_thread_gives_back_its_openmp_pool_after_each_run() -> None:
    """Another thread's pool makes GNU OpenMP throttle every pool, the user's own torch work
    on the main thread included (drift/openmp.py)."""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", _LOOP_PROBE], env=env, capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    before, inside, after, right = done.stdout.split()
    assert right == "True"
    assert int(inside) == int(before) + 1, (before, inside, after)
    assert int(after) == int(before), (before, inside, after)
