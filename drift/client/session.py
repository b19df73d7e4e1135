"""InferenceSession: token-by-token inference through a chain of server-side KV caches.

One WebSocket per span. Every input sent to a span is kept; when a server fails mid-
session, its span is routed to other servers and that history is replayed into them,
so generation continues with identical results. Gemma 4: each step sends every span its
per-layer inputs and the new positions' keys/values of donors in earlier spans (the servers
keep the past ones); a replay carries them too. Sync methods wrap the async core.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from drift.client.extras import Tensors, hop_extras
from drift.client.remote import RemoteClient, slice_prompts
from drift.client.routing import Hop
from drift.client.transport import SpanSocket
from drift.wire import messages as m
from drift.wire.errors import DriftError, LengthExceeded


@dataclass(frozen=True)
class StepInputs:
    """What one step sent to one span: enough to replay it exactly."""

    hidden: torch.Tensor  # [B, T, H]
    position: int
    hypo_ids: torch.Tensor | None  # [B]
    attention_mask: torch.Tensor | None  # [B, T]
    prompts: torch.Tensor | None  # [n_blocks_of_session, B, P, H] (sliced per hop on send)
    per_layer: torch.Tensor | None = None  # [B, T, n_blocks_of_session, P] (sliced per hop)
    shared: Tensors = field(default_factory=dict)  # K/V of earlier donors this span read


@dataclass
class SpanState:
    hop: Hop
    socket: SpanSocket
    history: list[StepInputs] = field(default_factory=list)


class InferenceSession:
    """A KV-cached session over blocks [start_block, end_block); use as a context manager."""

    def __init__(
        self, client: RemoteClient, start_block: int, end_block: int, *,
        max_length: int, batch_size: int = 1, dtype: torch.dtype = torch.float32,
    ) -> None:  # fmt: skip
        self.client = client
        self.start_block, self.end_block = start_block, end_block
        self.max_length, self.batch_size = max_length, batch_size
        self.dtype_name = str(dtype).removeprefix("torch.")
        self.position = 0
        self.spans: list[SpanState] = []
        self.closed = False
        self.failovers = 0

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_msg(self, hop: Hop) -> m.OpenSession:
        return m.OpenSession(self.client.model_fingerprint, hop.start_block, hop.end_block,
                             self.max_length, self.batch_size, self.dtype_name)  # fmt: skip

    async def _connect(self, start: int, end: int) -> list[SpanState]:
        """Open sockets along a fresh route over [start, end), retrying around failures."""
        attempts = 0
        while True:
            hops = await self.client.route(
                start, end, inference=True, tokens_needed=self.max_length * self.batch_size
            )
            opened: list[SpanState] = []
            try:
                for hop in hops:
                    sock = await SpanSocket.open(
                        self.client.http, hop, self._open_msg(hop), self.client.config
                    )
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
        per_layer_inputs [B, T, n_blocks, P]: Gemma 4's (ClientHead.per_layer_inputs)."""
        if self.closed:
            raise RuntimeError("this inference session is closed")
        position = self.position if position is None else position
        if position > self.position:
            raise LengthExceeded(f"position {position} is past the session's {self.position}")
        if position + hidden.shape[1] > self.max_length:
            raise LengthExceeded(
                f"session max_length {self.max_length} exceeded: position {position} + "
                f"{hidden.shape[1]} new tokens; open the session with a larger max_length"
            )
        step = StepInputs(hidden, position, hypo_ids, attention_mask, prompts, per_layer_inputs)
        out = self.client.run(self._step(step))
        self.position = position + hidden.shape[1]
        return out

    async def _step(self, step: StepInputs) -> torch.Tensor:
        if not self.spans:
            self.spans = await self._connect(self.start_block, self.end_block)
        hidden = step.hidden
        shared: Tensors = {}  # keys/values of this step's new positions, by donor
        i = 0
        while i < len(self.spans):
            inputs = self._inputs(step, hidden, self.spans[i].hop, shared)
            try:
                out, donated = await self._send(self.spans[i], inputs, self.end_block)
            except DriftError as exc:
                await self._failover(i, exc)
                continue  # retry the same index: now the replacement's first span
            self.spans[i].history.append(inputs)
            shared.update(donated)
            hidden = out
            i += 1
        return hidden

    def _inputs(self, step: StepInputs, hidden: torch.Tensor, hop: Hop,
                shared: Tensors) -> StepInputs:  # fmt: skip
        """What span `hop` gets of `step`: its input and the K/V it reads of earlier donors."""
        read = hop_extras(self.client.sharing, hop.start_block, hop.start_block, hop.end_block,
                          None, shared)  # fmt: skip
        return StepInputs(hidden, step.position, step.hypo_ids, step.attention_mask,
                          step.prompts, step.per_layer, read)  # fmt: skip

    async def _send(
        self, span: SpanState, s: StepInputs, stop: int
    ) -> tuple[torch.Tensor, Tensors]:
        """One step on one span: (its output, the K/V it donated to blocks before `stop`)."""
        hop = span.hop
        extras = hop_extras(self.client.sharing, self.start_block, hop.start_block,
                            hop.end_block, s.per_layer, s.shared)  # fmt: skip
        donate = self.client.sharing.donated(hop.start_block, hop.end_block, stop)
        started = time.perf_counter()
        reply = await span.socket.step(
            s.hidden, s.position, hypo_ids=s.hypo_ids, attention_mask=s.attention_mask,
            prompts=slice_prompts(s.prompts, self.start_block, hop), extras=extras,
            donate=donate,
        )  # fmt: skip
        # measured step time feeds the per-peer EWMA that routing reads as rtt_s
        self.client.swarm.note_rtt(span.hop.peer_id, time.perf_counter() - started)
        return reply.hidden_states, reply.extras

    async def _failover(self, index: int, exc: DriftError) -> None:
        """Replace span `index` by a new route over its blocks and replay its history."""
        failed = self.spans[index]
        self.client.note_failure(exc, failed.hop)
        self.failovers += 1
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

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.spans:
            self.client.run(self._close_all())

    async def _close_all(self) -> None:
        for span in self.spans:
            await span.socket.close()
        self.spans = []
