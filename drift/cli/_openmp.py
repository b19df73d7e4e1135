"""How long an idle OpenMP worker of a DRIFT process spins before it sleeps.

torch's CPU kernels (its own and MKL's) run on GNU OpenMP, whose workers spin 300,000 times
(about 7 ms of a core here: scripts/bench_spin.py) after each burst of compute before they
sleep. A pipeline hands each token from process to process (client, server, server, ...), so on
a machine that several of them share, every hand-off leaves the next one computing beside a
spinning core. DRIFT's commands bound the spin to 10,000 (about 0.2 ms): far longer than the
gaps between the kernels of one step, far shorter than the pause between steps. Set before
torch loads (libgomp reads it once); a GOMP_SPINCOUNT or OMP_WAIT_POLICY of the user's wins.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping

SPIN_VAR = "GOMP_SPINCOUNT"
BOUNDED_SPINS = "10000"
USER_VARS = (SPIN_VAR, "OMP_WAIT_POLICY")


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
