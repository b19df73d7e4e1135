"""OpenAI request bodies as frozen dataclasses, validated once at the edge.

`parse_chat` / `parse_completion` turn a decoded JSON body into a typed request or raise
`BadRequest` naming the field (`details={"param": ...}`). As OpenAI, a field it does not know
is a 400 (`unknown_parameter`); so is an OpenAI field DRIFT cannot honour when it is set
(`unsupported_parameter`, see UNSUPPORTED); wrong types and out-of-range values are refused.
Knows nothing of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from drift.api.messages import (
    ChatMessage,
    ToolChoice,
    ToolSpec,
    check_schema_depth,
    parse_messages,
    parse_tool_choice,
    parse_tools,
)
from drift.wire.errors import BadRequest

MAX_N = 16  # choices per request
MAX_PROMPTS = 16  # prompts per completions request (each is a row of generation)
MAX_STOP = 4  # stop strings per request, as OpenAI
MAX_TOP_LOGPROBS = 20


# OpenAI fields DRIFT accepts and ignores (bookkeeping that changes no output)
IGNORED = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier")
# OpenAI fields DRIFT cannot honour: a 400 naming them when set to anything but "off"
UNSUPPORTED = {
    "chat": ("audio", "functions", "function_call", "logit_bias", "modalities", "prediction",
             "reasoning_effort", "verbosity", "web_search_options"),
    "completion": ("best_of", "logit_bias", "suffix"),
}  # fmt: skip
_OFF: tuple[Any, ...] = ({}, [], "", "none", ["text"])  # values that ask for nothing
_SAMPLING = ("model", "max_tokens", "temperature", "top_p", "n", "seed", "stop",
             "presence_penalty", "frequency_penalty", "logprobs", "stream", "stream_options",
             "response_format")  # fmt: skip
KNOWN = {
    "chat": (*_SAMPLING, "messages", "max_completion_tokens", "top_logprobs", "tools",
             "tool_choice", "parallel_tool_calls"),
    "completion": (*_SAMPLING, "prompt", "echo"),
}  # fmt: skip


@dataclass(frozen=True)
class ResponseFormat:
    kind: str  # "text" | "json_object" | "json_schema"
    schema: dict[str, Any] | None = None  # json_schema only
    name: str | None = None


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
    response_format: ResponseFormat
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = field(default_factory=lambda: ToolChoice("none"))
    parallel_tool_calls: bool = True


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: tuple[str | tuple[int, ...], ...]  # text, or token ids
    echo: bool
    options: SamplingOptions
    response_format: ResponseFormat  # a DRIFT extension for completions (vLLM has it too)


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


def check_fields(body: dict[str, Any], endpoint: str) -> None:
    """400 for a field OpenAI does not define, or one DRIFT cannot honour that is set."""
    known = KNOWN[endpoint]
    unsupported = UNSUPPORTED[endpoint]
    unknown = [k for k in body if k not in known and k not in IGNORED and k not in unsupported]
    if unknown:
        raise BadRequest(
            f"unrecognized request argument supplied: {', '.join(unknown)}",
            param=unknown[0], code="unknown_parameter",
        )  # fmt: skip
    refused = [k for k in unsupported if k in body and not _is_off(k, body[k], body)]
    if refused:
        raise BadRequest(
            f"DRIFT does not support {', '.join(refused)} (unsupported here: "
            f"{', '.join(unsupported)})", param=refused[0], code="unsupported_parameter",
        )  # fmt: skip


def _is_off(key: str, value: Any, body: dict[str, Any]) -> bool:
    if key == "best_of":  # best_of == n is plain sampling
        return value is None or value == body.get("n", 1)
    return value is None or value in _OFF


def _response_format(body: dict[str, Any]) -> ResponseFormat:
    value = body.get("response_format")
    if value is None:
        return ResponseFormat("text")
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("text", "json_object"):
        return ResponseFormat(kind)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise _bad("response_format", "'json_schema' needs an object with a 'schema' object")
        name = spec.get("name")
        check_schema_depth(spec.get("schema") or {}, "response_format")
        return ResponseFormat(
            kind, spec.get("schema") or {}, name if isinstance(name, str) else None
        )
    raise _bad(
        "response_format", "'response_format.type' is 'text', 'json_object' or 'json_schema'"
    )


def parse_chat(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    check_fields(body, "chat")
    logprobs = None
    if _bool(body, "logprobs"):
        logprobs = _opt_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    tools = parse_tools(body.get("tools"))
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean")
    return ChatRequest(
        model=_model(body),
        messages=parse_messages(body.get("messages")),
        options=_options(body, logprobs),
        response_format=_response_format(body),
        tools=tools,
        tool_choice=parse_tool_choice(body.get("tool_choice"), tools),
        parallel_tool_calls=parallel,
    )


def _prompts(body: dict[str, Any], limit: int = MAX_PROMPTS) -> tuple[str | tuple[int, ...], ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) > limit and not isinstance(prompt[0], int):
        raise _bad("prompt", f"'prompt' takes at most {limit} prompts, got {len(prompt)}")
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
    check_fields(body, "completion")
    logprobs = _opt_int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    return CompletionRequest(
        model=_model(body),
        prompts=_prompts(body),
        echo=_bool(body, "echo"),
        options=_options(body, logprobs),
        response_format=_response_format(body),
    )


MAX_EMBED_INPUTS = 2048  # inputs per embeddings request, as OpenAI


@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    inputs: tuple[str | tuple[int, ...], ...]  # text, or token ids
    base64: bool  # encoding_format "base64" (else "float")
    dimensions: int | None


def parse_embeddings(body: Any) -> EmbeddingsRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = [k for k in body if k not in ("model", "input", "encoding_format", "dimensions",
                                            *IGNORED)]  # fmt: skip
    if unknown:
        raise BadRequest(f"unrecognized request argument supplied: {', '.join(unknown)}",
                         param=unknown[0], code="unknown_parameter")  # fmt: skip
    body = {**body, "prompt": body.get("input")}
    try:
        inputs = _prompts(body, MAX_EMBED_INPUTS)
    except BadRequest as exc:
        raise _bad("input", exc.message.replace("'prompt'", "'input'")) from exc
    if len(inputs) > MAX_EMBED_INPUTS:
        raise _bad("input", f"at most {MAX_EMBED_INPUTS} inputs per request, got {len(inputs)}")
    if any(len(x) == 0 for x in inputs):
        raise _bad("input", "an input is empty")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise _bad("encoding_format", "'encoding_format' is 'float' or 'base64'")
    return EmbeddingsRequest(_model(body), inputs, encoding == "base64",
                             _opt_int(body, "dimensions", 1))  # fmt: skip
