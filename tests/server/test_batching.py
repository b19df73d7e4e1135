"""Concurrent sessions' steps on a real server run as one forward and equal each run alone.

The compute thread is held busy (a job waiting on an event) while every session sends its
step, so they are all queued when it frees: deterministic batching, no timing. Families
with sliding windows (mistral, gemma3) and ALiBi (falcon) beside llama; a step that fails
its session's own checks (position past the end) gets its error while the others in its
batch get their outputs; /metrics shows the batch sizes and each forward's seconds.
"""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest
import torch

from drift.models.checkpoint import Checkpoint
from drift.models.span import ModelSpan
from drift.wire import messages as m
from drift.wire.extras import concrete
from drift.wire.lora import lora_name
from tests.server.wsclient import RawSession
from tests.tiny_models import save_tiny

pytestmark = pytest.mark.timeout(120)

PASTS = (6, 2, 9, 1)  # prompt tokens of each session before the batched steps
ROWS = (1, 2, 1, 1)


async def _queued(server, n: int) -> None:
    while server.sessions.batcher.queued < n:
        await asyncio.sleep(0.01)


def _hidden(seed: int, rows: int, tokens: int) -> torch.Tensor:
    return torch.randn(rows, tokens, 64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3_text", "falcon_alibi"])
async def test_queued_steps_run_as_one_forward_and_equal_alone(family, servers, tmp_path):
    model_dir = save_tiny(family, tmp_path / family)
    n = Checkpoint(model_dir).config.num_hidden_layers
    running = await servers(model_dir, 0, n)
    server, fp = running.server, running.server.backend.fingerprint
    span = ModelSpan.load(Checkpoint(model_dir), 0, n)
    alone = [span.new_session(batch_size=rows, max_length=32) for rows in ROWS]
    async with aiohttp.ClientSession() as http:
        remote = [await RawSession.open(http, running.url, fp, 0, n, max_length=32,
                                        batch_size=rows) for rows in ROWS]  # fmt: skip
        positions = [0] * len(ROWS)
        for u, (past, rows) in enumerate(zip(PASTS, ROWS, strict=True)):  # prompts, one at a time
            x = _hidden(u, rows, past)
            got = await remote[u].step(x, 0)
            torch.testing.assert_close(got, alone[u].step(x), atol=1e-5, rtol=0)
            positions[u] = past
        for t in range(3):
            xs = [_hidden(10 * t + u, rows, 1) for u, rows in enumerate(ROWS)]
            bad = 3 if t == 2 else None  # its step claims a position past the session's end
            gate = threading.Event()
            server.backend.executor.submit(gate.wait)
            for u, x in enumerate(xs):
                await remote[u].send_step(x, 20 if u == bad else positions[u])
            await _queued(server, len(ROWS))
            gate.set()
            for u, x in enumerate(xs):
                msg = await remote[u].ws.receive()
                if u == bad:
                    assert msg.type == aiohttp.WSMsgType.TEXT and "length" in msg.data
                    continue
                got = m.decode(m.StepResponse, msg.data).hidden_states
                torch.testing.assert_close(got, alone[u].step(x), atol=1e-5, rtol=0)
                positions[u] += 1
        async with http.get(f"{running.url}/metrics") as resp:
            text = await resp.text()
        for s in remote:
            await s.close()
    buckets = {line.split('le="')[1].split('"')[0]: float(line.split()[-1])
               for line in text.splitlines()
               if line.startswith("drift_step_batch_size_bucket")}  # fmt: skip
    assert buckets["+Inf"] - buckets["2"] >= 2  # two rounds of 4 sessions in one forward
    # each forward is timed once, compute only: within the latency of the steps it served
    # (which also count the wait behind the gate)
    values = {line.split()[0]: float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(("drift_step_forward_seconds_", "drift_step_latency_seconds_"))}  # fmt: skip
    assert values["drift_step_forward_seconds_count"] == buckets["+Inf"]
    assert 0 < values["drift_step_forward_seconds_sum"] < values["drift_step_latency_seconds_sum"]


async def test_sessions_stepping_in_turn_wait_for_each_other(servers, tmp_path):
    """With batch_wait_ms, sessions stepping concurrently in loops get their solo outputs
    (a wait never changes numbers, and a session that stops stepping is not waited for)."""
    model_dir = save_tiny("llama", tmp_path / "llama")
    running = await servers(model_dir, 0, 4, batch_wait_ms=50)
    fp = running.server.backend.fingerprint
    span = ModelSpan.load(Checkpoint(model_dir), 0, 4)

    async def user(http, u: int) -> None:
        remote = await RawSession.open(http, running.url, fp, 0, 4, max_length=32)
        alone = span.new_session(batch_size=1, max_length=32)
        for t in range(6 + u):  # users stop one after another
            x = _hidden(100 * u + t, 1, 3 if t == 0 else 1)
            position = 0 if t == 0 else 2 + t
            got = await remote.step(x, position)
            torch.testing.assert_close(got, alone.step(x), atol=1e-5, rtol=0)
        await remote.close()

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(user(http, u) for u in range(3)))
    assert running.server.sessions.batcher.sizes.count >= 6


async def test_a_lora_session_is_never_batched_with_a_plain_one(servers, tmp_path):
    """A session whose first step sent LoRA weights keeps them for its later steps; queued
    beside a plain session's step, each still gets what it gets alone (LoRA applies to the
    whole span while a forward runs, so such a session runs alone)."""
    model_dir = save_tiny("llama", tmp_path / "llama")
    running = await servers(model_dir, 0, 2)
    server, fp = running.server, running.server.backend.fingerprint
    gen = torch.Generator().manual_seed(0)
    lora = {lora_name(b, "self_attn.q_proj", ab): torch.randn(*shape, generator=gen) * 0.3
            for b in (0, 1) for ab, shape in (("A", (2, 64)), ("B", (64, 2)))}  # fmt: skip
    x0, x1, y0, y1 = (_hidden(s, 1, t) for s, t in ((1, 4), (2, 1), (3, 5), (4, 1)))
    span = ModelSpan.load(Checkpoint(model_dir), 0, 2)
    want = {}
    for name, weights, steps in (("lora", lora, (x0, x1)), ("base", {}, (x0, x1)),
                                 ("plain", {}, (y0, y1))):  # fmt: skip
        with span.serving(weights):
            alone = span.new_session(batch_size=1, max_length=16)
            want[name] = [alone.step(x) for x in steps]
    assert (want["lora"][1] - want["base"][1]).abs().max() > 1e-3  # the weights matter here
    async with aiohttp.ClientSession() as http:
        a = await RawSession.open(http, running.url, fp, 0, 2, max_length=16)
        b = await RawSession.open(http, running.url, fp, 0, 2, max_length=16)
        torch.testing.assert_close(await a.step(x0, 0, extras=lora), want["lora"][0],
                                   atol=1e-5, rtol=0)  # fmt: skip
        await b.step(y0, 0)
        gate = threading.Event()
        server.backend.executor.submit(gate.wait)
        await a.send_step(x1, 4)
        await b.send_step(y1, 5)
        while sum(s.busy for s in server.sessions.sessions.values()) < 2:
            await asyncio.sleep(0.01)  # both steps taken in (queued or waiting for the thread)
        gate.set()
        got = [m.decode(m.StepResponse, (await s.ws.receive()).data).hidden_states for s in (a, b)]
        for s in (a, b):
            await s.close()
    torch.testing.assert_close(got[0], want["lora"][1], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], want["plain"][1], atol=1e-5, rtol=0)


async def test_a_long_step_of_a_session_running_alone_goes_in_chunks(servers, tmp_path):
    """A session with LoRA weights runs alone (never batched); its 9-token step on a server
    of 4-token chunks runs as 3 chunks and equals the step run whole in-process."""
    model_dir = save_tiny("llama", tmp_path / "llama")
    running = await servers(model_dir, 0, 2, chunk_tokens=4)
    server, fp = running.server, running.server.backend.fingerprint
    gen = torch.Generator().manual_seed(1)
    lora = {lora_name(b, "self_attn.q_proj", ab): torch.randn(*shape, generator=gen) * 0.3
            for b in (0, 1) for ab, shape in (("A", (2, 64)), ("B", (64, 2)))}  # fmt: skip
    x, y = _hidden(5, 1, 9), _hidden(6, 1, 1)
    span = ModelSpan.load(Checkpoint(model_dir), 0, 2)
    with span.serving(lora):
        alone = span.new_session(batch_size=1, max_length=16)
        want = [alone.step(x), alone.step(y)]
    async with aiohttp.ClientSession() as http:
        remote = await RawSession.open(http, running.url, fp, 0, 2, max_length=16)
        chunks = server.backend.chunks_run
        torch.testing.assert_close(await remote.step(x, 0, extras=lora), want[0],
                                   atol=1e-5, rtol=0)  # fmt: skip
        assert server.backend.chunks_run - chunks == 3
        torch.testing.assert_close(await remote.step(y, 9), want[1], atol=1e-5, rtol=0)
        await remote.close()


async def test_gemma4_steps_with_extras_run_as_one_forward(servers, tmp_path):
    """A Gemma 4 server for blocks [2, 5) (donor 2's K/V, read by block 5, are asked back;
    donor 3's are read by block 4 inside the span): three sessions' queued steps, each with
    its per-layer inputs, run as one forward; each gets the output and the donated K/V it
    gets alone, and a step asking for every block's states runs alone. Chunks of 4 tokens:
    the 6- and 9-token prompts run in chunks, their named tensors cut to match and the K/V
    each chunk donates joined in the reply."""
    model_dir = save_tiny("gemma4_text", tmp_path / "gemma4_text")
    running = await servers(model_dir, 2, 5, chunk_tokens=4)
    server, fp = running.server, running.server.backend.fingerprint
    span = ModelSpan.load(Checkpoint(model_dir), 2, 5)
    spec = span.extra_spec(2, 5)
    assert [d for d, _ in spec.donors] == [2]
    gen = torch.Generator().manual_seed(0)
    # float reduction order of a 4-row batch against a row alone, on hidden states of |x| ~ 3
    tol = {"atol": 1e-5, "rtol": 1e-5}

    def extras(rows: int, tokens: int) -> dict[str, torch.Tensor]:
        return {name: torch.randn(concrete(shape, rows, tokens), generator=gen)
                for name, shape in spec.inputs}  # fmt: skip

    alone = [span.new_session(batch_size=rows, max_length=32) for rows in ROWS[:3]]
    async with aiohttp.ClientSession() as http:
        remote = [await RawSession.open(http, running.url, fp, 2, 5, max_length=32,
                                        batch_size=rows) for rows in ROWS[:3]]  # fmt: skip
        for u, (past, rows) in enumerate(zip(PASTS[:3], ROWS[:3], strict=True)):
            x, named = _hidden(u, rows, past), extras(rows, past)
            chunks = server.sessions.batcher.sizes.count
            await remote[u].send_step(x, 0, extras=named, donate=(2,))
            got = await _reply(remote[u], (2,))
            assert server.sessions.batcher.sizes.count - chunks == -(-past // 4)
            out, donated = alone[u].run(0, x, extras=named, donate=(2,))
            torch.testing.assert_close(got.hidden_states, out, **tol)
            assert sorted(got.extras) == ["kv.2.k", "kv.2.v"]
            for name, value in donated.items():
                torch.testing.assert_close(got.extras[name], value, **tol)
        sizes = server.sessions.batcher.sizes.count
        for t in range(2):
            xs = [_hidden(10 * t + u, rows, 1) for u, rows in enumerate(ROWS[:3])]
            named = [extras(rows, 1) for rows in ROWS[:3]]
            gate = threading.Event()
            server.backend.executor.submit(gate.wait)
            for u, x in enumerate(xs):
                await remote[u].send_step(x, PASTS[u] + t, extras=named[u], donate=(2,))
            await _queued(server, 3)
            gate.set()
            for u, x in enumerate(xs):
                reply = await _reply(remote[u], (2,))
                out, donated = alone[u].run(PASTS[u] + t, x, extras=named[u], donate=(2,))
                torch.testing.assert_close(reply.hidden_states, out, **tol)
                assert sorted(reply.extras) == ["kv.2.k", "kv.2.v"]
                for name, value in donated.items():
                    torch.testing.assert_close(reply.extras[name], value, **tol)
        assert server.sessions.batcher.sizes.count == sizes + 2  # one forward per round
        x, named = _hidden(50, 1, 1), extras(1, 1)
        await remote[0].send_step(x, PASTS[0] + 2, extras=named, donate=(2,), block_states=True)
        reply = await _reply(remote[0], (2,), states=3)
        want, _ = alone[0].run(PASTS[0] + 2, x, extras=named, donate=(2,))
        torch.testing.assert_close(reply.hidden_states, want, **tol)
        assert server.sessions.batcher.sizes.count == sizes + 2  # not through the batcher
        for s in remote:
            await s.close()


async def _reply(session: RawSession, donate: tuple[int, ...], states: int = 0) -> m.StepResponse:
    msg = await session.ws.receive()
    assert msg.type == aiohttp.WSMsgType.BINARY, msg.data
    return m.decode(m.StepResponse, msg.data, donate=donate, states=states)
