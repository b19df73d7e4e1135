"""One running node per identity file: an exclusive lock held for the process's lifetime.

`lock_identity(path)` takes an advisory lock on `<path>.lock` (which records the holder's
pid) or raises IdentityInUse naming that pid and what to do. The operating system drops the
lock when the process dies, however it dies: fcntl.flock on POSIX, msvcrt.locking of one
byte past the pid on Windows (a locked Windows region cannot be read by others, so the pid
stays outside it); a no-op where neither exists.
Knows nothing about keys, records or the network.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from drift.wire.errors import DriftError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
try:
    import msvcrt  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # POSIX
    msvcrt = None  # type: ignore[assignment]

LOCK_OFFSET = 64  # Windows: the locked byte, past the pid text at the start of the file


class IdentityInUse(DriftError):
    code = "identity_in_use"
    status = 409

    def __init__(self, path: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid else "another process"
        super().__init__(
            f"identity file {path} is in use by {holder}: two nodes with one identity would "
            "fight over one peer id. Stop that process (drift down), or give this one its own "
            "--identity_path",
            pid=pid,
        )
        self.path, self.pid = path, pid


@dataclass
class IdentityLock:
    path: Path  # the identity file this lock guards
    fd: int | None  # the open lock file (None: locking unsupported here, or released)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def lock_identity(path: str | os.PathLike[str]) -> IdentityLock:
    """Hold `<path>.lock` exclusively; IdentityInUse if another process holds it."""
    path = Path(path)
    if fcntl is None and msvcrt is None:
        return IdentityLock(path, None)
    lock_path = path.with_name(path.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
    try:
        _lock(fd)
    except OSError:
        holder = _read_pid(fd)
        os.close(fd)
        raise IdentityInUse(path, holder) from None
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid()}\n".ljust(LOCK_OFFSET - 1).encode())
    return IdentityLock(path, fd)


def _lock(fd: int) -> None:
    """Take the exclusive lock without waiting (OSError when another process holds it)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    os.lseek(fd, LOCK_OFFSET, os.SEEK_SET)
    msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # released when the file is closed or the process ends


def _read_pid(fd: int) -> int | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
