"""Who a node is: its Ed25519 key, libp2p-style peer id, and join tokens naming it.

Knows nothing about records, gossip or HTTP.
"""

from drift.identity.keys import (
    Identity,
    load_or_create_identity,
    peer_id_from_public_key,
    public_key_from_peer_id,
    verify_signature,
)
from drift.identity.tokens import (
    JoinToken,
    format_hostport,
    parse_join_token,
    parse_join_tokens,
    parse_listen_maddr,
    parse_multiaddr,
)

__all__ = [
    "Identity",
    "JoinToken",
    "format_hostport",
    "load_or_create_identity",
    "parse_join_token",
    "parse_join_tokens",
    "parse_listen_maddr",
    "parse_multiaddr",
    "peer_id_from_public_key",
    "public_key_from_peer_id",
    "verify_signature",
]
