"""Exact limits: a queue's concurrency and rate limits that hold across all its partitions
and masters, through permits leased from the limit's own slot (permit_take.lua,
permit_settle.lua, global_limit.lua). A worker takes permits before it claims, binds each to
the run it claimed (or drops it), extends them with its heartbeats and gives them back with
its commits; a permit outlives its run's lease by PERMIT_MARGIN_MS and expires by itself
when its worker dies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from jobqueue.store.contract import Contract, NowArg, Wire, now_arg, text

# How much longer than its run's lease a permit lives: the limit's master and a partition's
# may disagree on the time, and a round trip lies between a permit's grant and its claim.
PERMIT_MARGIN_MS = 2_000


@dataclass(frozen=True)
class ExactKeys:
    """The keys of one queue's exact limits, in a slot of their own (``{q#exact}``: a
    partition's tag is ``{q#<digits>}`` or ``{q#<digits>~xyz}``, never this)."""

    queue: str

    @cached_property
    def prefix(self) -> str:
        return f"jq:{{{self.queue}#exact}}:"

    @cached_property
    def permits(self) -> str:
        return self.prefix + "permits"

    @cached_property
    def limits(self) -> str:
        return self.prefix + "limits"

    @cached_property
    def grants(self) -> str:
        return self.prefix + "grants"


def run_permit(partition_prefix: str, run_id: str, fence: int) -> str:
    """The permit a claimed run holds: its partition, id and fence."""
    return f"{partition_prefix}|{run_id}|{fence}"


class Taken(NamedTuple):
    now_ms: int
    granted: int  # permits '<token>:1' .. '<token>:granted'
    next_ms: int | None  # when a permit may free, if known
    limited: bool  # the queue has an exact limit (else every permit asked for is granted)


def _take(keys: ExactKeys, want: int, hold_ms: int, token: str, now: NowArg = None) -> Wire:
    return Wire(keys, {"now": now_arg(now), "want": want, "hold_ms": hold_ms, "token": token})


def _parse_take(reply: Any) -> Taken:
    nxt = int(reply[2])
    return Taken(int(reply[0]), int(reply[1]), None if nxt < 0 else nxt, int(reply[3]) == 1)


PERMIT_TAKE = Contract(
    "permit_take",
    build=_take,
    parse=_parse_take,
)


class Settled(NamedTuple):
    bound: int
    extended: int
    returned: int
    refused: list[str]  # run permits whose bind was refused: their runs must not run


def _settle(
    keys: ExactKeys,
    live_ms: int,
    binds: Sequence[tuple[str, str]] = (),
    unused: Sequence[str] = (),
    extends: Sequence[str] = (),
    returns: Sequence[str] = (),
    now: NowArg = None,
) -> Wire:
    tail: list[str | int] = [len(binds)]
    for taken, member in binds:
        tail += [taken, member]
    tail += [len(unused), *unused, len(extends), *extends, len(returns), *returns]
    return Wire(keys, {"now": now_arg(now), "live_ms": live_ms}, tail)


def _parse_settle(reply: Any) -> Settled:
    return Settled(int(reply[0]), int(reply[1]), int(reply[2]), [text(r) for r in reply[3:]])


PERMIT_SETTLE = Contract(
    "permit_settle",
    build=_settle,
    parse=_parse_settle,
)


def _global_limit(keys: ExactKeys, name: str, value: int | str | None, now: NowArg = None) -> Wire:
    return Wire(
        keys, {"now": now_arg(now), "name": name, "value": "" if value is None else value}
    )


GLOBAL_LIMIT = Contract(
    "global_limit",
    build=_global_limit,
    parse=lambda reply: int(reply) == 1,
)

CONTRACTS = (PERMIT_TAKE, PERMIT_SETTLE, GLOBAL_LIMIT)
