"""Process records: how `drift down` finds this machine's DRIFT processes.

Every long-running command (drift up / server / dht / api) writes one JSON file into
`<cache_dir>/run/` when it starts and removes it when it exits. A record names the pid and
the process start time (from /proc/<pid>/stat), so a pid reused by another program is
recognised and left alone. Knows nothing about what the processes do.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from drift.cli._secrets import scrub_argv
from drift.paths import resolve_cache_dir

RUN_DIR_NAME = "run"


def run_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return resolve_cache_dir(cache_dir) / RUN_DIR_NAME


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat);
    None when the process does not exist or /proc is unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(rest[19])  # fields 3.. start at index 0, so field 22 is index 19
    except (IndexError, ValueError):
        return None


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].startswith("Z")


@dataclass(frozen=True)
class ProcessRecord:
    """One running DRIFT process, as written to `<cache_dir>/run/<kind>-<pid>.json`."""

    kind: str  # "up" | "server" | "dht" | "api" | "demo"
    pid: int
    start_time: int | None  # clock ticks since boot, from /proc/<pid>/stat
    command: list[str]  # argv of the process, secrets replaced by ***
    port: int | None  # the HTTP port it listens on (None until bound)
    peer_id: str | None  # its membership peer id (None for processes without one)
    started_at: float  # wall-clock seconds since the epoch
    extra: dict[str, Any] = field(default_factory=dict)  # free-form: model, blocks, join token

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord:
        try:
            return cls(
                kind=str(data["kind"]),
                pid=int(data["pid"]),
                start_time=None if data["start_time"] is None else int(data["start_time"]),
                command=[str(a) for a in data["command"]],
                port=None if data["port"] is None else int(data["port"]),
                peer_id=None if data["peer_id"] is None else str(data["peer_id"]),
                started_at=float(data["started_at"]),
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a DRIFT process record: {exc!r}") from exc

    def file_name(self) -> str:
        return f"{self.kind}-{self.pid}.json"

    def status(self) -> str:
        """'running', 'stale' (the process is gone) or 'reused' (another program has its pid)."""
        if not pid_exists(self.pid):
            return "stale"
        now = process_start_time(self.pid)
        if self.start_time is not None and now is not None and now != self.start_time:
            return "reused"
        return "running"


def _write_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write the record readable by its owner only (it names ports, peer ids, commands)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


class RecordHandle:
    """The live record of the current process; `update` rewrites it (e.g. once the port is bound)."""

    def __init__(self, path: Path, record: ProcessRecord) -> None:
        self.path = path
        self.record = record

    def update(self, **fields: Any) -> None:
        self.record = replace(self.record, **fields)
        _write_atomic(self.path, asdict(self.record))

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


@contextlib.contextmanager
def process_record(
    kind: str,
    port: int | None = None,
    peer_id: str | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    **extra: Any,
) -> Iterator[RecordHandle]:
    """Write this process's record for the duration of the block; remove it on exit.

    Call it in every long-running command around the code that serves; `handle.update(port=...,
    peer_id=...)` once they are known. The record is removed however the block exits (normal
    return, exception, SIGTERM turned into an exception by aiohttp's run_app).
    """
    pid = os.getpid()
    record = ProcessRecord(
        kind=kind,
        pid=pid,
        start_time=process_start_time(pid),
        command=scrub_argv(sys.argv),  # secrets (--swarm_key, ?key=) never stored
        port=port,
        peer_id=peer_id,
        started_at=time.time(),
        extra=dict(extra),
    )
    path = run_dir(cache_dir) / record.file_name()
    handle = RecordHandle(path, record)
    _write_atomic(path, asdict(record))
    try:
        yield handle
    finally:
        handle.remove()


def _exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so `process_record`'s cleanup runs during slow startup
    (loading weights); the node runner replaces it with a graceful leave once serving."""
    signal.signal(signal.SIGTERM, _exit)


def read_records(
    cache_dir: str | os.PathLike[str] | None = None,
) -> list[tuple[Path, ProcessRecord | None]]:
    """Every record file in the run dir, parsed (None for a file that is not a valid record)."""
    directory = run_dir(cache_dir)
    if not directory.is_dir():
        return []
    out: list[tuple[Path, ProcessRecord | None]] = []
    for path in sorted(directory.glob("*.json")):
        try:
            out.append((path, ProcessRecord.from_json(json.loads(path.read_text()))))
        except (OSError, ValueError):
            out.append((path, None))
    return out


def wait_for_exit(record: ProcessRecord, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Wait until the recorded process is gone (or its pid reused); True if it went."""
    deadline = time.monotonic() + timeout_s
    while True:
        if record.status() != "running":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def send_signal(record: ProcessRecord, sig: int) -> None:
    """Signal the recorded process, only if it is still the process the record names."""
    if record.status() != "running":
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, sig)
