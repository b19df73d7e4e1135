"""The step batcher cannot be wedged, and waits only for sessions that are stepping.

Through a real server: a step that waited longer than RECENT_S for the compute thread (its
session then dropped from the batcher's recent table) runs, and so do the steps after it
(main raised ValueError in `_gather` there and never ran a step again); a drain job that
fails for any other reason fails only its own steps, is counted on /metrics, and the next
step runs; a held idle session (stepped, then kept open) costs another session's steps no
wait, and one that stopped stepping while still due costs one wait at most, none once its
client said it is idle; a prompt's step never waits for decoding sessions: counted, not timed.
"""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import orjson
import pytest
import torch

from drift.models.checkpoint import Checkpoint
from drift.models.span import ModelSpan
from drift.server import batcher as batcher_module
from drift.wire import messages as m
from tests.server.wsclient import RawSession
from tests.tiny_models import save_tiny

pytestmark = pytest.mark.timeout(120)


def _hidden(seed: int, tokens: int) -> torch.Tensor:
    return torch.randn(1, tokens, 64, generator=torch.Generator().manual_seed(seed))


async def _metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("drift_batch_")}  # fmt: skip


async def test_a_step_that_outwaited_recent_s_runs_and_the_server_steps_on(
    servers, tmp_path, monkeypatch
):
    monkeypatch.setattr(batcher_module, "RECENT_S", 0.05)
    model_dir = save_tiny("llama", tmp_path / "llama")
    running = await servers(model_dir, 0, 2, batch_wait_ms=10)
    server, fp = running.server, running.server.backend.fingerprint
    alone = ModelSpan.load(Checkpoint(model_dir), 0, 2).new_session(batch_size=1, max_length=16)
    async with aiohttp.ClientSession() as http:
        remote = await RawSession.open(http, running.url, fp, 0, 2, max_length=16)
        x0, x1 = _hidden(0, 3), _hidden(1, 1)
        gate = threading.Event()
        server.backend.executor.submit(gate.wait)  # the compute thread is busy elsewhere
        await remote.send_step(x0, 0)
        while server.sessions.batcher.queued < 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # queued longer than RECENT_S: dropped from the recent table
        gate.set()
        got = await asyncio.wait_for(remote.ws.receive(), 30)  # main: never answered
        torch.testing.assert_close(m.decode(m.StepResponse, got.data).hidden_states,
                                   alone.step(x0), atol=1e-5, rtol=0)  # fmt: skip
        out = await asyncio.wait_for(remote.step(x1, 3), 30)  # the server still steps
        torch.testing.assert_close(out, alone.step(x1), atol=1e-5, rtol=0)
        assert (await _metrics(http, running.url))["drift_batch_drains_failed_total"] == 0
        await remote.close()


async def test_a_failing_drain_fails_only_its_steps_and_is_counted(servers, tmp_path):
    model_dir = save_tiny("llama", tmp_path / "llama")
    running = await servers(model_dir, 0, 2)
    batcher, fp = running.server.sessions.batcher, running.server.backend.fingerprint
    alone = ModelSpan.load(Checkpoint(model_dir), 0, 2).new_session(batch_size=1, max_length=16)
    groups = batcher._groups

    def broken(items):  # a bug in the drain job, outside any forward
        batcher._groups = groups
        raise RuntimeError("drain bug")

    async with aiohttp.ClientSession() as http:
        remote = await RawSession.open(http, running.url, fp, 0, 2, max_length=16)
        batcher._groups = broken
        error = await asyncio.wait_for(remote.step_error(_hidden(0, 3), 0), 30)
        assert error["code"] == "internal"  # the step got the error (not left waiting)
        x0, x1 = _hidden(0, 3), _hidden(1, 1)
        torch.testing.assert_close(await asyncio.wait_for(remote.step(x0, 0), 30),
                                   alone.step(x0), atol=1e-5, rtol=0)  # fmt: skip
        torch.testing.assert_close(await asyncio.wait_for(remote.step(x1, 3), 30),
                                   alone.step(x1), atol=1e-5, rtol=0)  # fmt: skip
        assert (await _metrics(http, running.url))["drift_batch_drains_failed_total"] == 1
        await remote.close()


async def test_a_held_idle_session_costs_another_session_no_wait(servers, tmp_path, monkeypatch):
    """RECENT_S raised so that main's rule (wait for every session that stepped in the last
    RECENT_S) waits on every step of B; a session whose next step is not due is not waited for."""
    running, span = await _server(servers, tmp_path, monkeypatch, batch_wait_ms=50)
    batcher, fp = running.server.sessions.batcher, running.server.backend.fingerprint
    async with aiohttp.ClientSession() as http:
        held = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        for t in range(4):  # a request's steps, then the session is kept open, idle
            await held.step(_hidden(t, 3 if t == 0 else 1), 0 if t == 0 else 2 + t)
        pace = next(iter(batcher._seen.values()))
        assert pace.gap is not None
        await asyncio.sleep(2 * pace.gap + batcher.wait_s + 0.05)  # its next step is not due
        before = (batcher.waits, batcher.vain_waits)
        other = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        alone = span.new_session(batch_size=1, max_length=32)
        for t in range(8):
            x = _hidden(100 + t, 3 if t == 0 else 1)
            got = await other.step(x, 0 if t == 0 else 2 + t)
            torch.testing.assert_close(got, alone.step(x), atol=1e-5, rtol=0)
        assert (batcher.waits, batcher.vain_waits) == before == (0, 0)
        metrics = await _metrics(http, running.url)
        assert metrics["drift_batch_vain_waits_total"] == metrics["drift_batch_waits_total"] == 0
        await other.close()
        await held.close()


async def _server(servers, tmp_path, monkeypatch, batch_wait_ms: int):  # type: ignore[no-untyped-def]
    """A real server over a tiny Llama's 2 blocks (sessions count as stepping for a minute
    after their last step: RECENT_S) and the same blocks in-process for reference."""
    monkeypatch.setattr(batcher_module, "RECENT_S", 60.0)
    model_dir = save_tiny("llama", tmp_path / "llama")
    running = await servers(model_dir, 0, 2, batch_wait_ms=batch_wait_ms)
    return running, ModelSpan.load(Checkpoint(model_dir), 0, 2)


async def _decode(remote: RawSession, alone, seed: int, steps: int, gap_s: float = 0.0) -> None:
    """A session's prompt (3 tokens) and decode steps, each checked against `alone`."""
    for t in range(steps):
        x = _hidden(seed + t, 3 if t == 0 else 1)
        got = await remote.step(x, 0 if t == 0 else 2 + t)
        torch.testing.assert_close(got, alone.step(x), atol=1e-5, rtol=0)
        await asyncio.sleep(gap_s)


async def test_a_prompt_step_does_not_wait_for_decoding_sessions(servers, tmp_path, monkeypatch):
    """A decoding session (one token per step) is due right after its step; a prompt step of
    another session could not share its forward, and is not held back for it (main waited
    batch_wait_ms for it: `drift api`'s new request waited for the rows it was holding up)."""
    running, span = await _server(servers, tmp_path, monkeypatch, batch_wait_ms=200)
    batcher, fp = running.server.sessions.batcher, running.server.backend.fingerprint
    async with aiohttp.ClientSession() as http:
        decoding = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        await _decode(decoding, span.new_session(batch_size=1, max_length=32), 0, 4)
        assert (batcher.waits, batcher.vain_waits) == (0, 0)
        prompt = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        await _decode(prompt, span.new_session(batch_size=1, max_length=32), 100, 1)
        assert (batcher.waits, batcher.vain_waits) == (0, 0)  # main: (1, 1), 200 ms
        await prompt.close()
        await decoding.close()


async def test_a_session_waited_for_in_vain_is_not_waited_for_again(servers, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    """A session that stepped every 0.4 s and stopped (a `drift api` row ended, its session
    held for the next turn) stays due for 2 x 0.4 s + batch_wait_ms: another session's steps
    wait for it once, in vain, then no more until it steps again (main: on each step of the
    other session for those 0.85 s)."""
    running, span = await _server(servers, tmp_path, monkeypatch, batch_wait_ms=50)
    batcher, fp = running.server.sessions.batcher, running.server.backend.fingerprint
    async with aiohttp.ClientSession() as http:
        held = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        await _decode(held, span.new_session(batch_size=1, max_length=32), 0, 4, gap_s=0.4)
        other = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        await _decode(other, span.new_session(batch_size=1, max_length=32), 100, 10)
        assert (batcher.waits, batcher.vain_waits) == (1, 1)
        await other.close()
        await held.close()


async def test_a_session_its_client_says_is_idle_is_not_waited_for(servers, tmp_path,
                                                                   monkeypatch):  # fmt: skip
    """As above, but the held session's client sends `idle` after its last step (drift api
    does, holding it for the next turn): the other session's steps wait for it not even once,
    and the held session's next step is exact and waited for again (main: one vain wait)."""
    running, span = await _server(servers, tmp_path, monkeypatch, batch_wait_ms=50)
    batcher, fp = running.server.sessions.batcher, running.server.backend.fingerprint
    async with aiohttp.ClientSession() as http:
        held = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        held_alone = span.new_session(batch_size=1, max_length=32)
        await _decode(held, held_alone, 0, 4, gap_s=0.4)
        await held.ws.send_str(orjson.dumps(m.IdleSession().to_wire()).decode())
        for _ in range(100):  # no reply comes: see it arrive
            if batcher.idle_notices:
                break
            await asyncio.sleep(0.01)
        other = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        await _decode(other, span.new_session(batch_size=1, max_length=32), 100, 10)
        assert (batcher.waits, batcher.vain_waits, batcher.idle_notices) == (0, 0, 1)
        metrics = await _metrics(http, running.url)
        assert metrics["drift_batch_idle_notices_total"] == 1
        x = _hidden(7, 1)  # the held session's next turn: no reply came to `idle`
        torch.testing.assert_close(await held.step(x, 6), held_alone.step(x), atol=1e-5, rtol=0)
        assert len(batcher._seen) == 2  # it steps again: waited for again
        await other.close()
        await held.close()


async def test_a_session_that_closes_while_waited_for_is_waited_for_no_longer(
    servers, tmp_path, monkeypatch
):
    """A drain waiting for a stepping session's step stops when that session closes (its
    cache is freed on the compute thread, behind the very drain waiting for it: main waited
    out the whole batch_wait_ms, 3 s here, for a session already gone)."""
    running, span = await _server(servers, tmp_path, monkeypatch, batch_wait_ms=3000)
    batcher, fp = running.server.sessions.batcher, running.server.backend.fingerprint
    async with aiohttp.ClientSession() as http:
        closing = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        await _decode(closing, span.new_session(batch_size=1, max_length=32), 0, 4, gap_s=0.3)
        other = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        alone = span.new_session(batch_size=1, max_length=32)
        await _decode(other, alone, 100, 1)  # a prompt's step: it waits for nobody
        assert batcher.waits == 0
        x = _hidden(101, 1)
        step = asyncio.create_task(other.step(x, 3))  # waits for `closing`'s next step...
        for _ in range(200):
            if batcher.queued == 1:  # queued: a drain job waits with it for `closing`
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        await closing.close()  # ...which never comes
        torch.testing.assert_close(await step, alone.step(x), atol=1e-5, rtol=0)
        assert batcher.waits == 1 and batcher.wait_s_total < 1.5, batcher.wait_s_total
        metrics = await _metrics(http, running.url)
        assert metrics["drift_batch_wait_seconds_total"] == pytest.approx(batcher.wait_s_total)
        await other.close()


async def test_a_convoy_split_in_two_joins_up(servers, tmp_path, monkeypatch):
    """Two pairs of sessions keep one pace (a reply, then 0.25 s of the client's own work, as
    clients of a chain whose halves travel apart), the second pair 0.1 s behind the first:
    more than batch_wait_ms after it. A drain waits for sessions of its own pace until they
    are due (their last step plus their gap), so within a few rounds all four step as one
    forward (main: forwards of 1-3 steps every round, waiting 50 ms in vain)."""
    running, span = await _server(servers, tmp_path, monkeypatch, batch_wait_ms=50)
    batcher, fp = running.server.sessions.batcher, running.server.backend.fingerprint
    sizes: list[int] = []
    observe = batcher.sizes.observe
    monkeypatch.setattr(batcher.sizes, "observe", lambda n: (sizes.append(int(n)), observe(n)))

    async def user(http: aiohttp.ClientSession, u: int, delay: float) -> None:
        await asyncio.sleep(delay)
        remote = await RawSession.open(http, running.url, fp, 0, 2, max_length=32)
        await _decode(remote, span.new_session(batch_size=1, max_length=32), 100 * u, 12,
                      gap_s=0.25)  # fmt: skip
        await remote.close()

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(user(http, u, 0.1 * (u // 2)) for u in range(4)))
    assert sizes[-9:-1] == [4] * 8, sizes  # the last may lack a session that ended first
