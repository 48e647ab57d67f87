"""A failed attempt's traceback as stored with its history entry: bounded, newest kept."""

from __future__ import annotations

import traceback

TRUNCATED = "[... older part of the traceback cut ...]\n"


def format_traceback(error: BaseException, max_frames: int, max_bytes: int) -> str:
    """The full traceback of ``error`` (its causes and contexts too), at most ``max_frames``
    frames per exception and ``max_bytes`` UTF-8 bytes. The newest part is kept: the frame
    that raised and the exception's own line are what a reader needs first."""
    if max_bytes <= 0:
        return ""
    try:
        text = "".join(traceback.format_exception(error, limit=-max_frames)).rstrip("\n")
    except Exception as exc:  # a __str__ that raises, a broken frame: never lose the failure
        text = f"(the traceback could not be formatted: {type(exc).__name__})"
    # lone surrogates (undecodable bytes in a message) are not UTF-8: Redis would refuse them
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    room = max_bytes - len(TRUNCATED)
    if room <= 0:
        return data[-max_bytes:].decode("utf-8", "ignore")
    # cut in a character: 'ignore' drops its remains
    return TRUNCATED + data[-room:].decode("utf-8", "ignore")
