"""macOS / Windows code paths, run here with the platform faked: free memory and process
control through psutil only (no /proc, no os.sysconf, no os.kill, no SIGKILL), and stop
signals without `loop.add_signal_handler` (Windows' proactor loop raises NotImplementedError).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
from aiohttp import web

from drift.cli import down, procs
from drift.cli._capacity import free_memory
from drift.models.memory import resident_bytes
from drift.node.runner import install_stop_handlers, run_node


@pytest.fixture
def no_proc_fs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A platform without /proc and without the sysconf names macOS lacks."""
    real_read_text = Path.read_text

    def read_text(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(self).startswith("/proc"):
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return real_read_text(self, *args, **kwargs)

    def no_sysconf(name: str) -> int:
        raise ValueError(f"unrecognized configuration name {name!r}")

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(os, "sysconf", no_sysconf)


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_free_memory_and_rss_without_proc(monkeypatch: pytest.MonkeyPatch, no_proc_fs: None,
                                          platform: str) -> None:  # fmt: skip
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=12345 << 20))
    assert free_memory(torch.device("cpu")) == 12345 << 20
    rss = resident_bytes()
    assert rss is not None and rss > 0


def test_process_records_without_proc(tmp_path: Path, no_proc_fs: None) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = procs.process_start_time(child.pid)
        assert start is not None and abs(start - time.time()) < 3600
        record = procs.ProcessRecord("dht", child.pid, start, ["drift"], None, None, time.time())
        assert record.status() == "running"
        assert (
            procs.ProcessRecord("dht", child.pid, start - 10, [], None, None, 0).status()
            == "reused"
        )
    finally:
        child.kill()
        child.wait()
    assert record.status() == "stale"


class FakeProcess:
    """psutil.Process as on Windows: terminate/kill are TerminateProcess; nothing else used."""

    calls: list[tuple[int, str]] = []
    alive: set[int] = set()

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid if pid is not None else os.getpid()
        if self.pid not in FakeProcess.alive:
            raise psutil.NoSuchProcess(self.pid)

    def create_time(self) -> float:
        return 1000.0

    def status(self) -> str:
        return psutil.STATUS_RUNNING

    def terminate(self) -> None:
        FakeProcess.calls.append((self.pid, "terminate"))

    def kill(self) -> None:
        FakeProcess.calls.append((self.pid, "kill"))
        FakeProcess.alive.discard(self.pid)


def test_down_stops_and_kills_through_psutil_only(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path, capsys) -> None:  # fmt: skip
    """`drift down` on a faked Windows: no os.kill, no signal.SIGKILL (Windows has neither for
    other processes); the process ignores the terminate, so after --timeout it is killed."""
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.delattr(signal, "SIGKILL")

    def no_os_kill(*_args: object) -> None:
        raise AssertionError("os.kill used: not portable")

    monkeypatch.setattr(os, "kill", no_os_kill)
    monkeypatch.setattr(procs.psutil, "Process", FakeProcess)
    FakeProcess.calls, FakeProcess.alive = [], {424242}
    record = procs.ProcessRecord("server", 424242, 1000.0, ["drift"], 1, None, time.time())
    path = tmp_path / record.file_name()
    path.write_text("{}")
    assert down.stop_all([(path, record)], timeout_s=0.0) == 0
    assert FakeProcess.calls == [(424242, "terminate"), (424242, "kill")]
    assert not path.exists()
    assert "killing it" in capsys.readouterr().out


class NoSignalLoop:
    """A loop like Windows' proactor loop: no add_signal_handler."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[object, tuple[object, ...]]] = []

    def add_signal_handler(self, *_args: object) -> None:
        raise NotImplementedError

    def call_soon_threadsafe(self, callback, *args: object) -> None:  # type: ignore[no-untyped-def]
        self.scheduled.append((callback, args))


def test_stop_handlers_fall_back_to_signal_signal() -> None:
    before = signal.getsignal(signal.SIGTERM)
    loop = NoSignalLoop()
    got: list[int] = []
    undo = install_stop_handlers(loop, got.append)  # type: ignore[arg-type]
    try:
        signal.raise_signal(signal.SIGTERM)
        assert [args for _, args in loop.scheduled] == [(signal.SIGTERM,)]
    finally:
        undo()
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_run_node_stops_on_signals_without_add_signal_handler(
    monkeypatch: pytest.MonkeyPatch, sig: str
) -> None:
    """The whole runner on a loop without add_signal_handler: SIGTERM stops it cleanly,
    SIGINT too and then raises KeyboardInterrupt (the CLI's 130); handlers are restored."""
    loop_cls = type(asyncio.new_event_loop())

    def unsupported(self, *_args: object) -> None:  # type: ignore[no-untyped-def]
        raise NotImplementedError

    monkeypatch.setattr(loop_cls, "add_signal_handler", unsupported)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    app = web.Application()
    cleaned: list[bool] = []

    async def on_cleanup(_app: web.Application) -> None:
        cleaned.append(True)

    app.on_cleanup.append(on_cleanup)
    signum = getattr(signal, sig)

    def started(running) -> None:  # type: ignore[no-untyped-def]
        assert running.port > 0
        signal.raise_signal(signum)

    if sig == "SIGINT":
        with pytest.raises(KeyboardInterrupt):
            run_node(app, "127.0.0.1", 0, on_started=started)
    else:
        assert run_node(app, "127.0.0.1", 0, on_started=started) > 0
    assert cleaned == [True]
    assert {s: signal.getsignal(s) for s in before} == before


class FakeMsvcrt:
    """msvcrt.locking as on Windows: one process-wide table of locked (file, offset) bytes."""

    LK_NBLCK = 2

    def __init__(self) -> None:
        self.held: dict[tuple[int, int], int] = {}  # (inode, offset) -> holding fd

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        assert mode == self.LK_NBLCK and nbytes == 1
        key = (os.fstat(fd).st_ino, os.lseek(fd, 0, os.SEEK_CUR))
        holder = self.held.get(key)
        if holder is not None and holder != fd:
            try:
                os.fstat(holder)
            except OSError:  # the holder closed its file: the lock went with it
                pass
            else:
                raise PermissionError(13, "Permission denied")
        self.held[key] = fd


def test_identity_lock_on_windows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without fcntl the identity file is locked with msvcrt: a second holder is refused,
    told the first one's pid, and gets the lock once the first releases it."""
    from drift.identity import lock

    monkeypatch.setattr(lock, "fcntl", None)
    monkeypatch.setattr(lock, "msvcrt", FakeMsvcrt())
    key = tmp_path / "identity.key"
    first = lock.lock_identity(key)
    assert first.fd is not None
    with pytest.raises(lock.IdentityInUse) as refused:
        lock.lock_identity(key)
    assert refused.value.pid == os.getpid()
    first.release()
    second = lock.lock_identity(key)
    second.release()
