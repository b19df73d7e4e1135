"""Base58btc (the Bitcoin alphabet), as libp2p uses it for peer ids.

Pure byte <-> text conversion; it knows nothing about keys or multihashes.
"""

from __future__ import annotations

ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_INDEX = {ch: i for i, ch in enumerate(ALPHABET)}


def b58encode(data: bytes) -> str:
    """Encode bytes; each leading zero byte becomes a leading '1'."""
    zeros = len(data) - len(data.lstrip(b"\0"))
    num = int.from_bytes(data, "big")
    out = []
    while num:
        num, rem = divmod(num, 58)
        out.append(ALPHABET[rem])
    return "1" * zeros + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    """Decode base58btc text; ValueError names the first character outside the alphabet."""
    num = 0
    for ch in text:
        digit = _INDEX.get(ch)
        if digit is None:
            raise ValueError(f"{ch!r} is not a base58btc character")
        num = num * 58 + digit
    zeros = len(text) - len(text.lstrip("1"))
    body = num.to_bytes((num.bit_length() + 7) // 8, "big") if num else b""
    return b"\0" * zeros + body
