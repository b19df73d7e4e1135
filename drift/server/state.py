"""BlockServer: what the routes share (backend, sessions, metrics, config) and what it announces.

Holds no torch code itself; `describe()` is the /blocks document and the fields announced
in the membership record. The housekeeping loop reaps idle sessions and re-announces the
cache left when it changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from drift.models.checkpoint import Checkpoint
from drift.openmp import worker_release
from drift.server.backend import SpanBackend
from drift.server.budget import CacheBudget
from drift.server.compute_name import compute_name
from drift.server.config import ServerConfig
from drift.server.handoff_hub import HandoffHub
from drift.server.metrics import ServerMetrics
from drift.server.move import DRAIN_TIMEOUT_S, load_runtime, make_room, prepare_move
from drift.server.push import PeerLinks
from drift.server.runtime import SpanRuntime
from drift.server.sessions import SessionManager
from drift.swarm import BlocksInfo
from drift.wire.errors import BadRequest, Busy

log = logging.getLogger(__name__)


class BlockServer:
    def __init__(
        self, config: ServerConfig, backend: SpanBackend, *, throughput: float,
        announce: Callable[..., None] | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.runtime = SpanRuntime.build(backend, config)  # swapped whole by move_to
        self.throughput = throughput  # block-tokens per second of one block
        self.announce = announce  # MembershipNode.announce, or None outside a swarm
        device = getattr(backend.span, "device", None)
        # the cores or GPU it computes on, by name: clients do not overlap servers sharing it
        self.compute = compute_name(device) if device is not None else None
        self.metrics = ServerMetrics({
            "drift_active_sessions": ("Open inference sessions.", lambda: len(self.sessions.sessions)),
            "drift_cache_tokens_in_use": ("KV-cache block-tokens reserved.", lambda: self.budget.used),
            "drift_cache_tokens_total": ("KV-cache block-tokens in the budget.", lambda: self.budget.total),
        }, {
            "drift_step_batch_size": ("Sessions' steps run as one forward (since the span was loaded).",
                                      lambda: self.sessions.batcher.sizes),
            "drift_step_forward_seconds": ("Seconds of each forward of steps run as one "
                                           "(compute only: no queueing, wire or validation).",
                                           lambda: self.sessions.batcher.forward_s),
        }, {
            "drift_batch_waits_total": ("Step batches that waited for a stepping session's step.",
                                        lambda: self.sessions.batcher.waits),
            "drift_batch_vain_waits_total": ("Of those, waits that ended with no step come in.",
                                             lambda: self.sessions.batcher.vain_waits),
            "drift_batch_wait_seconds_total": ("Seconds step batches spent waiting for "
                                               "stepping sessions' steps.",
                                               lambda: self.sessions.batcher.wait_s_total),
            "drift_batch_idle_notices_total": ("Sessions their clients said were idle (held "
                                               "for a later turn): not waited for.",
                                               lambda: self.sessions.batcher.idle_notices),
            "drift_batch_drains_failed_total": ("Step batches that failed outside a forward "
                                                "(their steps got the error).",
                                                lambda: self.sessions.batcher.drains_failed),
        })  # fmt: skip
        self.sockets: set[web.WebSocketResponse] = set()  # inference sockets and push links
        self.calls: set[str] = set()  # ids of the named /forward, /backward calls being served
        self.links = PeerLinks()  # the links this server pushes steps over
        self.handoff = HandoffHub()  # sessions handed over (drift.server.handoff)
        self.state = "online"
        self.moving_to: tuple[int, int] | None = None  # the span a running move_to loads

    @property
    def backend(self) -> SpanBackend:
        return self.runtime.backend

    @property
    def budget(self) -> CacheBudget:
        return self.runtime.budget

    @property
    def sessions(self) -> SessionManager:
        return self.runtime.sessions

    async def move_to(self, start_block: int, end_block: int, *, ckpt: Checkpoint | None = None,
                      drain_timeout_s: float | None = None,
                      before_drain: Callable[[float], Awaitable[object]] | None = None,
                      make_room: bool = False,
                      confirm: Callable[[], Awaitable[bool]] | None = None) -> None:  # fmt: skip
        """Serve [start_block, end_block) instead: load it beside the old span, drain the old
        sessions (new ones get a retryable `busy`; `before_drain(deadline)` first, e.g. hand
        the live ones to other servers of their blocks: drift.server.handoff.hand_over_all),
        swap, re-announce (drift.server.move). `make_room`: the machine holds one span only:
        drain, free the old span, then load (announced `draining` meanwhile, so no one routes
        here; only for blocks others serve too: `confirm()`, once `draining` is announced,
        says whether they still do, or the move is called off with Busy); a failed load loads
        the old blocks back. BadRequest for a span outside the model, Busy while another move
        runs."""
        old = self.runtime
        n = old.backend.num_model_blocks
        if not 0 <= start_block < end_block <= n:
            raise BadRequest(f"cannot move to blocks [{start_block}, {end_block}): the model "
                             f"has {n} blocks")  # fmt: skip
        if self.moving_to is not None:
            raise Busy(f"already moving to blocks {list(self.moving_to)}")
        self.moving_to = (start_block, end_block)
        timeout = DRAIN_TIMEOUT_S if drain_timeout_s is None else drain_timeout_s
        try:
            if make_room:
                await self._move_making_room(start_block, end_block, ckpt, timeout, before_drain,
                                             confirm)  # fmt: skip
            else:
                new = await prepare_move(old, self.config, start_block, end_block, ckpt=ckpt,
                                         drain_timeout_s=timeout, before_drain=before_drain)  # fmt: skip
                self.runtime = new  # no await since the drain: requests see the old or the new span
                old.sessions.close_all()
                old.backend.executor.shutdown(wait=False)  # queued requests on the old span finish
        finally:
            self.moving_to = None
            if self.announce is not None:
                self.announce(**self.record_fields(), **({"draining": 0} if make_room else {}))
        log.info("moved from blocks [%d, %d) to [%d, %d)", old.backend.start_block,
                 old.backend.end_block, start_block, end_block)  # fmt: skip

    async def _move_making_room(self, start_block: int, end_block: int, ckpt: Checkpoint | None,
                                timeout: float,
                                before_drain: Callable[[float], Awaitable[object]] | None,
                                confirm: Callable[[], Awaitable[bool]] | None) -> None:  # fmt: skip
        old = self.runtime
        if self.announce is not None:
            self.announce(draining=1)  # routing avoids it while it holds nothing
        if confirm is not None and not await confirm():  # e.g. another server left them too
            raise Busy(f"blocks [{old.backend.start_block}, {old.backend.end_block}) are no "
                       "longer served by others: staying")  # fmt: skip
        await make_room(old, start_block, end_block, drain_timeout_s=timeout,
                        before_drain=before_drain)  # fmt: skip
        try:
            self.runtime = await load_runtime(old.backend, self.config, start_block, end_block,
                                              ckpt=ckpt)  # fmt: skip
        except Exception:
            log.exception("loading blocks [%d, %d) failed: loading blocks [%d, %d) back",
                          start_block, end_block, old.backend.start_block, old.backend.end_block)  # fmt: skip
            self.runtime = await load_runtime(old.backend, self.config, old.backend.start_block,
                                              old.backend.end_block, ckpt=ckpt)  # fmt: skip
            raise

    def describe(self) -> BlocksInfo:
        """The /blocks document."""
        b, budget = self.backend, self.budget
        return BlocksInfo(
            model=b.model_name, model_fingerprint=b.fingerprint, num_blocks=b.num_model_blocks,
            start_block=b.start_block, end_block=b.end_block, hidden_size=b.hidden_size,
            dtype=b.dtype_name, quant=b.quant, throughput=self.throughput,
            cache_tokens_total=budget.tokens_per_block, cache_tokens_left=budget.tokens_left,
            cache_block_tokens_total=budget.total, cache_block_tokens_left=budget.left,
            active_sessions=len(self.sessions.sessions),
            max_batch_size=self.config.max_batch_size,
            inference_max_length=self.config.inference_max_length,
            max_body_bytes=self.config.max_body_bytes, state=self.state,
            adapters=sorted(b.span.adapters), decode=dict(b.decode_status),
            compute=self.compute,
        )  # fmt: skip

    def record_fields(self) -> dict[str, Any]:
        """The membership-record fields this server announces."""
        return self.describe().record_fields()

    async def housekeeping_loop(self, tick_s: float = 1.0) -> None:
        last: tuple[float, ...] | None = None
        tick = min(tick_s, max(self.config.session_timeout_s / 4, 0.05))
        # this (event loop) thread's OpenMP pool, left by loading or by copying a prompt's
        # tensors, would make the compute thread's workers spin throttled (drift.openmp)
        release_workers = worker_release()
        while True:
            release_workers()
            self.sessions.reap()
            for sid in self.handoff.unclaimed(time.monotonic()):
                log.info("handed-over session %s was not resumed: closed", sid)
                self.handoff.unpark(sid)
                self.sessions.close(sid)
            load = self.metrics.load()  # steps/s and tokens/s, charted by the dashboard
            stalled = self.runtime.watchdog.check()  # > 0: degraded, routing avoids it
            now = (self.budget.tokens_left, len(self.sessions.sessions), self.sessions.held(),
                   stalled, *load.values())  # fmt: skip
            if self.announce is not None and now != last:
                try:
                    self.announce(cache_tokens_left=now[0], active_sessions=now[1],
                                  held_sessions=now[2], degraded_s=stalled, **load)  # fmt: skip
                except Exception:  # announcing must never stop the reaper
                    log.exception("announce failed")
                last = now
            await asyncio.sleep(tick)
