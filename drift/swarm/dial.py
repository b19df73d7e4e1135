"""Dialling a peer by its id: the TLS check that the node behind an address holds that id.

`peer_ssl(peer_id)` is what every connection to a peer passes as aiohttp's `ssl=`: on an
https/wss address it checks, right after the TLS handshake and before any byte of the
request is sent, that the server's certificate proves `peer_id` (drift.identity.tls), and
refuses the connection otherwise; on a plain http address it does nothing. Connections are
pooled per (address, peer id).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from drift.identity.tls import BadCertificate, peer_id_of_certificate


class PeerCertificate(aiohttp.Fingerprint):
    """aiohttp's certificate check, asking for a peer id instead of a certificate hash."""

    def __init__(self, peer_id: str) -> None:  # no super(): no hash to compare
        self.peer_id = peer_id

    @property
    def fingerprint(self) -> bytes:
        return self.peer_id.encode()

    def check(self, transport: asyncio.Transport) -> None:
        if not transport.get_extra_info("sslcontext"):
            return
        der = transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
        try:
            got = peer_id_of_certificate(der or b"")
        except BadCertificate as exc:
            got = f"<no DRIFT identity: {exc.message}>"
        if got != self.peer_id:
            host, port, *_ = transport.get_extra_info("peername")
            raise aiohttp.ServerFingerprintMismatch(self.peer_id.encode(), got.encode(), host,
                                                    port)  # fmt: skip

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, PeerCertificate) and other.peer_id == self.peer_id

    def __hash__(self) -> int:
        return hash(("drift-peer", self.peer_id))


def peer_ssl(peer_id: str) -> PeerCertificate:
    """The `ssl=` argument for any request to the peer `peer_id`."""
    return PeerCertificate(peer_id)


def is_wrong_peer(exc: BaseException) -> bool:
    """True when a connection failed because the node there is not the peer expected."""
    return isinstance(exc, aiohttp.ServerFingerprintMismatch)
