"""Process records: how `drift down` finds this machine's DRIFT processes.

Every long-running command (drift up / server / dht / api) writes one JSON file into
`<cache_dir>/run/` when it starts and removes it when it exits. A record names the pid and
the process creation time (psutil, on every platform), so a pid reused by another program
is recognised and left alone. Knows nothing about what the processes do.
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

import psutil

from drift.cli._budget import oom_kill_counts, oom_kills_now
from drift.cli._secrets import scrub_argv
from drift.paths import resolve_cache_dir

RUN_DIR_NAME = "run"


def run_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return resolve_cache_dir(cache_dir) / RUN_DIR_NAME


def process_start_time(pid: int) -> float | None:
    """The process's creation time (seconds since the epoch, from psutil on every platform);
    None when the process does not exist or cannot be read."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def pid_exists(pid: int) -> bool:
    """A live process has this pid (a zombie, exited but not yet reaped, does not count)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:
        return True
    except (psutil.Error, OSError):
        return False


@dataclass(frozen=True)
class ProcessRecord:
    """One running DRIFT process, as written to `<cache_dir>/run/<kind>-<pid>.json`."""

    kind: str  # "up" | "server" | "dht" | "api" | "demo"
    pid: int
    start_time: float | None  # creation time of the process (epoch seconds, psutil)
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
                start_time=None if data["start_time"] is None else float(data["start_time"]),
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
        # start_time below 1e9 is an older record's clock ticks since boot: not comparable
        known = self.start_time is not None and self.start_time > 1e9
        if known and now is not None and abs(now - self.start_time) > 0.5:  # type: ignore[operator]
            return "reused"
        return "running"


def how_it_died(record: ProcessRecord, now: dict[str, int] | None = None) -> str:
    """Why a stale record's process is gone: it never removed its record, so it was killed
    (SIGKILL, or the kernel's OOM killer when an OOM-kill counter covering it rose) or crashed."""
    then = record.extra.get("oom_kills") or {}
    now = oom_kills_now(list(then)) if now is None else now
    rose = [name for name, n in now.items() if name in then and n > int(then[name])]
    if rose:
        where = "its memory cgroup" if any(n != "host" for n in rose) else "this machine"
        return (f"killed by the kernel: out of memory (an OOM kill in {where} since it started; "
                "see --max_memory / a larger memory limit)")  # fmt: skip
    return "it ended without stopping: killed (SIGKILL, exit 137) or crashed"


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
        extra={**extra, "oom_kills": oom_kill_counts()},  # to tell an OOM kill later
    )
    path = run_dir(cache_dir) / record.file_name()
    handle = RecordHandle(path, record)
    _write_atomic(path, asdict(record))
    try:
        yield handle
    finally:
        handle.remove()


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt  # the command exits as interrupted (130), cleanups run


def exit_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt (as Ctrl+C), so `process_record`'s cleanup runs
    during slow startup (loading weights); the node runner replaces it with a graceful leave
    once serving."""
    signal.signal(signal.SIGTERM, _interrupt)


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


def _process(record: ProcessRecord) -> psutil.Process | None:
    """The recorded process, only if it is still the process the record names."""
    if record.status() != "running":
        return None
    try:
        return psutil.Process(record.pid)
    except psutil.Error:
        return None


def terminate(record: ProcessRecord) -> None:
    """Ask the recorded process to stop: SIGTERM on Unix (a node leaves gracefully);
    TerminateProcess on Windows, which has no graceful signal to send to another process."""
    if (proc := _process(record)) is not None:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()


def kill(record: ProcessRecord) -> None:
    """Kill the recorded process (SIGKILL on Unix, TerminateProcess on Windows)."""
    if (proc := _process(record)) is not None:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
