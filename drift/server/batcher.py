"""Batching the steps of concurrent sessions: those queued while the compute thread is busy
run together as one forward.

A step with no deep prompts, beam reorder or LoRA (named tensors allowed: Gemma 4) is queued
here instead of going to the compute thread on its own. The first step queued submits one drain
job; when the compute thread reaches it, the job takes every step queued by then, groups those
that can share a forward (drift.models.batch: same blocks, tokens per row and named tensors, one
step per session, at most `chunk_tokens` tokens per forward) and runs each group once. Steps
queued while it runs wait for the next drain job. Before taking the queue, a drain job waits for
the sessions that are stepping while their steps keep coming (`wait_s` after the latest,
WAIT_CAP x `wait_s` in all), so sessions stepping in turn along a chain of servers fall into one
convoy. Where a convoy has split in two (its halves a part of a round apart, each waiting in
vain for the other every round: measured 35 tokens/s against 53 for 8 clients through 2
servers), a drain also waits for the stepping sessions that keep the queued ones' pace (gaps
between steps within SAME_PACE) until `wait_s` after they are due to step (their last step plus
their gap), so the halves join up within a round or two; a session of another pace (a slower
client) is waited for only as before. A session is stepping while its next step is due: it
stepped in the last RECENT_S seconds and less than twice its own last gap between steps (+
`wait_s`) ago; a held idle session (a finished request's, kept for the next chat turn) is not
waited for. A drain waits only for sessions whose last step could share a forward with a queued
one (the same `batch_key`: a prompt's step does not wait for decoding sessions, which would run
apart anyway, and whose client may be waiting for that very prompt), and a session a drain
waited for in vain is not waited for again until it steps (a row of `drift api` that ended while
its session is held for the next turn costs one wait, not one per step of its gap), nor one
whose client said it is idle (`idle`: a session held for a later turn, announced by drift.wire's
`idle` message) or that closed (`forget`): a drain waiting for it stops at once. A wait that
ends with no new step is counted (`vain_waits`), and every wait's seconds (`wait_s_total`). A
group whose forward fails is rerun step by step, so an error reaches only its own session; any
other failure of a drain job fails only the steps it took, is counted (`drains_failed`) and
leaves the batcher ready for the next step. Knows nothing about HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from drift.metrics import Histogram
from drift.models.batch import BatchStep, StepOut, batch_key
from drift.models.session import SpanSession
from drift.server.backend import SpanBackend
from drift.server.metrics import LATENCY_BUCKETS_S

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # steps per forward, for /metrics
RECENT_S = 1.0  # seconds: a session that stepped this recently is expected to step again
WAIT_CAP = 5  # a drain waits at most this many times wait_s in all
SAME_PACE = 0.25  # gaps between steps this close (relative) are one pace: a convoy's


@dataclass(frozen=True)
class _Queued:
    step: BatchStep
    future: Future[StepOut]
    key: object  # what it may share a forward with (batch_key)

    @property
    def tokens(self) -> int:
        return int(self.step.hidden.shape[0] * self.step.hidden.shape[1])


@dataclass
class _Pace:
    """When a session's steps came: the latest, and the gap before it (None: one so far);
    the batch key of its latest step, and whether a drain has waited for it in vain since."""

    session: SpanSession
    last: float
    key: object
    gap: float | None = None
    missed: bool = False

    def due(self, now: float, wait_s: float) -> bool:
        """Whether its next step is expected soon (see the module docstring)."""
        since = now - self.last
        return (not self.missed and since <= RECENT_S
                and (self.gap is None or since <= 2 * self.gap + wait_s))  # fmt: skip


class StepBatcher:
    def __init__(self, backend: SpanBackend, *, wait_s: float = 0.0) -> None:
        self.backend = backend
        self.wait_s = wait_s  # seconds a drain may wait for recently active sessions' steps
        self.sizes = Histogram(BATCH_BUCKETS)  # sessions' steps per forward run
        # seconds of each group's forward on the compute thread (its reruns step by step
        # included): a step's compute, apart from its wait in the queue, wire and validation
        self.forward_s = Histogram(LATENCY_BUCKETS_S)
        # guards the queue and `_seen` between the event loop and the compute thread
        self._cond = threading.Condition()
        self._queue: list[_Queued] = []
        self._scheduled = False  # a drain job is submitted and has not yet taken the queue
        self._seen: dict[int, _Pace] = {}  # id(session) -> when its steps came
        self.waits = 0  # drains that waited for a stepping session's step
        self.vain_waits = 0  # of those, the ones that ended with no step come in
        self.drains_failed = 0  # drain jobs that failed outside a forward (bugs: logged)
        self.idle_notices = 0  # sessions their clients said were idle (not waited for)
        self.wait_s_total = 0.0  # seconds drains spent waiting for stepping sessions

    @property
    def queued(self) -> int:
        """Steps waiting for the next drain job."""
        with self._cond:
            return len(self._queue)

    async def step(self, step: BatchStep) -> StepOut:
        """A validated step of its session: its output [b, T, H] and the K/V it asked back
        (`donate`), on the CPU."""
        session = step.session
        item = _Queued(step, Future(), batch_key(step))
        with self._cond:
            self._queue.append(item)
            now, pace = time.monotonic(), self._seen.get(id(session))
            if pace is None or pace.session is not session:
                self._seen[id(session)] = _Pace(session, now, item.key)
            else:
                pace.gap, pace.last, pace.key, pace.missed = now - pace.last, now, item.key, False
            submit, self._scheduled = not self._scheduled, True
            self._cond.notify()
        if submit:
            try:
                self.backend.executor.submit(self._drain)
            except RuntimeError:  # the compute thread is shut down (a move, or exit)
                with self._cond:
                    self._scheduled = False
                raise
        return await asyncio.wrap_future(item.future)

    def idle(self, session: SpanSession) -> None:
        """Its client holds `session` for a later turn: no drain waits for its step until it
        steps again."""
        with self._cond:
            self.idle_notices += 1
        self.forget(session)

    def forget(self, session: SpanSession) -> None:
        """`session` takes no step now (idle, or closed: its cache is freed on the compute
        thread, maybe behind the very drain waiting for it): a drain waiting for it stops."""
        with self._cond:
            pace = self._seen.get(id(session))
            if pace is not None and pace.session is session:
                del self._seen[id(session)]
                self._cond.notify()

    def _drain(self) -> None:
        """On the compute thread: run everything queued so far, group by group. Whatever
        fails here fails only the steps this job took; the next step schedules a new job."""
        items: list[_Queued] = []
        try:
            with self._cond:
                try:
                    self._gather()
                finally:
                    items, self._queue, self._scheduled = self._queue, [], False
            live = [item for item in items if item.future.set_running_or_notify_cancel()]
            for group in self._groups(live):
                self.backend.executor.progressed()  # each group is timed as a unit of its own
                self.backend.chunks_run += 1
                self.sizes.observe(len(group))
                started = time.perf_counter()
                self._run(group)  # sets each step's result or error (a bug here fails the drain)
                self.forward_s.observe(time.perf_counter() - started)
        except BaseException as exc:  # never leave a step waiting forever, nor the batcher
            self.drains_failed += 1
            log.exception("a step batch failed; its %d steps get the error", len(items))
            for item in items:
                if not item.future.done():
                    item.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    def _gather(self) -> None:
        """(Lock held) Wait while steps keep coming until every stepping session whose step
        could join a queued one has one queued: at most `wait_s` after the latest arrival
        and WAIT_CAP x `wait_s` in all. Sessions that step in turn (a chain of servers) then
        run together, also when their steps trickle in. Those still missing at the deadline
        are not waited for again until they step."""
        start = time.monotonic()
        waited, arrived = False, len(self._queue)
        while True:
            now = time.monotonic()
            for key, pace in list(self._seen.items()):
                if pace.session.closed or now - pace.last > RECENT_S:
                    del self._seen[key]
            queued = {id(item.step.session) for item in self._queue}
            keys = {item.key for item in self._queue}
            stepping = {k for k, pace in self._seen.items()
                        if pace.key in keys and pace.due(now, self.wait_s)}  # fmt: skip
            latest = max((self._seen[k].last for k in queued if k in self._seen), default=start)
            expected = self._expected(queued, stepping - queued)
            deadline = min(max(start, latest, expected) + self.wait_s,
                           start + WAIT_CAP * self.wait_s)  # fmt: skip
            if queued >= stepping or now >= deadline:
                for k in stepping - queued:
                    self._seen[k].missed = True
                if waited:
                    self.waits += 1
                    self.wait_s_total += now - start
                    self.vain_waits += int(len(self._queue) == arrived)
                return
            waited = True
            self._cond.wait(deadline - now)

    def _expected(self, queued: set[int], missing: set[int]) -> float:
        """(Lock held) When the last of the `missing` stepping sessions that keep the queued
        ones' pace (their gaps within SAME_PACE of each other: a convoy split in two, each
        half a round behind the other) is expected to step: its last step plus its gap; 0
        where none is."""
        if not missing:
            return 0.0
        gaps = sorted(g for k in queued if k in self._seen
                      and (g := self._seen[k].gap) is not None)  # fmt: skip
        if not gaps:
            return 0.0
        period = gaps[len(gaps) // 2]
        return max((pace.last + pace.gap for k in missing
                    if (pace := self._seen[k]).gap is not None
                    and abs(pace.gap - period) <= SAME_PACE * period), default=0.0)  # fmt: skip

    def _groups(self, items: list[_Queued]) -> list[list[_Queued]]:
        """Arrival order; a step joins the first open group it fits (key, one step per
        session, the token cap), else opens one."""
        cap = self.backend.chunk_tokens
        groups: list[tuple[object, list[_Queued]]] = []
        for item in items:
            session, key = item.step.session, item.key
            for k, group in groups:
                if (k == key and all(g.step.session is not session for g in group)
                        and sum(g.tokens for g in group) + item.tokens <= cap):  # fmt: skip
                    group.append(item)
                    break
            else:
                groups.append((key, [item]))
        return [group for _, group in groups]

    def _run(self, group: list[_Queued]) -> None:
        run_steps = self.backend.run_steps  # the decode unit where it takes them (compiled.py)
        try:
            outs = run_steps([item.step for item in group])
        except Exception as exc:
            if len(group) == 1:
                group[0].future.set_exception(exc)
                return
            for item in group:  # one session's error (closed, bad position) stays its own
                try:
                    item.future.set_result(_on_cpu(run_steps([item.step])[0]))
                except Exception as one:
                    item.future.set_exception(one)
            return
        for item, out in zip(group, outs, strict=True):
            item.future.set_result(_on_cpu(out))


def _on_cpu(out: StepOut) -> StepOut:
    hidden, donated = out
    return hidden.to("cpu"), {name: t.to("cpu") for name, t in donated.items()}
