"""The script contract: each Lua file's header names its KEYS (with their Redis types) and ARGV
in order, and this module reads those names. Calls take their keys by name from an object that
has them as attributes (a partition's or a scheduler partition's keys), so a builder cannot pass
them in an order the script does not read; tests/test_script_contract.py checks every builder
against the header, and tests/test_script_corrupt_data.py plants foreign types by the header's.

Header lines (see lua/claim.lua):

    -- KEYS[1]  due       zset    jq:{q#p}:due   ...
    -- ARGV[1]  now                now ms, or '' for the server clock
    -- ARGV[4..] runs              3 fields per run: ...
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from jobqueue.store.scripts import SCRIPT_NAMES, ArgT, Call, lua_dir

_KEY = re.compile(r"^-- KEYS\[(\d+)\]\s+(\w+)\s+(\w+)", re.M)
_KINDS = frozenset({"string", "list", "set", "hash", "zset"})
_ARG = re.compile(r"^-- ARGV\[(\d+)(\.\.)?\]\s+(\w+)", re.M)


@dataclass(frozen=True)
class Contract:
    name: str
    keys: tuple[str, ...]
    kinds: tuple[str, ...]  # the Redis type of each key, as its header line says
    args: tuple[str, ...]  # the fixed ARGV, in order
    tail: str | None  # the name of a variadic ARGV tail (ARGV[n..]), if any
    _key_cache: dict[Any, tuple[str, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def kind_of(self, key: str) -> str:
        """The Redis type the script expects at the key it calls ``key`` (e.g. 'zset')."""
        return self.kinds[self.keys.index(key)]

    def keys_of(self, source: Any) -> tuple[str, ...]:
        """The KEYS, in the script's order, from the attributes of ``source`` (cached: a
        partition's keys object is built once and reused)."""
        found = self._key_cache.get(source)
        if found is None:
            found = tuple(getattr(source, name) for name in self.keys)
            self._key_cache[source] = found
        return found

    def call(self, source: Any, args: Sequence[ArgT]) -> Call:
        return Call(self.name, self.keys_of(source), tuple(args))

    def call_with(self, keys: dict[str, str], args: Sequence[ArgT]) -> Call:
        """For keys that are not a partition's (a run's record, a fenced resource)."""
        if set(keys) != set(self.keys):
            raise ValueError(f"{self.name} takes keys {self.keys}, not {tuple(keys)}")
        return Call(self.name, tuple(keys[name] for name in self.keys), tuple(args))


def parse_header(name: str, text: str) -> Contract:
    header = _header(text)
    declared = _KEY.findall(header)
    keys = _numbered([(int(n), k) for n, k, _ in declared], name, "KEYS")
    kinds = tuple(kind for _, _, kind in declared)
    if not set(kinds) <= _KINDS:
        raise ValueError(f"{name}.lua: a KEYS line's type is not one of {sorted(_KINDS)}")
    fixed: list[tuple[int, str]] = []
    tail = None
    for n, dots, arg in _ARG.findall(header):
        if dots:
            tail = arg
        else:
            fixed.append((int(n), arg))
    return Contract(name, keys, kinds, _numbered(fixed, name, "ARGV"), tail)


def _header(text: str) -> str:
    """The leading comment block."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def _numbered(items: list[tuple[int, str]], script: str, what: str) -> tuple[str, ...]:
    if [n for n, _ in items] != list(range(1, len(items) + 1)):
        raise ValueError(f"{script}.lua: {what} in its header are not numbered 1..n")
    return tuple(name for _, name in items)


@cache
def contracts() -> dict[str, Contract]:
    directory = lua_dir()
    return {
        name: parse_header(name, (directory / f"{name}.lua").read_text())
        for name in SCRIPT_NAMES
    }


def contract(name: str) -> Contract:
    return contracts()[name]
