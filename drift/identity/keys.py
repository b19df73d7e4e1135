"""A node's Ed25519 identity and its libp2p-style peer id.

The peer id is base58btc(identity multihash(protobuf PublicKey{Type=Ed25519, Data=key})),
so it reads `12D3KooW...` and anyone can check a signature from the id alone. Keys live in
a file (raw 32-byte private key, mode 0600) created on first start and reused afterwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from drift.identity.base58 import b58decode, b58encode
from drift.wire.errors import BadRequest

# protobuf PublicKey: field 1 (varint) KeyType.Ed25519 = 1; field 2 (bytes) len 32.
PUBLIC_KEY_PROTO_PREFIX = bytes([0x08, 0x01, 0x12, 0x20])
# identity multihash: code 0x00, digest length 36 (= protobuf bytes).
_MULTIHASH_PREFIX = bytes([0x00, 0x24])


def peer_id_from_public_key(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b58encode(_MULTIHASH_PREFIX + PUBLIC_KEY_PROTO_PREFIX + raw)


def public_key_from_peer_id(peer_id: str) -> Ed25519PublicKey:
    """The Ed25519 key inside a peer id; BadRequest if it is not an Ed25519 libp2p id."""
    if not isinstance(peer_id, str) or not peer_id:
        raise BadRequest(f"peer id must be a non-empty string, got {peer_id!r}")
    try:
        raw = b58decode(peer_id)
    except ValueError as exc:
        raise BadRequest(f"peer id {peer_id!r} is not base58btc: {exc}") from exc
    prefix = _MULTIHASH_PREFIX + PUBLIC_KEY_PROTO_PREFIX
    if len(raw) != len(prefix) + 32 or not raw.startswith(prefix):
        raise BadRequest(
            f"peer id {peer_id!r} is not an Ed25519 libp2p peer id (expected 12D3KooW...)"
        )
    return Ed25519PublicKey.from_public_bytes(raw[len(prefix) :])


def verify_signature(peer_id: str, data: bytes, signature: bytes) -> bool:
    """True when `signature` over `data` was made by the key behind `peer_id`."""
    try:
        public_key_from_peer_id(peer_id).verify(signature, data)
    except (InvalidSignature, BadRequest, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Identity:
    """One Ed25519 key pair and the peer id it gives."""

    private_key: Ed25519PrivateKey
    peer_id: str

    @classmethod
    def generate(cls) -> Identity:
        key = Ed25519PrivateKey.generate()
        return cls(key, peer_id_from_public_key(key.public_key()))

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> Identity:
        key = Ed25519PrivateKey.from_private_bytes(raw)
        return cls(key, peer_id_from_public_key(key.public_key()))

    def private_bytes(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)


def load_or_create_identity(path: str | os.PathLike[str]) -> Identity:
    """The identity stored at `path`; a new one is written there (mode 0600) if absent."""
    path = Path(path)
    if path.exists():
        raw = path.read_bytes()
        if len(raw) != 32:
            raise BadRequest(
                f"identity file {path} holds {len(raw)} bytes, expected a raw 32-byte "
                "Ed25519 private key; move it away to create a new identity"
            )
        return Identity.from_private_bytes(raw)
    identity = Identity.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(identity.private_bytes())
    return identity
