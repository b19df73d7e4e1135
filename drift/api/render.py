"""OpenAI response bodies: completions, chat completions (tool calls included), stream
chunks, log-probs, embeddings, model cards, errors.

Pure functions from DRIFT's results (`Delta`, `Finish`, `TokenEvent`) to the JSON shapes
the official `openai` client parses. Knows no HTTP and no model; `token_text` turns ids
into strings.
"""

from __future__ import annotations

import dataclasses
import secrets
from base64 import b64encode
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from drift.api.engine import ServedSpan, TokenEvent
from drift.api.service import Delta, Finish
from drift.api.tools import CallDelta, ToolCallParser
from drift.wire.errors import DriftError

TokenText = Callable[[int], str]

# drift error code -> OpenAI error code (where OpenAI has a well-known one)
_OPENAI_CODES = {
    "length_exceeded": "context_length_exceeded",
    "unauthorized": "invalid_api_key",
    "not_found": "model_not_found",
    "busy": "rate_limit_exceeded",
}


def error_body(status: int, message: str, code: str | None, param: str | None = None) -> dict:
    if status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def drift_error_body(exc: DriftError) -> dict:
    param = exc.details.get("param")
    code = exc.details.get("code")  # a finer OpenAI code than the class's (unknown_parameter)
    if not isinstance(code, str):
        code = _OPENAI_CODES.get(exc.code, exc.code)
    return error_body(exc.status, exc.message, code, param if isinstance(param, str) else None)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_logprobs(
    tokens: Sequence[TokenEvent], token_text: TokenText, offset: int
) -> dict[str, Any]:
    """The legacy completions `logprobs` object; `offset` is where the first token starts."""
    out: dict[str, Any] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for event in tokens:
        text = token_text(event.token_id)
        out["tokens"].append(text)
        out["token_logprobs"].append(event.logprob)
        out["top_logprobs"].append({token_text(t): lp for t, lp in event.top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def _entry(token_text: TokenText, token_id: int, logprob: float | None) -> dict[str, Any]:
    text = token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tokens: Sequence[TokenEvent], token_text: TokenText) -> dict[str, Any]:
    content = []
    for event in tokens:
        entry = _entry(token_text, event.token_id, event.logprob)
        entry["top_logprobs"] = [_entry(token_text, t, lp) for t, lp in event.top]
        content.append(entry)
    return {"content": content}


def model_card(model_id: str, created: int, *, pooling: str, hidden_size: int) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "drift",
        "embeddings": {"pooling": pooling, "normalized": True, "dimensions": hidden_size,
                       "source": "final normed hidden state"},
    }  # fmt: skip


def route_json(route: Sequence[ServedSpan]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(span) for span in route]


def embeddings_body(model: str, vectors: Sequence[Sequence[float]], *, base64: bool,
                    prompt_tokens: int) -> dict[str, Any]:  # fmt: skip
    data = []
    for i, vector in enumerate(vectors):
        value: Any = vector
        if base64:  # OpenAI's: little-endian float32 bytes, base64
            value = b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}  # fmt: skip


class ResponseBuilder:
    """Accumulates one request's events into a response body, or renders them as chunks.

    With `tools` (chat requests that may call tools), each choice's text goes through a
    ToolCallParser: calls become `tool_calls` (finish_reason "tool_calls"), the rest content.
    """

    def __init__(
        self,
        *,
        chat: bool,
        model: str,
        created: int,
        token_text: TokenText,
        prompt_tokens: int,
        echo: Sequence[str],  # per choice: text to put before the completion ("" = none)
        logprobs: bool,
        tools: bool = False,  # parse tool calls out of the text
        text_allowed: bool = True,  # with tools: may the answer be text (tool_choice auto)
    ) -> None:
        self.chat = chat
        self.model = model
        self.created = created
        self.token_text = token_text
        self.prompt_tokens = prompt_tokens
        self.echo = list(echo)
        self.logprobs = logprobs
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        n = len(self.echo)
        self.texts = ["" for _ in range(n)]
        self.tokens: list[list[TokenEvent]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None for _ in range(n)]
        self.calls: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        self.parsers = [ToolCallParser(text_allowed=text_allowed) if tools else None
                        for _ in range(n)]  # fmt: skip
        self.route: tuple[ServedSpan, ...] = ()
        self.completion_tokens = 0
        self._started = [False for _ in range(n)]

    def _pieces(self, event: Delta | Finish) -> tuple[str, list[CallDelta]]:
        """The event's new content text and tool-call pieces (through the parser)."""
        parser = self.parsers[event.index]
        if parser is None:
            return (event.text if isinstance(event, Delta) else ""), []
        pieces = parser.push(event.text) if isinstance(event, Delta) else parser.finish()
        text = "".join(p for p in pieces if isinstance(p, str))
        calls = [p for p in pieces if isinstance(p, CallDelta)]
        for piece in calls:
            own = self.calls[event.index]
            if piece.index == len(own):
                own.append({"id": piece.id, "type": "function",
                            "function": {"name": piece.name, "arguments": ""}})  # fmt: skip
            own[piece.index]["function"]["arguments"] += piece.arguments
        return text, calls

    def _reason(self, event: Finish) -> str:
        if event.reason == "stop" and self.calls[event.index]:
            return "tool_calls"
        return event.reason

    # -- non-streaming ------------------------------------------------------------------
    def add(self, event: Delta | Finish) -> None:
        text, _ = self._pieces(event)
        self.texts[event.index] += text
        if isinstance(event, Delta):
            self.tokens[event.index].extend(event.tokens)
        else:
            self.finish[event.index] = self._reason(event)
            self.completion_tokens += event.completion_tokens
            self.route = event.route or self.route

    def body(self) -> dict[str, Any]:
        choices = []
        for i, text in enumerate(self.texts):
            lp = self._logprobs(i, self.tokens[i], len(self.echo[i])) if self.logprobs else None
            choice: dict[str, Any] = {"index": i, "logprobs": lp, "finish_reason": self.finish[i]}
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if self.calls[i]:
                    message["content"] = text or None
                    message["tool_calls"] = self.calls[i]
                choice["message"] = message
            else:
                choice["text"] = self.echo[i] + text
            choices.append(choice)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
            "usage": usage(self.prompt_tokens, self.completion_tokens),
            "drift_route": route_json(self.route),
        }

    # -- streaming ----------------------------------------------------------------------
    def chunk(self, event: Delta | Finish) -> dict[str, Any] | None:
        """One stream chunk for this event (None when there is nothing to say)."""
        i = event.index
        first = not self._started[i]
        self._started[i] = True
        offset = len(self.echo[i]) + len(self.texts[i])
        text, calls = self._pieces(event)
        self.texts[i] += text
        tokens = event.tokens if isinstance(event, Delta) else ()
        finish = None
        if isinstance(event, Finish):
            self.completion_tokens += event.completion_tokens
            self.route = event.route or self.route
            finish = self._reason(event)
        if not text and not calls and not tokens and finish is None and not first:
            return None
        lp = self._logprobs(i, tokens, offset) if self.logprobs and tokens else None
        choice: dict[str, Any] = {"index": i, "logprobs": lp, "finish_reason": finish}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text or (first and not calls):
                delta["content"] = text
            if calls:
                delta["tool_calls"] = [_call_chunk(c) for c in calls]
            choice["delta"] = delta
        else:
            choice["text"] = (self.echo[i] if first else "") + text
        out = self._envelope([choice])
        if finish is not None and self.route:
            out["drift_route"] = route_json(self.route)
        return out

    def usage_chunk(self) -> dict[str, Any]:
        out = self._envelope([])
        out["usage"] = usage(self.prompt_tokens, self.completion_tokens)
        return out

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def _logprobs(self, i: int, tokens: Sequence[TokenEvent], offset: int) -> dict[str, Any]:
        if self.chat:
            return chat_logprobs(tokens, self.token_text)
        return completion_logprobs(tokens, self.token_text, offset)


def _call_chunk(piece: CallDelta) -> dict[str, Any]:
    if piece.id is None:
        return {"index": piece.index, "function": {"arguments": piece.arguments}}
    return {"index": piece.index, "id": piece.id, "type": "function",
            "function": {"name": piece.name, "arguments": piece.arguments}}  # fmt: skip
