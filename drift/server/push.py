"""Server-to-server push (drift.wire.push): the links this server pushes over and whom it
pushes to (the /push WebSocket other servers push into is drift.server.push_route; each
session's socket, lock and last step id are its `Session`'s, drift.server.sessions).

A step that names `next` hops runs here, then goes on to the first hop over a persistent
WebSocket to its /push (authenticated with the swarm key like any call, TLS bound to its
peer id); that server runs it on the session it names and replies to the client on that
session's own socket. A server pushes only to a peer its swarm table holds live at the
address named (else `push_refused`); a pushed step older than one the session already ran
(a client that gave up on the push and relayed it) is dropped, and the receiver takes a
pushed step only with its session's push token (drift.wire.push; checked in push_route).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
from aiohttp import WSMsgType

from drift.node.membership import MembershipNode
from drift.swarm.dial import peer_ssl
from drift.waits import wait_for
from drift.wire.auth import auth_headers
from drift.wire.errors import PushRefused
from drift.wire.push import NextHop

log = logging.getLogger(__name__)
PUSH_PATH = "/push"
CONNECT_TIMEOUT_S = 5.0  # opening a link to the next server (in the background)
WAIT_S = 0.5  # how long a step's reply waits for its push to be sent on a kept link


def check_member(node: MembershipNode, hop: NextHop) -> None:
    """PushRefused unless `hop` is a live member of this server's table at an address it
    proved (drift.node.admission: in an open swarm, every announced address is dialled and
    proven before the record is trusted)."""
    record = node.table.get(hop.peer_id)
    if record is None or not node.table.is_live(hop.peer_id, node.clock()):
        raise PushRefused(f"will not push to peer {hop.peer_id}: it is not a live member of "
                          "this server's swarm table", peer_id=hop.peer_id)  # fmt: skip
    if hop.addr not in record.addrs or not node.admission.is_proven(hop.peer_id, hop.addr):
        raise PushRefused(f"will not push to peer {hop.peer_id} at {hop.addr}: its record "
                          f"announces {list(record.addrs)}", peer_id=hop.peer_id)  # fmt: skip
    if hop.push_token is None:
        raise PushRefused(f"will not push to peer {hop.peer_id}: the hop names no push_token "
                          "for its session (its server issued none): relay instead",
                          peer_id=hop.peer_id)  # fmt: skip


class PeerLinks:
    """One outgoing WebSocket per (address, peer id), opened on first use and kept."""

    def __init__(self) -> None:
        self._links: dict[tuple[str, str], aiohttp.ClientWebSocketResponse] = {}
        self._opening: dict[tuple[str, str], asyncio.Lock] = {}
        self._opening_tasks: dict[tuple[str, str], asyncio.Task[Any]] = {}
        self._readers: set[asyncio.Task[None]] = set()

    async def send(self, node: MembershipNode, hop: NextHop, data: bytes) -> None:
        """Send one frame to `hop` over the kept link, within WAIT_S; raises if there is none
        yet or it broke (then one is opened in the background, for later steps: the reply to
        the client never waits for a handshake)."""
        key = (hop.addr, hop.peer_id)
        ws = self._links.get(key)
        if ws is None or ws.closed:
            self._open_soon(node, hop)
            raise ConnectionError("no link to it yet (opening one for the next steps)")
        try:
            await wait_for(ws.send_bytes(data), WAIT_S)
        except (aiohttp.ClientError, ConnectionError, RuntimeError, asyncio.TimeoutError):
            await ws.close()
            if self._links.get(key) is ws:
                del self._links[key]
            self._open_soon(node, hop)
            raise

    def _open_soon(self, node: MembershipNode, hop: NextHop) -> None:
        key = (hop.addr, hop.peer_id)
        task = self._opening_tasks.get(key)
        if task is None or task.done():
            task = asyncio.create_task(self._link(node, hop))
            task.add_done_callback(_retrieved)
            self._opening_tasks[key] = task

    async def _link(self, node: MembershipNode, hop: NextHop) -> aiohttp.ClientWebSocketResponse:
        key = (hop.addr, hop.peer_id)
        async with self._opening.setdefault(key, asyncio.Lock()):
            ws = self._links.get(key)
            if ws is not None and not ws.closed:
                return ws
            if node.http is None:
                raise RuntimeError("this node is not running")
            headers = auth_headers(node.config.swarm_key, "GET", PUSH_PATH, peer_id=hop.peer_id)
            ws = await wait_for(node.http.ws_connect(
                f"{hop.addr}{PUSH_PATH}", headers=headers, max_msg_size=0,
                ssl=peer_ssl(hop.peer_id),
            ), CONNECT_TIMEOUT_S)  # fmt: skip
            self._links[key] = ws
            task = asyncio.create_task(self._drain(key, ws))
            self._readers.add(task)
            task.add_done_callback(self._readers.discard)
            return ws

    async def _drain(self, key: tuple[str, str], ws: aiohttp.ClientWebSocketResponse) -> None:
        """Read what the peer says back on a link (errors about pushed steps: logged)."""
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                log.warning("push link to %s says: %s", key[1], msg.data[:500])
        if self._links.get(key) is ws:
            del self._links[key]

    async def close(self) -> None:
        for ws in list(self._links.values()):
            with contextlib.suppress(Exception):
                await ws.close()
        self._links.clear()
        for task in [*self._readers, *self._opening_tasks.values()]:
            task.cancel()


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A background link opening's failure, logged (not left unretrieved)."""
    if not task.cancelled() and task.exception() is not None:
        log.info("push link failed to open: %r", task.exception())


def forward_error(hop: NextHop, exc: BaseException) -> str:
    """What a reply says when its step could not go on to `hop`."""
    return f"could not push to {hop.peer_id} at {hop.addr}: {exc!r}"
