"""`drift api`: serve a swarm's model behind OpenAI's HTTP API (chat with tools and
structured output, completions, embeddings, SSE) and a chat page at /.

Parses the flags once, loads the client side of the model (embeddings, head, tokenizer),
builds the engine and the aiohttp app from drift.api, and runs it until Ctrl+C.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from drift.cli._exits import UsageError
from drift.cli._net import check_port_free
from drift.cli._options import (
    DEFAULT_MODEL,
    add_cache_dir,
    add_initial_peers,
    add_model,
    add_swarm_key,
    add_torch_dtype,
)
from drift.cli._secrets import api_keys_from
from drift.identity.swarm_key import resolve_swarm_key
from drift.wire.errors import DriftError

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "api",
        help="serve the swarm's model behind an OpenAI-compatible HTTP API",
        description="Serve MODEL (run by the swarm behind --initial_peers) on /v1/models, "
        "/v1/chat/completions, /v1/completions and /v1/embeddings, streamed or not, with a "
        "chat page at / and Prometheus metrics at /metrics.",
    )
    add_model(p, default=None,
              default_help="the swarm's only model; with --local: " + DEFAULT_MODEL)  # fmt: skip
    add_initial_peers(p)
    p.add_argument("--local", action="store_true",
                   help="run the whole model in this process instead (no swarm; for trials)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--api_key", action="append", default=[],
                   help="accepted 'Authorization: Bearer' key; repeat for several (shows in the "
                        "process list: prefer --api_key_file or $DRIFT_API_KEY, comma-separated)")  # fmt: skip
    p.add_argument("--api_key_file", default=None,
                   help="file of accepted API keys, one per line")  # fmt: skip
    p.add_argument("--no_auth", action="store_true", help="accept requests without any API key")
    p.add_argument("--served_model_name", default=None,
                   help="the model id clients send (default: MODEL as given)")  # fmt: skip
    add_swarm_key(p)
    p.add_argument("--max_concurrent", type=int, default=8,
                   help="requests generating at once, each with its own swarm sessions "
                        "(default: 8)")  # fmt: skip
    p.add_argument("--max_batch", type=int, default=8,
                   help="requests generating together: over a swarm one engine loop advances "
                        "up to this many each step (a request joins at the next step and "
                        "leaves the step it ends; more wait for a row); with --local, requests "
                        "waiting together run as one batch of up to this many; 1 = off "
                        "(default: 8)")  # fmt: skip
    p.add_argument("--queue_size", type=int, default=32,
                   help="requests waiting for a slot before HTTP 429 (default: 32)")  # fmt: skip
    p.add_argument("--default_max_tokens", type=int, default=512,
                   help="completion length when a request names none (default: 512)")  # fmt: skip
    p.add_argument("--prefix_sessions", type=int, default=8,
                   help="sessions kept after a one-request generation so that a request "
                        "starting with its tokens (the next chat turn) continues it instead of "
                        "sending the whole conversation again (over a swarm); 0 = off (default: 8)")  # fmt: skip
    p.add_argument("--cors_origins", action="append", default=[], metavar="ORIGIN",
                   help="browser origin allowed to call /v1 from another site, e.g. "
                        "https://app.example; repeat for several, '*' for any (default: none; "
                        "the chat page at / needs none)")  # fmt: skip
    add_cache_dir(p)
    add_torch_dtype(p)
    p.set_defaults(func=run)


def _engine(args: argparse.Namespace, model_id: str | None) -> Any:
    from drift.api.engine import CausalLMEngine
    from drift.api.swarm import swarm_engine

    if args.local:
        import torch
        from transformers import AutoModelForCausalLM

        from drift.models.checkpoint import open_checkpoint
        from drift.models.devices import parse_dtype

        dtype = parse_dtype(args.torch_dtype, torch.device("cpu"))
        ckpt = open_checkpoint(args.model or DEFAULT_MODEL, cache_dir=args.cache_dir, dtype=dtype)
        model = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=dtype).eval()
        tokenizer = ckpt.tokenizer()
        return CausalLMEngine(model, tokenizer, model_id=model_id or args.model or DEFAULT_MODEL)
    from drift.cli.generate import load_client
    from drift.identity.tokens import parse_join_tokens

    tokens = parse_join_tokens(args.initial_peers)
    key = resolve_swarm_key(args.swarm_key, key_file=args.swarm_key_file, tokens=tokens)
    model, tokenizer = load_client(args.model, tokens, swarm_key=key,
                                   cache_dir=args.cache_dir, torch_dtype=args.torch_dtype)  # fmt: skip
    model_id = model_id or model.base_model_name  # no MODEL: the name the swarm announces
    from drift.api.prefix import SessionPool

    pool = SessionPool(model, max_sessions=args.prefix_sessions) if args.prefix_sessions else None
    return swarm_engine(model, tokenizer, model_id=model_id, pool=pool)


def _check(args: argparse.Namespace) -> str | None:
    try:
        api_keys = api_keys_from(args.api_key, args.api_key_file)
    except DriftError as exc:
        return exc.message
    if not args.local and not args.initial_peers:
        return "give --initial_peers (join tokens of the swarm), or --local"
    if not api_keys and not args.no_auth:
        return ("give at least one API key: --api_key_file, $DRIFT_API_KEY or --api_key "
                "(or --no_auth to serve without keys)")  # fmt: skip
    if min(args.max_concurrent, args.default_max_tokens, args.max_batch) < 1 or args.queue_size < 0:
        return (
            "--max_concurrent, --max_batch and --default_max_tokens must be >= 1, --queue_size >= 0"
        )
    if args.prefix_sessions < 0:
        return "--prefix_sessions must be >= 0"
    return None


def run(args: argparse.Namespace) -> int:
    from drift.api.app import ApiConfig, build_api_app
    from drift.api.grammar import INSTALL_HINT, GrammarCompiler
    from drift.api.service import ServiceConfig
    from drift.cli.procs import process_record
    from drift.node.app import find_web_dir
    from drift.node.runner import run_node
    from drift.paths import resolve_cache_dir

    problem = _check(args)
    if problem:
        raise UsageError(problem)
    check_port_free(args.host, args.port)  # before loading the model, not after
    api_keys = api_keys_from(args.api_key, args.api_key_file)
    model_id = args.served_model_name or args.model
    config = ApiConfig(
        api_keys=api_keys,
        service=ServiceConfig(max_concurrent=args.max_concurrent, queue_size=args.queue_size,
                              default_max_tokens=args.default_max_tokens,
                              max_batch=args.max_batch),
        cors_origins=tuple(o for flag in args.cors_origins for o in flag.split(",") if o),
        web_dir=find_web_dir(),
    )  # fmt: skip
    if not GrammarCompiler.available():
        print(f"drift api: llguidance is not installed: requests with tools or response_format "
              f"will get a 400 ({INSTALL_HINT})", file=sys.stderr)  # fmt: skip
    what = args.model or "the swarm's model"
    print(f"loading {what} ...", file=sys.stderr, flush=True)
    engine = _engine(args, model_id)
    model_id = engine.model_id

    cache_dir = resolve_cache_dir(args.cache_dir)
    with process_record("api", cache_dir=cache_dir, model=model_id) as record:

        def started(running: Any) -> None:
            record.update(port=running.port)
            print(f"OpenAI-compatible API for {model_id!r} on "
                  f"http://{running.host}:{running.port}/v1", file=sys.stderr, flush=True)  # fmt: skip

        run_node(build_api_app(engine, config), args.host, args.port, on_started=started)
    return 0
