"""`drift dht` as separate processes: join, Ctrl+C leave, SIGKILL expiry, stable identity."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from drift.identity import parse_join_token
from tests.node.node_helpers import Nodes, live_ids, wait_for

ROOT = Path(__file__).resolve().parents[2]
TOKEN_RE = re.compile(r"join token: (drift://\S+)")


class DhtProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.token: str | None = None
        self._ready = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            self.lines.append(line)
            match = TOKEN_RE.search(line)
            if match:
                self.token = match.group(1)
                self._ready.set()

    async def ready(self, timeout: float = 20.0) -> str:
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError("drift dht printed no token:\n" + "".join(self.lines)) from None
        assert self.token is not None
        return self.token

    async def wait(self, timeout: float = 10.0) -> int:
        rc = await asyncio.wait_for(self.proc.wait(), timeout)
        await self._reader
        return rc

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def start_dht(cache: Path, *args: str) -> DhtProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), DRIFT_CACHE=str(cache))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "drift.cli",
        "dht",
        "--host_maddrs",
        "/ip4/127.0.0.1/tcp/0",
        "--gossip_interval",
        "0.2",
        "--record_ttl",
        "2",
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    return DhtProcess(proc)


@pytest.fixture
async def dhts():
    """`await dhts(cache, *args)` -> a started `drift dht`; each killed and reaped at teardown."""
    started: list[DhtProcess] = []

    async def start(cache: Path, *args: str) -> DhtProcess:
        started.append(await start_dht(cache, *args))
        return started[-1]

    try:
        yield start
    finally:
        for p in started:
            p.kill()
            await p.wait()


@pytest.mark.timeout(90)
async def test_dht_processes_join_leave_and_expire(tmp_path: Path, nodes: Nodes, dhts) -> None:
    seed, _ = await nodes.start()
    seed_token = seed.join_token().to_drift()
    key_a = tmp_path / "a.key"
    a = await dhts(tmp_path, "--identity_path", str(key_a), "--initial_peers", seed_token)
    b = await dhts(tmp_path, "--initial_peers", seed.join_token().to_multiaddr())
    id_a = parse_join_token(await a.ready()).peer_id
    id_b = parse_join_token(await b.ready()).peer_id
    assert key_a.exists() and oct(key_a.stat().st_mode & 0o777) == "0o600"
    await wait_for(lambda: {id_a, id_b} <= live_ids(seed), 15, "processes to join")

    # Ctrl+C: the node publishes a signed offline record to the seed and exits cleanly (a
    # record that merely expired would not read "offline": the seed never saw one)
    a.proc.send_signal(signal.SIGINT)
    await wait_for(lambda: id_a not in live_ids(seed), 10, "SIGINT node to leave")
    assert seed.table.get(id_a) is not None and seed.table.get(id_a).state == "offline"  # type: ignore[union-attr]
    assert await a.wait() == 130  # Ctrl+C: "interrupted" (drift.cli._exits), after leaving
    assert any("left the swarm (offline record sent to" in line for line in a.lines), a.lines

    # SIGKILL: no offline record; the node disappears only when its record expires
    b.proc.kill()
    await b.wait()
    await asyncio.sleep(0.3)
    assert id_b in live_ids(seed)
    await wait_for(lambda: id_b not in live_ids(seed), 5, "SIGKILLed node to expire")
    gone = seed.table.get(id_b)
    assert gone is None or gone.state == "online"  # expired, never published offline

    # restart with the same identity file: same peer id, joins again
    again = await dhts(tmp_path, "--identity_path", str(key_a), "--initial_peers", seed_token)
    assert parse_join_token(await again.ready()).peer_id == id_a
    await wait_for(lambda: id_a in live_ids(seed), 10, "restarted node to rejoin")
    again.proc.send_signal(signal.SIGTERM)
    assert await again.wait() == 0


def test_dht_help_and_bad_arguments() -> None:
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def dht(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "drift.cli", "dht", *args],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)  # fmt: skip

    out = dht("--help")
    assert out.returncode == 0 and "--initial_peers" in out.stdout
    bad = dht("--host_maddrs", "/ip4/127.0.0.1/tcp/0", "--initial_peers", "127.0.0.1:31337")
    assert bad.returncode == 2 and "drift://<peer_id>@<host>:<port>" in bad.stderr
