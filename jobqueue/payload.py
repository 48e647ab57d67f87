"""JSON payloads with a size limit: the only serialisation jobqueue ever uses (never pickle)."""

from __future__ import annotations

import json
from typing import Any

from jobqueue.errors import PayloadError

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


_CONTAINERS = (dict, list, tuple)


def _non_string_key(value: Any, root: str) -> tuple[str, Any] | None:
    """A dict key in ``value`` (already encoded, so acyclic) that is not a string, with the
    path of its dict (e.g. ``args[0]['a']``), or None. An explicit stack: no recursion
    limit to meet."""
    stack: list[tuple[Any, str]] = [(value, root)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return path, key
                if isinstance(child, _CONTAINERS):
                    stack.append((child, f"{path}[{key!r}]"))
        elif isinstance(item, list | tuple):
            for i, child in enumerate(item):
                if isinstance(child, _CONTAINERS):
                    stack.append((child, f"{path}[{i}]"))
    return None


def _nested(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> bool:
    """Whether the arguments need the key walk: the usual call (scalars passed by position or
    keyword) has no dict to look into. A loop, not any(): this is on enqueue's hot path."""
    for arg in args:
        if isinstance(arg, _CONTAINERS):
            return True
    for key, value in kwargs.items():
        if type(key) is not str or isinstance(value, _CONTAINERS):
            return True
    return False


def _refuse_non_string_keys(value: Any, root: str, what: str) -> None:
    """JSON keys are strings: the encoder would store ``{1: 'a'}`` as ``{"1": "a"}`` and
    ``{True: 1}`` as ``{"true": 1}``, so the task would get other arguments than were given
    (and a caller another result than was returned). Refused, naming where."""
    found = _non_string_key(value, root)
    if found is not None:
        path, key = found
        stored = _ENCODER.encode({key: 0})[1:-3]  # what the key would have become
        raise PayloadError(
            f"{what}: key {key!r} ({type(key).__name__}) in {path} is not a string; JSON keys "
            f"are strings, so it would be stored as {stored}: use string keys"
        )


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
    text = _dumps({"args": list(args), "kwargs": kwargs}, "task arguments")
    if _nested(args, kwargs):
        _refuse_non_string_keys(list(args), "args", "task arguments")
        _refuse_non_string_keys(kwargs, "kwargs", "task arguments")
    return _check_size(text, limit, "task arguments")


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
    text = _dumps(value, "task result")
    if isinstance(value, _CONTAINERS):
        _refuse_non_string_keys(value, "result", "task result")
    return _check_size(text, limit, "task result")


def decode_result(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text  # a record written by something else: show it as it is
