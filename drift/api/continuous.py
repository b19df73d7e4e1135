"""One engine loop per model: every step, all running requests advance together.

`ContinuousBatcher` runs one loop thread over a swarm engine. A request joins at the next
step (its prompt goes through the swarm while the others decode their next token); one
that ends (EOS, its token budget, cancelled) leaves that step and its sessions are closed
at once. Requests that join at the same step (of one LoRA adapter) share one batched set
of sessions (a group, left-padded; an idle loop lets a burst gather for a moment first,
GATHER_S after each arrival, so requests sent together share one group); a lone joiner
gets one-row sessions (which may continue a held session sharing its prefix,
drift.api.prefix); a group whose prompts all start with a held session's tokens is forked
from it (only the rest of each prompt goes through the swarm). The groups' steps are sent in
parallel, the servers' batcher (drift.server.batcher) runs them as one forward, and the
head runs once for all rows. A group's sessions close when its last row ends (its ended
rows are stepped on, unseen, until then). Sampling, penalties, grammars, log-probs and
adapters stay per row (drift.api.sampling). At most `max_batch` rows hold sessions.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import cast

import torch
from transformers import LogitsProcessorList

from drift.api.engine import BatchRow, CausalLMEngine, OpenedSessions
from drift.api.sampling import LogprobRecorder
from drift.models.row_kernel import activated, kernel_in
from drift.models.threads import threads

GATHER_S = 0.005  # an idle loop waits this long after each request for another to come
GATHER_CAP_S = 0.02  # and at most this long in all


@dataclass(eq=False)
class _Row:
    """A request: its processors and the tokens so far (prompt + generated)."""

    req: BatchRow
    processors: LogitsProcessorList
    recorder: LogprobRecorder | None
    ids: list[int]
    count: int = 0  # tokens generated
    done: bool = False  # ended (on_done called); its group may still step it


@dataclass(eq=False)
class _Group:
    """Rows that joined at one step: one batched set of sessions."""

    rows: list[_Row]
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    opened: OpenedSessions | None = None
    mask: torch.Tensor | None = None  # [B, seen] of the session's tokens (None: all ones)
    routed: bool = False

    @property
    def live(self) -> list[_Row]:
        return [r for r in self.rows if not r.done]


@dataclass
class BatcherStats:
    steps: int = 0  # loop steps run
    row_steps: int = 0  # live rows advanced, summed over steps
    most_rows: int = 0  # the most live rows in one step
    groups: int = 0  # session sets opened


class ContinuousBatcher:
    def __init__(self, engine: CausalLMEngine, max_batch: int) -> None:
        if engine.sessions is None:
            raise ValueError("continuous batching needs an engine over a swarm (sessions)")
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.engine = engine
        self.max_batch = max_batch
        self.stats = BatcherStats()
        self._queue: deque[BatchRow] = deque()
        self._groups: list[_Group] = []
        self._cv = threading.Condition()
        self._closed = False
        self._steps = ThreadPoolExecutor(max_batch, thread_name_prefix="drift-api-step")
        self._thread = threading.Thread(target=self._loop, name="drift-api-engine", daemon=True)
        self._thread.start()

    # -- outside -------------------------------------------------------------------------
    def submit(self, *reqs: BatchRow) -> None:
        """Queue requests; they join the running rows at the next step (together: one group,
        room allowing); each one's `on_done` ends it."""
        with self._cv:
            if self._closed:
                raise RuntimeError("the engine loop is closed")
            self._queue.extend(reqs)
            self._cv.notify()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        """Rows holding sessions (an ended row of a running group included)."""
        return sum(len(g.rows) for g in self._groups)

    def close(self) -> None:
        """Stop the loop; rows still running or waiting end with an error."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()
        self._steps.shutdown(wait=True)

    # -- the loop ------------------------------------------------------------------------
    def _loop(self) -> None:
        # the head and sampling on the torch threads the SDK chose for generate() (drift.client.
        # head_threads): the same burst after a wait for the servers, every step
        model = self.engine.model
        with threads(getattr(model, "generate_threads", None)), activated(kernel_in(model.head)):
            self._run()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._queue and not self._groups:
                    self._cv.wait()
                if self._closed:
                    break
                if not self._groups:  # idle: a burst arriving together joins as one group
                    self._gather()
                room = self.max_batch - self.running
                joining = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
            self._join(joining)
            self._step()
        gone = RuntimeError("the API is shutting down")
        for group in list(self._groups):
            self._fail(group, gone)
        for req in self._queue:
            req.on_done(gone)
        self._queue.clear()

    def _gather(self) -> None:
        """(Lock held) While requests keep coming (each within GATHER_S of the one before,
        GATHER_CAP_S in all), let them queue: requests sent together (a client's parallel
        calls, a burst) then share one set of sessions instead of the first going alone."""
        deadline = time.monotonic() + GATHER_CAP_S
        seen = len(self._queue)
        while not self._closed and seen < self.max_batch:
            self._cv.wait(min(GATHER_S, max(0.0, deadline - time.monotonic())))
            if len(self._queue) == seen or time.monotonic() >= deadline:
                return
            seen = len(self._queue)

    def _join(self, reqs: list[BatchRow]) -> None:
        """New rows, one group per LoRA adapter (their sessions open at their first step)."""
        by_adapter: dict[str | None, list[_Row]] = {}
        for req in reqs:
            procs, recorder = self.engine.processors(len(req.prompt_ids), req.params,
                                                     req.generator)  # fmt: skip
            row = _Row(req, procs, recorder, list(req.prompt_ids))
            by_adapter.setdefault(req.params.adapter, []).append(row)
        self._groups.extend(_Group(rows) for rows in by_adapter.values())

    def _step(self) -> None:
        """Advance every running row by one token (a joining group: its whole prompts)."""
        for group in list(self._groups):
            for row in group.live:
                if row.req.cancel.is_set():
                    self._end(group, row)  # cancelled before its next step: freed now
        groups = list(self._groups)
        if not groups:
            return
        results = list(self._steps.map(self._advance, groups))
        stepped: list[tuple[_Group, _Row, torch.Tensor]] = []
        for group, hidden in zip(groups, results, strict=True):
            if isinstance(hidden, BaseException):
                self._fail(group, hidden)
                continue
            self._route(group)
            stepped += [(group, row, hidden[i : i + 1]) for i, row in enumerate(group.rows)
                        if not row.done]  # fmt: skip
        if not stepped:
            return
        with torch.inference_mode():  # one head for all rows: [B, H] -> [B, V]
            logits = self.engine.project(torch.cat([h for _, _, h in stepped])).float()
        self.stats.steps += 1
        self.stats.row_steps += len(stepped)
        self.stats.most_rows = max(self.stats.most_rows, len(stepped))
        for i, (group, row, _) in enumerate(stepped):
            try:
                self._choose(group, row, logits[i : i + 1])
            except Exception as exc:  # a processor's failure ends only its row
                self._end(group, row, exc)

    def _advance(self, group: _Group) -> torch.Tensor | BaseException:
        """(On a step thread) open the group's sessions if new and send its next tokens: the
        final normed states of the rows' last positions [B, H], or what failed."""
        try:
            with torch.inference_mode():
                if group.opened is None:
                    ids, group.mask = self._first(group)
                else:
                    last = [r.ids[-1] if not r.done else self.engine.pad_token_id
                            for r in group.rows]  # fmt: skip
                    ids = torch.tensor([last], dtype=torch.long).T  # [B, 1]
                    if group.mask is not None:
                        group.mask = torch.cat([group.mask, group.mask.new_ones(len(last), 1)], 1)
                assert group.opened is not None
                return self.engine.row_step(group.opened, ids, group.mask)
        except Exception as exc:
            return exc

    def _first(self, group: _Group) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Open the group's sessions: its first step's ids [B, T] and mask (None: no pads)."""
        prompts = [r.req.prompt_ids for r in group.rows]
        group.opened = group.stack.enter_context(
            self.engine.open_group(prompts, [r.req.params for r in group.rows]))  # fmt: skip
        self.stats.groups += 1
        held = self.engine.held_tokens(group.opened)  # a shared prefix already there
        rest = [list(p)[held:] for p in prompts]
        width = max(len(p) for p in rest)
        if all(len(p) == width for p in rest):
            return torch.tensor(rest, dtype=torch.long), None
        ids = torch.full((len(rest), width), self.engine.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rest), held + width), dtype=torch.long)
        mask[:, :held] = 1  # the prefix, then each prompt's rest left-padded
        for i, p in enumerate(rest):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, held + width - len(p) :] = 1
        return ids, mask

    def _route(self, group: _Group) -> None:
        """Tell the group's rows which servers ran them (once, after the first step)."""
        if not group.routed and group.opened is not None:
            group.routed = True
            route = group.opened.route()
            for row in group.rows:
                if row.req.on_route is not None:
                    row.req.on_route(route)

    def _choose(self, group: _Group, row: _Row, scores: torch.Tensor) -> None:
        """The row's processors pick its next token from its logits [1, V] (as generate()
        does: processors, then argmax); report it; end the row if it is done."""
        req = row.req
        input_ids = cast(torch.LongTensor, torch.tensor([row.ids], dtype=torch.long))
        token = int(row.processors(input_ids, scores).argmax(dim=-1)[0])
        req.on_token(self.engine.event(token, row.recorder, req.params.top_logprobs))
        row.count += 1
        row.ids.append(token)
        eos = token in self.engine.eos_token_ids
        if eos or row.count >= req.params.max_new_tokens or req.cancel.is_set():
            self._end(group, row)

    def _end(self, group: _Group, row: _Row, exc: BaseException | None = None) -> None:
        """The row ends now; its group's sessions close with its last row (kept for a next
        turn when clean, drift.api.prefix)."""
        row.done = True
        if not group.live:
            self._groups.remove(group)
            try:
                group.stack.close()
            except Exception as close_exc:  # closing failed: the row still ends
                exc = exc or close_exc
        if exc is None:
            row.req.on_done()
        else:
            row.req.on_done(exc)

    def _fail(self, group: _Group, exc: BaseException) -> None:
        """The group's step failed: its open rows end with `exc`, its sessions close."""
        if group in self._groups:
            self._groups.remove(group)
        with contextlib.suppress(Exception):
            group.stack.__exit__(type(exc), exc, exc.__traceback__)
        for row in group.live:
            row.done = True
            row.req.on_done(exc)


def engine_gauges(loop: ContinuousBatcher) -> dict[str, tuple[str, Callable[[], float]]]:
    """/metrics gauges of the engine loop (ApiMetrics.gauges): rows, waiting, steps shared."""
    return {
        "drift_api_engine_rows": ("Requests holding a row of the engine loop.",
                                  lambda: loop.running),
        "drift_api_engine_waiting": ("Requests waiting for a row (--max_batch).",
                                     lambda: loop.waiting),
        "drift_api_engine_steps": ("Steps the engine loop ran.", lambda: loop.stats.steps),
        "drift_api_engine_row_steps": ("Rows advanced, summed over the steps (/ steps: rows "
                                       "per step).", lambda: loop.stats.row_steps),
    }  # fmt: skip
