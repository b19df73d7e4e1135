"""`drift server MODEL`: serve a span of MODEL's blocks as a swarm member (Petals' options).

Parses the arguments once into a NodeConfig and a ServerConfig, loads the blocks
(drift.server.build), mounts the compute routes and the client parts (drift.server.parts)
on the node app and runs it until
Ctrl+C / SIGTERM, with a process record for `drift down`. `drift up` reuses the options
and the config builder.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path

from drift.cli._exits import usage_errors
from drift.cli._net import check_port_free
from drift.cli._options import (
    add_device,
    add_model,
    add_node_options,
    add_torch_dtype,
)
from drift.cli._progress import progress_bar
from drift.cli.dht import log_join_info, node_config_from_args, node_identity
from drift.cli.procs import RecordHandle, exit_on_sigterm, process_record
from drift.identity import Identity
from drift.node import MembershipNode, NodeConfig, RunningApp, build_node_app, run_node
from drift.paths import resolve_cache_dir
from drift.server.config import ServerConfig, parse_adapters, parse_decode_threads
from drift.swarm import PeerRecord, parse_span
from drift.swarm.reader import read_swarm_blocking
from drift.wire.errors import BadRequest

log = logging.getLogger("drift.server")
BATCH_WAIT_MS = ServerConfig.batch_wait_ms


def add_server_options(p: argparse.ArgumentParser, *, num_blocks_default: str = "all") -> None:
    """The block-serving options of drift server and drift up (names as in the Petals docs)."""
    add_model(p)
    span = p.add_mutually_exclusive_group()
    span.add_argument(
        "--num_blocks",
        type=int,
        default=None,
        help=f"serve this many blocks where the swarm is weakest (default: {num_blocks_default})",
    )
    span.add_argument(
        "--block_indices",
        default=None,
        help="serve exactly blocks START:END (half-open), e.g. 0:15",
    )
    add_device(p)
    add_torch_dtype(p)
    p.add_argument(
        "--attn_cache_tokens",
        type=int,
        default=8192,
        help="KV-cache budget in tokens per served block (default: 8192)",
    )
    p.add_argument(
        "--client_cache_share",
        type=float,
        default=0.5,
        help="fraction (0, 1] of the KV-cache budget one client (by address) may hold in all "
        "its sessions beyond its first; more is refused as cache_full naming this limit; "
        "clients that prove the swarm key (a private swarm's own) are not limited "
        "(default: 0.5; 1 = no limit)",
    )
    p.add_argument(
        "--watchdog_s",
        type=float,
        default=30.0,
        help="seconds one unit of work (a prompt chunk, a batch of steps) may run on the "
        "compute thread before this server announces itself degraded (routing avoids it "
        "while others serve its blocks) until that unit ends (default: 30)",
    )
    p.add_argument("--max_batch_size", type=int, default=8,
                   help="sequences per request or session (default: 8)")  # fmt: skip
    p.add_argument(
        "--inference_max_length",
        type=int,
        default=2048,
        help="largest max_length (tokens) a session may open (default: 2048)",
    )
    p.add_argument(
        "--drain_timeout", type=float, default=ServerConfig.drain_timeout_s,
        help="seconds a graceful stop (Ctrl+C, SIGTERM, drift down) spends handing live "
             "sessions to other servers before it stops; a second Ctrl+C stops at once; "
             "0: no handoff (default: %(default)s)",
    )  # fmt: skip
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
        "--batch_wait_ms",
        type=float,
        default=BATCH_WAIT_MS,
        help="ms a batch of concurrent sessions' steps waits after the latest step came for "
        "those of other sessions still stepping (idle ones are not waited for; at most 5x in all), so they run "
        f"as one forward; 0 = run what is queued (default: {BATCH_WAIT_MS:g})",
    )
    p.add_argument(
        "--throughput",
        type=float,
        default=None,
        help="announced block-tokens/s of one block (default: measured once, cached)",
    )
    add_quant_type(p)
    p.add_argument(
        "--compile",
        default="auto",
        choices=["auto", "on", "off"],
        help="how decode steps run: off = eager transformers; auto = the lean step (KV room "
        "preallocated, layers called directly), torch.compile'd on accelerators; on = compiled "
        "everywhere (at start-up; a CPU needs a C++ compiler) (default: auto)",
    )
    p.add_argument(
        "--decode_threads",
        default="auto",
        help="torch threads of decode steps (one token per session): auto = the faster of "
        "torch's own count and 1, timed after pauses at start-up on a CPU (a pipeline's "
        "steps follow pauses, and some schedulers then run a team's threads on one core), "
        "once for one-row steps and once for batches of 4 rows or more; torch's own where "
        "OMP_NUM_THREADS is set; or a number (default: auto)",
    )
    p.add_argument(
        "--row_kernel",
        default="auto",
        choices=["auto", "off"],
        help="float32 products of a few rows (decode steps, short prompts) on the CPU: auto = "
        "DRIFT's C kernel, built at start-up with the machine's C compiler (cc or $CC; ~1.5-2x "
        "faster decode steps), torch's BLAS where none builds; off = torch's BLAS (default: auto)",
    )
    p.add_argument(
        "--adapters",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="serve these peft LoRA adapters beside the blocks: NAME=PATH or PATH (named by its "
        "last path component); PATH is a directory with adapter_config.json and "
        "adapter_model.safetensors, or a Hub repository id. Clients pick one with "
        "active_adapter=NAME (default: none)",
    )


def add_quant_type(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quant_type",
        default="auto",
        choices=["auto", "none", "int8", "nf4"],
        help="store the blocks' linear weights quantized with bitsandbytes (pip install "
        "'drift-swarm[quant]'): int8 ~1/4, nf4 ~1/7 of float32's weight memory; norms and "
        "activations stay in --torch_dtype (default: auto = nf4 on CUDA when bitsandbytes is "
        "installed, else none; on the CPU it works but is slower)",
    )


def server_config_from_args(args: argparse.Namespace, *, num_blocks: int | None = None,
                            cache_dir: Path | None = None) -> ServerConfig:  # fmt: skip
    """A validated ServerConfig from the parsed options (`num_blocks` overrides the flag)."""
    start, end = (None, None) if args.block_indices is None else parse_span(args.block_indices)
    for name in ("attn_cache_tokens", "max_batch_size", "inference_max_length"):
        if getattr(args, name) < 1:
            raise BadRequest(f"--{name} must be >= 1")
    if not 0 < args.client_cache_share <= 1:
        raise BadRequest("--client_cache_share must be in (0, 1]")
    if args.watchdog_s <= 0:
        raise BadRequest("--watchdog_s must be > 0")
    if not 0 <= args.drain_timeout <= 3600:
        raise BadRequest("--drain_timeout must be in [0, 3600] seconds")
    if args.session_timeout <= 0 or args.max_body_mb <= 0:
        raise BadRequest("--session_timeout and --max_body_mb must be > 0")
    try:
        adapters = parse_adapters(args.adapters)
    except ValueError as exc:
        raise BadRequest(f"--adapters: {exc}") from exc
    if not 0 <= args.batch_wait_ms <= 1000:
        raise BadRequest("--batch_wait_ms must be in [0, 1000]")
    try:
        decode_threads = parse_decode_threads(args.decode_threads, os.environ)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    return ServerConfig(
        model=args.model, start_block=start, end_block=end,
        num_blocks=args.num_blocks if num_blocks is None else num_blocks,
        device=args.device, torch_dtype=args.torch_dtype,
        attn_cache_tokens=args.attn_cache_tokens, client_cache_share=args.client_cache_share,
        watchdog_s=args.watchdog_s,
        max_batch_size=args.max_batch_size,
        inference_max_length=args.inference_max_length, session_timeout_s=args.session_timeout,
        drain_timeout_s=args.drain_timeout,
        max_body_bytes=int(args.max_body_mb * (1 << 20)), throughput=args.throughput,
        cache_dir=cache_dir or resolve_cache_dir(args.cache_dir), quant_type=args.quant_type,
        adapters=adapters,
        batch_wait_ms=args.batch_wait_ms, compile=args.compile, decode_threads=decode_threads,
        row_kernel=args.row_kernel == "auto",
    )  # fmt: skip


def live_swarm_records(config: NodeConfig) -> list[PeerRecord]:
    """The verified live records of the swarm `config` joins (none without initial peers)."""
    if not config.initial_peers:
        return []
    snap = read_swarm_blocking(config.initial_peers, swarm_key=config.swarm_key)
    return [r for r in snap.live() if r.state == "online"]


def run(args: argparse.Namespace) -> int:
    with usage_errors():
        node_config = node_config_from_args(args)
        config = server_config_from_args(args)
    check_port_free(node_config.host, node_config.port)  # before minutes of loading
    identity = node_identity(args).identity  # locked until this process exits
    node_config = dataclasses.replace(node_config, client_max_size=config.max_body_bytes)
    with process_record("server", cache_dir=config.cache_dir, peer_id=identity.peer_id,
                        model=config.model) as rec:  # fmt: skip
        exit_on_sigterm()  # while loading, SIGTERM (drift down) ends it through `finally`
        return _load_and_serve(rec, identity, node_config, config)


def _load_and_serve(rec: RecordHandle, identity: Identity, node_config: NodeConfig,
                    config: ServerConfig) -> int:  # fmt: skip
    from drift.models.checkpoint import open_checkpoint
    from drift.models.devices import parse_dtype, pick_device
    from drift.server.build import attach_server, load_server
    from drift.server.parts import PartsService, add_parts_routes

    records = live_swarm_records(node_config)
    dtype = parse_dtype(config.torch_dtype, pick_device(config.device))  # a GGUF converts to it
    ckpt = open_checkpoint(config.model, cache_dir=config.cache_dir, revision=config.revision,
                           dtype=dtype)  # fmt: skip
    server = load_server(config, records=records, progress=progress_bar("loading blocks"),
                         ckpt=ckpt)  # fmt: skip
    node = MembershipNode(identity, node_config)
    b = server.backend
    log.info("serving blocks [%d, %d) of %s as %s (quantization: %s), throughput %.1f "
             "block-tokens/s", b.start_block, b.end_block, b.model_name, b.dtype_name, b.quant,
             server.throughput)  # fmt: skip
    app = build_node_app(node)
    attach_server(app, server, node)
    assert config.cache_dir is not None
    add_parts_routes(app, PartsService(ckpt, config.cache_dir))  # clients need no model copy

    def started(running: RunningApp) -> None:
        token = node.join_token().to_drift(with_key=False)
        rec.update(port=running.port, extra={**rec.record.extra, "join_token": token,
                                             "blocks": [b.start_block, b.end_block]})  # fmt: skip
        log_join_info(node, running)

    run_node(app, node_config.host, node_config.port, on_started=started)
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
