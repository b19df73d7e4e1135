"""The client's engine: swarm view, bans, HTTP session and retries, on one event loop.

`RemoteClient` runs stateless forward and backward over a chain of servers, rerouting
around failing peers (banned with backoff, bounded retries), and opens inference sessions.
Gemma 4's per-layer inputs and shared keys/values travel beside the hidden states
(drift.client.extras), and so do LoRA weights being trained (drift.wire.lora); `adapter`
names a served LoRA adapter every request asks for, and only servers holding it are routed
to. Every public method is a coroutine run on the client's loop; `run` is the sync bridge.
A client not closed is closed when collected or at interpreter exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import torch

import drift.client.calls as calls
import drift.client.transport as transport
from drift.client.bans import BanList
from drift.client.config import ClientConfig
from drift.client.extras import Tensors, add_grads, hop_extras
from drift.client.latency import StepTimeouts
from drift.client.loop import LoopThread
from drift.client.patience import patience_for, patiently
from drift.client.resolve import ModelOrigin, check_served
from drift.client.routing import (
    Hop,
    LatencyModel,
    ServerInfo,
    inference_route,
    missing_blocks,
    spread_route,
)
from drift.client.spares import Spares
from drift.client.swarm_view import SwarmView
from drift.identity.tokens import JoinToken
from drift.models.sharing import KVSharing
from drift.swarm import format_ranges
from drift.wire.errors import DriftError, MissingBlocks
from drift.wire.extras import BLOCK_STATES, PER_LAYER_INPUTS, kv_names
from drift.wire.lora import in_span, split_lora

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HopTrace:
    """What one hop of a forward was given: enough to run its backward (or redo it)."""

    hop: Hop
    hidden: torch.Tensor  # [B, T, H] the hop's input
    extras: Tensors  # named tensors sent beside it (per-layer inputs, K/V it read)
    donate: tuple[int, ...]  # blocks whose keys/values it gave back
    stop: int  # the hop gave the K/V that blocks in [its end, stop) read
    states: torch.Tensor | None = None  # [B, T, n, H] each block's output, when asked


def slice_prompts(prompts: torch.Tensor | None, start: int, hop: Hop) -> torch.Tensor | None:
    """The deep prompts of a hop, from prompts over blocks starting at `start`."""
    if prompts is None:
        return None
    return prompts[hop.start_block - start : hop.end_block - start]


class RemoteClient:
    def __init__(
        self, initial_peers: tuple[JoinToken, ...], model_fingerprint: str, config: ClientConfig,
        sharing: KVSharing | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.model_fingerprint = model_fingerprint
        # what the model is and where it came from, for the error when no server serves it
        self.origin = ModelOrigin(model_fingerprint[:16], model_fingerprint, "its fingerprint")
        # the served LoRA adapter requests ask for, by name: a model reads its config's
        # `active_adapter` (Petals' idiom, `model.config.active_adapter = name`)
        self.adapter_of: Callable[[], str | None] = lambda: None
        self.sharing = sharing or KVSharing()  # which blocks read other blocks' keys/values
        self.loop = LoopThread()
        self.bans = BanList(config.ban_base_s, config.ban_max_s)
        self.timeouts = StepTimeouts(factor=config.step_timeout_factor,
                                     min_s=config.min_step_timeout_s,
                                     max_s=config.step_timeout_s)  # fmt: skip
        self.http: aiohttp.ClientSession = self.loop.run(self._make_http())
        self.swarm = SwarmView(initial_peers, config, self.http, self.bans)
        self.sockets: weakref.WeakSet[transport.SpanSocket] = weakref.WeakSet()  # open ones
        self.spares = Spares(functools.partial(transport.handshake, self.http, config=config),
                             config.spare_socket_s)  # fmt: skip
        # closes the sockets, the spares, the HTTP session and the loop: on close(), when
        # collected, or at interpreter exit
        self._finalizer = weakref.finalize(self, _shut_down, self.loop, self.http, self.sockets,
                                           self.spares)  # fmt: skip

    async def _make_http(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(auto_decompress=True)

    @property
    def adapter(self) -> str | None:
        return self.adapter_of()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run(coro)

    def submit(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Start `coro` without waiting for it (finalizers, from any thread)."""
        self.loop.submit(coro)

    async def open_socket(self, hop: Hop, request: Any, *,
                          wait: bool = True) -> transport.SpanSocket:  # fmt: skip
        """An inference socket to `hop` with `request`'s session open on it (`wait=False`:
        the open sent, its reply read before the first step's: SpanSocket.begin): on the
        spare socket to that server if one is ready (drift.client.spares), else a fresh one.
        Closed with the client if still open then."""
        sock = await self.spares.open(hop, request, self.config, wait=wait)
        if sock is None:
            sock = await transport.SpanSocket.open(self.http, hop, request, self.config,
                                                   wait=wait)  # fmt: skip
        self.sockets.add(sock)
        return sock

    def patience(self, sock: transport.SpanSocket, window_s: float,
                 started: float) -> transport.Patience:  # fmt: skip
        """For a step on `sock` waited on since `started` (time.perf_counter()): past its
        timeout, ask the server whether it still holds the step (drift.client.patience)."""
        return patience_for(self.http, self.config, self.timeouts, sock.hop, window_s, started,
                            session_id=sock.session_id)  # fmt: skip

    async def open_sockets(
        self, requests: Sequence[tuple[Hop, Any]], *, wait: bool = True
    ) -> tuple[list[transport.SpanSocket], list[tuple[Hop, BaseException]]]:
        """Inference sockets to every hop at once (a chain opens in one round trip, not one
        per hop): (the sockets in order, []) or, when any open failed, ([], each failed hop
        with its error), every socket that did open closed again. `wait`: as open_socket."""
        await self.spares.ended({hop.peer_id for hop, _ in requests})  # their old sessions freed
        opened = await asyncio.gather(*(self.open_socket(hop, req, wait=wait)
                                        for hop, req in requests),
                                      return_exceptions=True)  # fmt: skip
        socks = [s for s in opened if isinstance(s, transport.SpanSocket)]
        failed = [(hop, e) for (hop, _), e in zip(requests, opened, strict=True)
                  if isinstance(e, BaseException)]  # fmt: skip
        if not failed:
            return socks, []
        await transport.close_all(socks)
        return [], failed

    @property
    def closed(self) -> bool:
        return self.loop.closed

    def close(self) -> None:
        """Close the connections (servers free the sessions) and stop the loop; idempotent.
        Returns when they are closed."""
        detached = self._finalizer.detach()
        if detached is not None:
            _, shut_down, args, _ = detached
            shut_down(*args, wait=True)

    async def route(
        self, start: int, end: int, *, inference: bool = False, tokens_needed: int = 0,
        adapter: str | None = None, avoid: Collection[str] = (),
    ) -> list[Hop]:  # fmt: skip
        """A chain over [start, end) of servers holding `adapter` (if named), none of the peers
        in `avoid`. When just banned servers cover a block (a peer that failed a moment ago),
        wait for their bans to end; when just degraded ones do (compute stalled past their
        watchdog's bound), route to them: a slow answer beats none. MissingBlocks only when
        no server covers a block, saying why each known server of it is left out."""
        fp = self.model_fingerprint
        choose = functools.partial(self._choose, start, end, inference, tokens_needed, adapter,
                                   frozenset(avoid))  # fmt: skip
        await self.swarm.fresh_enough()
        with contextlib.suppress(MissingBlocks):
            return choose()
        await self.swarm.refresh(force=True)  # maybe a server came back or joined
        with contextlib.suppress(MissingBlocks):
            return choose()
        wait = self.swarm.ban_wait(fp, start, end)
        if wait is not None:
            await asyncio.sleep(wait)
            with contextlib.suppress(MissingBlocks):
                return choose()
        try:
            return choose(degraded_too=True)
        except MissingBlocks as exc:
            if not self.swarm.servers(fp, banned_too=True):
                check_served(self.origin, self.swarm.table.live(time.time()))  # another model?
            self.swarm.refuse_other_protocols(fp, start, end)
            if exc.details.get("adapter") is not None:
                raise
            raise self.swarm.explain(exc, fp, avoid) from None

    def _choose(self, start: int, end: int, inference: bool, tokens_needed: int,
                adapter: str | None, avoid: frozenset[str] = frozenset(), *,
                degraded_too: bool = False) -> list[Hop]:  # fmt: skip
        servers = [s for s in self.swarm.servers(self.model_fingerprint, degraded_too=degraded_too)
                   if s.peer_id not in avoid]  # fmt: skip
        servers = with_adapter(servers, adapter, start, end)
        if inference:
            model = LatencyModel(
                rtt_default_s=self.config.rtt_default_s,
                cache_penalty_s=self.config.cache_penalty_s,
                cache_tokens_needed=tokens_needed,
            )
            return inference_route(servers, start, end, model)
        return spread_route(servers, start, end)

    def note_failure(self, exc: BaseException, hop: Hop) -> None:
        """Ban the peer if the error is its fault; re-raise if no retry can help."""
        if not calls.is_retryable(exc):
            raise exc
        seconds = self.bans.ban(hop.peer_id, unreachable=refused(exc))
        log.info("server %s failed on blocks [%d, %d) (%s): not routed to for %.1f s",
                 hop.peer_id, hop.start_block, hop.end_block, exc, seconds)  # fmt: skip

    def count_failure(self, exc: DriftError, hop: Hop, attempts: int) -> int:
        """note_failure, then `attempts` + 1; re-raise `exc` once that passes max_retries."""
        self.note_failure(exc, hop)
        attempts += 1
        if attempts > self.config.max_retries:
            raise exc
        return attempts

    async def _timed(self, hop: Hop, kind: str, hidden: torch.Tensor,
                     call: Callable[..., Awaitable[T]]) -> T:  # fmt: skip
        """Await `call(timeout_s=..., call_id=...)` within the peer's reply timeout for this
        request (a few times its measured pace, counting what this client has in flight
        there), longer while the server says it is serving the call (GET /compute?call=: its
        compute advances on other clients' work ahead of it), and feed its duration to the
        peer's timeouts. PeerUnavailable when the wait ends."""
        tokens = hidden.shape[0] * hidden.shape[1]
        call_id = secrets.token_hex(8)
        with self.timeouts.waiting(hop.peer_id, kind, tokens) as timeout_s:
            started = time.perf_counter()
            # past its timeout the call goes on while the server says it is serving it
            # (another client's work ahead of it), never past step_timeout_s in all
            task = asyncio.ensure_future(
                call(timeout_s=max(timeout_s, self.config.step_timeout_s), call_id=call_id)
            )
            more = patience_for(self.http, self.config, self.timeouts, hop, timeout_s, started,
                                call_id=call_id)  # fmt: skip
            result = await patiently(task, timeout_s, more, f"{hop.peer_id}: no {kind} reply",
                                     hop.peer_id)  # fmt: skip
        self.timeouts.observe(hop.peer_id, kind, tokens, time.perf_counter() - started)
        return result

    async def forward(
        self, hidden: torch.Tensor, start: int, end: int, *,
        attention_mask: torch.Tensor | None = None, prompts: torch.Tensor | None = None,
        per_layer: torch.Tensor | None = None, shared: Tensors | None = None,
        stop: int | None = None, states: bool = False, lora: Tensors | None = None,
    ) -> tuple[torch.Tensor, list[HopTrace]]:  # fmt: skip
        """Hidden states through [start, end); also what each hop was given. `per_layer`
        [B, T, end - start, P] and `shared` (K/V of donors before `start`) are Gemma 4's; hops
        give back the K/V that blocks in [their end, `stop` (default end)) read. With
        `states`, each hop's trace holds its blocks' outputs. `lora`: wire-named LoRA
        weights, each hop sent its blocks' (their gradients come back from `backward`)."""
        shared = dict(shared or {})
        stop = end if stop is None else stop
        trace: list[HopTrace] = []
        block, attempts = start, 0
        while block < end:
            hops = await self.route(block, end, adapter=self.adapter)
            for hop in hops:
                extras = hop_extras(self.sharing, start, hop.start_block, hop.end_block,
                                    per_layer, shared)  # fmt: skip
                extras.update(in_span(lora or {}, hop.start_block, hop.end_block))
                donate = self.sharing.donated(hop.start_block, hop.end_block, stop)
                try:
                    reply = await self._timed(hop, "forward", hidden, functools.partial(
                        calls.forward, self.http, hop, self.model_fingerprint, hidden, self.config,
                        attention_mask=attention_mask, prompts=slice_prompts(prompts, start, hop),
                        extras=extras, donate=donate, states=states, adapter=self.adapter,
                    ))  # fmt: skip
                except DriftError as exc:
                    attempts = self.count_failure(exc, hop, attempts)
                    break
                self.bans.success(hop.peer_id)
                given = dict(reply.extras)
                trace.append(
                    HopTrace(hop, hidden, extras, donate, stop, given.pop(BLOCK_STATES, None))
                )
                shared.update(given)
                hidden, block = reply.hidden_states, hop.end_block
        return hidden, trace

    async def backward(
        self, trace: list[HopTrace], grad: torch.Tensor, start: int, *,
        attention_mask: torch.Tensor | None = None, prompts: torch.Tensor | None = None,
        per_layer: torch.Tensor | None = None, grad_shared: Tensors | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, Tensors]:  # fmt: skip
        """Gradients from a forward's trace w.r.t. the chain's input, its deep prompts, its
        per-layer inputs, and (by name) the K/V it read from donors before `start` and the
        LoRA weights it was sent. `grad_shared`: gradients w.r.t. the K/V the chain gave to
        blocks after it."""
        grad_prompts = torch.zeros_like(prompts) if prompts is not None else None
        grad_per_layer = torch.zeros_like(per_layer) if per_layer is not None else None
        grad_kv = dict(grad_shared or {})
        for step in reversed(trace):
            hop = step.hop
            grad_out = {n: grad_kv.pop(n) for d in step.donate for n in kv_names(d) if n in grad_kv}
            grad, g_prompts, g_extras = await self._backward_hop(
                step, grad, start, attention_mask, prompts, grad_out
            )
            if grad_prompts is not None and g_prompts is not None:
                grad_prompts[hop.start_block - start : hop.end_block - start] += g_prompts
            g_per_layer = g_extras.pop(PER_LAYER_INPUTS, None)
            if grad_per_layer is not None and g_per_layer is not None:
                grad_per_layer[:, :, hop.start_block - start : hop.end_block - start] += g_per_layer
            add_grads(grad_kv, g_extras)
        return grad, grad_prompts, grad_per_layer, grad_kv

    async def _backward_hop(
        self, step: HopTrace, grad: torch.Tensor, start: int,
        mask: torch.Tensor | None, prompts: torch.Tensor | None, grad_out: Tensors,
    ) -> tuple[torch.Tensor, torch.Tensor | None, Tensors]:  # fmt: skip
        attempts = 0
        hop = step.hop
        sub_prompts = slice_prompts(prompts, start, step.hop)
        while True:
            try:
                reply = await self._timed(hop, "backward", step.hidden, functools.partial(
                    calls.backward, self.http, hop, self.model_fingerprint, step.hidden, grad, self.config,
                    attention_mask=mask, prompts=sub_prompts, extras=step.extras,
                    grad_extras=grad_out, adapter=self.adapter,
                ))  # fmt: skip
                return reply.grad_inputs, reply.grad_prompts, dict(reply.grad_extras)
            except DriftError as exc:
                attempts = self.count_failure(exc, hop, attempts)
            # another server for exactly this span: forward through its chain, then backward
            a, b = step.hop.start_block, step.hop.end_block
            lora, others = split_lora(step.extras)
            per_layer = others.get(PER_LAYER_INPUTS)
            read = {k: v for k, v in others.items() if k != PER_LAYER_INPUTS}
            _, sub_trace = await self.forward(
                step.hidden, a, b, attention_mask=mask, prompts=sub_prompts, per_layer=per_layer,
                shared=read, stop=step.stop, lora=lora,
            )  # fmt: skip
            if len(sub_trace) == 1:
                hop = sub_trace[0].hop
                continue
            g, g_prompts, g_per_layer, g_kv = await self.backward(
                sub_trace, grad, a, attention_mask=mask, prompts=sub_prompts,
                per_layer=per_layer, grad_shared=grad_out,
            )  # fmt: skip
            if g_per_layer is not None:
                g_kv[PER_LAYER_INPUTS] = g_per_layer
            return g, g_prompts, g_kv


def refused(exc: BaseException) -> bool:
    """Whether `exc` (or the network error behind a PeerUnavailable) is a connection that
    could not be made: nothing listens at the peer's address."""
    cause = exc.__cause__ if isinstance(exc, DriftError) else exc
    return isinstance(cause, aiohttp.ClientConnectorError | ConnectionRefusedError)


def with_adapter(servers: list[ServerInfo], adapter: str | None, start: int,
                 end: int) -> list[ServerInfo]:  # fmt: skip
    """The servers holding `adapter` (all when None); MissingBlocks naming the blocks that
    no server holding it covers."""
    if adapter is None:
        return servers
    holding = [s for s in servers if adapter in s.adapters]
    missing = missing_blocks(holding, start, end)
    if missing and not missing_blocks(servers, start, end):
        raise MissingBlocks(f"no server holding LoRA adapter {adapter!r} serves blocks "
                            f"{format_ranges(missing)} (others serve them without it)",
                            missing=missing, adapter=adapter)  # fmt: skip
    return holding


def _shut_down(loop: LoopThread, http: aiohttp.ClientSession, sockets: Any, spares: Spares,
               *, wait: bool | None = None) -> None:  # fmt: skip
    """Close the inference sockets (servers free their sessions), the spares, the HTTP
    session, and stop the loop. `wait` None (a finalizer): wait on the main thread only
    (interpreter exit), never on a thread the collector happened to run on (it may be serving
    those servers)."""
    if wait is None:
        wait = threading.current_thread() is threading.main_thread()
    loop.close(_close_connections(http, list(sockets), spares), wait=wait)


async def _close_connections(http: aiohttp.ClientSession, sockets: list[Any],
                             spares: Spares) -> None:  # fmt: skip
    await asyncio.gather(transport.close_all(sockets), spares.close())
    if not http.closed:
        await http.close()
