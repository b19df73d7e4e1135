"""The OpenAI-compatible aiohttp app: /v1/models, /v1/chat/completions, /v1/completions,
/v1/embeddings, plus /health, /metrics and the chat page at / (web/chat).

Routes parse the body into typed requests, build the request's grammar (tools,
response_format; drift.api.constraints), hand the work to `GenerationService`, and
serialise the result as JSON or server-sent events (`data: {...}`, then `data: [DONE]`).
Middlewares (drift.api.middleware): CORS, metrics, OpenAI-shaped errors, Bearer keys.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from drift.api import prep
from drift.api.continuous import engine_gauges
from drift.api.engine import CausalLMEngine, GenerationParams
from drift.api.metrics import ApiMetrics
from drift.api.middleware import add_cors, bearer_auth, counted, json_response, openai_errors
from drift.api.protocol import (
    SamplingOptions,
    parse_chat,
    parse_completion,
    parse_embeddings,
)
from drift.api.render import ResponseBuilder, drift_error_body, embeddings_body, model_card
from drift.api.service import Delta, Finish, GenerationService, ServiceConfig
from drift.wire.errors import BadRequest, DriftError, NotFound
from drift.wire.version import __version__

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApiConfig:
    api_keys: tuple[str, ...] = ()  # accepted Bearer keys; empty = no authentication
    service: ServiceConfig = field(default_factory=ServiceConfig)
    max_body_bytes: int = 8 * 2**20  # largest request body
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call /v1 ("*" = any)
    web_dir: Path | None = None  # holds chat/ (the chat page served at /); None = no page


SERVICE = web.AppKey("drift_api_service", GenerationService)
CONFIG = web.AppKey("drift_api_config", ApiConfig)
STARTED = web.AppKey("drift_api_started", int)
METRICS = web.AppKey("drift_api_metrics", ApiMetrics)
PREP = web.AppKey("drift_api_prep", prep.Prep)

_json = json_response


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


def _card(request: web.Request, adapter: str | None = None) -> dict[str, Any]:
    engine = request.app[SERVICE].engine
    model_id = engine.model_id if adapter is None else f"{engine.model_id}:{adapter}"
    return model_card(model_id, request.app[STARTED], pooling=engine.pooling,
                      hidden_size=engine.hidden_size)  # fmt: skip


async def list_models(request: web.Request) -> web.Response:
    """The base model, and one `model:adapter` id per LoRA adapter the swarm serves."""
    adapters = await request.app[SERVICE].adapters()
    return _json({"object": "list", "data": [_card(request, a) for a in (None, *adapters)]})


async def get_model(request: web.Request) -> web.Response:
    adapter = await request.app[SERVICE].check_model(request.match_info["model"])
    return _json(_card(request, adapter))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    service, pool = request.app[SERVICE], request.app[PREP]
    engine = service.engine
    req = await pool.parse(await request.read(), parse_chat)
    adapter = await service.check_model(req.model)
    prompt, grammar = await pool.run(prep.chat, engine, req)
    tools = req.tools if req.tool_choice.mode != "none" else ()
    params = service.params_for(prompt, req.options, grammar, adapter)
    builder = _builder(engine, req.options, chat=True, prompts=[prompt], echo=[""])
    if tools:
        builder = _builder(engine, req.options, chat=True, prompts=[prompt], echo=[""],
                           tools=True, text_allowed=req.tool_choice.mode == "auto")  # fmt: skip
    return await _run(request, [prompt], [params], req.options, builder)


async def completions(request: web.Request) -> web.StreamResponse:
    service, pool = request.app[SERVICE], request.app[PREP]
    engine = service.engine
    req = await pool.parse(await request.read(), parse_completion)
    adapter = await service.check_model(req.model)
    prompts, grammar, echo = await pool.run(prep.completion, engine, req)
    params = [service.params_for(ids, req.options, grammar, adapter) for ids in prompts]
    builder = _builder(engine, req.options, chat=False, prompts=prompts, echo=echo)
    return await _run(request, prompts, params, req.options, builder)


async def embeddings(request: web.Request) -> web.Response:
    service, pool = request.app[SERVICE], request.app[PREP]
    engine = service.engine
    req = await pool.parse(await request.read(), parse_embeddings)
    if await service.check_model(req.model) is not None:
        raise BadRequest("embeddings come from the base model: name it without ':adapter'",
                         param="model")  # fmt: skip
    if req.dimensions is not None and req.dimensions != engine.hidden_size:
        raise BadRequest(f"this model's embeddings have {engine.hidden_size} dimensions; "
                         "'dimensions' cannot change that", param="dimensions")  # fmt: skip
    inputs = await pool.run(prep.embedding_inputs, engine, req.inputs)
    longest = max(len(x) for x in inputs)
    if longest > engine.context_length:
        raise BadRequest(f"an input has {longest} tokens; this model's maximum context length "
                         f"is {engine.context_length}", param="input")  # fmt: skip
    vectors = await service.embed(inputs)
    return _json(embeddings_body(engine.model_id, vectors, base64=req.base64,
                                 prompt_tokens=sum(len(x) for x in inputs)))  # fmt: skip


async def metrics(request: web.Request) -> web.Response:
    text = request.app[METRICS].render()
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})  # fmt: skip


async def chat_page(request: web.Request) -> web.StreamResponse:
    return _static_file(request, "index.html")


async def chat_static(request: web.Request) -> web.StreamResponse:
    return _static_file(request, request.match_info["path"])


def _static_file(request: web.Request, rel: str) -> web.StreamResponse:
    web_dir = request.app[CONFIG].web_dir
    if web_dir is not None:
        root = (web_dir / "chat").resolve()
        target = (root / rel).resolve()
        if target.is_relative_to(root) and target.is_file():
            return web.FileResponse(target)
    if rel == "index.html":
        model_id = request.app[SERVICE].engine.model_id
        return web.Response(
            text=f"DRIFT OpenAI-compatible API for {model_id}: /v1 (no chat page)\n"
        )
    raise NotFound(f"no static file {rel!r}")


def _builder(
    engine: CausalLMEngine,
    options: SamplingOptions,
    *,
    chat: bool,
    prompts: Sequence[Sequence[int]],
    echo: Sequence[str],
    tools: bool = False,
    text_allowed: bool = True,
) -> ResponseBuilder:
    return ResponseBuilder(
        chat=chat,
        model=engine.model_id,
        created=int(time.time()),
        token_text=engine.token_text,
        prompt_tokens=sum(len(p) for p in prompts),
        echo=echo if not chat else [""] * options.n,
        logprobs=options.logprobs is not None,
        tools=tools,
        text_allowed=text_allowed,
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
    app_metrics = ApiMetrics()
    app = web.Application(
        middlewares=[counted(app_metrics), openai_errors, bearer_auth(config.api_keys)],
        client_max_size=config.max_body_bytes,
    )
    add_cors(app, config.cors_origins)
    app[CONFIG] = config
    app[STARTED] = int(time.time())
    app[METRICS] = app_metrics

    async def service_ctx(app: web.Application) -> AsyncIterator[None]:
        service = GenerationService(engine, config.service, app_metrics)
        app[SERVICE] = service
        app[PREP] = prep.Prep()
        app_metrics.gauges.update({
            "drift_api_queue_depth": ("Requests waiting for a generation slot.",
                                      lambda: service.waiting),
            "drift_api_active_requests": ("Generations and embedding batches running.",
                                          lambda: service.active),
        })  # fmt: skip
        if service.loop is not None:
            app_metrics.gauges.update(engine_gauges(service.loop))
        yield
        app[PREP].close()
        service.close()

    app.cleanup_ctx.append(service_ctx)
    app.router.add_get("/", chat_page)
    app.router.add_get("/chat/{path:.+}", chat_static)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", get_model)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    return app
