"""`drift server MODEL`: serve a span of MODEL's blocks as a swarm member (Petals' options).

Parses the arguments once into a NodeConfig and a ServerConfig, loads the blocks
(drift.server.build), mounts the compute routes on the node app and runs it until
Ctrl+C / SIGTERM. `server_config_from_args` is shared with `drift up`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from drift.cli.dht import add_node_options, load_identity, log_join_info, node_config_from_args
from drift.wire.errors import BadRequest, DriftError

log = logging.getLogger("drift.server")


def add_server_options(p: argparse.ArgumentParser) -> None:
    """The block-serving options (names as in the Petals docs)."""
    p.add_argument("model", help="alias (smollm2), local checkpoint dir, .gguf file or Hub id")
    span = p.add_mutually_exclusive_group()
    span.add_argument(
        "--num_blocks",
        type=int,
        default=None,
        help="serve this many blocks where the swarm is weakest (default: all)",
    )
    span.add_argument(
        "--block_indices",
        default=None,
        help="serve exactly blocks START:END (half-open), e.g. 0:15",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:i] | xpu | mps")
    p.add_argument("--torch_dtype", default="float32", help="float32 | float16 | bfloat16")
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="listen port (overrides the port of --host_maddrs; 0 = any free port)",
    )
    p.add_argument(
        "--attn_cache_tokens",
        type=int,
        default=8192,
        help="KV-cache budget in tokens per served block (default: 8192)",
    )
    p.add_argument("--max_batch_size", type=int, default=8, help="sequences per request")
    p.add_argument(
        "--inference_max_length",
        type=int,
        default=2048,
        help="largest max_length (tokens) a session may open (default: 2048)",
    )
    p.add_argument(
        "--session_timeout",
        type=float,
        default=300.0,
        help="seconds an idle inference session keeps its cache (default: 300)",
    )
    p.add_argument(
        "--max_body_mb",
        type=float,
        default=64.0,
        help="largest request body or WebSocket message, MiB (default: 64)",
    )
    p.add_argument(
        "--throughput",
        type=float,
        default=None,
        help="announced block-tokens/s of one block (default: measured at start)",
    )
    p.add_argument("--cache_dir", default=None,
                   help="cache dir: converted models, throughput measurements")  # fmt: skip


def parse_block_indices(text: str | None) -> tuple[int | None, int | None]:
    if text is None:
        return None, None
    start, colon, end = text.partition(":")
    if not colon or not start.strip().isdigit() or not end.strip().isdigit():
        raise BadRequest(f"--block_indices {text!r} must look like START:END, e.g. 0:15")
    return int(start), int(end)


def server_config_from_args(args: argparse.Namespace):  # -> ServerConfig
    """A validated ServerConfig from the parsed options."""
    from drift.server.config import ServerConfig

    start, end = parse_block_indices(args.block_indices)
    for name in ("attn_cache_tokens", "max_batch_size", "inference_max_length"):
        if getattr(args, name) < 1:
            raise BadRequest(f"--{name} must be >= 1")
    if args.session_timeout <= 0 or args.max_body_mb <= 0:
        raise BadRequest("--session_timeout and --max_body_mb must be > 0")
    return ServerConfig(
        model=args.model, start_block=start, end_block=end, num_blocks=args.num_blocks,
        device=args.device, torch_dtype=args.torch_dtype,
        attn_cache_tokens=args.attn_cache_tokens, max_batch_size=args.max_batch_size,
        inference_max_length=args.inference_max_length, session_timeout_s=args.session_timeout,
        max_body_bytes=int(args.max_body_mb * (1 << 20)), throughput=args.throughput,
        cache_dir=Path(args.cache_dir).expanduser() if args.cache_dir else None,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from drift.cli.up import swarm_records
    from drift.node import MembershipNode, build_node_app, run_node
    from drift.server.build import attach_server, load_server

    try:
        node_config = node_config_from_args(args)
        if args.port is not None:
            node_config = dataclasses.replace(node_config, port=args.port)
        config = server_config_from_args(args)
        node_config = dataclasses.replace(node_config, client_max_size=config.max_body_bytes)
        records = []
        if node_config.initial_peers:
            records = swarm_records(node_config.initial_peers, node_config.swarm_key)
        server = load_server(config, records=records)
        node = MembershipNode(load_identity(args.identity_path), node_config)
    except DriftError as exc:
        log.error("%s", exc.message)
        return 2
    b = server.backend
    log.info("serving blocks [%d, %d) of %s as %s, throughput %.1f block-tokens/s",
             b.start_block, b.end_block, b.model_name, b.dtype_name, server.throughput)  # fmt: skip
    app = build_node_app(node)
    attach_server(app, server, node)
    run_node(app, node_config.host, node_config.port,
             on_started=lambda running: log_join_info(node, running))  # fmt: skip
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "server",
        help="serve a span of a model's blocks in a swarm",
        description="Load blocks of MODEL and serve /forward, /backward and /inference as a "
        "swarm member. Ctrl+C leaves gracefully.",
    )
    add_server_options(p)
    add_node_options(p)
    p.set_defaults(func=run)
