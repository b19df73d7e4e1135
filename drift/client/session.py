"""InferenceSession: token-by-token inference through a chain of server-side KV caches.

The session owns the position and what the spans open with; its `Chain` (drift.client.chain)
owns one WebSocket per span, every input sent to each, and failover (a failed span's blocks
routed to other servers, its history replayed: identical results); `extend` grows every span's session in
place (reopened and replayed only where a server refuses). Gemma 4: each step sends every
span its per-layer inputs and the new positions' keys/values of donors in earlier spans
(the servers keep the past ones); a replay carries them too. LoRA: a session asks its
servers for a served adapter (`adapter`, at open), and sends LoRA weights being trained
(`lora`) once per socket, with its first step. Steps take tensors on any device and give
them back there, in the caller's dtype. Sync methods wrap the async core."""

from __future__ import annotations

import dataclasses
import logging

import torch

from drift.client.chain import Chain, MakeRoom, SpanState
from drift.client.extras import Tensors
from drift.client.remote import RemoteClient
from drift.client.routing import Hop
from drift.client.step_inputs import Chunk, StepInputs, fork_history, split_step, to_cpu
from drift.client.transport import OpenRefused, close_all
from drift.wire import messages as m
from drift.wire.errors import BadRequest, DriftError, LengthExceeded

log = logging.getLogger(__name__)


class InferenceSession:
    """A KV-cached session over blocks [start_block, end_block); use as a context manager."""

    def __init__(
        self, client: RemoteClient, start_block: int, end_block: int, *,
        max_length: int, batch_size: int = 1, dtype: torch.dtype = torch.float32,
        adapter: str | None = None, lora: Tensors | None = None, headroom: int = 0,
        make_room: MakeRoom | None = None,
    ) -> None:  # fmt: skip
        """`adapter`: a served LoRA adapter; `lora`: wire-named LoRA weights (drift.wire.lora)
        of the blocks, detached, sent to each server once. `headroom`: tokens of
        `max_length` the session opens without where servers refuse them (past a server's
        limit, or no room on any): it then opens `max_length - headroom` long (its
        `max_length` says which, once its first step is through). `make_room`: awaited on
        the client's loop where no server has room for the session, before its headroom is
        given up or the refusal rises: True when it freed some (e.g. the caller's idle
        sessions closed), and the servers are asked again."""
        if not 0 <= headroom < max_length:
            raise ValueError(f"headroom {headroom} must be in [0, max_length={max_length})")
        self.client = client
        self.headroom, self.make_room = headroom, make_room
        self.adapter = adapter
        self.lora = dict(lora or {})
        self.start_block, self.end_block = start_block, end_block
        self.max_length, self.batch_size = max_length, batch_size
        self.dtype = dtype  # what steps travel in (the servers check it)
        self.dtype_name = str(dtype).removeprefix("torch.")
        self._position = 0  # tokens the servers hold (the next step starts here)
        self.chain = Chain(client, self, start_block, end_block, self.lora)
        self.closed = False
        self._spared = False  # spares to its servers asked for (after its first step)

    @property
    def position(self) -> int:
        """Where the next step starts: tokens the spans' caches hold."""
        return self._position

    @position.setter
    def position(self, position: int) -> None:
        self.rollback(position)

    def rollback(self, position: int) -> None:
        """The next step starts at `position` (at most the current one): the servers then
        overwrite their caches from there (a step below the cache length rolls back)."""
        if not 0 <= position <= self._position:
            raise LengthExceeded(f"cannot roll back to position {position}: the session holds "
                                 f"{self._position} tokens")  # fmt: skip
        self._position = position

    @property
    def spans(self) -> list[SpanState]:
        return self.chain.spans

    @property
    def failovers(self) -> int:
        return self.chain.failovers

    @property
    def moves(self) -> int:
        """Spans followed to the server their session was handed to (drift.client.handoff)."""
        return self.chain.moves

    @property
    def pushed(self) -> int:
        """Span replies that came by server push (not sent by us)."""
        return self.chain.pushed

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def drop_headroom(self) -> bool:
        """Open `headroom` tokens shorter from now on (a server refused the length: past its
        limit, or no room); whether there was headroom to give up."""
        if not self.headroom:
            return False
        log.debug("opening %d tokens shorter: %d", self.headroom, self.max_length - self.headroom)
        self.max_length, self.headroom = self.max_length - self.headroom, 0
        return True

    def open_msg(self, hop: Hop) -> m.OpenSession:
        return m.OpenSession(self.client.model_fingerprint, hop.start_block, hop.end_block,
                             self.max_length, self.batch_size, self.dtype_name,
                             self.adapter)  # fmt: skip

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
        self._position = position + tokens
        back = None if block_states is None else block_states.to(hidden.device, hidden.dtype)
        return out.to(hidden.device, hidden.dtype), back

    def connect(self) -> None:
        """Open the sessions on the servers now, not at the first step: a refusal (no room
        for it: CacheFull; no server: MissingBlocks) rises here."""
        self.client.run(self._connect())

    async def _connect(self) -> None:
        if not self.chain.spans:
            self.chain.spans = await self.chain.connect(self.start_block, self.end_block)

    async def _step(
        self, step: StepInputs, states: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`step` through every span. Past `prefill_chunk_tokens` tokens it travels in chunks
        (no message outgrows a server's body limit), pipelined: span i+1 computes chunk j
        while span i computes chunk j+1 (`Chain.pipeline`, relayed; spans whose servers share
        cores take each chunk in turn instead). A step of one chunk goes
        `Chain.whole`: relayed span by span, or pushed from server to server. The session's
        first step follows its opens at once, without waiting for their answers (one round
        trip less before the first token); where one did not open, the chain is opened
        again the long way and the step sent again. After the session's first step, spare
        sockets to its servers are made ready for the next session (drift.client.spares),
        off that step's path."""
        if not self.chain.spans:
            self.chain.spans = await self.chain.connect(self.start_block, self.end_block,
                                                        wait=False)  # fmt: skip
        try:
            out = await self._through(step, states)
        except OpenRefused as exc:  # only before a first step went through every span
            log.debug("a session did not open (%s): opening again, waiting", exc)
            await self.chain.reopen(exc)
            out = await self._through(step, states)
        self.headroom = 0  # opened: what it holds is its own from now on
        if not self._spared:
            self._spared = True
            for span in self.chain.spans:
                self.client.spares.refill(span.hop)
        return out

    async def _through(
        self, step: StepInputs, states: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        chain = self.chain
        parts = split_step(step, self.client.config.prefill_chunk_tokens)
        if len(parts) == 1:
            return await chain.whole(step, states)
        chunks = [Chunk(c, c.hidden) for c in parts]
        await chain.confirm()  # a pipeline's failures are spans failing, not opens refused
        if len(chain.spans) > 1:
            await chain.pipeline(chunks, states)
        for chunk in chunks:  # what the pipeline left (all, without one), with failovers
            await chain.through(chunk, states)
        hidden = torch.cat([c.hidden for c in chunks], dim=1)
        if not states:
            return hidden, None
        return hidden, torch.cat([torch.cat(c.outputs, dim=2) for c in chunks], dim=1)

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
        shorter, self.max_length = self.max_length, max_length  # what Chain.connect reserves
        fresh: list[list[SpanState]] = []
        try:  # all opened before any is given up: a refusal changes nothing
            for i in indices:
                span = self.spans[i]
                fresh.append(await self.chain.connect(span.hop.start_block, span.hop.end_block))
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
            await self.chain.replay(group, old.history, old.hop.end_block)

    def fork(self, batch_size: int, max_length: int,
             tokens: int | None = None) -> InferenceSession:  # fmt: skip
        """A new session of `batch_size` rows, each starting with the first `tokens` tokens
        (default: all) this one-row session holds (a shared prompt prefix, computed once),
        its position there. It opens on the same servers, which copy their caches
        (OpenSession.fork_of); its spans' histories are this one's, rows repeated (a
        failover replays them). Raises DriftError where a server refuses (an older one, no
        room: nothing stays open); this session is not changed."""
        if self.closed or not self.spans or self.batch_size != 1 or self.lora:
            raise BadRequest("only an open one-row session without LoRA weights is forked")
        tokens = self._position if tokens is None else tokens
        if not 1 <= tokens <= self._position:
            raise LengthExceeded(f"a fork of {tokens} tokens: the session holds "
                                 f"{self._position}")  # fmt: skip
        if max_length < tokens:
            raise LengthExceeded(f"max_length {max_length} is under the {tokens} tokens a "
                                 "fork starts with")  # fmt: skip
        new = InferenceSession(self.client, self.start_block, self.end_block,
                               max_length=max_length, batch_size=batch_size, dtype=self.dtype,
                               adapter=self.adapter)  # fmt: skip
        new.chain.spans = self.client.run(self._forked(new, tokens))
        new._position = tokens
        return new

    async def _forked(self, new: InferenceSession, tokens: int) -> list[SpanState]:
        """Every span's fork opened at once; all closed again if one is refused."""

        socks, failed = await self.client.open_sockets([
            (span.hop, dataclasses.replace(new.open_msg(span.hop),
                                           fork_of=span.socket.session_id, fork_tokens=tokens))
            for span in self.spans
        ])  # fmt: skip
        if failed:
            raise failed[0][1]
        if any(sock.holds != tokens for sock in socks):
            await close_all(socks)
            raise BadRequest("a server did not fork the session (an older one)")
        return [SpanState(span.hop, sock, fork_history(span.history, tokens, new.batch_size))
                for span, sock in zip(self.spans, socks, strict=True)]  # fmt: skip

    def idle(self) -> None:
        """Say the session takes no step for now (kept open for a later turn of a chat): its
        servers then batch other sessions' steps without waiting for its next one, until it
        steps again. Sent in the background (from any thread); a step may follow at once."""
        if not self.closed and self.spans and not self.client.closed:
            self.client.submit(self.chain.idle())

    async def aclose(self) -> None:
        """`close`, awaited on the client's loop (a `make_room` closing idle sessions)."""
        if not self.closed:
            self.closed = True
            if self.spans:
                await self.chain.close()

    def close(self, *, wait: bool = True) -> None:
        """Close every span's socket (the servers free the caches); `wait=False` does not
        wait for their replies (generate()'s own sessions, a finalizer; from any thread):
        this client's next session on those servers opens once they are through
        (drift.client.spares). A closed client has closed them all."""
        if self.closed:
            return
        self.closed = True
        if not self.spans or self.client.closed:
            return
        if wait:
            self.client.run(self.chain.close())
        else:
            self.client.submit(self.chain.close())
