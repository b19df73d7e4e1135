"""torch's OpenMP workers in DRIFT's processes: how long they spin, and whose pools exist.

torch's CPU kernels (its own and MKL's) run on GNU OpenMP (LLVM's or Intel's elsewhere). Two
things about it cost DRIFT's pipelines time; both are measured in docs/performance.md.

Spinning. An idle worker spins 300,000 times (about 7 ms of a core here:
scripts/bench_spin.py) after each burst of compute before it sleeps. A pipeline hands each
token from process to process (client, server, server, ...), so on a machine that several of
them share, every hand-off leaves the next one computing beside a spinning core.
- `bound_spinning`: DRIFT's commands bound the spin to 10,000 (about 0.2 ms): far longer
  than the gaps between the kernels of one step, far shorter than the pause between steps.
  Set before torch loads (libgomp reads it once); a GOMP_SPINCOUNT or OMP_WAIT_POLICY of the
  user's wins.
- `worker_release`: a library imported after torch cannot set that, so the client ends the
  pool of the thread that waits for the servers before each wait.

Pools. Every thread that runs a parallel kernel gets a pool of its own, and GNU OpenMP counts
the workers of every pool in the process: once they outnumber the CPUs, *every* pool's
workers spin only 100 times (its "throttled" count, whatever GOMP_SPINCOUNT says) before
they sleep, so each kernel of a step waits for sleeping workers to be woken. A server
computes on its compute thread, but loading (and any large tensor its event loop copies)
leaves the main thread a pool as well: its compute pool then ran throttled, 15-22% slower
per step here (scripts/bench_omp_pools.py). A client's loop thread decoding a prompt's
replies does the same to the user's own torch work on the main thread. `worker_release`,
called on those threads now and then, ends their pools (OpenMP 5's `omp_pause_resource_all`
ends the calling thread's pool only; its next kernel starts fresh workers, 0.03-0.15 ms).
Where the runtime lacks the call, releasing does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path

SPIN_VAR = "GOMP_SPINCOUNT"
BOUNDED_SPINS = "10000"
USER_VARS = (SPIN_VAR, "OMP_WAIT_POLICY")

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: keep what a restart needs, free the threads
RUNTIMES = ("libgomp", "libomp", "libiomp5")  # GNU (Linux wheels), LLVM (macOS), Intel


def bound_spinning(environ: MutableMapping[str, str], loaded: bool | None = None) -> bool:
    """Set GOMP_SPINCOUNT=10000 in `environ` unless the user chose a spin or wait policy or
    torch is already loaded (`loaded`; default: whether it is in sys.modules, too late then).
    Child processes inherit it. Returns whether it was set."""
    if loaded is None:
        loaded = "torch" in sys.modules
    if loaded or any(name in environ for name in USER_VARS):
        return False
    environ[SPIN_VAR] = BOUNDED_SPINS
    return True


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
