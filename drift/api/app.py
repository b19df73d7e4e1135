"""The OpenAI-compatible aiohttp app: /v1/models, /v1/chat/completions, /v1/completions.

Routes parse the body into typed requests, hand the work to `GenerationService`, and
serialise the result as JSON or server-sent events (`data: {...}`, then `data: [DONE]`).
One middleware checks `Authorization: Bearer` keys in constant time; another maps every
error to OpenAI's shape `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from drift.api.engine import CausalLMEngine, GenerationParams
from drift.api.protocol import SamplingOptions, parse_chat, parse_completion
from drift.api.render import ResponseBuilder, drift_error_body, error_body, model_card
from drift.api.service import Delta, Finish, GenerationService, ServiceConfig
from drift.wire.errors import BadRequest, DriftError, Unauthorized
from drift.wire.version import __version__

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ApiConfig:
    api_keys: tuple[str, ...] = ()  # accepted Bearer keys; empty = no authentication
    service: ServiceConfig = field(default_factory=ServiceConfig)
    max_body_bytes: int = 8 * 2**20  # largest request body


SERVICE = web.AppKey("drift_api_service", GenerationService)
CONFIG = web.AppKey("drift_api_config", ApiConfig)
STARTED = web.AppKey("drift_api_started", int)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except DriftError as exc:
        return _json(drift_error_body(exc), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _json(error_body(exc.status, f"{exc.reason}: {request.path}", None), exc.status)
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        return _json(error_body(500, "internal server error", "internal"), 500)


def _bearer_auth(keys: Sequence[str]) -> Any:
    wanted = [k.encode() for k in keys]

    @web.middleware
    async def bearer_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if wanted and request.path.startswith("/v1"):
            header = request.headers.get("Authorization", "")
            given = header[7:].strip().encode() if header.startswith("Bearer ") else b""
            ok = False
            for key in wanted:  # compare against every key: time does not depend on which
                ok |= hmac.compare_digest(given, key)
            if not ok:
                raise Unauthorized(
                    "incorrect API key provided"
                    if given
                    else "missing API key: send 'Authorization: Bearer <key>'"
                )
        return await handler(request)

    return bearer_auth


async def _body(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc


async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return _json(
        {
            "status": "ok",
            "version": __version__,
            "model": service.engine.model_id,
            "active": service.active,
            "waiting": service.waiting,
            "tokens_generated": service.tokens_generated,
        }
    )


async def list_models(request: web.Request) -> web.Response:
    card = model_card(request.app[SERVICE].engine.model_id, request.app[STARTED])
    return _json({"object": "list", "data": [card]})


async def get_model(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    service.check_model(request.match_info["model"])
    return _json(model_card(service.engine.model_id, request.app[STARTED]))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    req = parse_chat(await _body(request))
    service.check_model(req.model)
    prompt = service.engine.chat_prompt(req.messages)
    params = service.params_for(prompt, req.options)
    builder = _builder(service.engine, req.options, chat=True, prompts=[prompt], echo=[""])
    return await _run(request, [prompt], [params], req.options, builder)


async def completions(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    engine = service.engine
    req = parse_completion(await _body(request))
    service.check_model(req.model)
    prompts = [engine.encode(p) if isinstance(p, str) else list(p) for p in req.prompts]
    for ids in prompts:
        bad = [t for t in ids if not 0 <= t < engine.vocab_size()]
        if bad:
            raise BadRequest(f"token ids out of the vocabulary: {bad[:5]}", param="prompt")
    params = [service.params_for(ids, req.options) for ids in prompts]
    echo = [
        (p if isinstance(p, str) else engine.decode(p)) if req.echo else ""
        for p in req.prompts
        for _ in range(req.options.n)
    ]
    builder = _builder(engine, req.options, chat=False, prompts=prompts, echo=echo)
    return await _run(request, prompts, params, req.options, builder)


def _builder(
    engine: CausalLMEngine,
    options: SamplingOptions,
    *,
    chat: bool,
    prompts: Sequence[Sequence[int]],
    echo: Sequence[str],
) -> ResponseBuilder:
    return ResponseBuilder(
        chat=chat,
        model=engine.model_id,
        created=int(time.time()),
        token_text=engine.token_text,
        prompt_tokens=sum(len(p) for p in prompts),
        echo=echo if not chat else [""] * options.n,
        logprobs=options.logprobs is not None,
    )


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _run(
    request: web.Request,
    prompts: Sequence[Sequence[int]],
    params: Sequence[GenerationParams],
    options: SamplingOptions,
    builder: ResponseBuilder,
) -> web.StreamResponse:
    service = request.app[SERVICE]
    async with service.slot():
        gen = service.generate(prompts, params, options)
        async with contextlib.aclosing(gen) as events:
            # The first event comes after the prompt went through the swarm: errors until
            # then (missing blocks, ...) still get a proper status code.
            first = await anext(events)
            if not options.stream:
                return await _collect(request, first, events, builder)
            return await _stream(request, first, events, builder, options.include_usage)


async def _collect(
    request: web.Request,
    first: Delta | Finish,
    events: AsyncIterator[Delta | Finish],
    builder: ResponseBuilder,
) -> web.StreamResponse:
    builder.add(first)
    async for event in events:
        if _gone(request):  # the client left: stop generating (closing `events` cancels)
            return web.Response(status=499)
        builder.add(event)
    return _json(builder.body())


def _sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _stream(
    request: web.Request,
    first: Delta | Finish,
    events: AsyncIterator[Delta | Finish],
    builder: ResponseBuilder,
    include_usage: bool,
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        chunk = builder.chunk(first)
        if chunk is not None:
            await response.write(_sse(chunk))
        async for event in events:
            chunk = builder.chunk(event)
            if chunk is not None:
                await response.write(_sse(chunk))
        if include_usage:
            await response.write(_sse(builder.usage_chunk()))
    except ConnectionResetError:
        log.info("client closed the stream %s; generation cancelled", builder.id)
        return response
    except DriftError as exc:  # after the headers went out: report in-band
        await response.write(_sse(drift_error_body(exc)))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def build_api_app(engine: CausalLMEngine, config: ApiConfig) -> web.Application:
    """The app; its cleanup stops the executor (waiting for running generations)."""
    app = web.Application(
        middlewares=[openai_errors, _bearer_auth(config.api_keys)],
        client_max_size=config.max_body_bytes,
    )
    app[CONFIG] = config
    app[STARTED] = int(time.time())

    async def service_ctx(app: web.Application) -> AsyncIterator[None]:
        app[SERVICE] = GenerationService(engine, config.service)
        yield
        app[SERVICE].close()

    app.cleanup_ctx.append(service_ctx)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", get_model)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    return app
