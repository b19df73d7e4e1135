"""Talking to one server over one inference WebSocket: its session's open, steps and close.

Steps and replies are the typed messages of drift.wire, sent as tensor frames (control
messages as text); every wait has a timeout from ClientConfig; server errors come back as
the DriftError they name, and a peer that cannot be reached raises PeerUnavailable. No
routing, no retries here. One-shot requests (/forward, /backward, /compute):
drift.client.calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiohttp
import torch

from drift.client.config import ClientConfig
from drift.client.routing import Hop
from drift.swarm.dial import peer_ssl
from drift.waits import wait_for
from drift.wire import codec
from drift.wire import messages as m
from drift.wire.auth import auth_headers
from drift.wire.checks import ACTIVATION_DTYPES
from drift.wire.errors import DriftError, PeerUnavailable, from_payload
from drift.wire.extend import ExtendSession, SessionExtended
from drift.wire.handoff import ResumeSession, raise_if_moved
from drift.wire.step import StepRequest, StepResponse

Opening = m.OpenSession | ResumeSession  # what starts a socket's session: new, or handed over


class OpenRefused(Exception):
    """A session opened without waiting for its reply (`SpanSocket.begin(wait=False)`) did not
    open on `hop`: refused, or no answer (`__cause__`, a DriftError, says which). Not a
    DriftError itself: the chain opens again the long way (drift.client.chain.Chain.reopen),
    which treats the refusal as connecting does (a full server left out, a failing one
    noted)."""

    def __init__(self, hop: Hop, message: str) -> None:
        super().__init__(message)
        self.hop = hop


async def handshake(http: aiohttp.ClientSession, hop: Hop,
                    config: ClientConfig) -> aiohttp.ClientWebSocketResponse:  # fmt: skip
    """An inference WebSocket to `hop`, no session open on it yet: TCP, TLS and the HTTP
    upgrade with the swarm-key proof, within connect_timeout_s (a frozen server accepts the
    TCP connection in its kernel and then says nothing)."""
    url = f"{hop.addr}/inference"
    headers = auth_headers(config.swarm_key, "GET", "/inference", peer_id=hop.peer_id)
    try:
        return await wait_for(http.ws_connect(
            url, headers=headers, max_msg_size=0, ssl=peer_ssl(hop.peer_id),
            timeout=aiohttp.ClientWSTimeout(ws_receive=config.step_timeout_s,
                                            ws_close=config.connect_timeout_s),
        ), config.connect_timeout_s)  # fmt: skip
    except aiohttp.WSServerHandshakeError as exc:
        raise from_payload(None, exc.status) from exc
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise PeerUnavailable(f"{hop.peer_id} at {url}: {exc!r}", peer_id=hop.peer_id) from exc


Patience = Callable[[], Awaitable[float]]  # past a step's timeout: seconds more to wait (0: none)


class SpanSocket:
    """One inference WebSocket to one server for blocks [hop.start_block, hop.end_block)."""

    def __init__(self, hop: Hop, ws: aiohttp.ClientWebSocketResponse, config: ClientConfig):
        self.hop = hop
        self.ws = ws
        self.config = config
        self._step_id = 0
        self.session_id = ""  # the server's id of this socket's session (once opened)
        self.push_token: str | None = None  # what steps pushed into it carry (drift.wire.push)
        self.holds = 0  # tokens its session started with (a fork: OpenSession.fork_tokens)
        self.idles = False  # its server takes `idle` (SessionOpened.idles)
        self.dtype = torch.float32  # what the session computes in (replies are restored to it)
        self._opening = False  # the open was sent and its reply not read yet (`opened`)

    @classmethod
    async def open(
        cls, http: aiohttp.ClientSession, hop: Hop, request: Opening, config: ClientConfig,
        *, wait: bool = True,
    ) -> SpanSocket:  # fmt: skip
        """A fresh socket to `hop` with `request`'s session open on it (`begin`)."""
        ws = await handshake(http, hop, config)
        return await cls.begin(hop, ws, request, config, wait=wait)

    @classmethod
    async def begin(
        cls, hop: Hop, ws: aiohttp.ClientWebSocketResponse, request: Opening,
        config: ClientConfig, *, wait: bool = True,
    ) -> SpanSocket:  # fmt: skip
        """Open `request`'s session on `ws`, a socket to `hop` handshaken with no session yet
        (`handshake`); `ws` is closed if that fails. PeerUnavailable whose cause is not a
        timeout: the server had closed `ws` (or it broke) before the session opened.
        `wait=False`: only send the open; steps may follow at once (the server takes a
        socket's messages in order) under the session id and push token the request chose,
        and the reply is read before the first step's (`opened`)."""
        sock = cls(hop, ws, config)
        sock.dtype = ACTIVATION_DTYPES[request.dtype]
        try:
            try:
                await ws.send_str(codec.encode_text(request))
            except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                raise PeerUnavailable(f"{hop.peer_id}: {exc!r}", peer_id=hop.peer_id) from exc
            sock._opening = True
            if isinstance(request, m.OpenSession):  # what it chose, if anything
                sock.session_id, sock.push_token = request.session_id or "", request.push_token
            if wait:
                await sock._read_opened()
        except BaseException:
            await sock.close()
            raise
        return sock

    async def opened(self) -> None:
        """The reply to an open sent without waiting (`begin(wait=False)`), read now if it was
        not yet: OpenRefused, with the reason as its cause, if the session did not open."""
        if self._opening:
            try:
                await self._read_opened()
            except DriftError as exc:
                raise OpenRefused(self.hop, f"{self.hop.peer_id}: {exc.message}") from exc

    async def _read_opened(self) -> None:
        # reserving a cache is quick: a server that does not answer soon is not well
        msg = await self._receive(self.config.connect_timeout_s + self.config.min_step_timeout_s)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise PeerUnavailable(f"{self.hop.peer_id}: expected session_opened, got {msg.type}")
        kind, obj = codec.read_text(msg.data)
        self._raise_if_error(kind, obj)
        opened = m.SessionOpened.from_wire(obj)
        # a server that predates client-chosen ids says its own
        self.session_id, self.push_token = opened.session_id, opened.push_token
        self.holds, self.idles = opened.holds, opened.idles
        self._opening = False

    async def extend(self, max_length: int) -> None:
        """Room for `max_length` tokens in this socket's session, kept in place by the server
        (drift.wire.extend); its refusal rises (LengthExceeded, CacheFull, or BadRequest from
        a server that does not know `extend`). Replies to older steps are skipped."""
        await self.opened()
        try:
            await self.ws.send_str(codec.encode_text(ExtendSession(max_length)))
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise PeerUnavailable(f"{self.hop.peer_id}: {exc!r}", peer_id=self.hop.peer_id) from exc
        deadline = time.monotonic() + self.config.connect_timeout_s + self.config.min_step_timeout_s
        while True:
            msg = await self._receive(max(deadline - time.monotonic(), 0.001))
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue  # a reply to a step given up on
            kind, obj = codec.read_text(msg.data)
            if codec.text_step_id(obj) is not None:
                continue  # an error of a step given up on
            self._raise_if_error(kind, obj)
            SessionExtended.from_wire(obj)
            return

    async def idle(self) -> None:
        """Tell the server this session takes no step for now (drift.wire's IdleSession; no
        reply), where it takes it. A socket that broke meanwhile shows at the next step."""
        if self.idles and not self.ws.closed:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError, RuntimeError):
                await self.ws.send_str(codec.encode_text(m.IdleSession()))

    async def _receive(self, timeout_s: float | None = None) -> aiohttp.WSMessage:
        timeout = self.config.step_timeout_s if timeout_s is None else timeout_s
        try:
            # receive's own timeout: no extra Task per step, as asyncio.wait_for would make
            msg = await self.ws.receive(timeout=timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise PeerUnavailable(f"{self.hop.peer_id}: {exc!r}", peer_id=self.hop.peer_id) from exc
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                        aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):  # fmt: skip
            raise PeerUnavailable(
                f"{self.hop.peer_id} closed the inference socket", peer_id=self.hop.peer_id
            )
        return msg

    def _raise_if_error(self, kind: str | None, obj: Any) -> None:
        raise_if_moved(obj)  # handoff hook: SessionMovedError names where the session lives
        if kind == "error":
            err = m.ErrorMessage.from_wire(obj)
            raise from_payload({"error": {"code": err.code, "message": err.message}}, 500)

    def next_step_id(self) -> int:
        """A fresh step id on this socket (for a step sent on it or pushed to its session)."""
        self._step_id += 1
        return self._step_id

    async def step(
        self, hidden: torch.Tensor, position: int, *,
        hypo_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None, extras: dict[str, torch.Tensor] | None = None,
        donate: tuple[int, ...] = (), states: bool = False, timeout_s: float | None = None,
        patience: Patience | None = None,
    ) -> StepResponse:  # fmt: skip
        """One step; PeerUnavailable if no reply comes within `timeout_s` (default: the
        config's step_timeout_s) and the time `patience` grants past it."""
        req = StepRequest(self.next_step_id(), position, hidden, hypo_ids, attention_mask,
                          prompts, extras or {}, donate, states)  # fmt: skip
        await self.send(req)
        return await self.receive(req.step_id, donate=donate, states=states, timeout_s=timeout_s,
                                  patience=patience)  # fmt: skip

    async def send(self, req: StepRequest) -> None:
        """Send a step (its `next_hops`: the spans its output is pushed on to)."""
        try:
            await self.ws.send_bytes(codec.encode(req, self.config.wire_dtype))
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise PeerUnavailable(f"{self.hop.peer_id}: {exc!r}", peer_id=self.hop.peer_id) from exc

    async def receive(
        self, step_id: int, *, donate: tuple[int, ...] = (), states: bool = False,
        timeout_s: float | None = None, patience: Patience | None = None,
    ) -> StepResponse:  # fmt: skip
        """The reply to step `step_id` (older ones, of a push given up on, are skipped); its
        `pushed` / `push_error` say whether the server pushed it on. Past `timeout_s`,
        `patience` (if given) says how much longer to wait: a server busy with other
        clients' work is not left as failed. A session whose open is still unanswered reads
        that answer first (`opened`)."""
        await self.opened()
        timeout = self.config.step_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        n_states = self.hop.end_block - self.hop.start_block if states else 0
        while True:
            try:
                msg = await self._receive(max(deadline - time.monotonic(), 0.001))
            except PeerUnavailable as exc:
                if patience is None or not isinstance(exc.__cause__, asyncio.TimeoutError):
                    raise
                more = await patience()
                if more <= 0:
                    raise
                deadline = time.monotonic() + more
                continue
            if msg.type == aiohttp.WSMsgType.TEXT:
                kind, obj = codec.read_text(msg.data)
                if _older(codec.text_step_id(obj), step_id):
                    continue
                self._raise_if_error(kind, obj)
                raise PeerUnavailable(f"{self.hop.peer_id}: unexpected text reply to a step")
            frame = codec.Frame.read(msg.data)
            if _older(frame.step_id, step_id):
                continue
            reply = frame.message(StepResponse, self.dtype, donate=donate, states=n_states)
            if reply.step_id != step_id:
                raise PeerUnavailable(f"{self.hop.peer_id}: reply to step {reply.step_id}, "
                                      f"expected {step_id}")  # fmt: skip
            return reply

    async def close(self) -> None:
        await close_ws(self.ws, self.config.connect_timeout_s)


def _older(step_id: int | None, expected: int) -> bool:
    """A reply to an earlier step than the one awaited (stale: skipped)."""
    return step_id is not None and step_id < expected


async def close_ws(ws: aiohttp.ClientWebSocketResponse, timeout_s: float | None) -> None:
    """Close a WebSocket, waiting at most `timeout_s` for the server's answer; a connection
    already gone is closed too (nothing raised)."""
    if not ws.closed:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            await wait_for(ws.close(), timeout_s)


async def close_all(sockets: Iterable[SpanSocket]) -> None:
    """Close sockets at once: each close waits for its server's answer (a round trip), so
    a chain's sockets close in one round trip, not one per server."""
    await asyncio.gather(*(sock.close() for sock in sockets))
