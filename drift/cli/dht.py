"""`drift dht`: run a membership-only node (serves no blocks) until Ctrl+C / SIGTERM.

It parses its arguments into a NodeConfig, loads or creates the identity, logs the node's
reachable address and join token, and keeps a process record for `drift down`.
`node_config_from_args` and `log_join_info` are reused by `drift server` / `drift up`, which
take the same options (drift.cli._options.add_node_options; re-exported here).
"""

from __future__ import annotations

import argparse
import logging

from drift.cli._exits import usage_errors
from drift.cli._identity import NodeIdentity, open_node_identity
from drift.cli._net import check_port_free
from drift.cli._options import add_node_options, listen_address, tls_enabled
from drift.cli.procs import exit_on_sigterm, process_record
from drift.identity import format_hostport, parse_join_tokens
from drift.identity.swarm_key import resolve_swarm_key
from drift.identity.tokens import parse_multiaddr
from drift.node import MembershipNode, NodeConfig, RunningApp, build_node_app, run_node
from drift.paths import resolve_cache_dir
from drift.wire.errors import BadRequest

log = logging.getLogger("drift.dht")


def node_config_from_args(args: argparse.Namespace) -> NodeConfig:
    """Validated NodeConfig from the parsed options (BadRequest naming the bad value)."""
    host, port = listen_address(args)
    tls = tls_enabled(args)
    if not tls:
        log.warning("--plain_http: this node serves plain HTTP, unencrypted; peers and clients "
                    "must write its address with ?tls=off (multiaddr: /http), as the address it "
                    "prints does")  # fmt: skip
    public_addrs = []
    for maddr in args.announce_maddrs:
        a_host, a_port, _ = parse_multiaddr(maddr, need_peer_id=False)
        public_addrs.append(f"{'https' if tls else 'http'}://{format_hostport(a_host, a_port)}")
    tokens = parse_join_tokens(args.initial_peers)
    swarm_key = resolve_swarm_key(args.swarm_key, key_file=args.swarm_key_file, tokens=tokens)
    if args.gossip_interval <= 0 or args.record_ttl <= args.gossip_interval or args.fanout < 1:
        raise BadRequest(
            "need --gossip_interval > 0, --record_ttl > --gossip_interval, --fanout >= 1"
        )
    return NodeConfig(
        host=host,
        port=port,
        public_addrs=tuple(public_addrs),
        public_ip=args.public_ip,
        initial_peers=tokens,
        swarm_key=swarm_key,
        tls=tls,
        gossip_interval_s=args.gossip_interval,
        record_ttl_s=args.record_ttl,
        fanout=args.fanout,
    )


def node_identity(args: argparse.Namespace, *, fallback: bool = False) -> NodeIdentity:
    """The locked identity of a node command (drift.cli._identity), its choice logged."""
    cache = resolve_cache_dir(args.cache_dir)
    chosen = open_node_identity(args.identity_path, cache_dir=cache, fallback=fallback)
    if chosen.note:
        log.warning("%s", chosen.note)
    return chosen


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
        log.info("private swarm: joiners need the swarm key (--swarm_key_file, $DRIFT_SWARM_KEY "
                 "or --swarm_key)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    with usage_errors():
        config = node_config_from_args(args)
    check_port_free(config.host, config.port)  # a busy port: one line, exit code 1
    node = MembershipNode(node_identity(args).identity, config)
    app = build_node_app(node)
    cache = resolve_cache_dir(args.cache_dir)
    with process_record("dht", cache_dir=cache, peer_id=node.peer_id) as rec:
        exit_on_sigterm()  # until the node runs, SIGTERM (drift down) ends it through `finally`

        def started(running: RunningApp) -> None:
            token = node.join_token().to_drift(with_key=False)
            rec.update(port=running.port, extra={"join_token": token})
            log_join_info(node, running)

        run_node(app, config.host, config.port, on_started=started)
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
