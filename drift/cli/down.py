"""`drift down`: stop this machine's DRIFT processes, found through their process records.

Stopping is graceful first (SIGTERM: a node publishes itself offline and drains), then a
kill after --timeout. Stale records are removed; a process that reused a recorded pid is
left alone, and so is a node a service manager runs (`drift up --print-service`): the user is
told the command that stops it there. Exit code 1 when something is still running. Knows nothing about what the processes do.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

from drift.cli._options import add_cache_dir
from drift.cli._service import stop_hint
from drift.cli.procs import (
    ProcessRecord,
    how_it_died,
    kill,
    read_records,
    run_dir,
    terminate,
    wait_for_exit,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "down",
        help="stop the DRIFT processes running on this machine",
        description="Stop this machine's DRIFT processes (drift up / server / dht / api) "
        "gracefully, then kill those that do not exit within --timeout.",
    )
    p.add_argument("--list", action="store_true", help="only list the processes; stop nothing")
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait after SIGTERM before killing a process (default: 30)",
    )
    p.add_argument(
        "--kind",
        action="append",
        choices=["up", "server", "dht", "api", "demo"],
        help="only these kinds of process (repeatable; default: all)",
    )
    add_cache_dir(p)
    p.set_defaults(func=run)


def describe(record: ProcessRecord) -> str:
    age = max(0.0, time.time() - record.started_at)
    port = f"port {record.port}" if record.port else "no port yet"
    peer = f"peer {record.peer_id[:16]}..." if record.peer_id else "no peer id"
    model = f", {record.extra['model']}" if record.extra.get("model") else ""
    service = f", service {record.extra['service']}" if record.extra.get("service") else ""
    return f"{record.kind:<6} pid {record.pid:<7} {port}, {peer}{model}{service}, up {_age(age)}"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def run(args: argparse.Namespace) -> int:
    records = read_records(args.cache_dir)
    live: list[tuple[Path, ProcessRecord]] = []
    for path, record in records:
        if record is None:
            print(f"removing unreadable record {path}")
            _remove(path)
            continue
        if args.kind and record.kind not in args.kind:
            continue
        status = record.status()
        if status == "stale":
            print(
                f"removing stale record: {describe(record)} (process is gone: "
                f"{how_it_died(record)})"
            )
            _remove(path)
        elif status == "reused":
            print(
                f"removing stale record: pid {record.pid} now belongs to another program; left alone"
            )
            _remove(path)
        else:
            live.append((path, record))
    if not live:
        print(f"no DRIFT processes running (records in {run_dir(args.cache_dir)})")
        return 0
    if args.list:
        for _, record in live:
            print(describe(record))
        return 0
    managed = [(p, r) for p, r in live if r.extra.get("service")]
    for _, record in managed:  # stopping it here would only see it restarted
        print(f"not stopping {describe(record)}: a service runs it; stop it there: "
              f"{stop_hint(str(record.extra['service']))}")  # fmt: skip
    rest = [(p, r) for p, r in live if not r.extra.get("service")]
    survivors = stop_all(rest, args.timeout) if rest else 0
    return 1 if survivors or managed else 0


def stop_all(live: list[tuple[Path, ProcessRecord]], timeout_s: float) -> int:
    """Terminate every process at once, wait up to `timeout_s`, kill the rest; count survivors."""
    for _, record in live:
        print(f"stopping {describe(record)}", flush=True)
        terminate(record)
    deadline = time.monotonic() + timeout_s
    survivors = 0
    for path, record in live:
        if wait_for_exit(record, max(0.0, deadline - time.monotonic())):
            print(f"  pid {record.pid}: stopped")
        else:
            print(f"  pid {record.pid}: still running after {timeout_s:g}s, killing it", flush=True)
            kill(record)
            if not wait_for_exit(record, 5.0):
                survivors += 1
                print(f"  pid {record.pid}: survived the kill")
                continue
        _remove(path)  # the process removes its own record; a killed one cannot
    return survivors
