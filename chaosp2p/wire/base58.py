"""Base58 (Bitcoin alphabet), the text form libp2p uses for PeerIDs.

Small and self-contained: PeerIDs are 38 bytes, so the quadratic big-integer conversion costs
microseconds and saves a dependency.
"""

from __future__ import annotations

ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_INDEX = {ch: i for i, ch in enumerate(ALPHABET)}


def b58encode(data: bytes) -> str:
    """Encode bytes as base58btc text."""
    zeros = len(data) - len(data.lstrip(b"\0"))
    number = int.from_bytes(data, "big")
    digits = []
    while number:
        number, rem = divmod(number, 58)
        digits.append(ALPHABET[rem])
    return "1" * zeros + "".join(reversed(digits))


def b58decode(text: str, *, max_len: int = 128) -> bytes:
    """Decode base58btc text; raise ``ValueError`` on a bad character or oversized input."""
    if len(text) > max_len:
        raise ValueError(f"base58 text longer than {max_len} characters")
    number = 0
    for ch in text:
        try:
            number = number * 58 + _INDEX[ch]
        except KeyError:
            raise ValueError(f"invalid base58 character {ch!r}") from None
    zeros = len(text) - len(text.lstrip("1"))
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    return b"\0" * zeros + body
