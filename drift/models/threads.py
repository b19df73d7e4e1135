"""torch's intra-op thread count for a pipeline's steps: set for a while, and chosen by timing.

A pipeline step (a server's decode step, a client's head) is a burst of small products
after a pause. torch runs it on a team of OpenMP threads, and every product ends at a
barrier where the team waits for its slowest thread. That pays only while the team's
threads run at once, and after a pause that is the kernel scheduler's choice: some wake a
thread beside the one that woke it (Firecracker guests pack woken threads onto one vCPU,
/proc/sys/kernel/sched_vcpu_pack), and the team then takes turns on one core in 4 ms
slices while another core idles (drift.server.decode_threads has the numbers). `choose`
times a step both ways; `threads` sets the count for a while.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import torch

ROUNDS = 6  # timed steps per thread count (interleaved); the median counts
PAUSE_S = 0.02  # before each timed step: longer than OpenMP's spin, as between pipeline steps
MARGIN = 0.9  # torch's count is kept only where it is at least 10% faster than one thread


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[None]:
    """The calling thread's torch intra-op threads set to `n` inside (None, or the count it
    has: left as they are), then its count before. The count is the thread's own (OpenMP's,
    per thread); torch also keeps the last count set as the one new threads start with, and
    MKL's is the process's, so another thread's products may run on this count meanwhile:
    slower or faster, never different."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def choose(step: Callable[[], None], default: int, *, rounds: int = ROUNDS,
           pause_s: float = PAUSE_S,
           pause: Callable[[float], None] = time.sleep) -> tuple[int, dict[int, float]]:  # fmt: skip
    """`default` threads or one for `step`, each timed `rounds` times after `pause(pause_s)`,
    interleaved; and the median seconds of each. A team must earn its place: `default` is
    kept only where MARGIN faster, since one thread is never slowed by where the scheduler
    puts its other threads, nor slows the processes beside it."""
    if default <= 1:
        return default, {}
    times: dict[int, list[float]] = {default: [], 1: []}
    with threads(default):
        step()  # warm: the team exists
    for _ in range(rounds):
        for n, seen in times.items():
            with threads(n):
                pause(pause_s)
                started = time.perf_counter()
                step()
                seen.append(time.perf_counter() - started)
    medians = {n: statistics.median(seen) for n, seen in times.items()}
    return (default if medians[default] < MARGIN * medians[1] else 1), medians
