"""A peer's address: `http://host:port` or `https://host:port`, and nothing else.

Every address a membership record announces and every hop a pushed step names is checked
here: a scheme, a host (name, IPv4, or IPv6 in brackets) and a port, with no user, path,
query or fragment, so a URL built as `f"{addr}{PATH}"` always reaches PATH on that host.
"""

from __future__ import annotations

import ipaddress
import re

SCHEMES = ("http", "https")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")  # fmt: skip
_FORM = "scheme://host:port (http or https, no path, query or user)"


def addr_problem(addr: object) -> str | None:
    """Why `addr` is not a peer address (None when it is one)."""
    if not isinstance(addr, str):
        return f"an address must be a string, got {type(addr).__name__}"
    scheme, sep, hostport = addr.partition("://")
    if not sep or scheme not in SCHEMES:
        return f"address {addr!r} must be {_FORM}"
    if hostport.startswith("["):
        host, close, after = hostport[1:].partition("]")
        if not close or not after.startswith(":") or not _is_ip6(host):
            return f"address {addr!r} must be {_FORM}; IPv6 as [ip6]:port"
        port = after[1:]
    else:
        host, colon, port = hostport.rpartition(":")
        if not colon or not _HOSTNAME.match(host):
            return f"address {addr!r} must be {_FORM}"
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        return f"address {addr!r} must be {_FORM} with a port 1-65535"
    return None


def check_addr(addr: object) -> str:
    """`addr` itself when it is a peer address; ValueError saying why otherwise."""
    problem = addr_problem(addr)
    if problem is not None:
        raise ValueError(problem)
    assert isinstance(addr, str)
    return addr


def _is_ip6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False
