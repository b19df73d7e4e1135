"""InferenceSession: token-by-token inference through a chain of server-side KV caches.

One WebSocket per span. Every input sent to a span is kept; when a server fails mid-
session, its span is routed to other servers and that history is replayed into them,
so generation continues with identical results; `extend` grows every span's session in
place (reopened and replayed only where a server refuses). Gemma 4: each step sends every
span its per-layer inputs and the new positions' keys/values of donors in earlier spans
(the servers keep the past ones); a replay carries them too. LoRA: a session asks its
servers for a served adapter (`adapter`, at open), and sends LoRA weights being trained
(`lora`) once per socket, with its first step. Steps take tensors on any device and give
them back there, in the caller's dtype. Sync methods wrap the async core."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import torch

from drift.client.extras import Tensors, hop_extras
from drift.client.handoff import follow_move
from drift.client.remote import RemoteClient, slice_prompts
from drift.client.routing import Hop
from drift.client.step_inputs import Chunk, StepInputs, split_step, to_cpu
from drift.client.transport import SpanSocket
from drift.wire import messages as m
from drift.wire.errors import DriftError, LengthExceeded, PushRefused
from drift.wire.extras import BLOCK_STATES
from drift.wire.lora import in_span
from drift.wire.push import NextHop


@dataclass
class SpanState:
    hop: Hop
    socket: SpanSocket
    history: list[StepInputs] = field(default_factory=list)
    lora_sent: bool = False  # the session's LoRA weights went with a step on this socket


class InferenceSession:
    """A KV-cached session over blocks [start_block, end_block); use as a context manager."""

    def __init__(
        self, client: RemoteClient, start_block: int, end_block: int, *,
        max_length: int, batch_size: int = 1, dtype: torch.dtype = torch.float32,
        adapter: str | None = None, lora: Tensors | None = None,
    ) -> None:  # fmt: skip
        """`adapter`: a served LoRA adapter; `lora`: wire-named LoRA weights (drift.wire.lora)
        of the blocks, detached, sent to each server once."""
        self.client = client
        self.adapter = adapter
        self.lora = dict(lora or {})
        self.start_block, self.end_block = start_block, end_block
        self.max_length, self.batch_size = max_length, batch_size
        self.dtype = dtype  # what steps travel in (the servers check it)
        self.dtype_name = str(dtype).removeprefix("torch.")
        self.position = 0
        self.spans: list[SpanState] = []
        self.closed = False
        self.failovers = 0
        self.moves = 0  # spans followed to the server their session was handed to (handoff)
        self.push_off = False  # a push was refused: steps are relayed until a failover
        self.pushed = 0  # span replies that came by server push (not sent by us)

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_msg(self, hop: Hop) -> m.OpenSession:
        return m.OpenSession(self.client.model_fingerprint, hop.start_block, hop.end_block,
                             self.max_length, self.batch_size, self.dtype_name,
                             self.adapter)  # fmt: skip

    async def _connect(self, start: int, end: int) -> list[SpanState]:
        """Open sockets along a fresh route over [start, end), retrying around failures."""
        attempts = 0
        while True:
            hops = await self.client.route(start, end, inference=True, adapter=self.adapter,
                                           tokens_needed=self.max_length * self.batch_size)  # fmt: skip
            opened: list[SpanState] = []
            try:
                for hop in hops:
                    sock = await self.client.open_socket(hop, self._open_msg(hop))
                    opened.append(SpanState(hop, sock))
                return opened
            except DriftError as exc:
                for span in opened:
                    await span.socket.close()
                attempts = self.client.count_failure(exc, hop, attempts)

    def step(
        self, hidden: torch.Tensor, *, position: int | None = None,
        hypo_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None, per_layer_inputs: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Run new tokens' hidden states [B, T, H] through every span; returns [B, T, H].
        per_layer_inputs [B, T, n_blocks, P]: Gemma 4's (ClientHead.per_layer_inputs).
        No new tokens (T = 0) is no step: nothing is sent and [B, 0, H] comes back."""
        return self._run(hidden, position, hypo_ids, attention_mask, prompts, per_layer_inputs,
                         states=False)[0]  # fmt: skip

    def step_with_states(
        self, hidden: torch.Tensor, *, position: int | None = None,
        hypo_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None, per_layer_inputs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """`step`, also giving each block's output [B, T, n_blocks, H] (the servers send
        them only when asked: n_blocks times the bytes of a step's reply)."""
        out, states = self._run(hidden, position, hypo_ids, attention_mask, prompts,
                                per_layer_inputs, states=True)  # fmt: skip
        assert states is not None
        return out, states

    def _run(
        self, hidden: torch.Tensor, position: int | None, hypo_ids: torch.Tensor | None,
        mask: torch.Tensor | None, prompts: torch.Tensor | None, per_layer: torch.Tensor | None,
        *, states: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        if self.closed:
            raise RuntimeError("this inference session is closed")
        position = self.position if position is None else position
        if position > self.position:
            raise LengthExceeded(f"position {position} is past the session's {self.position}")
        batch, tokens, width = hidden.shape
        if tokens == 0:
            n = self.end_block - self.start_block
            return hidden.clone(), hidden.new_empty(batch, 0, n, width) if states else None
        if position + tokens > self.max_length:
            raise LengthExceeded(
                f"session max_length {self.max_length} exceeded: position {position} + "
                f"{tokens} new tokens; open the session with a larger max_length"
            )
        step = StepInputs(hidden.to("cpu", self.dtype), position, to_cpu(hypo_ids), to_cpu(mask),
                          to_cpu(prompts), to_cpu(per_layer))  # fmt: skip
        out, block_states = self.client.run(self._step(step, states))
        self.position = position + tokens
        back = None if block_states is None else block_states.to(hidden.device, hidden.dtype)
        return out.to(hidden.device, hidden.dtype), back

    async def _step(
        self, step: StepInputs, states: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`step` through every span. Past `prefill_chunk_tokens` tokens it travels in chunks
        (no message outgrows a server's body limit), pipelined: span i+1 computes chunk j
        while span i computes chunk j+1 (`_pipeline`, relayed). A step of one chunk goes
        `_whole`: relayed span by span, or pushed from server to server."""
        if not self.spans:
            self.spans = await self._connect(self.start_block, self.end_block)
        parts = split_step(step, self.client.config.prefill_chunk_tokens)
        if len(parts) == 1:
            return await self._whole(step, states)
        chunks = [Chunk(c, c.hidden) for c in parts]
        if len(self.spans) > 1:
            await self._pipeline(chunks, states)
        for chunk in chunks:  # what the pipeline left (all, without one), with failovers
            await self._through(chunk, states)
        hidden = torch.cat([c.hidden for c in chunks], dim=1)
        if not states:
            return hidden, None
        return hidden, torch.cat([torch.cat(c.outputs, dim=2) for c in chunks], dim=1)

    async def _through(self, chunk: Chunk, states: bool) -> None:
        """`chunk` through the spans it has not passed yet, one after another; a failed span
        is replaced (its history replayed) and the chunk sent again."""
        if chunk.error is not None:  # the pipeline's failure on span `depth`
            exc, chunk.error = chunk.error, None
            await self._failover(chunk.depth, exc)
        while chunk.depth < len(self.spans):
            try:
                await self._advance(chunk, states)
            except DriftError as exc:
                await self._failover(chunk.depth, exc)  # then the replacement's first span

    async def _advance(self, chunk: Chunk, states: bool) -> None:
        """`chunk` through span `chunk.depth`: kept in its history, the chunk moves on."""
        span = self.spans[chunk.depth]
        inputs = self._inputs(chunk.step, chunk.hidden, span.hop, chunk.shared)
        out, donated = await self._send(span, inputs, self.end_block, states)
        span.history.append(inputs)
        if states:
            chunk.outputs.append(donated.pop(BLOCK_STATES))
        chunk.shared.update(donated)
        chunk.hidden, chunk.depth = out, chunk.depth + 1

    async def _pipeline(self, chunks: list[Chunk], states: bool) -> None:
        """Chunks through the spans, each span taking them in order as the one before gives
        them. At the first failure every span stops taking chunks; the failed chunk keeps
        its error, and `_through` finishes what is left in order."""
        queues: list[asyncio.Queue[Chunk | None]] = [asyncio.Queue() for _ in self.spans]
        for chunk in chunks:
            queues[0].put_nowait(chunk)
        queues[0].put_nowait(None)
        failed = False

        async def work(i: int) -> None:
            nonlocal failed
            while (chunk := await queues[i].get()) is not None and not failed:
                try:
                    await self._advance(chunk, states)
                except DriftError as exc:
                    failed, chunk.error = True, exc
                    break
                if i + 1 < len(queues):
                    queues[i + 1].put_nowait(chunk)
            if i + 1 < len(queues):
                queues[i + 1].put_nowait(None)

        await asyncio.gather(*(work(i) for i in range(len(self.spans))))

    async def _whole(
        self, step: StepInputs, states: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each span's output feeds the next. Sent span by span (relayed), or, when
        `_pushing`, sent to one span that pushes it on along the rest (drift.wire.push):
        the client then only reads each span's reply, in order. A span that fails is
        replaced and replayed (`_failover`), and the step relayed from there."""
        hidden = step.hidden
        shared: Tensors = {}  # keys/values of this step's new positions, by donor
        outputs: list[torch.Tensor] = []  # each hop's blocks' outputs, when asked
        awaited: dict[int, int] = {}  # span index -> step id its pushed reply comes under
        started = time.perf_counter()
        i = 0
        while i < len(self.spans):
            span = self.spans[i]
            inputs = self._inputs(step, hidden, span.hop, shared)
            try:
                if i in awaited:
                    out, donated, pushed = await self._read(span, inputs, awaited[i], started)
                    pushed = pushed or i == max(awaited)  # the last pushes nowhere
                elif self._pushing(i, step, states):
                    awaited = await self._send_pushed(i, inputs)
                    continue
                else:
                    out, donated = await self._send(span, inputs, self.end_block, states)
                    pushed = True
            except PushRefused:
                self.push_off, awaited = True, {}  # relay this step, and the next ones
                continue
            except DriftError as exc:
                awaited = {}
                await self._failover(i, exc)
                continue  # retry the same index: now the replacement's first span
            self.pushed += i in awaited and i != min(awaited)
            if pushed is not True:  # the chain stopped here: relay the rest of this step
                awaited = {}
            started = time.perf_counter()
            span.history.append(inputs)
            if states:
                outputs.append(donated.pop(BLOCK_STATES))
            shared.update(donated)
            hidden = out
            i += 1
        return hidden, torch.cat(outputs, dim=2) if states else None

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
                             sp.socket.next_step_id()) for sp in later)  # fmt: skip
        first = self.spans[index].socket
        req = m.StepRequest(first.next_step_id(), s.position, s.hidden, s.hypo_ids,
                            s.attention_mask)  # fmt: skip
        await first.send(req, hops)
        return {index: req.step_id} | {index + 1 + k: h.step_id for k, h in enumerate(hops)}

    async def _read(self, span: SpanState, s: StepInputs, step_id: int,
                    started: float) -> tuple[torch.Tensor, Tensors, bool | str]:  # fmt: skip
        """A pushed step's reply from `span`, within its adaptive timeout counted from the
        previous span's reply (the time this span's part of the chain takes)."""
        key, tokens = f"{span.hop.peer_id}:step", s.hidden.shape[0] * s.hidden.shape[1]
        reply, pushed = await span.socket.receive(
            step_id, timeout_s=self.client.timeouts.timeout(key, tokens)
        )
        seconds = time.perf_counter() - started
        self.client.swarm.note_rtt(span.hop.peer_id, seconds)
        self.client.timeouts.observe(key, tokens, seconds)
        return reply.hidden_states, dict(reply.extras), pushed

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
        key, tokens = f"{span.hop.peer_id}:step", s.hidden.shape[0] * s.hidden.shape[1]
        reply = await span.socket.step(
            s.hidden, s.position, hypo_ids=s.hypo_ids, attention_mask=s.attention_mask,
            prompts=slice_prompts(s.prompts, self.start_block, hop), extras=extras,
            donate=donate, states=states, timeout_s=self.client.timeouts.timeout(key, tokens),
        )  # fmt: skip
        seconds = time.perf_counter() - started
        span.lora_sent = True
        # measured step time feeds the per-peer EWMA that routing reads as rtt_s, and the
        # step timeout: a peer that stops answering is left after a few of its step times
        self.client.swarm.note_rtt(span.hop.peer_id, seconds)
        self.client.timeouts.observe(key, tokens, seconds)
        return reply.hidden_states, dict(reply.extras)

    async def _failover(self, index: int, exc: DriftError) -> None:
        """Replace span `index` by a new route over its blocks and replay its history."""
        if await follow_move(self, index, exc):  # handoff hook: it lives elsewhere, no replay
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
            new_spans = await self._connect(failed.hop.start_block, failed.hop.end_block)
            try:
                await self._replay(new_spans, failed.history, failed.hop.end_block)
                break
            except DriftError as replay_exc:
                for span in new_spans:
                    await span.socket.close()
                attempts = self.client.count_failure(replay_exc, new_spans[0].hop, attempts)
        self.spans[index : index + 1] = new_spans

    async def _replay(self, spans: list[SpanState], history: list[StepInputs], stop: int) -> None:
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

    def extend(self, max_length: int) -> None:
        """Room for `max_length` tokens: each span's server grows its session in place
        (drift.wire.extend: it keeps its cache, nothing is replayed); a span whose server
        refuses (no room, its limit, an older server) is reopened that long on a new route
        and its inputs replayed (as a failover does). Before the first step, only the number
        changes. If no route takes a refused span, the error rises (a server's largest
        max_length: LengthExceeded) and the session keeps its old max_length."""
        if max_length <= self.max_length:
            return
        if not self.spans:
            self.max_length = max_length
            return
        self.client.run(self._grow(max_length))

    async def _grow(self, max_length: int) -> None:
        refused: list[int] = []
        for i, span in enumerate(self.spans):
            try:
                await span.socket.extend(max_length)
            except DriftError:
                refused.append(i)
        if refused:
            await self._reopen(max_length, refused)
        self.max_length = max_length

    async def _reopen(self, max_length: int, indices: list[int]) -> None:
        """Spans `indices` reopened `max_length` long on new routes, their inputs replayed."""
        shorter, self.max_length = self.max_length, max_length  # what _connect reserves
        fresh: list[list[SpanState]] = []
        try:  # all opened before any is given up: a refusal changes nothing
            for i in indices:
                span = self.spans[i]
                fresh.append(await self._connect(span.hop.start_block, span.hop.end_block))
        except BaseException:
            for group in fresh:
                for new in group:
                    await new.socket.close()
            raise
        finally:
            self.max_length = shorter
        for i, group in reversed(list(zip(indices, fresh, strict=True))):
            old = self.spans[i]
            await old.socket.close()
            self.spans[i : i + 1] = group
            await self._replay(group, old.history, old.hop.end_block)

    def close(self, *, wait: bool = True) -> None:
        """Close every span's socket (the servers free the caches); `wait=False` does not
        wait for it (a finalizer, from any thread). A closed client has closed them all."""
        if self.closed:
            return
        self.closed = True
        if not self.spans or self.client.closed:
            return
        if wait:
            self.client.run(self._close_all())
        else:
            self.client.submit(self._close_all())

    async def _close_all(self) -> None:
        for span in self.spans:
            await span.socket.close()
        self.spans = []
