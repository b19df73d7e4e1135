"""The CPU-bound part of a request, off the event loop: JSON of big bodies, chat templates,
tokenizers and grammar compiles run on a small pool of their own (`Prep`), so /health,
/metrics and other users' streams keep answering while a worst-case request is read.

Pure functions of the engine and the parsed request; the routes (drift.api.app) await them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import orjson

from drift.api.constraints import request_grammar
from drift.api.engine import CausalLMEngine
from drift.api.grammar import Grammar
from drift.api.protocol import ChatRequest, CompletionRequest
from drift.wire.errors import BadRequest

T = TypeVar("T")
INLINE_BYTES = 64 << 10  # a body this small is decoded on the loop (a thread hop costs more)
WORKERS = 2  # requests prepared at once; more wait their turn (never on the loop)


class Prep:
    """A bounded pool for request preparation (closed with the app)."""

    def __init__(self, workers: int = WORKERS) -> None:
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="drift-api-prep")
        self.jobs = 0  # preparations run off the loop (for tests and /metrics)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        self.jobs += 1
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def parse(self, raw: bytes, parse: Callable[[Any], T]) -> T:
        """`parse` of the body's JSON (both off the loop when the body is big); BadRequest
        when it is not JSON."""
        if len(raw) < INLINE_BYTES:
            return parse(loads(raw))
        return await self.run(lambda: parse(loads(raw)))

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc


def compile_grammar(engine: CausalLMEngine, lark: str | None, param: str) -> Grammar | None:
    return None if lark is None else engine.grammars.compile(lark, param=param)


def chat(engine: CausalLMEngine, req: ChatRequest) -> tuple[list[int], Grammar | None]:
    """The chat request's prompt ids and grammar."""
    tools = req.tools if req.tool_choice.mode != "none" else ()
    prompt = engine.chat_prompt(req.messages, tools)
    lark = request_grammar(req.response_format, tools, req.tool_choice,
                           parallel=req.parallel_tool_calls)  # fmt: skip
    return prompt, compile_grammar(engine, lark, "tools" if tools else "response_format")


def completion(engine: CausalLMEngine, req: CompletionRequest
               ) -> tuple[list[list[int]], Grammar | None, list[str]]:  # fmt: skip
    """The completion request's prompt ids, grammar and echoed texts."""
    prompts = [engine.encode(p) if isinstance(p, str) else list(p) for p in req.prompts]
    check_ids(engine, prompts, "prompt")
    grammar = compile_grammar(engine, request_grammar(req.response_format), "response_format")
    echo = [
        (p if isinstance(p, str) else engine.decode(p)) if req.echo else ""
        for p in req.prompts
        for _ in range(req.options.n)
    ]
    return prompts, grammar, echo


def embedding_inputs(engine: CausalLMEngine, inputs: Sequence[str | tuple[int, ...]]
                     ) -> list[list[int]]:  # fmt: skip
    out = [engine.encode(x, "input") if isinstance(x, str) else list(x) for x in inputs]
    check_ids(engine, out, "input")
    return out


def check_ids(engine: CausalLMEngine, inputs: Sequence[Sequence[int]], param: str) -> None:
    for ids in inputs:
        bad = [t for t in ids if not 0 <= t < engine.vocab_size()]
        if bad:
            raise BadRequest(f"token ids out of the vocabulary: {bad[:5]}", param=param)
