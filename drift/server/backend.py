"""The compute side of a block server: one loaded span and the executor its torch work runs on.

Stateless forward and backward over any sub-span of what is held, after the checks that
only the server can do (model, span, batch, tokens per request), run in chunks of at most
`chunk_tokens` tokens (drift.server.chunks) so other requests run in between. Knows nothing
about HTTP; sessions live in sessions.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from drift.models.batch import BatchStep, StepOut, run_steps
from drift.models.memory import trim_heap
from drift.models.row_kernel import activated, kernel_in
from drift.models.threads import threads
from drift.server.chunks import (
    MIN_CHUNK_TOKENS,
    chunk_tokens_for,
    forward_chunks,
    merge_grad_prompts,
    row_groups,
)
from drift.server.compute_thread import ComputeThread
from drift.server.decode_threads import BATCH_ROWS
from drift.wire.checks import dtype_name
from drift.wire.errors import BadRequest, Busy, ModelMismatch, PayloadTooLarge, SpanNotServed
from drift.wire.extras import ExtraSpec
from drift.wire.messages import BackwardRequest, BackwardResponse, ForwardRequest, ForwardResponse

T = TypeVar("T")
log = logging.getLogger(__name__)
TRIM_AFTER_TOKENS = 32  # a step this long (a prompt, not a decode or a short draft) trims


class SpanBackend:
    def __init__(
        self, span: Any, *, model_name: str, fingerprint: str, max_batch_size: int,
        quant: str = "none", max_request_tokens: int = 8192, chunk_tokens: int = 1024,
        pace: float | None = None, sized_by_pace: bool = False,
        prompt_pace: float | None = None,
    ) -> None:  # fmt: skip
        self.span = span  # drift.models.ModelSpan
        self.model_name = model_name
        self.fingerprint = fingerprint
        self.max_batch_size = max_batch_size
        self.quant = quant
        self.max_request_tokens = max_request_tokens  # B x T of one /forward or /backward
        self.chunk_tokens = chunk_tokens  # tokens of one unit of work on the compute thread
        self.pace = pace  # measured block-tokens/s of one block (None: not measured)
        # whether chunk_tokens follows the pace (not set by the operator): then it grows to
        # the pace prompts' units are seen to run at (`note_prompt_unit`)
        self.sized_by_pace = sized_by_pace
        self.prompt_pace = prompt_pace  # block-tokens/s prompts' units ran at, smoothed
        self.chunks_run = 0  # units of work run (a counter for metrics and tests)
        self.start_block: int = span.start_block
        self.end_block: int = span.end_block
        self.hidden_size: int = int(span.config.hidden_size)
        self.num_model_blocks: int = int(span.config.num_hidden_layers)
        self.dtype_name = dtype_name(span.dtype)
        # Plain decode steps: a lean (maybe compiled) unit, or None for the eager path; set by
        # drift.server.compiled.attach_decode, with what /blocks shows of it.
        self.decode: Any = None
        self.decode_status: dict[str, Any] = {"mode": "eager", "reason": "--compile off"}
        # torch threads plain decode steps run on (drift.server.decode_threads), set at
        # start-up: `decode_threads` under BATCH_ROWS rows, `batch_threads` from there; None:
        # torch's own, as prompts
        self.decode_threads: int | None = None
        self.batch_threads: int | None = None
        # DRIFT's row kernel, installed in the span's linears (drift.server.products): session
        # steps compute on it (`activated`: decode steps, prompts of a few tokens), /forward
        # and /backward on torch's BLAS
        self.row_kernel = kernel_in(span.layers)
        # One worker per device: torch work never blocks the event loop, and runs in order.
        self.executor = ComputeThread()
        self.unloaded: str | None = None  # why compute is refused: the weights were freed
        self.trim: Callable[[], None] = trim_heap  # returns freed heap memory to the OS
        # sessions whose last step was a prompt: their next step trims its memory too
        self._prompted: weakref.WeakSet[Any] = weakref.WeakSet()

    @property
    def n_blocks(self) -> int:
        return self.end_block - self.start_block

    @property
    def unit_s(self) -> float | None:
        """Seconds one unit of compute-thread work (a chunk of `chunk_tokens` tokens through
        every block held) takes at the measured pace; None where it was not measured."""
        if not self.pace:
            return None
        return self.chunk_tokens * self.n_blocks / self.pace

    def note_prompt_unit(self, rows: int, tokens: int, seconds: float) -> None:
        """A unit of a prompt (`rows` x `tokens` tokens through every block held; shorter
        than MIN_CHUNK_TOKENS per row: not a prompt) was answered in `seconds`, waits
        included. The 16-token pace that sized the units underestimates how
        fast prompts run (SmolLM2 on 2 CPU cores: about half), and small units cost: 4,096
        tokens in 256-token units took 9% longer than in 512-token ones. So, where the
        operator did not fix it, chunk_tokens follows the pace units are seen to run at
        (smoothed; never below the measured pace's size), keeping a unit within
        CHUNK_TARGET_S as before."""
        if not self.sized_by_pace or tokens < MIN_CHUNK_TOKENS or seconds <= 0:
            return
        seen = rows * tokens * self.n_blocks / seconds
        pace = seen if self.prompt_pace is None else (self.prompt_pace + seen) / 2
        self.prompt_pace = pace
        chunk = self.sized_chunk(self.n_blocks)
        if chunk != self.chunk_tokens:
            log.info("prompt units now %d tokens (prompts ran at %.0f block-tokens/s)",
                     chunk, pace)  # fmt: skip
            self.chunk_tokens = chunk

    def sized_chunk(self, n_blocks: int) -> int:
        """Tokens of a unit over `n_blocks` blocks at the pace units run at: the larger of the
        measured pace and the one prompts ran at (`note_prompt_unit`)."""
        return chunk_tokens_for(max(self.pace or 0.0, self.prompt_pace or 0.0), n_blocks)

    def extra_spec(self, start_block: int, end_block: int) -> ExtraSpec:
        """What a request for [start_block, end_block) carries beside hidden_states (Gemma 4):
        the wire edge validates against it, so a span not held here is refused first."""
        self.check_span(start_block, end_block)
        return self.span.extra_spec(start_block, end_block)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run torch work on the compute thread (a retryable Busy once `unload`ed)."""
        if self.unloaded is not None:
            raise Busy(self.unloaded)
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def check(self, model: str, start_block: int, end_block: int, batch: int,
              tokens: int = 0) -> None:  # fmt: skip
        """Model, span and batch of a request; with `tokens` (its T), B x T too."""
        if model not in (self.fingerprint, self.model_name):
            raise ModelMismatch(
                f"this server serves {self.model_name} (fingerprint {self.fingerprint[:12]}), "
                f"not {model[:64]}"
            )
        self.check_span(start_block, end_block)
        if batch > self.max_batch_size:
            raise BadRequest(
                f"batch size {batch} exceeds this server's max of {self.max_batch_size}"
            )
        if batch * tokens > self.max_request_tokens:
            raise PayloadTooLarge(
                f"{batch} x {tokens} = {batch * tokens} tokens exceed this server's "
                f"max_request_tokens={self.max_request_tokens}; split the batch or the sequence"
            )

    def check_span(self, start_block: int, end_block: int) -> None:
        if not (self.start_block <= start_block and end_block <= self.end_block):
            raise SpanNotServed(
                f"blocks [{start_block}, {end_block}) are not all held here: this server "
                f"holds [{self.start_block}, {self.end_block})",
                start_block=self.start_block,
                end_block=self.end_block,
            )

    async def run_chunk(self, fn: Callable[[], T]) -> T:
        self.chunks_run += 1
        return await self.run(fn)

    def run_steps(self, steps: list[BatchStep]) -> list[StepOut]:
        """Batched steps of sessions (drift.server.batcher), on the compute thread; plain
        decode steps (one token each) on `step_threads`."""
        decoding = all(int(s.hidden.shape[1]) == 1 for s in steps)
        rows = sum(int(s.hidden.shape[0]) for s in steps)
        try:
            with threads(self.step_threads(rows) if decoding else None):
                return self.compute_steps(steps)
        finally:
            self._release_freed(steps)

    def step_threads(self, rows: int) -> int | None:
        """Torch threads of a decode step of `rows` rows (drift.server.decode_threads)."""
        return self.batch_threads if rows >= BATCH_ROWS else self.decode_threads

    def compute_steps(self, steps: list[BatchStep]) -> list[StepOut]:
        """(Compute thread) The decode unit where it takes `steps`, else drift.models.batch;
        every session step with the row kernel active (its few-row products: decode steps,
        prompts of a few tokens)."""
        with activated(self.row_kernel):
            if self.decode is not None and self.decode.takes(steps):
                return [(out, {}) for out in self.decode.run(steps)]
            return run_steps(steps)

    def _release_freed(self, steps: list[BatchStep]) -> None:
        """(Compute thread) Hand freed heap memory back to the OS after steps with a prompt
        (over TRIM_AFTER_TOKENS tokens in a row: its activations, up to tokens x tokens
        attention scores per layer) and after the first step of each such session after it
        (the decode unit moves the prompt's keys/values into their buffers): glibc keeps
        such memory, and 8 sessions' prompts of 1,000 tokens left a server's resident memory
        half as large again as its KV budget. A trim takes a few ms, once or twice per
        prompt (decode steps of sessions past their first never pay one)."""
        prompted = [s.session for s in steps if int(s.hidden.shape[1]) > TRIM_AFTER_TOKENS]
        if prompted or any(s.session in self._prompted for s in steps):
            self.trim()
        for step in steps:
            self._prompted.discard(step.session)
        self._prompted.update(prompted)

    # The requests were validated at the wire edge (ForwardRequest/BackwardRequest.from_wire)
    # and by `check`: the span's trusted entries run them as they are. Plain requests run
    # chunk by chunk; those with extras (Gemma 4's per-layer inputs and shared K/V, LoRA
    # weights), a served LoRA adapter, or asking for every block's states run as one unit
    # (bounded by max_request_tokens).
    async def forward(self, req: ForwardRequest) -> ForwardResponse:
        self.check(req.model, req.start_block, req.end_block, *req.hidden_states.shape[:2])
        if req.extras or req.donate or req.block_states or req.adapter:
            return await self.run_chunk(functools.partial(self._forward, req))
        outs = []
        for group in row_groups(req.hidden_states, req.attention_mask, req.prompts,
                                self.chunk_tokens):  # fmt: skip
            out = None
            for unit in forward_chunks(self.span, req.start_block, req.end_block, group,
                                       self.chunk_tokens):  # fmt: skip
                out = await self.run_chunk(unit)
            outs.append(out)
        return ForwardResponse(await self.run(_gather, outs))

    async def backward(self, req: BackwardRequest) -> BackwardResponse:
        self.check(req.model, req.start_block, req.end_block, *req.hidden_states.shape[:2])
        if req.extras or req.grad_extras or req.adapter:
            return await self.run_chunk(functools.partial(self._backward, req))
        grads, grad_prompts = [], []
        for group in row_groups(req.hidden_states, req.attention_mask, req.prompts,
                                self.chunk_tokens, grad=req.grad_outputs):  # fmt: skip
            grad, g_prompts = await self.run_chunk(
                functools.partial(self._backward_rows, req.start_block, req.end_block, group)
            )
            grads.append(grad)
            grad_prompts.append(g_prompts)
        return BackwardResponse(torch.cat(grads, dim=0),
                                merge_grad_prompts(grad_prompts, req.prompts))  # fmt: skip

    def _forward(self, req: ForwardRequest) -> ForwardResponse:
        with self.span.serving(adapter=req.adapter):
            out, donated = self.span.run_forward(req.start_block, req.end_block,
                                                 req.hidden_states, req.attention_mask,
                                                 req.prompts, req.extras, req.donate,
                                                 req.block_states)  # fmt: skip
        return ForwardResponse(out.to("cpu"), {k: v.to("cpu") for k, v in donated.items()})

    def _backward(self, req: BackwardRequest) -> BackwardResponse:
        with self.span.serving(adapter=req.adapter):
            grad, grad_prompts, grad_extras = self.span.run_backward(
                req.start_block, req.end_block, req.hidden_states, req.grad_outputs,
                req.attention_mask, req.prompts, req.extras, req.grad_extras,
            )  # fmt: skip
        return BackwardResponse(
            grad.detach().to("cpu"),
            None if grad_prompts is None else grad_prompts.to("cpu"),
            {k: v.detach().to("cpu") for k, v in grad_extras.items()},
        )

    def _backward_rows(
        self, start: int, end: int, group: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        grad, grad_prompts, _ = self.span.run_backward(start, end, group.hidden, group.grad,
                                                       group.mask, group.prompts)  # fmt: skip
        return grad.detach().to("cpu"), None if grad_prompts is None else grad_prompts.to("cpu")

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def unload(self, reason: str) -> None:
        """Free the span's weights (a move that makes room first, drift.server.move): compute
        is refused with `reason` from now on. Blocks until the work running now finished
        (queued work is dropped): call it off the event loop."""
        self.unloaded = reason
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.decode = None  # the lean decode unit holds views of the weights
        self.span.unload()


def _gather(outs: list[torch.Tensor]) -> torch.Tensor:
    """Row groups' outputs as one [B, T, H] CPU tensor (on the compute thread: a device sync)."""
    return torch.cat([o.to("cpu") for o in outs], dim=0)
