"""NodeConfig: everything a membership node needs to know, built once by drift/cli."""

from __future__ import annotations

from dataclasses import dataclass, field

from drift.identity import JoinToken
from drift.wire.version import __version__


@dataclass(frozen=True)
class NodeConfig:
    host: str = "127.0.0.1"  # listen address
    port: int = 0  # listen port; 0 = any free port
    public_addrs: tuple[str, ...] = ()  # http(s)://host:port URLs peers reach us at; () = derive
    public_ip: str | None = None  # with public_addrs empty: announce http://<public_ip>:<port>
    initial_peers: tuple[JoinToken, ...] = ()  # seeds to join through
    swarm_key: str | None = field(default=None, repr=False)  # private swarm secret; None: open
    tls: bool = False  # serve TLS with a certificate bound to the identity (https:// records)
    gossip_interval_s: float = 5.0  # mean time between gossip rounds, seconds
    gossip_jitter: float = 0.25  # each wait is interval * (1 +- jitter)
    fanout: int = 3  # random live peers contacted per round
    record_ttl_s: float = 30.0  # our record expires this long after each re-signing, seconds
    request_timeout_s: float = 5.0  # total timeout of one gossip request, seconds
    leave_timeout_s: float = 2.0  # time allowed to publish the offline record, seconds
    auth_max_skew_s: float = 60.0  # HMAC timestamps older/newer than this are refused, seconds
    max_records: int = 1024  # peers the membership table holds
    max_gossip_records: int = 1100  # records accepted in one gossip body or reply
    max_pending: int = 256  # open swarm: unverified records waiting for a dial
    dials_per_round: int = 16  # open swarm: pending records dialled per gossip round
    leave_fanout: int = 8  # peers told of a graceful leave (initial peers first)
    client_max_size: int = 1 << 20  # largest request body the app accepts, bytes
    max_body_memory: int = 256 << 20  # request bodies held at once, all requests, bytes (429)
    idle_timeout_s: float = 30.0  # a connection silent this long (no request, no body) closes
    version: str = __version__  # DRIFT version announced in records and /health
