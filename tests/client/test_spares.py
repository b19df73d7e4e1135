"""Spare sockets (drift.client.spares): once a session opened, a handshaken socket to each of
its servers waits for the next session, which opens on it without a handshake of its own.
Against real servers on loopback: the second generate() handshakes nothing before its
steps, a spare the server closed meanwhile is replaced by a fresh socket without a ban,
a private swarm's spare carries its own proof (one session per handshake still holds), and
closing the model closes the spares. Every answer equals local transformers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import torch

from drift.client import ClientConfig
from drift.client.transport import SpanSocket
from tests.server.reference import load_reference

KEY = "spare-sockets-test-key"
IDS = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(3))


@pytest.fixture
def fresh_opens(monkeypatch) -> list[str]:
    """The peers every fresh socket (a handshake on a session's critical path) went to."""
    opened: list[str] = []
    original = SpanSocket.open.__func__  # type: ignore[attr-defined]

    async def counted(cls, http, hop, request, config, **kwargs):
        opened.append(hop.peer_id)
        return await original(cls, http, hop, request, config, **kwargs)

    monkeypatch.setattr(SpanSocket, "open", classmethod(counted))
    return opened


async def _wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _generate(model, local) -> None:
    out = model.generate(IDS, max_new_tokens=5, do_sample=False)
    assert torch.equal(out, local.generate(IDS, max_new_tokens=5, do_sample=False))


async def test_the_next_session_opens_on_spare_sockets(tiny_dirs, swarm_model, fresh_opens):
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4)])
    spares = model.client.spares
    await asyncio.to_thread(_generate, model, local)
    assert len(fresh_opens) == 2  # the first session: a handshake per server
    # a spare to each server is handshaken in the background
    await _wait_for(lambda: spares.ready == 2)
    await asyncio.to_thread(_generate, model, local)
    assert len(fresh_opens) == 2 and spares.taken == 2  # the second opened on the spares
    await asyncio.to_thread(_generate, model, local)  # at once: spares made after its 1st step
    assert len(fresh_opens) == 2 and spares.taken == 4
    await _wait_for(lambda: spares.ready == 2)  # and made spares again
    ready = [ws for ws, _ in spares._ready.values()]
    held = [_open_sockets(s) for s in swarm.servers]
    await asyncio.to_thread(model.close)
    assert all(ws.closed for ws in ready)  # closing the model closes its spares
    await _wait_for(_each_closed_one(swarm, held))  # on the servers too


async def test_a_spare_the_server_closed_is_replaced_without_a_ban(
    tiny_dirs, swarms, sdk_models, fresh_opens
) -> None:
    """A server closes a socket with no session after its idle timeout (here 0.3 s, shorter
    than the client keeps a spare): the next session finds its spare closed and opens a
    fresh socket; nobody is banned."""
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], node={"idle_timeout_s": 0.3})
    model = await sdk_models.open(model_dir, swarm.token)
    bans: list[str] = []
    ban = model.client.bans.ban
    model.client.bans.ban = lambda peer, **kw: bans.append(peer) or ban(peer, **kw)
    await asyncio.to_thread(_generate, model, local)
    await _wait_for(lambda: model.client.spares.ready == 2)
    held = [_open_sockets(s) for s in swarm.servers]  # the spare and a push link
    await _wait_for(_each_closed_one(swarm, held))  # each server closed its spare
    await asyncio.to_thread(_generate, model, local)
    assert model.client.spares.taken == 2 and len(fresh_opens) == 4 and not bans


def _open_sockets(running) -> int:
    return sum(not ws.closed for ws in running.server.sockets)


def _each_closed_one(swarm, held: list[int]) -> Callable[[], bool]:
    """Whether each server has one socket fewer open than `held` says it had."""
    return lambda: all(_open_sockets(s) <= n - 1 for s, n in zip(swarm.servers, held, strict=True))


async def test_a_spare_is_closed_after_spare_socket_s(tiny_dirs, swarms, sdk_models) -> None:
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token,
                                  client_config=ClientConfig(spare_socket_s=0.5))  # fmt: skip
    await asyncio.to_thread(_generate, model, local)
    await _wait_for(lambda: model.client.spares.ready == 2)
    await _wait_for(lambda: model.client.spares.ready == 0)  # closed by the client
    await _wait_for(lambda: _open_sockets(swarm.servers[0]) == 0)


async def test_a_private_swarms_spare_carries_its_own_proof(tiny_dirs, swarms, sdk_models,
                                                            fresh_opens) -> None:  # fmt: skip
    """Each spare is a fresh handshake with a fresh proof: sessions keep opening one per
    socket (the server refuses a second session on a proven socket)."""
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], swarm_key=KEY)
    model = await sdk_models.open(model_dir, swarm.token, swarm_key=KEY)
    for _ in range(3):
        await asyncio.to_thread(_generate, model, local)
        await _wait_for(lambda: model.client.spares.ready == 2)
    assert len(fresh_opens) == 2 and model.client.spares.taken == 4


async def test_no_spares_when_turned_off(tiny_dirs, swarms, sdk_models, fresh_opens) -> None:
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token,
                                  client_config=ClientConfig(spare_socket_s=0))  # fmt: skip
    for _ in range(2):
        await asyncio.to_thread(_generate, model, local)
        await asyncio.sleep(0.2)  # a spare would be handshaken by now
        assert model.client.spares.ready == 0
    assert len(fresh_opens) == 4 and model.client.spares.taken == 0


async def test_generate_returns_before_its_close_and_the_next_session_opens_after(
    tiny_dirs, swarm_model, monkeypatch
) -> None:
    """generate() does not wait for its servers' replies to the session's close (here held
    back 0.5 s); the next session on those servers opens only once that close is through."""
    import drift.client.spares as spares_module

    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    _, model = await swarm_model(model_dir, [(0, 2), (2, 4)])
    events: list[str] = []
    close_all, begin = spares_module.close_all, SpanSocket.begin.__func__  # type: ignore[attr-defined]

    async def slow_close(socks):
        await asyncio.sleep(0.5)
        events.append("closed")
        await close_all(socks)

    async def counted_begin(cls, hop, ws, request, config, **kwargs):
        events.append("open")
        return await begin(cls, hop, ws, request, config, **kwargs)

    monkeypatch.setattr(spares_module, "close_all", slow_close)
    monkeypatch.setattr(SpanSocket, "begin", classmethod(counted_begin))
    await asyncio.to_thread(_generate, model, local)  # warm (and its close, held back)
    await _wait_for(lambda: "closed" in events and model.client.spares.ready == 2)
    events.clear()
    started = time.monotonic()
    await asyncio.to_thread(model.generate, IDS, max_new_tokens=2, do_sample=False)
    assert time.monotonic() - started < 0.5 and events == ["open", "open"]
    await asyncio.to_thread(_generate, model, local)
    assert events[:5] == ["open", "open", "closed", "open", "open"], events
