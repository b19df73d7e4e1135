"""`drift up [MODEL] [--join TOKEN]`: serve as many blocks as fit, in a new or existing swarm.

A stable identity (under the cache dir) and a stable port (31337) keep the printed join
command valid across restarts. The block count comes from free memory unless pinned; the
span is where the swarm is weakest, after a short random delay. The arguments become one
frozen `UpConfig`; composes drift.node and drift.server; the background loops (coverage
reports, re-balancing) live in _up_loops.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drift.cli._budget import parse_size
from drift.cli._exits import usage_errors
from drift.cli._gpus import Child, count_devices, parse_gpus, plan, supervise
from drift.cli._identity import open_node_identity
from drift.cli._net import DEFAULT_PORT, check_port_free, join_command, pick_free_port
from drift.cli._options import add_node_options
from drift.cli._progress import progress_bar
from drift.cli._secrets import new_swarm_key, read_key_file, write_key_file
from drift.cli._service import DEFAULT_NAME as DEFAULT_SERVICE_NAME
from drift.cli._service import build_spec, current_service, render
from drift.cli._up_loops import BalanceConfig, start_loops
from drift.cli.dht import node_config_from_args
from drift.cli.procs import RecordHandle, exit_on_sigterm, process_record
from drift.cli.server import add_server_options, live_swarm_records, server_config_from_args
from drift.identity import Identity
from drift.node import NodeConfig
from drift.paths import resolve_cache_dir
from drift.server.config import ServerConfig
from drift.swarm import PeerRecord
from drift.wire.errors import BadRequest


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
        "--private",
        action="store_true",
        help="start a new private swarm: create a random swarm key in <cache_dir>/swarm.key "
        "(mode 0600; reused on restart) unless a key is given; joiners pass a copy of it with "
        "--swarm_key_file",
    )
    p.add_argument(
        "--max_memory",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="the most memory this server may use in all, e.g. 3GiB or 1536MiB, for a share of "
        "the machine (default: $DRIFT_MAX_MEMORY, else no cap beyond what the machine has: its "
        "memory cgroup (container or systemd limit), its free RAM, or the GPU's free memory)",
    )
    p.add_argument(
        "--gpus",
        type=parse_gpus,
        default=None,
        metavar="all|N",
        help="on a machine with several GPUs, how many serve, each as its own server (its own "
        "port, PORT + i, and identity; the others join the first): all (default) or a count",
    )
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
    p.add_argument(
        "--print-service",
        "--print_service",
        dest="print_service",
        choices=["systemd", "launchd"],
        default=None,
        help="print a systemd user unit or a launchd agent that runs this same command as a "
        "service (stable identity, restarted when it stops), and exit; see the comment at "
        "its top for where to put it, its logs and how to stop it",
    )
    p.add_argument(
        "--service_name",
        default=DEFAULT_SERVICE_NAME,
        help=f"the unit / agent name for --print-service (default: {DEFAULT_SERVICE_NAME}; "
        "one per node on a machine)",
    )
    p.set_defaults(func=run)


@dataclass(frozen=True)
class UpConfig:
    """Everything `drift up` was asked for, checked once before minutes of loading."""

    model: str  # MODEL as given (the join command repeats it)
    node: NodeConfig
    server: ServerConfig  # num_blocks None: sized from free memory
    identity_path: Path | None  # --identity_path; None: <cache>/identity.key (or a free one)
    swarm_key_file: Path | None  # where a --private swarm's key lives (to tell joiners)
    start_delay_s: float  # max random wait before reading the swarm, seconds
    balance: BalanceConfig | None  # None: never move (pinned span or --balance_quality 0)
    auto_port: bool = False  # the default port, not asked for: a busy one moves to a free one
    max_memory: int | None = None  # --max_memory: this process's share of the machine, bytes
    gpus: int | None = None  # --gpus: servers on a machine with several GPUs (None: all)


def up_config_from_args(args: argparse.Namespace) -> UpConfig:
    cache = resolve_cache_dir(args.cache_dir)
    server = server_config_from_args(args, cache_dir=cache)
    node = dataclasses.replace(node_config_from_args(args), client_max_size=server.max_body_bytes)
    balance = None
    if args.balance_quality > 0 and server.start_block is None:
        balance = BalanceConfig(args.balance_quality, args.mean_balance_check_period,
                                getattr(args, "max_memory", None))  # fmt: skip
    identity_path = Path(args.identity_path).expanduser() if args.identity_path else None
    key_file = None
    if args.private:
        if node.initial_peers:
            raise BadRequest("--private starts a new swarm; to join one, pass its key with "
                             "--swarm_key_file or $DRIFT_SWARM_KEY instead")  # fmt: skip
        if node.swarm_key is None:
            key_file = cache / "swarm.key"
            node = dataclasses.replace(node, swarm_key=private_swarm_key(key_file))
    argv = getattr(args, "argv", None) or sys.argv[1:]
    asked = any(a.split("=", 1)[0] in ("--port", "--host_maddrs") for a in argv)
    auto_port = node.port == DEFAULT_PORT and not args.host_maddrs and not asked
    return UpConfig(args.model, node, server, identity_path, key_file, args.start_delay, balance,
                    auto_port, getattr(args, "max_memory", None), getattr(args, "gpus", None))  # fmt: skip


def private_swarm_key(path: Path) -> str:
    """The key in `path`, created (random, mode 0600) if the file does not exist yet."""
    if not path.exists():
        write_key_file(path, new_swarm_key())
        say(f"created a swarm key for this private swarm in {path} (mode 0600)")
    return read_key_file(path)


def say(text: str) -> None:
    print(text, flush=True)


def run(args: argparse.Namespace) -> int:
    with usage_errors():
        cfg = up_config_from_args(args)
        if args.print_service:
            print(service_text(cfg, args), end="")
            return 0
        kind, n = count_devices(cfg.server.device, cfg.gpus)
        children = per_gpu(cfg, getattr(args, "argv", None) or sys.argv[1:], kind, n) \
            if n > 1 else None  # fmt: skip
    if children is not None:
        return supervise(children, join=not cfg.node.initial_peers)
    return _run(cfg)


def per_gpu(cfg: UpConfig, argv: list[str], kind: str, n: int) -> list[Child]:
    """One `drift up` per GPU (drift.cli._gpus): ports from this one's on (each checked
    free, or the next free one when the port was not asked for), said before they start."""
    ports: list[int] = []
    for _ in range(n):
        want = max(cfg.node.port, ports[-1] + 1) if ports else cfg.node.port
        if cfg.auto_port:
            while want in ports:
                want += 1
            want, _note = pick_free_port(cfg.node.host, want)
        else:
            check_port_free(cfg.node.host, want)
        ports.append(want)
    say(f"{n} {kind.upper()} devices: one server each, on ports {', '.join(map(str, ports))} "
        "(--gpus 1 serves from the first only)")  # fmt: skip
    return plan(argv, n, kind=kind, ports=ports, identity_path=cfg.identity_path,
                cache_dir=cfg.server.cache_dir or resolve_cache_dir(None),
                private_key=cfg.swarm_key_file)  # fmt: skip


def service_text(cfg: UpConfig, args: argparse.Namespace) -> str:
    """The unit / agent for --print-service (drift.cli._service)."""
    cache = cfg.server.cache_dir or resolve_cache_dir(None)
    identity = cfg.identity_path or cache / "identity.key"
    argv = getattr(args, "argv", None) or sys.argv[1:]
    spec = build_spec(args.print_service, args.service_name, argv, identity_path=identity,
                      cache_dir=cache)  # fmt: skip
    return render(spec)


def _run(cfg: UpConfig) -> int:
    # before minutes of loading, not after; a second node on this machine takes the next port
    if cfg.auto_port:
        port, note = pick_free_port(cfg.node.host, cfg.node.port)
        if note:
            say(note)
            cfg = dataclasses.replace(cfg, node=dataclasses.replace(cfg.node, port=port))
    else:
        check_port_free(cfg.node.host, cfg.node.port)
    chosen = open_node_identity(cfg.identity_path, cache_dir=cfg.server.cache_dir or Path("."),
                                fallback=True)  # locked until this process exits  # fmt: skip
    if chosen.note:
        say(chosen.note)
    identity = chosen.identity
    say(f"peer id {identity.peer_id} (identity {chosen.path})")
    with process_record("up", cache_dir=cfg.server.cache_dir, peer_id=identity.peer_id,
                        model=cfg.model, service=current_service()) as rec:  # fmt: skip
        exit_on_sigterm()  # until the server runs, SIGTERM (drift down) ends it via `finally`
        return _load_and_serve(cfg, rec, identity)


def pick_num_blocks(cfg: UpConfig, ckpt: Any) -> int | None:
    """--num_blocks, or the memory-based count (None when --block_indices pins the span)."""
    if cfg.server.start_block is not None:
        return None
    if cfg.server.num_blocks is not None:
        return cfg.server.num_blocks
    from drift.cli._capacity import choose_num_blocks
    from drift.models.devices import parse_dtype, pick_device
    from drift.models.quant import parse_quant

    device = pick_device(cfg.server.device)
    dtype = parse_dtype(cfg.server.torch_dtype, device)
    quant = parse_quant(cfg.server.quant_type, device)
    cap = choose_num_blocks(ckpt.config.get_text_config(), device, dtype, quant=quant,
                            cache_tokens=cfg.server.attn_cache_tokens,
                            max_memory=cfg.max_memory)  # fmt: skip
    say(f"memory: {cap.explain()}")
    return cap.num_blocks


def swarm_format(records: list[PeerRecord]) -> tuple[str, str] | None:
    """(dtype, quant) most of the swarm's servers run, or None when no server says."""
    counts: dict[tuple[str, str], int] = {}
    for r in records:
        if r.role == "server" and r.dtype:
            key = (r.dtype, r.quant or "none")
            counts[key] = counts.get(key, 0) + 1
    return max(counts, key=lambda k: counts[k]) if counts else None


def follow_swarm_format(cfg: UpConfig, records: list[PeerRecord]) -> UpConfig:
    """--torch_dtype / --quant_type left at auto take the swarm's, so a joiner run as printed
    holds what the others hold (not float32 on a CPU beside bfloat16 servers)."""
    found = swarm_format(records)
    s = cfg.server
    if found is None or (s.torch_dtype != "auto" and s.quant_type != "auto"):
        return cfg
    dtype = found[0] if s.torch_dtype == "auto" else s.torch_dtype
    quant = found[1] if s.quant_type == "auto" else s.quant_type
    say(f"serving as the swarm does: --torch_dtype {dtype} --quant_type {quant}")
    return dataclasses.replace(cfg, server=dataclasses.replace(s, torch_dtype=dtype,
                                                               quant_type=quant))  # fmt: skip


def _load_and_serve(cfg: UpConfig, rec: RecordHandle, identity: Identity) -> int:
    from drift.models.checkpoint import open_checkpoint
    from drift.models.devices import parse_dtype, pick_device

    records: list[PeerRecord] = []
    tokens = cfg.node.initial_peers
    if tokens:  # read first: the swarm's dtype decides how the checkpoint is opened
        if cfg.server.start_block is None and cfg.start_delay_s > 0:
            delay = random.uniform(0, cfg.start_delay_s)
            say(f"waiting {delay:.1f}s so servers starting together pick different blocks ...")
            time.sleep(delay)  # synchronous start-up: no event loop runs yet
        say(f"reading the swarm from {tokens[0].to_drift(with_key=False)} ...")
        records = live_swarm_records(cfg.node)
        cfg = follow_swarm_format(cfg, records)
    say(f"opening {cfg.model} (converted once, then cached under {cfg.server.cache_dir}) ...")
    dtype = parse_dtype(cfg.server.torch_dtype, pick_device(cfg.server.device))  # a GGUF
    ckpt = open_checkpoint(cfg.model, cache_dir=cfg.server.cache_dir, dtype=dtype)  # converts to it
    cfg = dataclasses.replace(
        cfg, server=dataclasses.replace(cfg.server, num_blocks=pick_num_blocks(cfg, ckpt))
    )
    if tokens:  # re-read: servers that announced while this one opened the checkpoint
        records = live_swarm_records(cfg.node)
    return serve(cfg, rec, identity, ckpt, records)


def serve(cfg: UpConfig, rec: RecordHandle, identity: Identity, ckpt: Any,
          records: list[PeerRecord]) -> int:  # fmt: skip
    from drift.node.app import build_node_app
    from drift.node.membership import MembershipNode
    from drift.node.runner import RunningApp, run_node
    from drift.server.build import attach_server, load_server
    from drift.server.parts import PartsService, add_parts_routes

    say("loading blocks (weights are read block by block) ...")
    t0 = time.perf_counter()
    server = load_server(cfg.server, records=records, progress=progress_bar("loading blocks"),
                         ckpt=ckpt)  # fmt: skip
    b = server.backend
    say(f"loaded blocks [{b.start_block}, {b.end_block}) of {b.model_name} ({b.num_model_blocks} "
        f"blocks) as {b.dtype_name} (quantization: {b.quant}) in {time.perf_counter() - t0:.1f}s; "
        f"throughput {server.throughput:.1f} block-tokens/s")  # fmt: skip
    node = MembershipNode(identity, cfg.node)
    app = build_node_app(node)
    attach_server(app, server, node)
    add_parts_routes(app, PartsService(ckpt, cfg.server.cache_dir or Path(".")))

    loops: list[Any] = []  # keeps the background tasks referenced

    async def on_started(running: RunningApp) -> None:
        token = node.join_token().to_drift(with_key=False)  # the key is never printed
        rec.update(port=running.port, extra={**rec.record.extra, "join_token": token})
        say(f"serving blocks [{b.start_block}, {b.end_block}) on port {running.port}")
        say("to add another machine to this swarm, run there:")
        if cfg.node.swarm_key:
            where = cfg.swarm_key_file or "a file holding this swarm's key"
            say(f"  {join_command(cfg.model, token)} --swarm_key_file swarm.key")
            say(f"  (private swarm: copy {where} there as swarm.key, or set $DRIFT_SWARM_KEY)")
        else:
            say(f"  {join_command(cfg.model, token)}")
        say(f"dashboard: {node.addrs[0]}/")
        loops.extend(start_loops(node, server, ckpt, cfg.balance))

    run_node(app, cfg.node.host, cfg.node.port, on_started=on_started)
    say("stopped")
    return 0
