"""TLS certificates bound to a node's Ed25519 identity, as libp2p's TLS handshake does.

A node's certificate is self-signed by a fresh P-256 key and carries an extension (libp2p's
OID 1.3.6.1.4.1.53594.1.1) holding SignedKey{public key (libp2p protobuf), signature}: the
identity key's signature over "libp2p-tls-handshake:" + the certificate's public key. Whoever
dials checks that signature and derives the peer id from the certificate itself, then
compares it with the peer id in the token or the signed record: no certificate authority,
and a man in the middle (who lacks the identity key) is refused. No sockets here.
"""

from __future__ import annotations

import datetime
import os
import ssl
import tempfile

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.x509.oid import NameOID

from drift.identity.keys import (
    PUBLIC_KEY_PROTO_PREFIX,
    Identity,
    peer_id_from_public_key,
    public_key_from_peer_id,
)
from drift.wire.errors import BadRequest

SIGNED_KEY_OID = x509.ObjectIdentifier("1.3.6.1.4.1.53594.1.1")
SIGNATURE_PREFIX = b"libp2p-tls-handshake:"


class BadCertificate(BadRequest):
    code = "bad_certificate"


def _der_octets(items: list[bytes]) -> bytes:
    """DER SEQUENCE of OCTET STRINGs (the SignedKey structure)."""
    body = b"".join(b"\x04" + _der_length(len(i)) + i for i in items)
    return b"\x30" + _der_length(len(body)) + body


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def _read_der(data: bytes, pos: int, tag: int) -> tuple[bytes, int]:
    """(contents, next position) of the DER element of `tag` at `pos`."""
    if pos + 2 > len(data) or data[pos] != tag:
        raise BadCertificate("malformed SignedKey extension")
    length, pos = data[pos + 1], pos + 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or pos + count > len(data):
            raise BadCertificate("malformed SignedKey extension")
        length, pos = int.from_bytes(data[pos : pos + count], "big"), pos + count
    if pos + length > len(data):
        raise BadCertificate("malformed SignedKey extension")
    return data[pos : pos + length], pos + length


def make_certificate(identity: Identity, *, days: int = 365) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) of a fresh certificate bound to `identity`."""
    key = ec.generate_private_key(ec.SECP256R1())
    spki = key.public_key().public_bytes(serialization.Encoding.DER,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)  # fmt: skip
    public = identity.private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                            serialization.PublicFormat.Raw)  # fmt: skip
    signed_key = _der_octets(
        [PUBLIC_KEY_PROTO_PREFIX + public, identity.sign(SIGNATURE_PREFIX + spki)]
    )
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity.peer_id)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.UnrecognizedExtension(SIGNED_KEY_OID, signed_key), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def peer_id_of_certificate(der: bytes) -> str:
    """The peer id a DER certificate proves (BadCertificate if it proves none)."""
    try:
        cert = x509.load_der_x509_certificate(der)
        value = cert.extensions.get_extension_for_oid(SIGNED_KEY_OID).value
    except (ValueError, x509.ExtensionNotFound) as exc:
        raise BadCertificate(f"the certificate carries no DRIFT identity: {exc}") from exc
    assert isinstance(value, x509.UnrecognizedExtension)
    sequence, _ = _read_der(value.value, 0, 0x30)
    proto, pos = _read_der(sequence, 0, 0x04)
    signature, _ = _read_der(sequence, pos, 0x04)
    if len(proto) != len(PUBLIC_KEY_PROTO_PREFIX) + 32 or not proto.startswith(
        PUBLIC_KEY_PROTO_PREFIX
    ):
        raise BadCertificate("the certificate's identity key is not an Ed25519 key")
    identity_key = Ed25519PublicKey.from_public_bytes(proto[len(PUBLIC_KEY_PROTO_PREFIX) :])
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)  # fmt: skip
    try:
        identity_key.verify(signature, SIGNATURE_PREFIX + spki)
    except InvalidSignature as exc:
        raise BadCertificate("the certificate's key is not signed by its identity key") from exc
    now = datetime.datetime.now(datetime.timezone.utc)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise BadCertificate("the certificate is expired or not yet valid")
    return peer_id_from_public_key(identity_key)


def certificate_proves(der: bytes, peer_id: str) -> bool:
    """True when the DER certificate proves `peer_id`."""
    public_key_from_peer_id(peer_id)  # BadRequest for a malformed id
    try:
        return peer_id_of_certificate(der) == peer_id
    except BadCertificate:
        return False


def server_context(identity: Identity) -> ssl.SSLContext:
    """A server TLS context presenting a fresh certificate bound to `identity`."""
    cert_pem, key_pem = make_certificate(identity)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    fd, path = tempfile.mkstemp(prefix="drift-tls-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem + cert_pem)
        context.load_cert_chain(path)  # ssl reads certificates only from files
    finally:
        os.unlink(path)
    return context
