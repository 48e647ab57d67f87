"""The script contract: one typed ``Contract`` object per Lua script (in ``runs``, ``schedules``
and ``admin``; every one of them by name in ``catalog``) names the script's KEYS and fixed ARGV
in order, its variadic ARGV tail, how a call is built and how its reply is parsed. Every call
of a script is built by its contract and every reply parsed by it, so a caller never spells a
key order, an argument position or a reply layout.

The KEYS (with their Redis types) and ARGV are spelled once, in the Lua file's header: a
contract takes its ``keys``, ``args`` and ``tail`` from it (``headers()`` reads them), and a
builder's Wire names them (its dict keys, a keys object's attributes), checked against the
header at every call (ContractError). tests/test_script_contract.py checks each builder and
that no contract spells its own; tests/test_script_corrupt_data.py plants foreign types by
the header's. Header lines (see lua/claim.lua):

    -- KEYS[1]  due       zset    jq:{q#p}:due   ...
    -- ARGV[1]  now                now ms, or '' for the server clock
    -- ARGV[4..] runs              3 fields per run: ...
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from operator import itemgetter
from typing import Any, Generic, NamedTuple, ParamSpec, TypeVar

from jobqueue.store.scripts import SCRIPT_NAMES, ArgT, Call, header_of, lua_dir

NowArg = int | None

P = ParamSpec("P")
R = TypeVar("R")


def now_arg(now: NowArg) -> str | int:
    """ARGV[1] of every script: the caller's clock (tests) or '' for the server's."""
    return "" if now is None else int(now)


def text(value: Any) -> str:
    """A reply element as text (a client without decode_responses answers bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Wire(NamedTuple):
    """What a contract's builder returns: where the keys come from (a hashable object with the
    key names as attributes, such as a partition's keys, or a dict of name to key), the fixed
    ARGV by name, and the variadic tail."""

    keys: Any
    args: Mapping[str, ArgT]
    tail: Sequence[ArgT] = ()


class ContractError(ValueError):
    """A builder that does not give what its contract names (a bug, never bad input)."""


_HEADER = object()  # Contract's default: what the script's header says


class Contract(Generic[P, R]):
    """One script: its name, KEYS and fixed ARGV by name and the name of its variadic ARGV tail
    (None when it has none), all read from its Lua header (lua/<name>.lua), ``call(...)`` to
    build a Call (typed like the builder) and ``parse(reply)`` to read the reply. ``keys``,
    ``args`` and ``tail`` are given only for a script that is not in lua/ (tests)."""

    __slots__ = ("_build", "_key_cache", "_parse", "_pick", "args", "keys", "name", "tail")

    def __init__(
        self,
        name: str,
        *,
        build: Callable[P, Wire],
        parse: Callable[[Any], R],
        keys: tuple[str, ...] | None = None,
        args: tuple[str, ...] | None = None,
        tail: Any = _HEADER,
    ) -> None:
        if keys is None or args is None:
            header = headers()[name]
            keys = header.keys if keys is None else keys
            args = header.args if args is None else args
            tail = header.tail if tail is _HEADER else tail
        elif tail is _HEADER:
            tail = None
        self.name = name
        self.keys: tuple[str, ...] = keys
        self.args: tuple[str, ...] = args
        self.tail: str | None = tail
        self._build = build
        self._parse = parse
        # The fixed ARGV in the script's order, picked by name (itemgetter: a call is built per
        # enqueue and per claim, where a microsecond shows).
        pick = itemgetter(*args)
        self._pick: Callable[[Mapping[str, ArgT]], tuple[ArgT, ...]] = (
            pick if len(args) > 1 else lambda fixed: (pick(fixed),)
        )
        # A partition's keys object is built once and reused: its KEYS tuple is worked out
        # once (the claim and commit paths call per batch).
        self._key_cache: dict[Any, tuple[str, ...]] = {}

    def __repr__(self) -> str:
        return f"Contract({self.name!r})"

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Call:
        source, fixed, tail = self._build(*args, **kwargs)
        if len(fixed) != len(self.args):
            raise ContractError(f"{self.name} takes ARGV {self.args}, not {tuple(fixed)}")
        try:
            values = self._pick(fixed)
        except KeyError as exc:
            raise ContractError(f"{self.name} takes ARGV {self.args}, not {tuple(fixed)}") from exc
        if tail:
            if self.tail is None:
                raise ContractError(f"{self.name} takes no ARGV beyond {self.args}")
            values += tuple(tail)
        keys = self._key_cache.get(source) if type(source) is not dict else None
        if keys is None:
            keys = self._keys_of(source)
        return Call(self.name, keys, values)

    def parse(self, reply: Any) -> R:
        return self._parse(reply)

    def _keys_of(self, source: Any) -> tuple[str, ...]:
        if isinstance(source, Mapping):  # keys that are not a partition's (a run's record)
            if set(source) != set(self.keys):
                raise ContractError(f"{self.name} takes keys {self.keys}, not {tuple(source)}")
            return tuple(source[name] for name in self.keys)
        found = tuple(getattr(source, name) for name in self.keys)
        self._key_cache[source] = found
        return found


# -- the Lua headers ---------------------------------------------------------------------------

_KEY = re.compile(r"^-- KEYS\[(\d+)\]\s+(\w+)\s+(\w+)", re.M)
_KINDS = frozenset({"string", "list", "set", "hash", "zset"})
_ARG = re.compile(r"^-- ARGV\[(\d+)(\.\.)?\]\s+(\w+)", re.M)


@dataclass(frozen=True)
class Header:
    """What a Lua file's header declares."""

    name: str
    keys: tuple[str, ...]
    kinds: tuple[str, ...]  # the Redis type of each key, as its header line says
    args: tuple[str, ...]  # the fixed ARGV, in order
    tail: str | None  # the name of a variadic ARGV tail (ARGV[n..]), if any
    tail_at: int | None  # n of ARGV[n..]

    def kind_of(self, key: str) -> str:
        """The Redis type the script expects at the key it calls ``key`` (e.g. 'zset')."""
        return self.kinds[self.keys.index(key)]


def parse_header(name: str, source: str) -> Header:
    header = _header(source)
    declared = _KEY.findall(header)
    keys = _numbered([(int(n), k) for n, k, _ in declared], name, "KEYS")
    kinds = tuple(kind for _, _, kind in declared)
    if not set(kinds) <= _KINDS:
        raise ValueError(f"{name}.lua: a KEYS line's type is not one of {sorted(_KINDS)}")
    fixed: list[tuple[int, str]] = []
    tail, tail_at = None, None
    for n, dots, arg in _ARG.findall(header):
        if dots:
            tail, tail_at = arg, int(n)
        else:
            fixed.append((int(n), arg))
    return Header(name, keys, kinds, _numbered(fixed, name, "ARGV"), tail, tail_at)


def _header(source: str) -> str:
    """The leading comment block."""
    return header_of(source)


def _numbered(items: list[tuple[int, str]], script: str, what: str) -> tuple[str, ...]:
    if [n for n, _ in items] != list(range(1, len(items) + 1)):
        raise ValueError(f"{script}.lua: {what} in its header are not numbered 1..n")
    return tuple(name for _, name in items)


@cache
def headers() -> dict[str, Header]:
    directory = lua_dir()
    return {
        name: parse_header(name, (directory / f"{name}.lua").read_text())
        for name in SCRIPT_NAMES
    }
