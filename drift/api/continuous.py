"""One engine loop per model: every step, all running requests advance together.

`ContinuousBatcher` runs one loop thread over a swarm engine. A request joins at the next
step (its prompt goes through the swarm while the others decode their next token); one
that ends (EOS, its token budget, cancelled) leaves that step and its sessions are closed
at once. Each row keeps its own one-row sessions: the rows' steps are sent in parallel and
the servers' batcher (drift.server.batcher) runs them as one forward; the client then
computes the head once for all rows. Sampling, penalties, grammars, log-probs and LoRA
adapters stay per row (drift.api.sampling). At most `max_batch` rows run; others wait.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import cast

import torch
from transformers import LogitsProcessorList

from drift.api.engine import BatchRow, CausalLMEngine, OpenedSessions
from drift.api.sampling import LogprobRecorder


@dataclass
class _Row:
    """A running request: its sessions, the tokens so far and those to send next."""

    req: BatchRow
    processors: LogitsProcessorList
    recorder: LogprobRecorder | None
    ids: list[int]  # prompt + generated
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    opened: OpenedSessions | None = None
    pending: list[int] = field(default_factory=list)  # tokens the session has not seen
    count: int = 0  # tokens generated
    routed: bool = False


@dataclass
class BatcherStats:
    steps: int = 0  # loop steps run
    row_steps: int = 0  # rows advanced, summed over steps
    most_rows: int = 0  # the most rows that ran in one step


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
        self._rows: list[_Row] = []
        self._cv = threading.Condition()
        self._closed = False
        self._steps = ThreadPoolExecutor(max_batch, thread_name_prefix="drift-api-row")
        self._thread = threading.Thread(target=self._loop, name="drift-api-engine", daemon=True)
        self._thread.start()

    # -- outside -------------------------------------------------------------------------
    def submit(self, req: BatchRow) -> None:
        """Queue a request; it joins the running rows at the next step (`on_done` ends it)."""
        with self._cv:
            if self._closed:
                raise RuntimeError("the engine loop is closed")
            self._queue.append(req)
            self._cv.notify()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._rows)

    def close(self) -> None:
        """Stop the loop; rows still running or waiting end with an error."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()
        self._steps.shutdown(wait=True)

    # -- the loop ------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._queue and not self._rows:
                    self._cv.wait()
                if self._closed:
                    break
                room = self.max_batch - len(self._rows)
                joining = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
            for req in joining:
                self._rows.append(self._new_row(req))
            self._step()
        gone = RuntimeError("the API is shutting down")
        for row in self._rows:
            self._end(row, gone)
        for req in self._queue:
            req.on_done(gone)
        self._rows, self._queue = [], deque()

    def _new_row(self, req: BatchRow) -> _Row:
        procs, recorder = self.engine.processors(len(req.prompt_ids), req.params,
                                                     req.generator)  # fmt: skip
        return _Row(req, procs, recorder, list(req.prompt_ids))

    def _step(self) -> None:
        """Advance every running row by one token (a joining row: its whole prompt)."""
        for row in [r for r in self._rows if r.req.cancel.is_set()]:
            self._end(row)  # cancelled before its next step: freed now
        rows = list(self._rows)
        if not rows:
            return
        results = list(self._steps.map(self._advance, rows))
        stepped = [(row, h) for row, h in zip(rows, results, strict=True)
                   if isinstance(h, torch.Tensor)]  # fmt: skip
        for row, h in zip(rows, results, strict=True):
            if not isinstance(h, torch.Tensor):
                self._end(row, h)
        if not stepped:
            return
        with torch.inference_mode():  # one head for all rows: [B, H] -> [B, V]
            logits = self.engine.project(torch.cat([h for _, h in stepped])).float()
        self.stats.steps += 1
        self.stats.row_steps += len(stepped)
        self.stats.most_rows = max(self.stats.most_rows, len(stepped))
        for i, (row, _) in enumerate(stepped):
            try:
                self._choose(row, logits[i : i + 1])
            except Exception as exc:  # a processor's failure ends only its row
                self._end(row, exc)

    def _advance(self, row: _Row) -> torch.Tensor | BaseException:
        """(On a step thread) open the row's sessions if new, send its pending tokens: the
        final normed state of its last position [1, H], or what failed."""
        try:
            with torch.inference_mode():
                if row.opened is None:
                    req = row.req
                    row.opened = row.stack.enter_context(self.engine.open_row(req.prompt_ids,
                                                                              req.params))  # fmt: skip
                    row.pending = row.ids[self.engine.held_tokens(row.opened) :]
                hidden = self.engine.row_step(row.opened, row.pending)
            row.pending = []
            return hidden
        except Exception as exc:
            return exc

    def _choose(self, row: _Row, scores: torch.Tensor) -> None:
        """The row's processors pick its next token from its logits [1, V] (as generate()
        does: processors, then argmax); report it; end the row if it is done."""
        req = row.req
        if not row.routed and row.opened is not None:
            row.routed = True
            if req.on_route is not None:
                req.on_route(row.opened.route())
        input_ids = cast(torch.LongTensor, torch.tensor([row.ids], dtype=torch.long))
        token = int(row.processors(input_ids, scores).argmax(dim=-1)[0])
        req.on_token(self.engine.event(token, row.recorder, req.params.top_logprobs))
        row.count += 1
        row.ids.append(token)
        row.pending = [token]
        eos = token in self.engine.eos_token_ids
        if eos or row.count >= req.params.max_new_tokens or req.cancel.is_set():
            self._end(row)

    def _end(self, row: _Row, exc: BaseException | None = None) -> None:
        """The row leaves now: its sessions closed (kept for a next turn when clean)."""
        if row in self._rows:
            self._rows.remove(row)
        try:
            if exc is None:
                row.stack.close()
            else:
                row.stack.__exit__(type(exc), exc, exc.__traceback__)
        except Exception as close_exc:  # closing failed: the row still ends
            exc = exc or close_exc
        if exc is None:
            row.req.on_done()
        else:
            row.req.on_done(exc)
