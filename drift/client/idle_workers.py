"""Put the calling thread's idle OpenMP workers to sleep before it blocks on the network.

The client computes a little per token (embeddings, final norm, lm_head), then waits tens of
milliseconds for the servers. torch's OpenMP workers spin after each burst of compute (GNU
OpenMP: 300,000 times, about 6 ms of a core here) unless GOMP_SPINCOUNT was set before torch
loaded, which a library imported after torch cannot do. Where the servers share the machine
(the demo, tests, a workstation serving and chatting), that spinning core is taken from the
first server's step. OpenMP 5's `omp_pause_resource_all` ends the calling thread's pool at
once (while the loop thread sends, off the token's path); its next parallel region starts
fresh workers: 0.03-0.15 ms per token here at 2-8 threads, the price on a machine of its own.
Where the runtime lacks the call, releasing does nothing. Measured: docs/performance.md.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: keep what a restart needs, free the threads
RUNTIMES = ("libgomp", "libomp", "libiomp5")  # GNU (Linux wheels), LLVM (macOS), Intel


def _loaded_runtime(maps: Path = Path("/proc/self/maps")) -> str | None:
    """The path of the OpenMP runtime mapped into this process, if /proc tells."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        if len(fields) == 6 and os.path.basename(fields[5]).startswith(RUNTIMES):
            return fields[5]
    return None


def worker_release(maps: Path = Path("/proc/self/maps")) -> Callable[[], None]:
    """A function that ends the calling thread's idle OpenMP workers (soft pause), found in
    the OpenMP runtime torch loaded; a no-op where there is none or it lacks the call.
    Calling it inside a parallel region does nothing (the runtime refuses)."""
    path = _loaded_runtime(maps)
    try:
        lib = ctypes.CDLL(path) if path else ctypes.CDLL(None)
        pause = lib.omp_pause_resource_all
    except (OSError, AttributeError, TypeError):  # TypeError: CDLL(None) on Windows
        return _nothing
    pause.argtypes = [ctypes.c_int]
    pause.restype = ctypes.c_int

    def release() -> None:
        pause(OMP_PAUSE_SOFT)

    return release


def _nothing() -> None:
    return None
