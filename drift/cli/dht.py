"""`drift dht`: run a membership-only node (serves no blocks) until Ctrl+C / SIGTERM.

It parses its arguments into a NodeConfig, loads or creates the identity, and logs the
node's reachable address and join token. `node_config_from_args` and `log_join_info` are
reused by `drift server` / `drift up`, which add the same options with `add_node_options`.
"""

from __future__ import annotations

import argparse
import logging

from drift.identity import Identity, format_hostport, load_or_create_identity, parse_join_tokens
from drift.identity.tokens import parse_listen_maddr, parse_multiaddr
from drift.node import MembershipNode, NodeConfig, RunningApp, build_node_app, run_node
from drift.wire.errors import DriftError

log = logging.getLogger("drift.dht")


def add_node_options(p: argparse.ArgumentParser) -> None:
    """The options every swarm member takes (identity, addresses, seeds, key, gossip)."""
    p.add_argument(
        "--identity_path",
        default=None,
        help="Ed25519 key file, created (mode 0600) on first start and reused so the "
        "peer id stays the same (default: a new identity every start)",
    )
    p.add_argument(
        "--host_maddrs",
        default="/ip4/0.0.0.0/tcp/31337",
        help="listen multiaddr, e.g. /ip4/0.0.0.0/tcp/31337 (port 0 = any free port)",
    )
    p.add_argument(
        "--announce_maddrs",
        nargs="*",
        default=[],
        help="multiaddrs others reach this node at, e.g. /ip4/203.0.113.5/tcp/31337",
    )
    p.add_argument(
        "--public_ip",
        default=None,
        help="announce this IP with the listening port (behind NAT with a forwarded port)",
    )
    p.add_argument(
        "--initial_peers",
        nargs="*",
        default=[],
        help="join tokens (drift://<peer_id>@<host>:<port>) or multiaddrs of members, "
        "space- or comma-separated",
    )
    p.add_argument(
        "--swarm_key",
        default=None,
        help="secret of a private swarm (default: the ?key= of a join token, else open)",
    )
    p.add_argument(
        "--gossip_interval",
        type=float,
        default=5.0,
        help="mean seconds between gossip rounds (default: 5)",
    )
    p.add_argument(
        "--record_ttl",
        type=float,
        default=30.0,
        help="seconds after which a silent peer is dropped (default: 30)",
    )
    p.add_argument("--fanout", type=int, default=3, help="peers contacted per gossip round")


def node_config_from_args(args: argparse.Namespace) -> NodeConfig:
    """Validated NodeConfig from the parsed options (BadRequest naming the bad value)."""
    host, port = parse_listen_maddr(args.host_maddrs)
    public_addrs = []
    for maddr in args.announce_maddrs:
        a_host, a_port, _ = parse_multiaddr(maddr, need_peer_id=False)
        public_addrs.append(f"http://{format_hostport(a_host, a_port)}")
    tokens = parse_join_tokens(args.initial_peers)
    swarm_key = args.swarm_key or next((t.swarm_key for t in tokens if t.swarm_key), None)
    if args.gossip_interval <= 0 or args.record_ttl <= args.gossip_interval or args.fanout < 1:
        raise SystemExit(
            "need --gossip_interval > 0, --record_ttl > --gossip_interval, --fanout >= 1"
        )
    return NodeConfig(
        host=host,
        port=port,
        public_addrs=tuple(public_addrs),
        public_ip=args.public_ip,
        initial_peers=tokens,
        swarm_key=swarm_key,
        gossip_interval_s=args.gossip_interval,
        record_ttl_s=args.record_ttl,
        fanout=args.fanout,
    )


def load_identity(path: str | None) -> Identity:
    if path is None:
        log.warning("no --identity_path: using a new identity (the peer id changes every start)")
        return Identity.generate()
    return load_or_create_identity(path)


def log_join_info(node: MembershipNode, running: RunningApp) -> None:
    """Log where the node listens and the token others join with."""
    token = node.join_token()
    log.info(
        "peer id %s listening on %s:%d, reachable at %s",
        node.peer_id,
        running.host,
        running.port,
        ", ".join(node.addrs),
    )
    log.info("join token: %s", token.to_drift(with_key=False))
    log.info("multiaddr: %s", token.to_multiaddr())
    if node.config.swarm_key:
        log.info(
            "private swarm: joiners need the swarm key (--swarm_key or ?key=<key> in the token)"
        )


def run(args: argparse.Namespace) -> int:
    try:
        config = node_config_from_args(args)
        node = MembershipNode(load_identity(args.identity_path), config)
    except DriftError as exc:
        log.error("%s", exc.message)
        return 2
    app = build_node_app(node)
    run_node(app, config.host, config.port, on_started=lambda running: log_join_info(node, running))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dht",
        help="run a membership-only node (serves no blocks)",
        description="Run a swarm member that serves no blocks: it gossips, answers /swarm and "
        "serves the dashboard. Prints its join token. Ctrl+C leaves gracefully.",
    )
    add_node_options(p)
    p.set_defaults(func=run)
