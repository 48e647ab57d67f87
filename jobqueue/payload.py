"""JSON payloads with a size limit: the only serialisation jobqueue ever uses (never pickle).

Rich values travel as tagged JSON, so that a task gets back the types it was given, whatever
its annotations say (and with none): a one-key object ``{"__jq__": [TYPE, VALUE, ...]}``:

- ``["datetime", ISO 8601, ZONE?]``: ``2026-11-29T06:30:00.250000+01:00``, an aware one with
  its offset, plus its IANA zone name when it has one (a ``ZoneInfo``), a naive one without
  offset; decoded to the same instant, offset and zone (or naive);
- ``["date", "2026-11-29"]``, ``["time", "06:30:00+01:00"]``;
- ``["decimal", "1.10"]``: its exact text (digits, exponent and sign kept);
- ``["uuid", "8-4-4-4-12 hex"]``; ``["bytes", base64]``; ``["tuple", [items]]``.

Plain JSON (str, int, float, bool, None, list, dict with string keys) is stored as it is, so
records written before tags existed read the same. A dict key that is not a string is refused
(JSON would store ``{1: 'a'}`` as ``{"1": "a"}``), and so is a dict of one key ``__jq__`` (it
would read back as a tag).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jobqueue.errors import PayloadError

DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024

TAG = "__jq__"


def _tagged(value: Any) -> Any:
    """The tagged form of a rich scalar (the encoder's ``default``: called only for what JSON
    has no form for)."""
    kind = type(value)
    if kind is dt.datetime:
        zone = getattr(value.tzinfo, "key", None)
        form = ["datetime", value.isoformat()]
        return {TAG: [*form, zone] if isinstance(zone, str) else form}
    if kind is dt.date:
        return {TAG: ["date", value.isoformat()]}
    if kind is dt.time:
        return {TAG: ["time", value.isoformat()]}
    if kind is Decimal:
        return {TAG: ["decimal", str(value)]}
    if kind is uuid.UUID:
        return {TAG: ["uuid", str(value)]}
    if kind is bytes:
        return {TAG: ["bytes", base64.b64encode(value).decode("ascii")]}
    raise TypeError(
        f"Object of type {kind.__name__} is not JSON serializable (JSON values, datetime, "
        "date, time, Decimal, UUID, bytes and tuples are)"
    )


def _untag(form: Any) -> Any:
    kind, text = form[0], form[1]
    if kind == "datetime":
        value = dt.datetime.fromisoformat(text)
        if len(form) > 2 and value.tzinfo is not None:
            try:
                return value.astimezone(ZoneInfo(form[2]))
            except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
                return value  # a zone this machine does not know: the same instant, its offset
        return value
    if kind == "date":
        return dt.date.fromisoformat(text)
    if kind == "time":
        return dt.time.fromisoformat(text)
    if kind == "decimal":
        return Decimal(text)
    if kind == "uuid":
        return uuid.UUID(text)
    if kind == "bytes":
        return base64.b64decode(text, validate=True)
    if kind == "tuple":
        return tuple(text)
    raise ValueError(f"unknown tag {kind!r}")


def _object_hook(obj: dict[str, Any]) -> Any:
    if len(obj) != 1 or TAG not in obj:
        return obj
    form = obj[TAG]
    if not isinstance(form, list) or len(form) < 2 or not isinstance(form[0], str):
        return obj  # not a tag jobqueue writes: shown as it is
    try:
        return _untag(form)
    except (ValueError, TypeError, InvalidOperation, binascii.Error):
        return obj


# allow_nan=False: NaN and Infinity are not JSON and other readers choke on them. One encoder
# for the process: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_tagged
)
_DECODER = json.JSONDecoder(object_hook=_object_hook)


def _dumps(value: Any, what: str) -> str:
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise PayloadError(f"{what} is nested too deeply to serialise") from None


def _loads(text: str) -> Any:
    return _DECODER.decode(text)


_CONTAINERS = (dict, list, tuple)


class _Scan:
    """What a walk of encoded arguments found: a dict key that is not a string (with the path
    of its dict, e.g. ``args[0]['a']``), a dict that would read back as a tag, and whether
    a tuple needs its tag."""

    __slots__ = ("bad_key", "tag_dict", "tuples")

    def __init__(self) -> None:
        self.bad_key: tuple[str, Any] | None = None
        self.tag_dict: str | None = None
        self.tuples = False


def _scan(value: Any, root: str) -> _Scan:
    """Walk ``value`` (already encoded, so acyclic). An explicit stack: no recursion limit
    to meet."""
    found = _Scan()
    stack: list[tuple[Any, str]] = [(value, root)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            if len(item) == 1 and TAG in item and found.tag_dict is None:
                found.tag_dict = path
            for key, child in item.items():
                if not isinstance(key, str):
                    found.bad_key = (path, key)
                    return found
                if isinstance(child, _CONTAINERS):
                    stack.append((child, f"{path}[{key!r}]"))
        elif isinstance(item, list | tuple):
            if type(item) is tuple:
                found.tuples = True
            for i, child in enumerate(item):
                if isinstance(child, _CONTAINERS):
                    stack.append((child, f"{path}[{i}]"))
    return found


def _with_tuples(value: Any) -> Any:
    """``value`` with each tuple in its tagged form (the encoder writes tuples as lists)."""
    kind = type(value)
    if kind is tuple:
        return {TAG: ["tuple", [_with_tuples(v) for v in value]]}
    if kind is list:
        return [_with_tuples(v) for v in value]
    if kind is dict:
        return {k: _with_tuples(v) for k, v in value.items()}
    return value


def _nested(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> bool:
    """Whether the arguments need the walk: the usual call (scalars passed by position or
    keyword) has no dict to look into. A loop, not any(): this is on enqueue's hot path."""
    for arg in args:
        if isinstance(arg, _CONTAINERS):
            return True
    if len(kwargs) == 1 and TAG in kwargs:
        return True
    for key, value in kwargs.items():
        if type(key) is not str or isinstance(value, _CONTAINERS):
            return True
    return False


def _refuse(value: Any, root: str, what: str) -> bool:
    """Refuse what would not read back as given; True when ``value`` has tuples (to encode
    again, tagged). JSON keys are strings: the encoder would store ``{1: 'a'}`` as
    ``{"1": "a"}`` and ``{True: 1}`` as ``{"true": 1}``, so the task would get other arguments
    than were given (and a caller another result than was returned). Refused, naming where."""
    found = _scan(value, root)
    if found.bad_key is not None:
        path, key = found.bad_key
        stored = _ENCODER.encode({key: 0})[1:-3]  # what the key would have become
        raise PayloadError(
            f"{what}: key {key!r} ({type(key).__name__}) in {path} is not a string; JSON keys "
            f"are strings, so it would be stored as {stored}: use string keys"
        )
    if found.tag_dict is not None:
        raise PayloadError(
            f"{what}: the dict in {found.tag_dict} has the one key {TAG!r}, which jobqueue "
            "reserves for tagged values (datetime, Decimal, ...): rename the key"
        )
    return found.tuples


def _tagged_again(value: Any, what: str) -> str:
    try:
        return _dumps(_with_tuples(value), what)
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
    what = "task arguments"
    data = {"args": list(args), "kwargs": kwargs}
    text = _dumps(data, what)
    if _nested(args, kwargs):
        tuples = _refuse(data["args"], "args", what)
        tuples = _refuse(kwargs, "kwargs", what) or tuples
        if len(kwargs) == 1 and TAG in kwargs:
            raise PayloadError(
                f"{what}: a single keyword argument called {TAG!r} would read back as a "
                "tagged value: rename it"
            )
        if tuples:
            text = _tagged_again(data, what)
    return _check_size(text, limit, what)


ARGS_HEAD = '{"args":['


def args_tail(payload: str, has_args: bool) -> str:
    """What follows values put first in an encoded payload's arguments: a run that receives its
    dependencies' results gets ``ARGS_HEAD + results + args_tail`` (lua/deliver.lua)."""
    if not payload.startswith(ARGS_HEAD):  # encode_payload always writes it so
        raise PayloadError("task arguments were not encoded as expected")
    rest = payload[len(ARGS_HEAD):]
    return "," + rest if has_args else rest


def decode_payload(text: str) -> tuple[list[Any], dict[str, Any]]:
    """Arguments back from Redis; anything malformed raises PayloadError (never executes)."""
    try:
        data = _loads(text)
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
    if isinstance(value, _CONTAINERS) and _refuse(value, "result", "task result"):
        text = _tagged_again(value, "task result")
    return _check_size(text, limit, "task result")


def decode_result(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return _loads(text)
    except (ValueError, RecursionError):
        return text  # a record written by something else: show it as it is
