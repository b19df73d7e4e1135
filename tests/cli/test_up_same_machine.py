"""Several nodes on one machine: a second `drift up` (no --port, same cache dir) takes the next
free port and another identity by itself and says so; an explicit --port that is taken is an
error naming the port's holder. Real sockets and real `drift up` processes on loopback."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drift.cli._net import DEFAULT_PORT, check_port_free, pick_free_port, port_holder
from drift.cli.main import build_parser
from drift.cli.procs import read_records
from drift.cli.up import up_config_from_args
from drift.wire.errors import BadRequest
from tests.tiny_models import save_tiny

ROOT = Path(__file__).resolve().parents[2]


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_pick_free_port_moves_past_a_held_port() -> None:
    with _listening() as held:
        port = held.getsockname()[1]
        assert port_holder(port) == f"pid {os.getpid()} ({' '.join(_cmdline())[:120]})"
        chosen, note = pick_free_port("127.0.0.1", port)
        assert chosen != port and port < chosen <= port + 64
        assert note and f"port {port} is in use by pid {os.getpid()}" in note
        assert f"listens on {chosen} instead" in note
        with pytest.raises(BadRequest, match=rf"port {port} .* in use by pid {os.getpid()}"):
            check_port_free("127.0.0.1", port)
    assert pick_free_port("127.0.0.1", port) == (port, None)  # free again: kept


def _cmdline() -> list[str]:
    import psutil

    return psutil.Process().cmdline()


def _args(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args


def test_only_the_default_port_moves(tmp_path: Path) -> None:
    cache = ["--cache_dir", str(tmp_path)]
    assert up_config_from_args(_args(["up", "smollm2", *cache])).auto_port
    assert not up_config_from_args(
        _args(["up", "smollm2", "--port", str(DEFAULT_PORT), *cache])
    ).auto_port
    assert not up_config_from_args(_args(["up", "smollm2", "--port=4000", *cache])).auto_port


def _up(model: Path, cache: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, DRIFT_CACHE=str(cache), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "drift.cli", "up", str(model), "--host", "127.0.0.1",
             "--plain_http", "--start_delay", "0", "--num_blocks", "2"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _serving_port(cache: Path, proc: subprocess.Popen, log: Path, known: set[int]) -> int:
    for _ in range(1800):  # polls until the new node has bound its port
        ports = {r.port for _, r in read_records(cache) if r is not None and r.port} - known
        if ports:
            return ports.pop()
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(log.read_text())


@pytest.mark.timeout(240)
def test_second_node_takes_next_port_and_identity(tmp_path: Path, popens) -> None:
    model = save_tiny("llama", tmp_path / "llama")
    cache = tmp_path / "cache"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    first = _up(model, cache, logs[0])
    popens.append(first)
    port_a = _serving_port(cache, first, logs[0], set())
    second = _up(model, cache, logs[1])
    popens.append(second)
    port_b = _serving_port(cache, second, logs[1], {port_a})
    text = logs[1].read_text()
    moved = re.search(rf"port {DEFAULT_PORT} is in use by (.+); this node listens on (\d+)", text)
    assert moved, text
    assert int(moved.group(2)) == port_b != port_a
    if port_a == DEFAULT_PORT:  # 31337 was free for the first node: the second names it
        assert f"pid {first.pid}" in moved.group(1)
    assert f"identity {cache / 'identities' / 'identity-1.key'}" in text
    assert "the default identity" in text and "is in use by" in text
    peers = {r.peer_id for _, r in read_records(cache) if r is not None}
    assert len(peers) == 2
    for proc in (first, second):
        proc.terminate()
    for proc in (first, second):
        assert proc.wait(timeout=60) in (0, 130, -15)
