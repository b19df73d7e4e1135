"""Between a client's sessions on a server: the ended session's sockets close in the
background, and a spare handshaken WebSocket waits for the next session there.

A session on a fresh socket first pays the connection (TCP, TLS, the HTTP upgrade with the
swarm-key proof: 2-3 round trips and both sides' CPU) and then its open message (one more).
A server this client uses is likely used again (the next generate(), the next chat turn),
so after a session's first step on a server (off that step's path), and again when it
ends if none is left by then, a spare to that server is handshaken in the background, and
the next session there opens on it: one round trip.

A handshake proves the swarm key for one session (the server refuses a second on it), so a
socket is never reused after its session: a spare is a fresh handshake. A spare is closed
after `keep_s` unused (before the server's own idle timeout for a socket without a session,
30 s by default, would close it); on one the server closed sooner, a fresh socket is opened
instead. Knows nothing about routing.

A session's end does not wait for its servers' replies to the close (a round trip: a
generate() returns without it); the client's next session on those servers opens after that
close is through (`ended`), so its servers have freed the old session's cache first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any

import aiohttp

from drift.client.config import ClientConfig
from drift.client.routing import Hop
from drift.client.transport import SpanSocket, close_all, close_ws
from drift.wire.errors import DriftError, PeerUnavailable

log = logging.getLogger(__name__)

Connect = Callable[[Hop], Awaitable[aiohttp.ClientWebSocketResponse]]
CLOSE_TIMEOUT_S = 10.0  # a spare's close waits this long for its server (aiohttp's own default)


class Spares:
    """At most one spare socket per server address; all of it on the client's loop."""

    def __init__(self, connect: Connect, keep_s: float) -> None:
        self._connect = connect
        self.keep_s = keep_s  # 0: no spares
        self._ready: dict[tuple[str, str], tuple[aiohttp.ClientWebSocketResponse, float]] = {}
        self._making: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._closing: set[asyncio.Task[None]] = set()  # spares closed at keep_s, closing
        self._ending: dict[asyncio.Task[None], frozenset[str]] = {}  # ended sessions, by peers
        self._closed = False
        self.taken = 0  # spares handed out (sessions opened on one, or tried)

    def end(self, sockets: Iterable[SpanSocket]) -> asyncio.Task[None]:
        """(On the client's loop) A session ended: close its sockets in the background (their
        servers free it), then make a spare to each of those servers if none is ready (one
        made after its first step lives `keep_s`). Await the task to wait for the servers'
        replies; `ended` waits for it too."""
        socks = list(sockets)
        task = asyncio.get_running_loop().create_task(self._end(socks))
        self._ending[task] = frozenset(sock.hop.peer_id for sock in socks)
        task.add_done_callback(lambda done: self._ending.pop(done, None))
        return task

    async def _end(self, socks: list[SpanSocket]) -> None:
        await close_all(socks)
        for sock in socks:
            self.refill(sock.hop)

    async def ended(self, peers: Collection[str]) -> None:
        """Once the sessions ended on any of `peers` are closed there."""
        ending = [task for task, those in self._ending.items() if not those.isdisjoint(peers)]
        if ending:
            await asyncio.wait(ending)

    @property
    def ready(self) -> int:
        """Spares handshaken and waiting."""
        return len(self._ready)

    async def open(self, hop: Hop, request: Any, config: ClientConfig, *,
                   wait: bool = True) -> SpanSocket | None:  # fmt: skip
        """`request`'s session opened on the spare to `hop`'s server; None if there is no
        spare, or the server had closed it (open a fresh socket then). A refusal, or a
        server that does not answer, rises as from a fresh socket. `wait=False`: the open
        only sent (SpanSocket.begin), so a spare the server had closed shows at its reply."""
        ws = await self.take(hop)
        if ws is None:
            return None
        try:
            return await SpanSocket.begin(hop, ws, request, config, wait=wait)
        except DriftError as exc:
            closed = isinstance(exc, PeerUnavailable) and not isinstance(
                exc.__cause__, asyncio.TimeoutError
            )
            if not closed:
                raise
            log.debug("the spare socket to %s was closed (%r): a fresh one", hop.peer_id, exc)
            return None

    async def take(self, hop: Hop) -> aiohttp.ClientWebSocketResponse | None:
        """The spare to `hop`'s server if one is ready (or its handshake under way: waiting
        for it is no slower than a fresh one), else None."""
        key = (hop.peer_id, hop.addr)
        making = self._making.get(key)
        if making is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(making)  # it logs its own failure and leaves no spare
        ready = self._ready.pop(key, None)
        if ready is None:
            return None
        ws, made = ready
        if ws.closed or time.monotonic() - made > self.keep_s:
            await _close(ws)
            return None
        self.taken += 1
        return ws

    def refill(self, hop: Hop) -> None:
        """Handshake a spare to `hop`'s server in the background, unless one is ready or
        under way (or spares are off). Call on the client's loop."""
        key = (hop.peer_id, hop.addr)
        if self._closed or self.keep_s <= 0 or key in self._ready or key in self._making:
            return
        self._making[key] = asyncio.get_running_loop().create_task(self._make(key, hop))

    async def _make(self, key: tuple[str, str], hop: Hop) -> None:
        try:
            ws = await self._connect(hop)
        except Exception as exc:  # noqa: BLE001 -- no spare: the next session connects itself
            log.debug("no spare socket to %s: %r", hop.peer_id, exc)
            return
        finally:
            self._making.pop(key, None)
        if self._closed:
            await _close(ws)
            return
        self._ready[key] = (ws, time.monotonic())
        asyncio.get_running_loop().call_later(self.keep_s, self._expire, key, ws)

    def _expire(self, key: tuple[str, str], ws: aiohttp.ClientWebSocketResponse) -> None:
        """`keep_s` after it was made: close the spare if it is still waiting."""
        ready = self._ready.get(key)
        if ready is None or ready[0] is not ws:
            return  # taken (or closed with the rest)
        del self._ready[key]
        task = asyncio.get_running_loop().create_task(_close(ws))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Finish closing ended sessions; close every spare and stop the handshakes under
        way; no more are made."""
        self._closed = True
        if self._ending:
            await asyncio.wait(list(self._ending))
        making = list(self._making.values())
        for task in making:
            task.cancel()
        await asyncio.gather(*making, return_exceptions=True)
        ready, self._ready = list(self._ready.values()), {}
        await asyncio.gather(*(_close(ws) for ws, _ in ready), *self._closing)


async def _close(ws: aiohttp.ClientWebSocketResponse) -> None:
    await close_ws(ws, CLOSE_TIMEOUT_S)
