"""Inference sessions: a KV cache per client over a (sub-)span, its budget, and its lifetime.

A `Session` owns everything of one client's session: its cache, limits, the socket its
replies go to, its step lock and the last step id it ran; closing it (`close`, `reap`) is one
call that leaves nothing behind. `open` reserves cache room (or raises CacheFull) and fixes
the session's `StepLimits`;
`step` runs a step the wire edge already validated against them (StepRequest.from_wire) on
the compute thread, `close` frees it; `reap` closes sessions idle past the timeout. A session
applies its served LoRA adapter (named at open) and the LoRA weights its last step carrying
any sent (a client's trained ones, sent once). Holds its socket but never touches it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from drift.models.batch import BatchStep
from drift.server.backend import SpanBackend
from drift.server.batcher import StepBatcher
from drift.server.budget import CacheBudget
from drift.wire.checks import ACTIVATION_DTYPES, StepLimits
from drift.wire.errors import BadRequest, Busy, LengthExceeded, UnknownAdapter, UnknownSession
from drift.wire.extend import SessionExtended
from drift.wire.extras import token_axis
from drift.wire.lora import split_lora
from drift.wire.messages import (
    OpenSession,
    SessionOpened,
    StepRequest,
    StepResponse,
    new_session_ids,
)

log = logging.getLogger(__name__)
HELD_AFTER_S = 5.0  # a session no step used for this long counts as held, not active


@dataclass
class Session:
    session_id: str
    request: OpenSession
    limits: StepLimits  # what every step is validated against at the wire edge
    cache: Any  # drift.models.SpanSession, touched only on the compute thread
    reserved: int  # block-tokens held in the budget
    client: str = ""  # who opened it (its address): its share of the budget is bounded
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False  # a step is running: never reaped mid-step
    lora: dict[str, torch.Tensor] = field(default_factory=dict)  # LoRA weights sent by a step
    socket: Any = None  # its client's WebSocket: every reply goes there, pushed ones too
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # a relayed and a pushed step
    last_step: int = -1  # never run at once; the newest step id it ran
    # what a step pushed into it must carry (drift.wire.push): issued at open, told only to
    # its client, never logged
    push_token: str = field(default_factory=lambda: new_session_ids()[1], repr=False)

    @property
    def n_blocks(self) -> int:
        return self.request.end_block - self.request.start_block

    def admit(self, step_id: int, *, pushed: bool) -> bool:
        """Whether to run this step: a pushed one only if newer than any the session ran (a
        client that gave up on a push relays the step itself)."""
        if pushed and step_id <= self.last_step:
            return False
        self.last_step = max(self.last_step, step_id)
        return True


class SessionManager:
    def __init__(
        self,
        backend: SpanBackend,
        budget: CacheBudget,
        *,
        max_length: int,
        timeout_s: float,
        batch_wait_s: float = 0.0,
        client_share: float = 1.0,
    ) -> None:
        self.backend = backend
        self.budget = budget
        self.max_length = max_length  # tokens: the largest max_length a session may ask for
        self.timeout_s = timeout_s  # seconds of idleness before a session is closed
        self.client_share = client_share  # fraction of the budget one client may hold
        self.sessions: dict[str, Session] = {}
        self.refusing: str | None = None  # why new sessions are refused (a span move), or None
        # plain steps of concurrent sessions, batched
        self.batcher = StepBatcher(backend, wait_s=batch_wait_s)

    async def open(self, req: OpenSession, socket: Any = None,
                   client: str = "") -> tuple[Session, SessionOpened]:  # fmt: skip
        """A new session replying on `socket`, opened by `client` (its address); Busy,
        UnknownAdapter, LengthExceeded or CacheFull (also past the client's share)."""
        if self.refusing is not None:
            raise Busy(self.refusing)
        self.backend.check(req.model, req.start_block, req.end_block, req.batch_size)
        if req.adapter is not None and req.adapter not in self.backend.span.adapters:
            raise UnknownAdapter(f"this server holds no adapter {req.adapter!r}; it holds "
                                 f"{sorted(self.backend.span.adapters)}")  # fmt: skip
        if req.max_length > self.max_length:
            raise LengthExceeded(
                f"max_length {req.max_length} exceeds this server's limit of {self.max_length}"
            )
        if req.session_id is not None and req.session_id in self.sessions:
            raise BadRequest(f"session id {req.session_id} is in use on this server; open "
                             "with another (or none: the server chooses)")  # fmt: skip
        source = None if req.fork_of is None else self._fork_source(req, client)
        n_blocks = req.end_block - req.start_block
        need = req.max_length * req.batch_size * n_blocks
        self._check_share(client, need, None)
        reserved = self.budget.reserve(need)
        try:
            # a fork copies K/V between its source's steps, on the compute thread; a fresh
            # cache is a few empty objects, made here (not queued behind others' compute)
            cache = (self._new_cache(req) if source is None
                     else await self.backend.run(self._new_cache, req, source))  # fmt: skip
        except BaseException:
            self.budget.release(reserved)
            raise
        limits = StepLimits(self.backend.hidden_size, req.batch_size, req.max_length,
                            n_blocks, ACTIVATION_DTYPES[req.dtype],
                            self.backend.extra_spec(req.start_block, req.end_block))  # fmt: skip
        # the client's own id and push token where it chose them (it may name them as a
        # pushed step's next hop before this reply reaches it), else fresh ones
        session_id, push_token = new_session_ids()
        session = Session(req.session_id or session_id, req, limits, cache, reserved,
                          socket=socket, client=client,
                          push_token=req.push_token or push_token)  # fmt: skip
        self.sessions[session.session_id] = session
        log.debug("opened session %s: %s", session.session_id, req)
        return session, SessionOpened(session.session_id, req.max_length, session.push_token,
                                      req.fork_tokens if source is not None else 0,
                                      idles=True)  # fmt: skip

    def _fork_source(self, req: OpenSession, client: str) -> Session:
        """The session `req` forks: this client's, over the same blocks, adapter and dtype,
        with no LoRA weights of its own (BadRequest, UnknownSession otherwise)."""
        assert req.fork_of is not None
        source = self.get(req.fork_of)
        have = source.request
        if source.client != client:
            raise BadRequest("a session forks only a session of the same client")
        if (have.start_block, have.end_block) != (req.start_block, req.end_block):
            raise BadRequest(f"fork_of covers blocks [{have.start_block}, {have.end_block}), "
                             f"not [{req.start_block}, {req.end_block})")  # fmt: skip
        if have.adapter != req.adapter or have.dtype != req.dtype or source.lora:
            raise BadRequest("a fork keeps its session's adapter, dtype and LoRA weights")
        return source

    def extend(self, session_id: str, max_length: int) -> SessionExtended:
        """Room for `max_length` tokens in an open session, in place: the extra cache room is
        reserved (or CacheFull, LengthExceeded past the limit: then nothing changes) and the
        session keeps what it holds. Not above its own max_length: nothing changes."""
        session = self.get(session_id)
        req = session.request
        if max_length > req.max_length:
            if max_length > self.max_length:
                raise LengthExceeded(f"max_length {max_length} exceeds this server's limit "
                                     f"of {self.max_length}")  # fmt: skip
            n_blocks = req.end_block - req.start_block
            more = (max_length - req.max_length) * req.batch_size * n_blocks
            self._check_share(session.client, more, session)
            session.reserved += self.budget.reserve(more)
            session.request = dataclasses.replace(req, max_length=max_length)
            session.limits = dataclasses.replace(session.limits, max_length=max_length)
            session.cache.grow(max_length)  # a number: safe beside a step on the compute thread
            log.debug("session %s extended to %d tokens", session_id, max_length)
        return SessionExtended(session_id, session.request.max_length)

    def _check_share(self, client: str, more: int, growing: Session | None) -> None:
        """The client's share of the budget (drift.server.budget.check_share): what its
        sessions hold, `growing` (a session it extends) counted as held, not as another."""
        if self.client_share >= 1 or not client:  # "" = a swarm-key member: not limited
            return
        mine = [s for s in self.sessions.values() if s.client == client]
        others = sum(1 for s in mine if s is not growing)
        self.budget.check_share(client, sum(s.reserved for s in mine), more,
                                share=self.client_share, others=others)  # fmt: skip

    def _new_cache(self, req: OpenSession, source: Session | None = None) -> Any:
        cache = self.backend.span.new_session(
            batch_size=req.batch_size, max_length=req.max_length,
            start_block=req.start_block, end_block=req.end_block,
        )  # fmt: skip
        if source is not None:  # on the compute thread: between the source's steps
            cache.fork(source.cache, req.fork_tokens)
        return cache

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise UnknownSession(
                f"session {session_id} is unknown here (closed, timed out or never opened); "
                "open a new one and replay its inputs"
            )
        return session

    async def step(self, session_id: str, req: StepRequest) -> StepResponse:
        """`req` was validated against this session's limits at the wire edge. A long prefill
        runs in chunks of the backend's `chunk_tokens`, so other sessions' steps run between.
        Chunks with no deep prompts, beam reorder or LoRA go through the batcher, so
        concurrent sessions' steps share a forward (Gemma 4's named tensors are cut into the
        same chunks, and the K/V each chunk donates joined again). A step asking for every
        block's states, or carrying named tensors but not batched, runs as one unit."""
        session = self.get(session_id)
        lora, others = split_lora(req.extras)
        if lora:  # kept for this step and the next ones
            session.lora, req = lora, dataclasses.replace(req, extras=others)
        # LoRA (a served adapter or weights a step sent) applies to the whole span while a
        # forward runs: such a session's steps run alone, never batched with others
        alone = bool(session.lora) or session.request.adapter is not None
        batched = req.hypo_ids is None and req.prompts is None and not alone
        session.busy = True
        try:
            if req.block_states or (not batched and (req.extras or req.donate)):
                return await self.backend.run_chunk(functools.partial(self._step, session, req))
            tokens, chunk = req.hidden_states.shape[1], self.backend.chunk_tokens
            outs, donated = [], []
            for pos in range(0, tokens, chunk):
                stop = min(tokens, pos + chunk)
                started = time.perf_counter()
                if batched:
                    mask = req.attention_mask
                    out, named = await self.batcher.step(BatchStep(
                        session.cache, req.position + pos, req.hidden_states[:, pos:stop],
                        None if mask is None else mask[:, pos:stop],
                        _tokens(req.extras, pos, stop), req.donate))  # fmt: skip
                else:  # unbatched: no named tensors (those run as one unit)
                    out, named = await self.backend.run_chunk(
                        functools.partial(self._step_tokens, session, req, pos, stop)), {}  # fmt: skip
                outs.append(out)
                donated.append(named)
                # units of prompts are sized by how fast they run (SpanBackend.note_prompt_unit)
                self.backend.note_prompt_unit(req.hidden_states.shape[0], stop - pos,
                                              time.perf_counter() - started)  # fmt: skip
        finally:
            session.busy = False
            session.last_used = time.monotonic()
        if len(outs) == 1:
            return StepResponse(req.step_id, outs[0], donated[0])
        # joined on the compute thread: a parallel copy on this (event loop) thread would give
        # it an OpenMP pool, and beside a second pool the compute pool's workers run
        # throttled until the housekeeping tick ends it (drift.openmp)
        hidden, named = await self.backend.run(lambda: (torch.cat(outs, dim=1), _joined(donated)))
        return StepResponse(req.step_id, hidden, named)

    def _step(self, session: Session, req: StepRequest) -> StepResponse:
        with self.backend.span.serving(session.lora, adapter=session.request.adapter):
            out, donated = session.cache.run(
                req.position, req.hidden_states, hypo_ids=req.hypo_ids,
                attention_mask=req.attention_mask, prompts=req.prompts, extras=req.extras,
                donate=req.donate, states=req.block_states,
            )  # fmt: skip
        return StepResponse(
            req.step_id, out.to("cpu"), {k: v.to("cpu") for k, v in donated.items()}
        )

    def _step_tokens(self, session: Session, req: StepRequest, pos: int,
                     stop: int) -> torch.Tensor:  # fmt: skip
        """Tokens [pos, stop) of a plain step (beam reorder with the first chunk only)."""
        mask = req.attention_mask
        with self.backend.span.serving(session.lora, adapter=session.request.adapter):
            out, _ = session.cache.run(req.position + pos, req.hidden_states[:, pos:stop],
                                       hypo_ids=req.hypo_ids if pos == 0 else None,
                                       attention_mask=None if mask is None else mask[:, pos:stop],
                                       prompts=req.prompts)  # fmt: skip
        return out.to("cpu")

    def idle(self, session_id: str) -> None:
        """The session's client holds it for a later turn (drift.wire's `idle`): its steps
        are not waited for until it steps again. An unknown (closed, reaped) one: nothing."""
        session = self.sessions.get(session_id)
        if session is not None:
            self.batcher.idle(session.cache)

    def close(self, session_id: str) -> None:
        """Free the session (its cache room, its cache, its socket's part in it)."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        self.budget.release(session.reserved)
        session.socket = None
        self.batcher.forget(session.cache)  # not waited for while its close is queued
        self.backend.executor.submit(session.cache.close)
        log.debug("closed session %s", session_id)

    def held(self, idle_s: float = HELD_AFTER_S, now: float | None = None) -> int:
        """Sessions open but not stepped for `idle_s` (a held prefix, an idle chat): room in
        the cache, no load on the compute."""
        now = time.monotonic() if now is None else now
        return sum(1 for s in self.sessions.values() if not s.busy and now - s.last_used > idle_s)

    def reap(self, now: float | None = None) -> list[str]:
        """Close sessions idle past the timeout; returns their ids."""
        now = time.monotonic() if now is None else now
        stale = [
            sid for sid, s in self.sessions.items()
            if not s.busy and now - s.last_used > self.timeout_s
        ]  # fmt: skip
        for sid in stale:
            log.info("session %s idle for over %.0f s: closed", sid, self.timeout_s)
            self.close(sid)
        return stale

    def close_all(self) -> None:
        for sid in list(self.sessions):
            self.close(sid)


def _tokens(named: dict[str, torch.Tensor], start: int, stop: int) -> dict[str, torch.Tensor]:
    """Tokens [start, stop) of each named tensor (drift.wire.extras.token_axis)."""
    return {k: v.narrow(token_axis(k), start, stop - start) for k, v in named.items()}


def _joined(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Named tensors of consecutive chunks, joined along their tokens."""
    return {k: torch.cat([p[k] for p in parts], dim=token_axis(k)) for k in parts[0]}
