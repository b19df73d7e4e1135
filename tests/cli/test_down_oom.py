"""`drift down --list` says how a server that left its record behind died: the kernel's OOM
killer (a real cgroup v1 limit where root allows) or a plain SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drift.cli.procs import ProcessRecord, how_it_died

CHILD = """
import sys, time
from drift.cli.procs import process_record
sys.stdin.readline()  # moved into its cgroup by the test
with process_record("up", cache_dir=sys.argv[1], model="m"):
    print("recorded", flush=True)
    if sys.argv[2] == "oom":
        hog = [bytearray(64 << 20) for _ in range(64)]  # 4 GiB in a small cgroup
    time.sleep(120)
"""
V1_ROOT = Path("/sys/fs/cgroup/memory")


def _record(counts: dict[str, int]) -> ProcessRecord:
    return ProcessRecord("up", 1, None, ["drift"], None, None, 0.0, {"oom_kills": counts})


def test_how_it_died_from_the_counters() -> None:
    rec = _record({"host": 3, "/sys/fs/cgroup/memory/m1": 0})
    assert "out of memory" in how_it_died(rec, {"host": 4, "/sys/fs/cgroup/memory/m1": 1})
    assert "memory cgroup" in how_it_died(rec, {"host": 4, "/sys/fs/cgroup/memory/m1": 1})
    assert "SIGKILL" in how_it_died(rec, {"host": 3, "/sys/fs/cgroup/memory/m1": 0})
    assert "SIGKILL" in how_it_died(_record({}), {"host": 9})  # an older record: no counters


def _start(tmp_path: Path, mode: str, group: Path | None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(Path.cwd()), DRIFT_CACHE=str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), mode], env=env,
                             text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    if group is not None:
        (group / "cgroup.procs").write_text(str(child.pid))
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "recorded"
    return child


def _down_list(tmp_path: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(Path.cwd()), DRIFT_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "drift.cli", "down", "--list"], env=env,
                         text=True, capture_output=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_sigkill_is_reported(tmp_path: Path) -> None:
    child = _start(tmp_path, "sleep", None)
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    text = _down_list(tmp_path)
    assert f"pid {child.pid}" in text and "killed (SIGKILL, exit 137)" in text, text


def test_an_oom_kill_in_a_real_cgroup_v1_is_reported(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not (V1_ROOT / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and a cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
    group = V1_ROOT / f"drift-test-oom-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(256 << 20))
        with (group / "memory.memsw.limit_in_bytes").open("w") as f:  # no swap either
            f.write(str(256 << 20))
        child = _start(tmp_path, "oom", group)
        assert child.wait(timeout=60) == -signal.SIGKILL
        text = _down_list(tmp_path)
        assert f"pid {child.pid}" in text, text
        assert "killed by the kernel: out of memory" in text and "memory cgroup" in text, text
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:  # the killed child's memory is still being uncharged
                time.sleep(0.1)
