"""The client's engine: swarm view, bans, HTTP session and retries, on one event loop.

`RemoteClient` runs stateless forward and backward over a chain of servers, rerouting
around failing peers (banned with backoff, bounded retries), and opens inference sessions.
Every public method is a coroutine run on the client's loop; `run` is the sync bridge.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp
import torch

from drift.client import transport
from drift.client.bans import BanList
from drift.client.config import ClientConfig
from drift.client.latency import StepTimeouts
from drift.client.loop import LoopThread
from drift.client.routing import Hop, LatencyModel, inference_route, spread_route
from drift.client.swarm_view import SwarmView
from drift.identity.tokens import JoinToken
from drift.wire.errors import DriftError, MissingBlocks

T = TypeVar("T")


def slice_prompts(prompts: torch.Tensor | None, start: int, hop: Hop) -> torch.Tensor | None:
    """The deep prompts of a hop, from prompts over blocks starting at `start`."""
    if prompts is None:
        return None
    return prompts[hop.start_block - start : hop.end_block - start]


class RemoteClient:
    def __init__(
        self, initial_peers: tuple[JoinToken, ...], model_fingerprint: str, config: ClientConfig
    ) -> None:
        self.config = config
        self.model_fingerprint = model_fingerprint
        self.loop = LoopThread()
        self.bans = BanList(config.ban_base_s, config.ban_max_s)
        self.timeouts = StepTimeouts(factor=config.step_timeout_factor,
                                     min_s=config.min_step_timeout_s,
                                     max_s=config.step_timeout_s)  # fmt: skip
        self.http: aiohttp.ClientSession = self.loop.run(self._make_http())
        self.swarm = SwarmView(initial_peers, config, self.http, self.bans)

    async def _make_http(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(auto_decompress=True)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run(coro)

    def close(self) -> None:
        if not self.http.closed:
            self.loop.run(self.http.close())
        self.loop.close()

    async def route(
        self, start: int, end: int, *, inference: bool = False, tokens_needed: int = 0
    ) -> list[Hop]:
        await self.swarm.refresh()
        servers = self.swarm.servers(self.model_fingerprint)
        try:
            if inference:
                model = LatencyModel(
                    rtt_default_s=self.config.rtt_default_s,
                    cache_penalty_s=self.config.cache_penalty_s,
                    cache_tokens_needed=tokens_needed,
                )
                return inference_route(servers, start, end, model)
            return spread_route(servers, start, end)
        except MissingBlocks:
            await self.swarm.refresh(force=True)  # maybe a server came back or joined
            servers = self.swarm.servers(self.model_fingerprint)
            if inference:
                return inference_route(
                    servers, start, end, LatencyModel(cache_tokens_needed=tokens_needed)
                )
            return spread_route(servers, start, end)

    def note_failure(self, exc: BaseException, hop: Hop) -> None:
        """Ban the peer if the error is its fault; re-raise if no retry can help."""
        if not transport.is_retryable(exc):
            raise exc
        self.bans.ban(hop.peer_id)

    def count_failure(self, exc: DriftError, hop: Hop, attempts: int) -> int:
        """note_failure, then `attempts` + 1; re-raise `exc` once that passes max_retries."""
        self.note_failure(exc, hop)
        attempts += 1
        if attempts > self.config.max_retries:
            raise exc
        return attempts

    def _timeout(self, hop: Hop, kind: str, hidden: torch.Tensor) -> float:
        """A peer's reply timeout for this request: a few times its measured pace."""
        return self.timeouts.timeout(f"{hop.peer_id}:{kind}", hidden.shape[0] * hidden.shape[1])

    async def _timed(self, hop: Hop, kind: str, hidden: torch.Tensor,
                     call: Coroutine[Any, Any, T]) -> T:  # fmt: skip
        """Await `call` and feed its duration to the peer's timeouts."""
        started = time.perf_counter()
        result = await call
        self.timeouts.observe(f"{hop.peer_id}:{kind}", hidden.shape[0] * hidden.shape[1],
                              time.perf_counter() - started)  # fmt: skip
        return result

    async def forward(
        self, hidden: torch.Tensor, start: int, end: int, *,
        attention_mask: torch.Tensor | None = None, prompts: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[tuple[Hop, torch.Tensor]]]:  # fmt: skip
        """Hidden states through [start, end); also each hop with the input it was given."""
        trace: list[tuple[Hop, torch.Tensor]] = []
        block, attempts = start, 0
        while block < end:
            hops = await self.route(block, end)
            for hop in hops:
                try:
                    out = await self._timed(hop, "forward", hidden, transport.forward(
                        self.http, hop, self.model_fingerprint, hidden, self.config,
                        attention_mask=attention_mask, prompts=slice_prompts(prompts, start, hop),
                        timeout_s=self._timeout(hop, "forward", hidden),
                    ))  # fmt: skip
                except DriftError as exc:
                    attempts = self.count_failure(exc, hop, attempts)
                    break
                self.bans.success(hop.peer_id)
                trace.append((hop, hidden))
                hidden, block = out, hop.end_block
        return hidden, trace

    async def backward(
        self, trace: list[tuple[Hop, torch.Tensor]], grad: torch.Tensor, start: int, *,
        attention_mask: torch.Tensor | None = None, prompts: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """Gradients w.r.t. the chain's input (and its deep prompts) from a forward's trace."""
        grad_prompts = torch.zeros_like(prompts) if prompts is not None else None
        for hop, inputs in reversed(trace):
            grad, g_prompts = await self._backward_hop(
                hop, inputs, grad, start, attention_mask, prompts
            )
            if grad_prompts is not None and g_prompts is not None:
                grad_prompts[hop.start_block - start : hop.end_block - start] += g_prompts
        return grad, grad_prompts

    async def _backward_hop(
        self, hop: Hop, inputs: torch.Tensor, grad: torch.Tensor, start: int,
        mask: torch.Tensor | None, prompts: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        attempts = 0
        while True:
            try:
                return await self._timed(hop, "backward", inputs, transport.backward(
                    self.http, hop, self.model_fingerprint, inputs, grad, self.config,
                    attention_mask=mask, prompts=slice_prompts(prompts, start, hop),
                    timeout_s=self._timeout(hop, "backward", inputs),
                ))  # fmt: skip
            except DriftError as exc:
                attempts = self.count_failure(exc, hop, attempts)
            # another server for exactly this span: forward through its chain, then backward
            sub_prompts = slice_prompts(prompts, start, hop)
            _, sub_trace = await self.forward(
                inputs, hop.start_block, hop.end_block, attention_mask=mask, prompts=sub_prompts
            )
            if len(sub_trace) == 1:
                hop = sub_trace[0][0]
                continue
            return await self.backward(
                sub_trace, grad, hop.start_block, attention_mask=mask, prompts=sub_prompts
            )
