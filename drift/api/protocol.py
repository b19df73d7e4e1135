"""OpenAI request bodies as frozen dataclasses, validated once at the edge.

`parse_chat` / `parse_completion` turn a decoded JSON body into a typed request or raise
`BadRequest` naming the field (`details={"param": ...}`). Unknown fields are ignored, as
OpenAI does; wrong types and out-of-range values are refused. Knows nothing of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drift.wire.errors import BadRequest

MAX_N = 16  # choices per request
MAX_PROMPTS = 16  # prompts per completions request (each is a row of generation)
MAX_STOP = 4  # stop strings per request, as OpenAI
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant" | "tool" | "developer"
    content: str


@dataclass(frozen=True)
class SamplingOptions:
    """What both endpoints share: how to draw tokens and when to stop."""

    max_tokens: int | None  # new tokens per choice; None = up to the context (capped by config)
    temperature: float  # 0 = greedy
    top_p: float  # nucleus mass in (0, 1]
    n: int  # choices
    seed: int | None
    stop: tuple[str, ...]
    presence_penalty: float
    frequency_penalty: float
    logprobs: int | None  # None = off; k = chosen token plus k alternatives
    stream: bool
    include_usage: bool  # stream_options.include_usage


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[ChatMessage, ...]
    options: SamplingOptions


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: tuple[str | tuple[int, ...], ...]  # text, or token ids
    echo: bool
    options: SamplingOptions


def _bad(param: str, message: str) -> BadRequest:
    return BadRequest(message, param=param)


def _opt_int(body: dict[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(key, f"'{key}' must be an integer, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise _bad(key, f"'{key}' must be {bound}, got {value}")
    return value


def _float(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(key, f"'{key}' must be a number, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise _bad(key, f"'{key}' must be between {lo} and {hi}, got {value}")
    return float(value)


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(key, f"'{key}' must be a boolean, got {type(value).__name__}")
    return value


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "'model' is required and must be a string")
    return model


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _bad("stop", "'stop' must be a string or a list of strings")
    if len(stop) > MAX_STOP:
        raise _bad("stop", f"'stop' takes at most {MAX_STOP} strings, got {len(stop)}")
    return tuple(s for s in stop if s)


def _options(body: dict[str, Any], logprobs: int | None) -> SamplingOptions:
    max_tokens = _opt_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", 1)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _bad("stream_options", "'stream_options' must be an object")
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=_float(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_float(body, "top_p", 1.0, 0.0, 1.0) or 1e-6,
        n=_opt_int(body, "n", 1, MAX_N) or 1,
        seed=_opt_int(body, "seed", -(2**63), 2**63 - 1),
        stop=_stop(body),
        presence_penalty=_float(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_float(body, "frequency_penalty", 0.0, -2.0, 2.0),
        logprobs=logprobs,
        stream=_bool(body, "stream"),
        include_usage=_bool(stream_options or {}, "include_usage"),
    )


def _content(index: int, content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise _bad(f"messages[{index}].content", "only text content parts are supported")
            if not isinstance(part.get("text"), str):
                raise _bad(f"messages[{index}].content", "a text part needs a string 'text'")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{index}].content", "'content' must be a string or a list of parts")


def _messages(body: dict[str, Any]) -> tuple[ChatMessage, ...]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "'messages' must be a non-empty list")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise _bad(f"messages[{i}]", "each message needs a string 'role'")
        out.append(ChatMessage(role=msg["role"], content=_content(i, msg.get("content"))))
    return tuple(out)


def parse_chat(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    logprobs = None
    if _bool(body, "logprobs"):
        logprobs = _opt_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    return ChatRequest(
        model=_model(body), messages=_messages(body), options=_options(body, logprobs)
    )


def _prompts(body: dict[str, Any]) -> tuple[str | tuple[int, ...], ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) > MAX_PROMPTS and not isinstance(prompt[0], int):
        raise _bad("prompt", f"'prompt' takes at most {MAX_PROMPTS} prompts, got {len(prompt)}")
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return (tuple(prompt),)
        if all(
            isinstance(p, list)
            and p
            and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
            for p in prompt
        ):
            return tuple(tuple(p) for p in prompt)
    raise _bad(
        "prompt",
        "'prompt' must be a string, a list of strings, a list of token ids or a list of those",
    )


def parse_completion(body: Any) -> CompletionRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    logprobs = _opt_int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    return CompletionRequest(
        model=_model(body),
        prompts=_prompts(body),
        echo=_bool(body, "echo"),
        options=_options(body, logprobs),
    )
