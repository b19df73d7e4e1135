"""`drift down` stops a real `drift dht` and a real `drift server` (tiny model, CPU), found
through the process records they write: both leave gracefully (the observing seed sees
their offline records at once, long before the records would expire) and no record remains."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from drift.cli.procs import read_records
from tests.node.node_helpers import Nodes, live_ids, wait_for
from tests.tiny_models import save_tiny

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--host", "127.0.0.1", "--port", "0", "--gossip_interval", "0.2", "--record_ttl", "30"]


async def drift(cache: Path, *args: str, log: Path | None = None) -> asyncio.subprocess.Process:
    """A `drift` subprocess; output to `log` (long-running ones) or a pipe."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), DRIFT_CACHE=str(cache))
    out = log.open("wb") if log else asyncio.subprocess.PIPE
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "drift.cli", *args, env=env, cwd=ROOT,
            stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    finally:
        if log:
            out.close()  # type: ignore[union-attr]


def live_records(cache: Path) -> dict[str, object]:
    return {r.kind: r for _, r in read_records(cache) if r is not None and r.port}


@pytest.fixture
async def procs():
    """A list for the `drift` subprocesses a test starts; each still running is killed and
    reaped at teardown."""
    started: list[asyncio.subprocess.Process] = []
    try:
        yield started
    finally:
        for p in started:
            if p.returncode is None:
                p.kill()
                await p.wait()


@pytest.mark.timeout(180)
async def test_down_stops_dht_and_server_gracefully(tmp_path: Path, nodes: Nodes, procs) -> None:
    model = save_tiny("llama", tmp_path / "llama")
    cache = tmp_path / "cache"
    seed, _ = await nodes.start(record_ttl_s=30.0)
    token = seed.join_token().to_drift()
    procs.append(
        await drift(cache, "dht", *FAST, "--initial_peers", token, log=tmp_path / "dht.log")
    )
    procs.append(await drift(cache, "server", str(model), "--block_indices", "0:2",
                             "--device", "cpu", "--throughput", "100", *FAST,
                             "--identity_path", str(tmp_path / "server.key"),
                             "--initial_peers", token, log=tmp_path / "server.log"))  # fmt: skip

    def both_up() -> bool:
        if any(p.returncode is not None for p in procs):
            logs = [(tmp_path / f).read_text() for f in ("dht.log", "server.log")]
            raise AssertionError("a drift process exited early:\n" + "\n".join(logs))
        return set(live_records(cache)) == {"dht", "server"}

    await wait_for(both_up, 90, "both process records with ports")
    recs = live_records(cache)
    assert {r.pid for r in recs.values()} == {p.pid for p in procs}  # type: ignore[attr-defined]
    peers = {r.peer_id for r in recs.values()}  # type: ignore[attr-defined]
    await wait_for(lambda: peers <= live_ids(seed), 20, "both to join the seed")
    server_rec = next(r for r in seed.live_records() if r.role == "server")
    assert server_rec.span == (0, 2)

    listed = await drift(cache, "down", "--list")
    out, _ = await listed.communicate()
    assert listed.returncode == 0 and b"dht" in out and b"server" in out, out

    down = await drift(cache, "down", "--timeout", "30")
    out, _ = await asyncio.wait_for(down.communicate(), 60)
    assert down.returncode == 0, out
    assert [await asyncio.wait_for(p.wait(), 30) for p in procs] == [0, 0], out
    for pid in peers:  # published offline, not merely silent (the ttl is 30 s)
        record = seed.table.get(pid)
        assert record is not None and record.state == "offline", pid
    assert not peers & live_ids(seed)
    assert read_records(cache) == []
