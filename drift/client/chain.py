"""The client's chain of spans: one socket per span of a route, each span's history (every
input it was sent), and `advance`, the one way a step moves through one span, shared by
relayed steps, pipelined prefill chunks and pushed steps (drift.wire.push). A span that
fails is replaced by a new route over its blocks and its history replayed (`failover`),
so results stay identical. Knows nothing of positions: its owner (InferenceSession) does."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from drift.client.extras import Tensors, hop_extras
from drift.client.handoff import follow_move
from drift.client.remote import RemoteClient, slice_prompts
from drift.client.routing import Hop
from drift.client.step_inputs import Chunk, StepInputs
from drift.client.transport import OpenRefused, SpanSocket, close_all
from drift.wire import messages as m
from drift.wire.errors import (
    CacheFull,
    DriftError,
    LengthExceeded,
    MissingBlocks,
    PeerUnavailable,
    PushRefused,
)
from drift.wire.extras import BLOCK_STATES
from drift.wire.lora import in_span
from drift.wire.push import NextHop
from drift.wire.step import StepRequest


def pipeline_stages(hops: list[Hop]) -> list[range]:
    """The stages a pipeline runs along `hops`: consecutive hops whose servers compute on the
    same cores or GPU (the same `compute` name, drift.server.compute_name) make one stage,
    which takes each chunk through all of them before the next chunk; any other hop is a
    stage of its own. Overlapping servers that share cores would only make them compete."""
    stages: list[range] = []
    for i, hop in enumerate(hops):
        if stages and hop.compute is not None and hops[stages[-1].start].compute == hop.compute:
            stages[-1] = range(stages[-1].start, i + 1)
        else:
            stages.append(range(i, i + 1))
    return stages


@dataclass
class SpanState:
    hop: Hop
    socket: SpanSocket
    history: list[StepInputs] = field(default_factory=list)
    lora_sent: bool = False  # the session's LoRA weights went with a step on this socket


# no server over a span has room: free some (the owner's idle sessions) and say if it did
MakeRoom = Callable[[], Awaitable[bool]]


class Opener(Protocol):
    """What a span's session is opened with (the chain's owner: it may change them)."""

    adapter: str | None
    max_length: int
    batch_size: int
    dtype_name: str  # what steps travel in
    make_room: MakeRoom | None

    def open_msg(self, hop: Hop) -> m.OpenSession: ...

    def drop_headroom(self) -> bool:
        """Open shorter from now on (a server refused the length, or none has room);
        whether it had headroom to give up."""
        ...


class Chain:
    """The spans over blocks [start_block, end_block), in order, and how steps cross them."""

    def __init__(self, client: RemoteClient, opener: Opener, start_block: int, end_block: int,
                 lora: Tensors) -> None:  # fmt: skip
        self.client = client
        self.opener = opener
        self.start_block, self.end_block = start_block, end_block
        self.lora = lora  # wire-named LoRA weights, sent to each span once
        self.spans: list[SpanState] = []
        self.failovers = 0
        self.moves = 0  # spans followed to the server their session was handed to (handoff)
        self.push_off = False  # a push was refused: steps are relayed until a failover
        self.pushed = 0  # span replies that came by server push (not sent by us)

    async def connect(self, start: int, end: int, *, wait: bool = True,
                      full: dict[str, CacheFull] | None = None) -> list[SpanState]:  # fmt: skip
        """Open sockets along a fresh route over [start, end), retrying around failures. A
        server with no room for the session (CacheFull: its budget, or this client's share
        of it) is answering, not failing: it is not banned (the client's other sessions keep
        routing to it), only left out of this session's routes; when no server with room is
        left, the owner may make room (`make_room`: its idle sessions closed) or give up its
        headroom (`drop_headroom`, also where a server refuses the length: LengthExceeded),
        and the route is tried again; else that refusal is raised, naming the limit. Each
        session is opened under an id and push token this client chose
        (OpenSession.session_id). `wait=False`: the opens are sent and not waited for, so
        the first step follows at once (its replies read each open's answer first:
        OpenRefused where one did not open, then `reopen`). `full`: servers that already
        refused this session for want of room."""
        attempts = 0
        full = dict(full or {})  # peer id -> its refusal of this session
        while True:
            try:
                hops = await self.client.route(start, end, inference=True,
                                               adapter=self.opener.adapter, avoid=full.keys(),
                                               tokens_needed=self.opener.max_length * self.opener.batch_size)  # fmt: skip
            except MissingBlocks:
                if not full:
                    raise
                if await self._more_room():  # the servers covering the blocks had none
                    full.clear()
                    continue
                raise list(full.values())[-1] from None
            requests = [(hop, _with_ids(self.opener.open_msg(hop))) for hop in hops]
            socks, failed = await self.client.open_sockets(requests, wait=wait)
            if not failed:
                return [SpanState(hop, sock) for hop, sock in zip(hops, socks, strict=True)]
            if not wait:  # a socket broke before its open went out: the long way
                wait = True
                continue
            if (any(isinstance(exc, LengthExceeded) for _, exc in failed)
                    and self.opener.drop_headroom()):  # fmt: skip
                continue  # past a server's limit: opened shorter
            faults: list[tuple[Hop, DriftError]] = []
            for hop, exc in failed:
                if not isinstance(exc, DriftError):
                    raise exc
                if isinstance(exc, CacheFull):
                    full[hop.peer_id] = exc
                else:
                    faults.append((hop, exc))
            for hop, exc in faults[1:]:  # every failed peer is noted, as one attempt
                self.client.note_failure(exc, hop)
            if faults:
                attempts = self.client.count_failure(faults[0][1], faults[0][0], attempts)

    async def _more_room(self) -> bool:
        """Every server that would take a span is full: room its owner made (`make_room`),
        else its headroom given up; whether either happened."""
        make_room = self.opener.make_room
        if make_room is not None and await make_room():
            return True
        return self.opener.drop_headroom()

    async def advance(self, chunk: Chunk, states: bool, awaited: dict[int, int] | None = None,
                      started: float = 0.0) -> bool:  # fmt: skip
        """`chunk` through span `chunk.depth`, the one way a step moves on (relayed, pipelined
        or pushed): sent to the span, or, when a push brings its reply (`awaited`: span index
        -> the step id it comes under; `started`: when the span before replied), read. Kept in
        the span's history, the chunk moves on; whether the push goes on past this span."""
        i = chunk.depth
        span = self.spans[i]
        inputs = self._inputs(chunk.step, chunk.hidden, span.hop, chunk.shared)
        if awaited and i in awaited:
            out, donated, went_on = await self._read(span, inputs, awaited[i], started)
            went_on |= i == max(awaited)  # the last pushes nowhere
            self.pushed += i != min(awaited)
        else:
            out, donated = await self._send(span, inputs, self.end_block, states)
            went_on = True
        span.history.append(inputs)
        if states:
            chunk.outputs.append(donated.pop(BLOCK_STATES))
        chunk.shared.update(donated)
        chunk.hidden, chunk.depth = out, i + 1
        return went_on

    async def through(self, chunk: Chunk, states: bool) -> None:
        """`chunk` through the spans it has not passed yet, one after another; a failed span
        is replaced (its history replayed) and the chunk sent again."""
        if chunk.error is not None:  # the pipeline's failure on span `depth`
            exc, chunk.error = chunk.error, None
            await self.failover(chunk.depth, exc)
        while chunk.depth < len(self.spans):
            try:
                await self.advance(chunk, states)
            except DriftError as exc:
                await self.failover(chunk.depth, exc)  # then the replacement's first span

    async def pipeline(self, chunks: list[Chunk], states: bool) -> None:
        """Chunks through the spans, each stage (`stages`) taking them in order as the one
        before gives them: stage i+1 computes chunk j while stage i computes chunk j+1. At
        the first failure every stage stops taking chunks; the failed chunk keeps its error,
        and `through` finishes what is left in order."""
        stages = pipeline_stages([span.hop for span in self.spans])
        queues: list[asyncio.Queue[Chunk | None]] = [asyncio.Queue() for _ in stages]
        for chunk in chunks:
            queues[0].put_nowait(chunk)
        queues[0].put_nowait(None)
        failed = False

        async def work(i: int) -> None:
            nonlocal failed
            while (chunk := await queues[i].get()) is not None and not failed:
                try:
                    for _ in stages[i]:  # advance moves chunk.depth on by one span
                        await self.advance(chunk, states)
                except DriftError as exc:
                    failed, chunk.error = True, exc
                    break
                if i + 1 < len(queues):
                    queues[i + 1].put_nowait(chunk)
            if i + 1 < len(queues):
                queues[i + 1].put_nowait(None)

        await asyncio.gather(*(work(i) for i in range(len(stages))))

    async def whole(self, step: StepInputs, states: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """`step` (one chunk) through every span, each output feeding the next: relayed span
        by span, or, when `_pushing`, sent to one span that pushes it on along the rest
        (drift.wire.push), the client then reading each span's reply in order. A span that
        fails is replaced and replayed (`failover`), and the step relayed from there."""
        chunk = Chunk(step, step.hidden)
        awaited: dict[int, int] = {}  # span index -> step id its pushed reply comes under
        started = time.perf_counter()
        while chunk.depth < len(self.spans):
            i = chunk.depth
            try:
                if i not in awaited and self._pushing(i, step, states):
                    inputs = self._inputs(step, chunk.hidden, self.spans[i].hop, chunk.shared)
                    awaited = await self._send_pushed(i, inputs)
                    continue
                went_on = await self.advance(chunk, states, awaited, started)
            except PushRefused:
                self.push_off, awaited = True, {}  # relay this step, and the next ones
                continue
            except DriftError as exc:
                awaited = {}
                await self.failover(i, exc)
                continue  # retry the same index: now the replacement's first span
            if not went_on:  # the chain stopped here: relay the rest of this step
                awaited = {}
            started = time.perf_counter()
        return chunk.hidden, torch.cat(chunk.outputs, dim=2) if states else None

    def _pushing(self, index: int, step: StepInputs, states: bool) -> bool:
        """Whether the step goes from span `index` on by server push: only a plain step
        (no block states, deep prompts, per-layer inputs, keys/values shared across spans or
        LoRA weights not yet sent: the client routes those) with spans after it, unless a
        push was refused."""
        if not self.client.config.push or self.push_off or index + 1 >= len(self.spans):
            return False
        if states or step.prompts is not None or step.per_layer is not None:
            return False
        if self.lora and not all(s.lora_sent for s in self.spans[index:]):
            return False  # LoRA weights go with a span's first step: the client sends those
        sharing = self.client.sharing
        return not any(
            sharing.consumed(s.hop.start_block, s.hop.end_block)
            or sharing.donated(s.hop.start_block, s.hop.end_block, self.end_block)
            for s in self.spans[index:]
        )

    async def _send_pushed(self, index: int, s: StepInputs) -> dict[int, int]:
        """Send the step to span `index`, naming every later span as its next hops; the step
        id each span's reply comes under."""
        later = self.spans[index + 1 :]
        hops = tuple(NextHop(sp.hop.addr, sp.hop.peer_id, sp.socket.session_id,
                             sp.socket.next_step_id(), sp.socket.push_token)
                     for sp in later)  # fmt: skip
        first = self.spans[index].socket
        req = StepRequest(first.next_step_id(), s.position, s.hidden, s.hypo_ids,
                          s.attention_mask, next_hops=hops)  # fmt: skip
        await first.send(req)
        return {index: req.step_id} | {index + 1 + k: h.step_id for k, h in enumerate(hops)}

    async def _read(self, span: SpanState, s: StepInputs, step_id: int,
                    started: float) -> tuple[torch.Tensor, Tensors, bool]:  # fmt: skip
        """A pushed step's reply from `span` and whether it went on, within its adaptive
        timeout counted from the previous span's reply (the time this span's part of the
        chain takes)."""
        peer, tokens = span.hop.peer_id, s.hidden.shape[0] * s.hidden.shape[1]
        with self.client.timeouts.waiting(peer, "step", tokens) as timeout_s:
            patience = self.client.patience(span.socket, timeout_s, started)
            reply = await span.socket.receive(step_id, timeout_s=timeout_s, patience=patience)
        seconds = time.perf_counter() - started
        self.client.swarm.note_rtt(peer, seconds)
        self.client.timeouts.observe(peer, "step", tokens, seconds)
        return reply.hidden_states, dict(reply.extras), reply.pushed

    def _inputs(self, step: StepInputs, hidden: torch.Tensor, hop: Hop,
                shared: Tensors) -> StepInputs:  # fmt: skip
        """What span `hop` gets of `step`: its input and the K/V it reads of earlier donors."""
        read = hop_extras(self.client.sharing, hop.start_block, hop.start_block, hop.end_block,
                          None, shared)  # fmt: skip
        return StepInputs(hidden, step.position, step.hypo_ids, step.attention_mask,
                          step.prompts, step.per_layer, read)  # fmt: skip

    async def _send(
        self, span: SpanState, s: StepInputs, stop: int, states: bool = False
    ) -> tuple[torch.Tensor, Tensors]:
        """One step on one span: (its output, the K/V it donated to blocks before `stop`, and
        with `states` its blocks' outputs as BLOCK_STATES)."""
        hop = span.hop
        extras = hop_extras(self.client.sharing, self.start_block, hop.start_block,
                            hop.end_block, s.per_layer, s.shared)  # fmt: skip
        if not span.lora_sent:
            extras.update(in_span(self.lora, hop.start_block, hop.end_block))
        donate = self.client.sharing.donated(hop.start_block, hop.end_block, stop)
        started = time.perf_counter()
        peer, tokens = hop.peer_id, s.hidden.shape[0] * s.hidden.shape[1]
        with self.client.timeouts.waiting(peer, "step", tokens) as timeout_s:
            reply = await span.socket.step(
                s.hidden, s.position, hypo_ids=s.hypo_ids, attention_mask=s.attention_mask,
                prompts=slice_prompts(s.prompts, self.start_block, hop), extras=extras,
                donate=donate, states=states, timeout_s=timeout_s,
                patience=self.client.patience(span.socket, timeout_s, started),
            )  # fmt: skip
        seconds = time.perf_counter() - started
        span.lora_sent = True
        # measured step time feeds the per-peer EWMA that routing reads as rtt_s, and the
        # step timeout: a peer that stops answering is left after a few of its step times
        self.client.swarm.note_rtt(peer, seconds)
        self.client.timeouts.observe(peer, "step", tokens, seconds)
        return reply.hidden_states, dict(reply.extras)

    async def failover(self, index: int, exc: DriftError) -> None:
        """Replace span `index` by a new route over its blocks and replay its history."""
        if await follow_move(self, index, exc, self.opener.dtype_name):  # handoff hook
            return
        failed = self.spans[index]
        self.client.note_failure(exc, failed.hop)
        self.failovers += 1
        self.push_off = False  # a new chain: pushing may work again
        if self.failovers > self.client.config.max_retries * max(1, len(self.spans)):
            raise exc
        await failed.socket.close()
        attempts = 0
        while True:
            new_spans = await self.connect(failed.hop.start_block, failed.hop.end_block)
            try:
                await self.replay(new_spans, failed.history, failed.hop.end_block)
                break
            except DriftError as replay_exc:
                await close_all(span.socket for span in new_spans)
                attempts = self.client.count_failure(replay_exc, new_spans[0].hop, attempts)
        self.spans[index : index + 1] = new_spans

    async def replay(self, spans: list[SpanState], history: list[StepInputs], stop: int) -> None:
        """Feed `history` (of one failed span) to `spans` covering its blocks; K/V pass
        between them only: later spans hold theirs already."""
        for past in history:
            hidden = past.hidden
            shared = dict(past.shared)
            for span in spans:
                inputs = self._inputs(past, hidden, span.hop, shared)
                hidden, donated = await self._send(span, inputs, stop)
                span.history.append(inputs)
                shared.update(donated)

    async def confirm(self) -> None:
        """Every span's open answered (those sent without waiting: `connect(wait=False)`);
        OpenRefused where one was not."""
        await asyncio.gather(*(span.socket.opened() for span in self.spans))

    async def reopen(self, refused: OpenRefused) -> None:
        """After an open sent without waiting was refused (`connect(wait=False)`): close every
        socket of the chain (no spares made of them), note a server's refusal as `connect`
        does (one with no room left out of the route, a length past its limit opened without
        the owner's headroom, another noted as failing) and connect again, waiting for each
        answer. A socket that broke or went unanswered is not held against its server here
        (a spare it had closed looks the same): connecting again finds out."""
        spans, self.spans = self.spans, []
        await close_all(span.socket for span in spans)
        cause, full = refused.__cause__, {}
        if isinstance(cause, CacheFull):
            full[refused.hop.peer_id] = cause
        elif isinstance(cause, LengthExceeded) and self.opener.drop_headroom():
            pass  # past that server's limit: opened shorter below
        elif isinstance(cause, DriftError) and not isinstance(cause, PeerUnavailable):
            self.client.note_failure(cause, refused.hop)
        self.spans = await self.connect(self.start_block, self.end_block, full=full)

    async def idle(self) -> None:
        """The session takes no step for now: every span's server is told (SpanSocket.idle)."""
        await asyncio.gather(*(span.socket.idle() for span in self.spans))

    async def close(self) -> None:
        """The session ended: its sockets close, then a spare to each server is made ready
        (drift.client.spares); this waits for the servers' replies to the close."""
        spans, self.spans = self.spans, []
        await self.client.spares.end(span.socket for span in spans)


def _with_ids(request: m.OpenSession) -> m.OpenSession:
    """`request` under a session id and push token of the client's choosing (fresh, random)."""
    session_id, push_token = m.new_session_ids()
    return dataclasses.replace(request, session_id=session_id, push_token=push_token)
