"""FNV-1a 32-bit: the one hash used for partitions and jitter (docs/design.md, "Jitter")."""

from __future__ import annotations

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a_32(text: str) -> int:
    """FNV-1a over UTF-16 code units, exactly as a JavaScript FNV-1a over ``charCodeAt``
    computes it.

    JavaScript's ``charCodeAt`` yields UTF-16 code units; hashing those (not UTF-8 bytes)
    keeps our jitter identical to such an implementation's for every string, ASCII or not,
    and so to the herd figures of docs/design.md.
    """
    h = _FNV_OFFSET
    data = text.encode("utf-16-le")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * _FNV_PRIME) & 0xFFFFFFFF
    return h
