"""JSON payloads with a size limit: the only serialisation jobqueue ever uses (never pickle)."""

from __future__ import annotations

import json
from typing import Any

from .errors import PayloadError

DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024


# allow_nan=False: NaN and Infinity are not JSON and other readers choke on them. One encoder
# for the process: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dumps(value: Any, what: str) -> str:
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise PayloadError(f"{what} is nested too deeply to serialise") from None


def _check_size(text: str, limit: int, what: str) -> str:
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        # A lone surrogate has no UTF-8 form: refuse it rather than store it mangled.
        raise PayloadError(f"{what} contain text that is not valid Unicode: {exc.reason}") from None
    if size > limit:
        raise PayloadError(f"{what} is {size:,} bytes as JSON; the limit is {limit:,} bytes")
    return text


def encode_payload(
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
    limit: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> str:
    return _check_size(
        _dumps({"args": list(args), "kwargs": kwargs}, "task arguments"), limit, "task arguments"
    )


def decode_payload(text: str) -> tuple[list[Any], dict[str, Any]]:
    """Arguments back from Redis; anything malformed raises PayloadError (never executes)."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"stored arguments are not valid JSON: {exc}") from None
    except RecursionError:  # valid JSON from another producer, nested past Python's limit
        raise PayloadError("stored arguments are nested too deeply to decode") from None
    if not isinstance(data, dict):
        raise PayloadError("stored arguments are not a JSON object")
    args, kwargs = data.get("args", []), data.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise PayloadError("stored arguments must hold a list 'args' and an object 'kwargs'")
    return args, kwargs


def encode_result(value: Any, limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    return _check_size(_dumps(value, "task result"), limit, "task result")


def decode_result(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text  # a record written by something else: show it as it is
