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

import torch

from drift.wire.errors import BadRequest, ModelMismatch, SpanNotServed
from drift.wire.frames import dtype_name
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

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run torch work on the compute thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def check(self, model: str, start_block: int, end_block: int, batch: int) -> None:
        if model not in (self.fingerprint, self.model_name):
            raise ModelMismatch(
                f"this server serves {self.model_name} (fingerprint {self.fingerprint[:12]}), "
                f"not {model[:64]}"
            )
        if not (self.start_block <= start_block and end_block <= self.end_block):
            raise SpanNotServed(
                f"blocks [{start_block}, {end_block}) are not all held here: this server "
                f"holds [{self.start_block}, {self.end_block})",
                start_block=self.start_block,
                end_block=self.end_block,
            )
        if batch > self.max_batch_size:
            raise BadRequest(
                f"batch size {batch} exceeds this server's max of {self.max_batch_size}"
            )

    async def forward(self, req: ForwardRequest) -> ForwardResponse:
        self.check(req.model, req.start_block, req.end_block, req.hidden_states.shape[0])
        return ForwardResponse(await self.run(self._forward, req))

    async def backward(self, req: BackwardRequest) -> BackwardResponse:
        self.check(req.model, req.start_block, req.end_block, req.hidden_states.shape[0])
        grad, grad_prompts = await self.run(self._backward, req)
        return BackwardResponse(grad, grad_prompts)

    def _forward(self, req: ForwardRequest) -> torch.Tensor:
        with torch.no_grad():
            out = self.span.forward(
                req.hidden_states.to(self.span.device),
                start_block=req.start_block,
                end_block=req.end_block,
                attention_mask=_to(req.attention_mask, self.span.device),
                prompts=_to(req.prompts, self.span.device),
            )
        return out.to("cpu", req.hidden_states.dtype)

    def _backward(self, req: BackwardRequest) -> tuple[torch.Tensor, torch.Tensor | None]:
        grad, grad_prompts = self.span.backward(
            req.hidden_states.to(self.span.device),
            req.grad_outputs.to(self.span.device),
            start_block=req.start_block,
            end_block=req.end_block,
            attention_mask=_to(req.attention_mask, self.span.device),
            prompts=_to(req.prompts, self.span.device),
        )
        grad = grad.detach().to("cpu", req.hidden_states.dtype)
        if grad_prompts is not None and req.prompts is not None:
            grad_prompts = grad_prompts.detach().to("cpu", req.prompts.dtype)
        return grad, grad_prompts

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def _to(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if t is None else t.to(device)
