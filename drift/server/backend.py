"""The compute side of a block server: one loaded span and the executor its torch work runs on.

Stateless forward and backward over any sub-span of what is held, after the checks that
only the server can do (model, span, batch). Knows nothing about HTTP; sessions live in
sessions.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from drift.wire.checks import dtype_name
from drift.wire.errors import BadRequest, ModelMismatch, SpanNotServed
from drift.wire.extras import ExtraSpec
from drift.wire.messages import BackwardRequest, BackwardResponse, ForwardRequest, ForwardResponse

T = TypeVar("T")


class SpanBackend:
    def __init__(
        self, span: Any, *, model_name: str, fingerprint: str, max_batch_size: int,
        quant: str = "none",
    ) -> None:  # fmt: skip
        self.span = span  # drift.models.ModelSpan
        self.model_name = model_name
        self.fingerprint = fingerprint
        self.max_batch_size = max_batch_size
        self.quant = quant
        self.start_block: int = span.start_block
        self.end_block: int = span.end_block
        self.hidden_size: int = int(span.config.hidden_size)
        self.num_model_blocks: int = int(span.config.num_hidden_layers)
        self.dtype_name = dtype_name(span.dtype)
        # One worker per device: torch work never blocks the event loop, and runs in order.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drift-compute")

    @property
    def n_blocks(self) -> int:
        return self.end_block - self.start_block

    def extra_spec(self, start_block: int, end_block: int) -> ExtraSpec:
        """What a request for [start_block, end_block) carries beside hidden_states (Gemma 4):
        the wire edge validates against it, so a span not held here is refused first."""
        self.check_span(start_block, end_block)
        return self.span.extra_spec(start_block, end_block)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run torch work on the compute thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def check(self, model: str, start_block: int, end_block: int, batch: int) -> None:
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

    def check_span(self, start_block: int, end_block: int) -> None:
        if not (self.start_block <= start_block and end_block <= self.end_block):
            raise SpanNotServed(
                f"blocks [{start_block}, {end_block}) are not all held here: this server "
                f"holds [{self.start_block}, {self.end_block})",
                start_block=self.start_block,
                end_block=self.end_block,
            )

    async def forward(self, req: ForwardRequest) -> ForwardResponse:
        self.check(req.model, req.start_block, req.end_block, req.hidden_states.shape[0])
        return await self.run(self._forward, req)

    async def backward(self, req: BackwardRequest) -> BackwardResponse:
        self.check(req.model, req.start_block, req.end_block, req.hidden_states.shape[0])
        return await self.run(self._backward, req)

    # The requests were validated at the wire edge (ForwardRequest/BackwardRequest.from_wire)
    # and by `check`: the span's trusted entries run them as they are.
    def _forward(self, req: ForwardRequest) -> ForwardResponse:
        out, donated = self.span.run_forward(req.start_block, req.end_block, req.hidden_states,
                                             req.attention_mask, req.prompts, req.extras,
                                             req.donate, req.block_states)  # fmt: skip
        return ForwardResponse(out.to("cpu"), {k: v.to("cpu") for k, v in donated.items()})

    def _backward(self, req: BackwardRequest) -> BackwardResponse:
        grad, grad_prompts, grad_extras = self.span.run_backward(
            req.start_block, req.end_block, req.hidden_states, req.grad_outputs,
            req.attention_mask, req.prompts, req.extras, req.grad_extras,
        )  # fmt: skip
        return BackwardResponse(
            grad.detach().to("cpu"),
            None if grad_prompts is None else grad_prompts.to("cpu"),
            {k: v.detach().to("cpu") for k, v in grad_extras.items()},
        )

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
