"""Ports and commands for `drift up`: is the stable port free, what is the join command.

The announced address itself (LAN over loopback, --public_ip overrides) is the
MembershipNode's business. Pure socket calls; no packet leaves the machine.
"""

from __future__ import annotations

import errno
import socket

from drift.wire.errors import BadRequest

DEFAULT_PORT = 31337


def check_port_free(host: str, port: int) -> None:
    """BadRequest naming --port when `host:port` cannot be bound (port 0 always passes)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            why = (
                "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
            )
            raise BadRequest(
                f"port {port} on {host or 'all interfaces'} {why}: another drift (see `drift down "
                f"--list`) or another program holds it. Pick another with --port, e.g. "
                f"--port {port + 1}; the join command printed at startup will name it"
            ) from exc


def join_command(model_arg: str | None, token: str) -> str:
    """The exact command another machine runs to join (MODEL left out when it is the default)."""
    model = f"{model_arg} " if model_arg else ""
    return f"drift up {model}--join {token}"
