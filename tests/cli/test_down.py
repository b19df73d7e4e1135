"""`drift down` against real processes that write process records (no mocks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from drift.cli.procs import (
    ProcessRecord,
    process_record,
    process_start_time,
    read_records,
    run_dir,
)

# A stand-in for a DRIFT service: writes its record, exits cleanly on SIGTERM (or ignores it).
SERVICE = """
import signal, sys, time
from drift.cli.procs import process_record
ignore = sys.argv[1] == "ignore"
def on_term(*_):
    if not ignore:
        raise SystemExit(0)
signal.signal(signal.SIGTERM, on_term)
with process_record("server", peer_id="12D3KooWtest") as rec:
    rec.update(port=int(sys.argv[2]))
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
"""


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ, DRIFT_CACHE=str(cache), PYTHONPATH=str(Path.cwd()))
    return env


def _start(cache: Path, mode: str, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVICE, mode, str(port)],
        env=_env(cache),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _drift(cache: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drift.cli", *args],
        env=_env(cache),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_record_written_and_removed(tmp_path):
    with process_record("dht", 1234, "12D3KooWx", cache_dir=tmp_path, model="m") as handle:
        [(path, record)] = read_records(tmp_path)
        assert record is not None and record.pid == os.getpid() and record.port == 1234
        assert record.start_time == process_start_time(os.getpid()) is not None
        assert record.extra["model"] == "m" and record.status() == "running"
        assert "host" in record.extra["oom_kills"]  # to tell an OOM kill later (Linux)
        handle.update(port=999)
        assert read_records(tmp_path)[0][1].port == 999
    assert read_records(tmp_path) == []


def test_list_then_down_stops_everything(tmp_path, popens):
    cache, started = tmp_path, popens
    started.append(_start(cache, "graceful", 4001))
    started.append(_start(cache, "graceful", 4002))
    listed = _drift(cache, "down", "--list")
    assert listed.returncode == 0, listed.stderr
    assert "port 4001" in listed.stdout and "port 4002" in listed.stdout
    assert all(p.poll() is None for p in started)  # --list stops nothing
    assert len(read_records(cache)) == 2

    down = _drift(cache, "down", "--timeout", "20")
    assert down.returncode == 0, down.stdout + down.stderr
    assert [p.wait(timeout=10) for p in started] == [0, 0]  # graceful exits
    assert read_records(cache) == []


def test_down_kills_a_process_ignoring_sigterm(tmp_path, popens):
    cache, started = tmp_path, popens
    started.append(_start(cache, "ignore", 4003))
    down = _drift(cache, "down", "--timeout", "1")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "killing" in down.stdout
    # killed because it outlived --timeout (not after some other wait)
    assert f"pid {started[0].pid}: still running after 1s, killing it" in down.stdout
    assert started[0].wait(timeout=10) == -9
    assert read_records(cache) == []


def test_stale_and_reused_records(tmp_path, popens):
    cache, started = tmp_path, popens
    directory = run_dir(cache)
    directory.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = ProcessRecord("server", dead.pid, 1, ["drift"], 4004, None, time.time())
    (directory / stale.file_name()).write_text(json.dumps(stale.__dict__))
    # A live process of another program holding a recorded pid: start time differs.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started.append(other)
    start = process_start_time(other.pid)
    assert start is not None
    reused = ProcessRecord("dht", other.pid, start - 10, ["drift"], 4005, None, time.time())
    (directory / reused.file_name()).write_text(json.dumps(reused.__dict__))
    (directory / "garbage.json").write_text("{not json")

    down = _drift(cache, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stale" in down.stdout and "another program" in down.stdout
    assert other.poll() is None  # left alone
    assert list(directory.glob("*.json")) == []


def test_help_and_module_entry(tmp_path):
    out = _drift(tmp_path, "down", "--help")
    assert out.returncode == 0 and "--list" in out.stdout and "--timeout" in out.stdout
    out = _drift(tmp_path, "down")
    assert out.returncode == 0 and "no DRIFT processes running" in out.stdout
