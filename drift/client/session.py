"""InferenceSession: token-by-token inference through a chain of server-side KV caches.

One WebSocket per span. Every input sent to a span is kept; when a server fails mid-
session, its span is routed to other servers and that history is replayed into them,
so generation continues with identical results. Sync methods wrap the async core.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

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
        prompts: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Run new tokens' hidden states [B, T, H] through every span; returns [B, T, H]."""
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
        step = StepInputs(hidden, position, hypo_ids, attention_mask, prompts)
        out = self.client.run(self._step(step))
        self.position = position + hidden.shape[1]
        return out

    async def _step(self, step: StepInputs) -> torch.Tensor:
        if not self.spans:
            self.spans = await self._connect(self.start_block, self.end_block)
        hidden = step.hidden
        i = 0
        while i < len(self.spans):
            inputs = StepInputs(hidden, step.position, step.hypo_ids, step.attention_mask,
                                step.prompts)  # fmt: skip
            try:
                out = await self._send(self.spans[i], inputs)
            except DriftError as exc:
                await self._failover(i, exc)
                continue  # retry the same index: now the replacement's first span
            self.spans[i].history.append(inputs)
            hidden = out
            i += 1
        return hidden

    async def _send(self, span: SpanState, s: StepInputs) -> torch.Tensor:
        started = time.perf_counter()
        key, tokens = f"{span.hop.peer_id}:step", s.hidden.shape[0] * s.hidden.shape[1]
        out = await span.socket.step(
            s.hidden, s.position, hypo_ids=s.hypo_ids, attention_mask=s.attention_mask,
            prompts=slice_prompts(s.prompts, self.start_block, span.hop),
            timeout_s=self.client.timeouts.timeout(key, tokens),
        )  # fmt: skip
        seconds = time.perf_counter() - started
        # measured step time feeds the per-peer EWMA that routing reads as rtt_s, and the
        # step timeout: a peer that stops answering is left after a few of its step times
        self.client.swarm.note_rtt(span.hop.peer_id, seconds)
        self.client.timeouts.observe(key, tokens, seconds)
        return out

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
                await self._replay(new_spans, failed.history)
                break
            except DriftError as replay_exc:
                for span in new_spans:
                    await span.socket.close()
                attempts = self.client.count_failure(replay_exc, new_spans[0].hop, attempts)
        self.spans[index : index + 1] = new_spans

    async def _replay(self, spans: list[SpanState], history: list[StepInputs]) -> None:
        for past in history:
            hidden = past.hidden
            for span in spans:
                inputs = StepInputs(hidden, past.position, past.hypo_ids, past.attention_mask,
                                    past.prompts)  # fmt: skip
                hidden = await self._send(span, inputs)
                span.history.append(inputs)

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
