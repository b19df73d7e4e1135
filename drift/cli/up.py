"""`drift up [MODEL] [--join TOKEN]`: serve as many blocks as fit, in a new or existing swarm.

A stable identity (under the cache dir) and a stable port (31337) keep the printed join
command valid across restarts. The block count comes from free memory unless pinned; the
span is where the swarm is weakest, after a short random delay. Composes drift.node and
drift.server; the background loops (coverage reports, re-balancing) live in _up_loops.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path
from typing import Any

from drift.cli._net import check_port_free, join_command
from drift.cli._options import add_node_options, listen_address
from drift.cli._progress import progress_bar
from drift.cli.procs import exit_on_sigterm, process_record, resolve_cache_dir
from drift.cli.server import add_server_options
from drift.wire.errors import BadRequest, DriftError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="serve a model's blocks: start a new swarm, or --join one",
        description="Serve as many of MODEL's blocks as fit on this machine. Without --join "
        "it starts a new swarm and prints the command other machines run to join it.",
    )
    add_server_options(p, num_blocks_default="as many as fit in free memory")
    add_node_options(p, join_alias=True)
    p.add_argument(
        "--start_delay",
        type=float,
        default=3.0,
        help="max random delay before picking blocks, seconds (default: 3)",
    )
    p.add_argument(
        "--balance_quality",
        type=float,
        default=0.5,
        help="re-balance when min/max block throughput falls below this (default: 0.5; 0 = never)",
    )
    p.add_argument(
        "--mean_balance_check_period",
        type=float,
        default=60.0,
        help="mean seconds between balance checks (default: 60)",
    )
    p.set_defaults(func=run)


def say(text: str) -> None:
    print(text, flush=True)


def parse_block_indices(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    start, colon, end = text.partition(":")
    if not colon or not start.strip().isdigit() or not end.strip().isdigit():
        raise BadRequest(f"--block_indices {text!r} must look like START:END, e.g. 0:15")
    return int(start), int(end)


def swarm_records(tokens: tuple[Any, ...], swarm_key: str | None) -> list[Any]:
    """The live records of the swarm behind `tokens`, verified (for picking our span)."""
    from drift.cli.status import read_swarm
    from drift.swarm import PeerRecord

    snap = read_swarm(tokens, swarm_key=swarm_key)
    now = time.time()
    out = []
    for raw in snap.records:
        try:
            rec = PeerRecord.from_wire(raw)
        except DriftError:
            continue
        if rec.verify() and rec.state == "online" and rec.expires_at > now:
            out.append(rec)
    return out


def _swarm_key(args: argparse.Namespace, tokens: tuple[Any, ...]) -> str | None:
    return args.swarm_key or next((t.swarm_key for t in tokens if t.swarm_key), None)


def pick_num_blocks(args: argparse.Namespace, ckpt: Any, cache: Path) -> int | None:
    """--num_blocks, or the memory-based count (None when --block_indices pins the span)."""
    if args.block_indices is not None:
        return None
    if args.num_blocks is not None:
        return int(args.num_blocks)
    from drift.cli._capacity import choose_num_blocks
    from drift.models.devices import parse_dtype, pick_device
    from drift.models.quant import parse_quant

    device = pick_device(args.device)
    dtype = parse_dtype(args.torch_dtype, device)
    quant = parse_quant(args.quant_type, device)
    cap = choose_num_blocks(ckpt.config, device, dtype, quant=quant,
                            cache_tokens=args.attn_cache_tokens)  # fmt: skip
    say(f"memory: {cap.explain()}")
    return cap.num_blocks


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except DriftError as exc:
        print(f"drift up: {exc.message}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from drift.cli.dht import node_config_from_args
    from drift.identity import load_or_create_identity
    from drift.identity.tokens import parse_join_tokens

    cache = resolve_cache_dir(args.cache_dir)
    node_config_from_args(args)  # every network option checked before minutes of loading
    host, port = listen_address(args)
    check_port_free(host, port)  # before minutes of loading, not after
    identity_path = (
        Path(args.identity_path).expanduser() if args.identity_path else cache / "identity.key"
    )
    identity = load_or_create_identity(identity_path)
    tokens = parse_join_tokens(args.initial_peers)
    span = parse_block_indices(args.block_indices)
    say(f"peer id {identity.peer_id} (identity {identity_path})")
    with process_record("up", cache_dir=cache, peer_id=identity.peer_id, model=args.model) as rec:
        exit_on_sigterm()  # until the server runs, SIGTERM (drift down) ends it via `finally`
        return _load_and_serve(args, rec, identity, tokens, span, cache, host, port)


def _load_and_serve(args: argparse.Namespace, rec: Any, identity: Any, tokens: tuple[Any, ...],
                    span: tuple[int, int] | None, cache: Path, host: str, port: int) -> int:  # fmt: skip

    from drift.models.checkpoint import open_checkpoint
    from drift.models.devices import parse_dtype, pick_device

    say(f"opening {args.model} (converted once, then cached under {cache}) ...")
    dtype = parse_dtype(args.torch_dtype, pick_device(args.device))  # a GGUF converts to it
    ckpt = open_checkpoint(args.model, cache_dir=cache, dtype=dtype)
    num_blocks = pick_num_blocks(args, ckpt, cache)
    records: list[Any] = []
    if tokens:
        if span is None and args.start_delay > 0:
            delay = random.uniform(0, args.start_delay)
            say(f"waiting {delay:.1f}s so servers starting together pick different blocks ...")
            time.sleep(delay)
        say(f"reading the swarm from {tokens[0].to_drift(with_key=False)} ...")
        records = swarm_records(tokens, _swarm_key(args, tokens))
    return serve(args, rec, identity, tokens, ckpt, cache, span, num_blocks, records, host, port)


def serve(args: argparse.Namespace, rec: Any, identity: Any, tokens: tuple[Any, ...], ckpt: Any,
          cache: Path, span: tuple[int, int] | None, num_blocks: int | None,
          records: list[Any], host: str, port: int) -> int:  # fmt: skip
    from drift.cli._up_loops import start_loops
    from drift.cli.dht import node_config_from_args
    from drift.cli.server import server_config_from_args
    from drift.node.app import build_node_app
    from drift.node.membership import MembershipNode
    from drift.node.runner import RunningApp, run_node
    from drift.server.build import attach_server, load_server

    config = dataclasses.replace(server_config_from_args(args), num_blocks=num_blocks,
                                 cache_dir=cache)  # fmt: skip
    say("loading blocks (weights are read block by block) ...")
    t0 = time.perf_counter()
    server = load_server(config, records=records, progress=progress_bar("loading blocks"))
    b = server.backend
    say(f"loaded blocks [{b.start_block}, {b.end_block}) of {b.model_name} ({b.num_model_blocks} "
        f"blocks) as {b.dtype_name} (quantization: {b.quant}) in {time.perf_counter() - t0:.1f}s; "
        f"throughput {server.throughput:.1f} block-tokens/s")  # fmt: skip
    node_config = dataclasses.replace(node_config_from_args(args), host=host, port=port,
                                      client_max_size=config.max_body_bytes)  # fmt: skip
    node = MembershipNode(identity, node_config)
    app = build_node_app(node)
    attach_server(app, server, node)

    loops: list[Any] = []  # keeps the background tasks referenced

    async def on_started(running: RunningApp) -> None:
        token = node.join_token()
        rec.update(port=running.port, extra={**rec.record.extra, "join_token": str(token)})
        say(f"serving blocks [{b.start_block}, {b.end_block}) on port {running.port}")
        say("to add another machine to this swarm, run there:")
        say(f"  {join_command(args.model, str(token))}")
        say(f"dashboard: {node.addrs[0]}/")
        loops.extend(start_loops(app, node, server, ckpt, args))

    run_node(app, host, port, on_started=on_started)
    say("stopped")
    return 0
