"""FNV-1a 32-bit: the one hash used for partitions and jitter (the seed's function)."""

from __future__ import annotations

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a_32(text: str) -> int:
    """FNV-1a over UTF-16 code units, exactly as the seed's JavaScript computes it.

    JavaScript's ``charCodeAt`` yields UTF-16 code units; hashing those (not UTF-8 bytes)
    keeps our jitter identical to the seed's for every string, ASCII or not.
    """
    h = _FNV_OFFSET
    data = text.encode("utf-16-le")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * _FNV_PRIME) & 0xFFFFFFFF
    return h
