"""Run OpenAI-style generation requests against an engine, off the event loop.

`GenerationService` admits requests (at most `max_concurrent` generate at once, at most
`queue_size` wait, the rest get `Busy`), runs each choice's `generate()` on an executor
thread and streams its tokens back through an asyncio queue as text deltas, applying
stop strings. Closing the iterator cancels the generation before its next token and waits
for the thread, so the request's sessions are freed before its slot is. No HTTP here.
With `max_batch` > 1 over a swarm, every choice joins one engine loop (drift.api.continuous)
at its next step: up to `max_batch` rows advance together and each leaves (freeing its
slot) the step it ends. Over a local model, choices waiting together run as one batch
(`generate_batch`); one arriving while batches run starts its own batch at once.
`embed` runs embedding inputs (one forward pass each) under the same slots. Token counts and timings go to the
app's `ApiMetrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from drift.api.continuous import ContinuousBatcher
from drift.api.engine import (
    BatchRow,
    CausalLMEngine,
    GenerationParams,
    ServedSpan,
    TokenEvent,
)
from drift.api.grammar import Grammar
from drift.api.metrics import ApiMetrics
from drift.api.protocol import SamplingOptions
from drift.api.textstream import StopTextStream
from drift.wire.errors import Busy, LengthExceeded, NotFound


@dataclass(frozen=True)
class ServiceConfig:
    max_concurrent: int = 4  # requests generating at once (each holds its own sessions)
    queue_size: int = 32  # requests allowed to wait for a slot; more get HTTP 429
    default_max_tokens: int = 512  # new tokens per choice when a request names none
    max_batch: int = 1  # rows of the engine loop (over a swarm) or of a batch (1 = off)
    batch_wait_s: float = 0.01  # how long a lone choice waits for others to batch with


@dataclass(frozen=True)
class Delta:
    index: int  # choice index
    text: str  # newly released text (may be empty)
    tokens: tuple[TokenEvent, ...]  # tokens consumed since the previous delta


@dataclass(frozen=True)
class Finish:
    index: int
    reason: str  # "stop" | "length"
    completion_tokens: int
    route: tuple[ServedSpan, ...] = ()  # the servers that ran the blocks (empty: local)


_DONE = object()


def _unset(exc: BaseException | None = None) -> None:  # replaced when the row is queued
    raise AssertionError("a batch row ran before its on_done was set")


class GenerationService:
    def __init__(
        self, engine: CausalLMEngine, config: ServiceConfig, metrics: ApiMetrics | None = None
    ) -> None:
        if config.max_concurrent < 1 or config.queue_size < 0 or config.max_batch < 1:
            raise ValueError("max_concurrent and max_batch must be >= 1 and queue_size >= 0")
        self.engine = engine
        self.config = config
        self.metrics = metrics or ApiMetrics()
        self.executor = ThreadPoolExecutor(config.max_concurrent, thread_name_prefix="drift-api")
        self._slots = asyncio.Semaphore(config.max_concurrent)
        self.waiting = 0  # requests queued for a slot
        self.active = 0  # generate() calls running on the executor
        self.tokens_generated = 0  # all tokens produced since start (written by the threads)
        self._pending: list[tuple[BatchRow, Future[None]]] = []  # choices waiting for a batch
        self._batches = 0  # batches running (each on an executor thread)
        # slots bound the rows; a batch whose rows have all ended but one still holds its
        # thread, so batches are bounded by the executor's threads
        self._max_batches = config.max_concurrent
        self._kick_scheduled = False
        # over a swarm: one engine loop whose rows join and leave every step
        self.loop: ContinuousBatcher | None = None
        if config.max_batch > 1 and engine.sessions is not None:
            self.loop = ContinuousBatcher(engine, config.max_batch)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()
        self.executor.shutdown(wait=True, cancel_futures=True)

    async def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters requests may name now (reading them may ask the swarm)."""
        return await asyncio.to_thread(self.engine.adapters)

    async def check_model(self, model: str) -> str | None:
        """The LoRA adapter a request's model id names ("base:adapter"; None: the base)."""
        if model == self.engine.model_id:
            return None
        base, _, adapter = model.rpartition(":")
        adapters = await self.adapters()
        if base == self.engine.model_id and adapter in adapters:
            return adapter
        served = [self.engine.model_id, *(f"{self.engine.model_id}:{a}" for a in adapters)]
        raise NotFound(f"the model {model!r} does not exist; this server serves {served}",
                       param="model")  # fmt: skip

    def params_for(
        self, prompt_ids: Sequence[int], options: SamplingOptions, grammar: Grammar | None = None,
        adapter: str | None = None,
    ) -> GenerationParams:  # fmt: skip
        """Check the prompt fits the context and size the completion."""
        room = self.engine.context_length - len(prompt_ids)
        wanted = options.max_tokens
        if wanted is None and room >= 1:
            wanted = min(self.config.default_max_tokens, room)
        if not prompt_ids or wanted is None or wanted > room:
            asked = options.max_tokens or 1
            raise LengthExceeded(
                f"this model's maximum context length is {self.engine.context_length} tokens; "
                f"you asked for {len(prompt_ids) + asked} tokens ({len(prompt_ids)} in the "
                f"prompt, {asked} for the completion). Shorten the prompt or max_tokens.",
                param="max_tokens" if options.max_tokens is not None else "messages",
            )
        return GenerationParams(
            max_new_tokens=wanted,
            temperature=options.temperature,
            top_p=options.top_p,
            presence_penalty=options.presence_penalty,
            frequency_penalty=options.frequency_penalty,
            top_logprobs=options.logprobs,
            grammar=grammar,
            adapter=adapter,
        )

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of `max_concurrent` slots; Busy when the queue in front of them is full."""
        if self._slots.locked() and self.waiting >= self.config.queue_size:
            raise Busy(
                f"the server is busy: {self.config.max_concurrent} requests are generating and "
                f"{self.waiting} are waiting; retry later"
            )
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self._slots.release()

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[GenerationParams],
        options: SamplingOptions,
    ) -> AsyncGenerator[Delta | Finish, None]:
        """Every choice of every prompt, one after the other (index = prompt * n + choice)."""
        seed = options.seed if options.seed is not None else secrets.randbits(63)
        generator = torch.Generator().manual_seed(seed % 2**63)
        self.metrics.prompt_tokens += sum(len(p) for p in prompts) * options.n
        for p, (prompt_ids, p_params) in enumerate(zip(prompts, params, strict=True)):
            for j in range(options.n):
                index = p * options.n + j
                choice = self._choice(index, prompt_ids, p_params, options.stop, generator)
                async with contextlib.aclosing(choice) as events:
                    async for event in events:
                        yield event

    async def _choice(
        self,
        index: int,
        prompt_ids: Sequence[int],
        params: GenerationParams,
        stops: Sequence[str],
        generator: torch.Generator,
    ) -> AsyncGenerator[Delta | Finish, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        cancel = threading.Event()

        def on_token(event: TokenEvent) -> None:
            self.tokens_generated += 1
            loop.call_soon_threadsafe(queue.put_nowait, event)

        def on_route(route: tuple[ServedSpan, ...]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, route)

        def job() -> None:
            try:
                self.engine.generate(prompt_ids, params, generator, on_token, cancel, on_route)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        self.active += 1
        if self.config.max_batch > 1:
            future = asyncio.wrap_future(self._submit_row(
                BatchRow(list(prompt_ids), params, generator, on_token, cancel, _unset, on_route),
                queue))  # fmt: skip
        else:
            future = loop.run_in_executor(self.executor, job)
        try:
            async for event in self._consume(index, queue, future, params, stops, cancel):
                yield event
        finally:
            cancel.set()
            with contextlib.suppress(BaseException):
                await asyncio.shield(future)
            self.active -= 1

    # -- batching -----------------------------------------------------------------------
    def _submit_row(self, row: BatchRow, queue: asyncio.Queue[object]) -> Future[None]:
        """Queue one choice for the engine loop, or else the next batch (its `on_done` is set
        here); the future ends when its row does."""
        loop = asyncio.get_running_loop()
        done: Future[None] = Future()

        def on_done(exc: BaseException | None = None) -> None:  # on the batch's thread
            if not done.done():
                if exc is None:
                    done.set_result(None)
                else:
                    done.set_exception(exc)
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        if self.loop is not None:
            self.loop.submit(dataclasses.replace(row, on_done=on_done))
            return done
        self._pending.append((dataclasses.replace(row, on_done=on_done), done))
        if not self._kick_scheduled:
            self._kick_scheduled = True
            loop.call_later(self.config.batch_wait_s, self._kick)
        return done

    def _kick(self) -> None:
        """Start batches from the waiting choices while fewer than allowed are running."""
        self._kick_scheduled = False
        loop = asyncio.get_running_loop()
        while self._pending and self._batches < self._max_batches:
            adapter = self._pending[0][0].params.adapter  # a batch shares one LoRA adapter
            batch = [p for p in self._pending if p[0].params.adapter == adapter]
            batch = batch[: self.config.max_batch]
            self._pending = [p for p in self._pending if all(p is not b for b in batch)]
            self._batches += 1
            running = loop.run_in_executor(self.executor, self._batch_job, batch)
            running.add_done_callback(self._batch_ended)

    def _batch_ended(self, _: object) -> None:
        self._batches -= 1
        if not self._kick_scheduled:  # else the open wait window starts the next batch
            self._kick()

    def _batch_job(self, batch: list[tuple[BatchRow, Future[None]]]) -> None:
        try:
            self.engine.generate_batch([row for row, _ in batch])
        except BaseException as exc:  # every row still open fails with it
            for row, _ in batch:
                row.on_done(exc)  # no-op for rows already ended

    async def _consume(
        self,
        index: int,
        queue: asyncio.Queue[object],
        future: asyncio.Future[None],
        params: GenerationParams,
        stops: Sequence[str],
        cancel: threading.Event,
    ) -> AsyncGenerator[Delta | Finish, None]:
        text = StopTextStream(self.engine.decode, stops)
        pending: list[TokenEvent] = []
        count, reason, route = 0, None, ()
        started, first = time.perf_counter(), None
        while (item := await queue.get()) is not _DONE:
            if isinstance(item, tuple):
                route = item
                continue
            assert isinstance(item, TokenEvent)
            if reason is not None:
                continue  # tokens generated after we asked generate() to stop
            if first is None:
                first = time.perf_counter()
                self.metrics.ttft.observe(first - started)
            count += 1
            self.metrics.completion_tokens += 1
            if item.token_id in self.engine.eos_token_ids:
                reason = "stop"
                cancel.set()
                continue
            pending.append(item)
            new = text.push(item.token_id)
            if text.stopped:
                reason = "stop"
                cancel.set()
            if new or reason is not None:
                yield Delta(index, new, tuple(pending))
                pending = []
        await future  # raises what generate() raised (MissingBlocks, ...)
        if first is not None:
            self.metrics.decoded(count, time.perf_counter() - first)
        if reason is None:
            reason = "length" if count >= params.max_new_tokens else "stop"
            new = text.finish()
            if new or pending:
                yield Delta(index, new, tuple(pending))
        yield Finish(index, reason, count, route)

    # -- embeddings ---------------------------------------------------------------------
    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """Pooled embeddings of `inputs` (see CausalLMEngine.embed), in order."""
        loop = asyncio.get_running_loop()
        out: list[list[float]] = []
        self.metrics.prompt_tokens += sum(len(x) for x in inputs)
        async with self.slot():
            self.active += 1
            try:
                for ids in inputs:
                    out.append(await loop.run_in_executor(self.executor, self.engine.embed, ids))
            finally:
                self.active -= 1
        return out
