"""Issue 16, findings 4 and 5 as real processes and real nodes on loopback.

Finding 5: a second process on an identity file refuses to start and says what to do;
`drift up` picks a fresh identity when the default one is in use; two nodes signing one peer
id at different addresses cannot flap the swarm's view of it. Finding 4: no command sends
the key itself; process records are 0600 and hold no secret; keys come from flags,
environment variables or key files and are never logged.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from drift.identity import Identity
from tests.node.node_helpers import Nodes, live_ids, wait_for

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret-never-shown"


def drift_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRIFT_")}
    return dict(env, PYTHONPATH=str(ROOT), DRIFT_CACHE=str(cache), **extra)


def start(cache: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "drift.cli", "dht", "--host", "127.0.0.1", "--port", "0",
         "--plain_http", *args],
        env=drift_env(cache, **env), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def wait_line(proc: subprocess.Popen[str], needle: str, timeout: float = 60) -> list[str]:
    """Output lines up to the first holding `needle` (AssertionError with the output if none)."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"no line with {needle!r}:\n{''.join(lines)}")


def stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.terminate()
    out, _ = proc.communicate(timeout=30)
    return out or ""


def test_second_process_on_an_identity_file_refuses(tmp_path: Path) -> None:
    """Finding 5: one identity file, one running node."""
    key = tmp_path / "node.key"
    first = start(tmp_path, "--identity_path", str(key))
    try:
        wait_line(first, "join token")
        second = subprocess.run(
            [sys.executable, "-m", "drift.cli", "dht", "--host", "127.0.0.1", "--port", "0",
             "--plain_http", "--identity_path", str(key)],
            env=drift_env(tmp_path), text=True, capture_output=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr  # a runtime failure (drift.cli._exits)
        said = second.stderr
        assert str(key) in said and f"pid {first.pid}" in said and "--identity_path" in said
    finally:
        stop(first)


def test_up_picks_a_fresh_identity_when_the_default_is_in_use(tmp_path: Path) -> None:
    """Finding 5: `drift up` without --identity_path never shares the default identity."""
    from drift.cli._identity import open_node_identity

    first = open_node_identity(None, cache_dir=tmp_path, fallback=True)
    second = open_node_identity(None, cache_dir=tmp_path, fallback=True)
    try:
        assert first.path == tmp_path / "identity.key" and first.note is None
        assert second.path != first.path and second.path.parent == tmp_path / "identities"
        assert second.identity.peer_id != first.identity.peer_id
        assert "in use" in (second.note or "") and str(second.path) in (second.note or "")
    finally:
        second.lock.release()
        first.lock.release()
    again = open_node_identity(None, cache_dir=tmp_path, fallback=True)  # free again
    assert again.path == first.path and again.identity.peer_id == first.identity.peer_id
    again.lock.release()


async def test_two_nodes_on_one_identity_cannot_flap(nodes: Nodes, caplog) -> None:
    """Finding 5: the record held first stays; the conflict is logged loudly."""
    seed, _ = await nodes.start()
    twin_id = Identity.generate()
    older, _ = await nodes.start(seed.join_token(), identity=twin_id)
    await wait_for(lambda: twin_id.peer_id in live_ids(seed), 5, "first twin to join")
    kept = seed.table.get(twin_id.peer_id).addrs  # type: ignore[union-attr]
    newer, _ = await nodes.start(seed.join_token(), identity=twin_id)
    seen = set()
    for _ in range(40):  # 2 s: ten gossip rounds of both twins
        held = seed.table.get(twin_id.peer_id)
        seen.add(held.addrs if held else None)
        await asyncio.sleep(0.05)
    assert seen == {kept}, f"the twins' records flapped at the seed: {seen}"
    assert any("ANOTHER PROCESS IS USING THIS NODE'S IDENTITY" in r.message
               or "two live records for peer" in r.message for r in caplog.records)  # fmt: skip
    assert newer.addrs != older.addrs


@pytest.fixture
async def nodes():
    started = Nodes()
    try:
        yield started
    finally:
        await started.stop_all()


def test_keys_from_env_and_file_never_logged_and_records_are_private(tmp_path: Path) -> None:
    """Finding 4: DRIFT_SWARM_KEY / --swarm_key_file make a private node; the key is not in
    its output, its process record is 0600 and holds neither the key nor the token's ?key=."""
    key_file = tmp_path / "swarm.key"
    key_file.write_text(SECRET + "\n")
    key_file.chmod(0o600)
    for how in ({"env": {"DRIFT_SWARM_KEY": SECRET}, "args": []},
                {"env": {}, "args": ["--swarm_key_file", str(key_file)]},
                {"env": {}, "args": ["--swarm_key", SECRET]}):  # fmt: skip
        cache = tmp_path / f"cache{len(list(tmp_path.iterdir()))}"
        proc = start(cache, *how["args"], **how["env"])
        try:
            lines = wait_line(proc, "join token")
            port = int(
                next(ln for ln in lines if "listening on" in ln).split(":")[-1].split(",")[0]
            )
            status = asyncio.run(_status(f"http://127.0.0.1:{port}/swarm"))
            assert status == 401, "the key did not make the node private"
            (record,) = list((cache / "run").glob("*.json"))
            assert stat.S_IMODE(record.stat().st_mode) == 0o600
            assert SECRET not in record.read_text()
            assert json.loads(record.read_text())["kind"] == "dht"
        finally:
            out = stop(proc)
        assert SECRET not in "".join(lines) + out


async def _status(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return resp.status


async def test_status_never_sends_the_key(tmp_path: Path) -> None:
    """Finding 4: `drift status` against a private swarm proves the key with an HMAC only."""
    seen: list[dict[str, str]] = []

    async def swarm(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"error": {"code": "forbidden", "message": "no"}}, status=403)

    app = web.Application()
    app.router.add_get("/swarm", swarm)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        token = f"drift://{Identity.generate().peer_id}@127.0.0.1:{port}?tls=off"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "drift.cli", "status", "--initial_peers", token,
            env=drift_env(tmp_path, DRIFT_SWARM_KEY=SECRET),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await runner.cleanup()
    assert seen, (out + err).decode()
    for headers in seen:
        assert "Authorization" not in headers and "X-Drift-Auth" in headers
        assert SECRET not in json.dumps(headers)
    assert SECRET not in (out + err).decode()
