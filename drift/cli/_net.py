"""Ports and commands for `drift up`: is the stable port free (and who holds it), which
port a second node on this machine takes, what is the join command.

The announced address itself (LAN over loopback, --public_ip overrides) is the
MembershipNode's business. Pure socket calls and psutil; no packet leaves the machine.
"""

from __future__ import annotations

import errno
import socket

import psutil

from drift.wire.errors import BadRequest

DEFAULT_PORT = 31337


AUTO_PORT_TRIES = 64  # ports after the default a second `drift up` on this machine tries


def port_holder(port: int) -> str | None:
    """'pid 1234 (python3 -m drift.cli up ...)' for the process listening on TCP `port`, where
    this user may see it (psutil; None when nothing visible listens or listing is refused)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            if conn.pid is None:
                return "a process of another user"
            try:
                cmd = " ".join(psutil.Process(conn.pid).cmdline()) or "?"
            except psutil.Error:
                cmd = "?"
            return f"pid {conn.pid} ({cmd[:120]})"
    return None


def bind_error(host: str, port: int) -> OSError | None:
    """Why `host:port` cannot be bound now, or None when it can (port 0 always can)."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def check_port_free(host: str, port: int) -> None:
    """BadRequest naming --port and the port's holder when `host:port` cannot be bound."""
    exc = bind_error(host, port)
    if exc is None:
        return
    in_use = exc.errno == errno.EADDRINUSE
    why = "is already in use" if in_use else f"cannot be bound ({exc})"
    holder = port_holder(port) if in_use else None
    by = f" by {holder}" if holder else ""
    raise BadRequest(
        f"port {port} on {host or 'all interfaces'} {why}{by} (DRIFT's own: `drift down "
        f"--list`). Pick another with --port, e.g. --port {port + 1}; the join command printed "
        f"at startup will name it"
    ) from exc


def pick_free_port(host: str, port: int) -> tuple[int, str | None]:
    """`port` when it is free; else the first free one after it, with a line saying why."""
    exc = bind_error(host, port)
    if exc is None or exc.errno != errno.EADDRINUSE:
        return port, None
    holder = port_holder(port) or "another process"
    for candidate in range(port + 1, port + 1 + AUTO_PORT_TRIES):
        if bind_error(host, candidate) is None:
            return candidate, (f"port {port} is in use by {holder}; this node listens on "
                               f"{candidate} instead (pass --port to choose)")  # fmt: skip
    check_port_free(host, port)  # every one taken: the usual one-line error
    return port, None


def join_command(model_arg: str | None, token: str) -> str:
    """The exact command another machine runs to join (MODEL left out when it is the default)."""
    model = f"{model_arg} " if model_arg else ""
    return f"drift up {model}--join {token}"
