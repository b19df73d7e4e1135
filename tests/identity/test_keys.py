"""Identity keys and peer ids: libp2p form, persistence, signature checks from the id."""

from __future__ import annotations

import os
import stat

import pytest

from drift.identity import (
    Identity,
    load_or_create_identity,
    public_key_from_peer_id,
    verify_signature,
)
from drift.identity.base58 import b58decode, b58encode
from drift.wire.errors import BadRequest


@pytest.mark.parametrize("data", [b"", b"\0", b"\0\0abc", b"hello world", bytes(range(256))])
def test_base58_round_trip(data: bytes) -> None:
    assert b58decode(b58encode(data)) == data


def test_base58_known_vector() -> None:
    # Bitcoin's test vector
    assert b58encode(b"Hello World!") == "2NEpo7TZRRrLZSi2U"
    with pytest.raises(ValueError, match="'0'"):
        b58decode("0abc")


def test_peer_id_is_libp2p_ed25519_form() -> None:
    ident = Identity.generate()
    assert ident.peer_id.startswith("12D3KooW")
    raw = b58decode(ident.peer_id)
    assert raw[:6] == bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20]) and len(raw) == 38
    pub = public_key_from_peer_id(ident.peer_id)
    assert pub.public_bytes_raw() == raw[6:]


def test_peer_id_of_rfc8032_key() -> None:
    # RFC 8032 test 1: seed 9d61b19d... -> public key d75a9801...
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    ident = Identity.from_private_bytes(seed)
    pub = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
    assert b58decode(ident.peer_id) == bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20]) + pub


def test_signature_checks_from_id_alone() -> None:
    a, b = Identity.generate(), Identity.generate()
    sig = a.sign(b"msg")
    assert verify_signature(a.peer_id, b"msg", sig)
    assert not verify_signature(a.peer_id, b"msg2", sig)
    assert not verify_signature(b.peer_id, b"msg", sig)
    assert not verify_signature("not-an-id", b"msg", sig)


@pytest.mark.parametrize("bad", ["", "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "12D3KooW0"])
def test_bad_peer_ids_rejected(bad: str) -> None:
    with pytest.raises(BadRequest, match="peer id"):
        public_key_from_peer_id(bad)


def test_identity_file_created_0600_and_reused(tmp_path) -> None:
    path = tmp_path / "sub" / "id.key"
    first = load_or_create_identity(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = load_or_create_identity(path)
    assert again.peer_id == first.peer_id
    path.write_bytes(b"short")
    with pytest.raises(BadRequest, match="32-byte"):
        load_or_create_identity(path)
