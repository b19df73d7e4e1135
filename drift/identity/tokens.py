"""Join tokens: `drift://<peer_id>@<host>:<port>[?key=<secret>][&tls=off]` and multiaddrs.

`/ip4/<host>/tcp/<port>[/tls|/http]/p2p/<peer_id>`, `/ip6/...` (brackets in the drift form)
and `/dns/...` (also `/dns4`, `/dns6`) name the same peer; a comma-separated string holds
several. A node speaks TLS unless its token says `tls=off` (multiaddr: `/http`): the dialler
then checks the node's certificate proves the token's peer id (drift.identity.tls). Listen
addresses (`/ip4/0.0.0.0/tcp/31337`) carry no peer id. Pure parsing.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote

from drift.identity.keys import public_key_from_peer_id
from drift.wire.errors import BadRequest

TOKEN_FORMS = (
    "drift://<peer_id>@<host>:<port>[?key=<swarm key>][&tls=off] (IPv6 host in brackets) or "
    "/ip4|ip6|dns/<host>/tcp/<port>[/tls|/http]/p2p/<peer_id>"
)
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")


def _bad(text: str, why: str) -> BadRequest:
    return BadRequest(f"bad join token {text!r}: {why}; expected {TOKEN_FORMS}")


def _host_kind(host: str) -> str:
    """'ip4', 'ip6' or 'dns'; ValueError if the host is none of them."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_RE.match(host) or len(host) > 253:
            raise ValueError(f"{host!r} is not an IP address or DNS name") from None
        return "dns"
    return "ip6" if ip.version == 6 else "ip4"


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"port {text!r} is not a number in 1..65535")
    return int(text)


@dataclass(frozen=True)
class JoinToken:
    """Where a peer listens and which peer id it must prove it holds."""

    peer_id: str
    host: str
    port: int
    swarm_key: str | None = field(default=None, repr=False)  # a secret: never in a repr
    tls: bool = True  # the node speaks TLS with a certificate proving peer_id (False: plain)

    @property
    def url(self) -> str:
        """Base URL of the peer's node app (https unless the node is plain HTTP)."""
        return f"{'https' if self.tls else 'http'}://{format_hostport(self.host, self.port)}"

    def to_drift(self, *, with_key: bool = True) -> str:
        text = f"drift://{self.peer_id}@{format_hostport(self.host, self.port)}"
        query = []
        if with_key and self.swarm_key:
            query.append("key=" + quote(self.swarm_key, safe=""))
        if not self.tls:
            query.append("tls=off")
        return text + ("?" + "&".join(query) if query else "")

    def to_multiaddr(self) -> str:
        plain = "" if self.tls else "/http"  # TLS is the default: no marker
        return f"/{_host_kind(self.host)}/{self.host}/tcp/{self.port}{plain}/p2p/{self.peer_id}"

    def __str__(self) -> str:
        """The token without its key (a str() may end up in a log); to_drift() has it."""
        return self.to_drift(with_key=False)


def format_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_peer_id(text: str, peer_id: str) -> None:
    try:
        public_key_from_peer_id(peer_id)
    except BadRequest as exc:
        raise _bad(text, exc.message) from exc


def _parse_drift(text: str) -> JoinToken:
    rest = text[len("drift://") :]
    rest, _, query = rest.partition("?")
    peer_id, at, hostport = rest.partition("@")
    if not at or not peer_id:
        raise _bad(text, "missing '<peer_id>@'")
    _check_peer_id(text, peer_id)
    if hostport.startswith("["):
        host, close, after = hostport[1:].partition("]")
        if not close or not after.startswith(":"):
            raise _bad(text, "IPv6 host needs the form [<ip6>]:<port>")
        port_text = after[1:]
        if not host or _host_kind_or_none(host) != "ip6":
            raise _bad(text, f"{host!r} in brackets is not an IPv6 address")
    else:
        host, colon, port_text = hostport.rpartition(":")
        if not colon or not host:
            raise _bad(text, "missing '<host>:<port>'")
        if ":" in host:
            raise _bad(text, "an IPv6 host must be written in brackets")
        if _host_kind_or_none(host) is None:
            raise _bad(text, f"{host!r} is not an IP address or DNS name")
    try:
        port = _port(port_text)
    except ValueError as exc:
        raise _bad(text, str(exc)) from exc
    key, tls = None, True
    if query:
        params = parse_qs(query, keep_blank_values=True)
        if set(params) - {"key", "tls"} or any(len(v) != 1 for v in params.values()):
            raise _bad(text, "the query may hold one key=<secret> and one tls=off, nothing else")
        if "key" in params:
            if not params["key"][0]:
                raise _bad(text, "key= is empty")
            key = params["key"][0]
        if "tls" in params:
            if params["tls"][0] not in ("on", "off"):
                raise _bad(text, "tls= must be on or off")
            tls = params["tls"][0] == "on"
    return JoinToken(peer_id, host, port, key, tls)


def _host_kind_or_none(host: str) -> str | None:
    try:
        return _host_kind(host)
    except ValueError:
        return None


def parse_multiaddr(text: str, *, need_peer_id: bool = True) -> tuple[str, int, str | None]:
    """(host, port, peer_id) of `/ip4|ip6|dns/<host>/tcp/<port>[/tls|/http][/p2p/<id>]`."""
    return _parse_multiaddr(text, need_peer_id=need_peer_id)[:3]


def _parse_multiaddr(text: str, *, need_peer_id: bool) -> tuple[str, int, str | None, bool]:
    """(host, port, peer_id, tls) of a multiaddr; TLS unless it says /http."""
    parts = text.split("/")
    tls = True
    if len(parts) > 5 and parts[5] in ("tls", "http"):
        tls = parts[5] == "tls"
        parts = parts[:5] + parts[6:]
    allowed = (7,) if need_peer_id else (5, 7)
    if parts[0] != "" or len(parts) not in allowed:
        raise _bad(text, "wrong number of multiaddr parts")
    proto, host, tcp, port_text = parts[1:5]
    kind = _host_kind_or_none(host)
    if proto not in ("ip4", "ip6", "dns", "dns4", "dns6") or kind is None:
        raise _bad(text, f"unknown address /{proto}/{host}")
    if (proto in ("ip4", "ip6") and kind != proto) or (proto.startswith("dns") and kind != "dns"):
        raise _bad(text, f"{host!r} is not a valid /{proto} address")
    if tcp != "tcp":
        raise _bad(text, f"expected /tcp/<port> after the host, got /{tcp}")
    try:
        port = int(port_text) if port_text == "0" and not need_peer_id else _port(port_text)
    except ValueError as exc:
        raise _bad(text, str(exc)) from exc
    peer_id = None
    if len(parts) == 7:
        if parts[5] not in ("p2p", "ipfs"):
            raise _bad(text, f"expected /p2p/<peer_id>, got /{parts[5]}")
        peer_id = parts[6]
        _check_peer_id(text, peer_id)
    return host, port, peer_id, tls


def parse_join_token(text: str) -> JoinToken:
    """One token in either form; BadRequest showing the expected forms otherwise."""
    text = text.strip()
    if text.startswith("drift://"):
        return _parse_drift(text)
    if text.startswith("/"):
        host, port, peer_id, tls = _parse_multiaddr(text, need_peer_id=True)
        assert peer_id is not None
        return JoinToken(peer_id, host, port, None, tls)
    raise _bad(text, "it starts with neither 'drift://' nor '/'")


def parse_join_tokens(text: str | list[str] | tuple[str, ...]) -> tuple[JoinToken, ...]:
    """Tokens from a comma-separated string (or several such strings); empty parts skipped."""
    items = [text] if isinstance(text, str) else list(text)
    return tuple(
        parse_join_token(part) for item in items for part in item.split(",") if part.strip()
    )


def parse_listen_maddr(text: str) -> tuple[str, int]:
    """(host, port) of a listen multiaddr like `/ip4/0.0.0.0/tcp/31337` (port 0 = any)."""
    host, port, _ = parse_multiaddr(text, need_peer_id=False)
    return host, port
