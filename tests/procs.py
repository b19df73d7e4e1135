"""`python -m drift.cli ...` subprocesses for tests: start, wait for an output line, kill.

A reader thread collects each process's output lines (stdout and stderr together);
`wait_for` waits for a pattern. Every process is killed by the test (fixture) that started it.
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time


class DriftProc:
    """One `python -m drift.cli *args` process whose output lines a reader thread collects."""

    def __init__(self, args: list[str], env: dict[str, str], module: str = "drift.cli") -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", module, *args], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []  # lines read so far by wait_for
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: re.Pattern[str] | str, timeout: float = 180) -> re.Match[str]:
        """The first output line matching `pattern`; AssertionError with the output if none."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.popen.poll() is not None and self.lines.empty():
                    break
                continue
            self.log.append(line)
            if found := rx.search(line):
                return found
        raise AssertionError(f"no line matching {rx.pattern!r}; output:\n{''.join(self.log)}")

    def output(self) -> str:
        """Every line so far: those wait_for read and those queued since."""
        while True:
            try:
                self.log.append(self.lines.get_nowait())
            except queue.Empty:
                return "".join(self.log)

    def kill(self) -> None:
        """SIGKILL: no goodbye, no offline record."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=30)
