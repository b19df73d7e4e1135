"""Which identity a node command runs as, locked for the life of the process.

`--identity_path` is taken (created on first start) and locked, or the command refuses to
start saying which process holds it. Without it, `drift up` uses `<cache>/identity.key` and,
when another process holds that one, the first free `<cache>/identities/identity-<n>.key`
(created if needed), saying so; `drift dht` and `drift server` use a fresh identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from drift.identity import Identity, load_or_create_identity
from drift.identity.lock import IdentityInUse, IdentityLock, lock_identity

MAX_FALLBACKS = 64  # identities `drift up` tries under <cache>/identities before giving up


@dataclass
class NodeIdentity:
    identity: Identity
    lock: IdentityLock  # hold it while the node runs (released at exit by the OS anyway)
    path: Path | None  # the identity file (None: a fresh identity kept in memory)
    note: str | None = None  # what to tell the user about the choice, if anything


def open_identity_file(path: Path) -> NodeIdentity:
    """Lock `path` (IdentityInUse if another process holds it), then load or create it."""
    lock = lock_identity(path)
    try:
        return NodeIdentity(load_or_create_identity(path), lock, path)
    except BaseException:
        lock.release()
        raise


def open_node_identity(path: str | Path | None, *, cache_dir: Path,
                       fallback: bool) -> NodeIdentity:  # fmt: skip
    """The identity a node runs as (see the module docstring). `fallback` is drift up's
    stable default under the cache dir; without it and without `path`, a fresh identity."""
    if path is not None:
        return open_identity_file(Path(path).expanduser())
    if not fallback:
        return NodeIdentity(Identity.generate(), IdentityLock(Path("-"), None), None,
                            "no --identity_path: a new identity (the peer id changes every start)")  # fmt: skip
    default = cache_dir / "identity.key"
    try:
        return open_identity_file(default)
    except IdentityInUse as busy:
        for n in range(1, MAX_FALLBACKS + 1):
            candidate = cache_dir / "identities" / f"identity-{n}.key"
            try:
                chosen = open_identity_file(candidate)
            except IdentityInUse:
                continue
            chosen.note = (f"the default identity {default} is in use by "
                           f"{f'pid {busy.pid}' if busy.pid else 'another process'}; this node "
                           f"runs as {candidate} instead (pass --identity_path to choose)")  # fmt: skip
            return chosen
        raise
