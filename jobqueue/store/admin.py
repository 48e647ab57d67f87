"""The contracts of the operator's scripts on a queue partition: purging dead runs for good
(``jobqueue dead purge``), putting runs back in their index (``jobqueue repair``), pausing
or resuming claims (``jobqueue queue pause``) and setting flow limits (``jobqueue queue
limit``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from jobqueue.anomalies import stored_int
from jobqueue.models import QueueLimits
from jobqueue.store.contract import Contract, NowArg, Wire, now_arg
from jobqueue.store.keys import PartitionKeys


class Purged(NamedTuple):
    purged: int
    refused: int  # no longer dead (requeued meanwhile) or gone


def _purge(pk: PartitionKeys, run_ids: Sequence[str], now: NowArg = None) -> Wire:
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix}, run_ids)


def _parse_purge(reply: Sequence[Any]) -> Purged:
    return Purged(int(reply[0]), int(reply[1]))


PURGE = Contract(
    "purge",
    build=_purge,
    parse=_parse_purge,
)


class Repaired(NamedTuple):
    indexed: int  # records given their missing index entry
    orphaned: int  # index entries without a record, moved to the orphans index
    unorphaned: int  # orphans whose record is back, put back in place
    unchanged: int


def _repair(
    pk: PartitionKeys, run_ids: Sequence[str], dry_run: bool = False, now: NowArg = None
) -> Wire:
    return Wire(
        pk,
        {"now": now_arg(now), "prefix": pk.prefix, "dry_run": "1" if dry_run else "0"},
        run_ids,
    )


def _parse_repair(reply: Sequence[Any]) -> Repaired:
    return Repaired(*(int(x) for x in reply[:4]))


REPAIR = Contract(
    "repair",
    build=_repair,
    parse=_parse_repair,
)

def _pause(pk: PartitionKeys, paused: bool, now: NowArg = None) -> Wire:
    return Wire(
        pk,
        {"now": now_arg(now), "prefix": pk.prefix, "action": "pause" if paused else "resume"},
    )


def _parse_pause(reply: Any) -> bool:
    """True when the call changed the partition, False when it already was so."""
    return int(reply) == 1


PAUSE = Contract(
    "pause",
    build=_pause,
    parse=_parse_pause,
)


def rate_value(count: int, window_ms: int) -> str:
    """A rate limit as set_limit takes it and claim reads it: count claims in window_ms."""
    return f"{count} {window_ms}"


def parse_rate(stored: Any) -> tuple[int, int] | None:
    """A stored rate limit 'N W' as (N, W ms), or None when it is not one."""
    if isinstance(stored, str):
        n, _, w = stored.partition(" ")
        if n.isascii() and n.isdigit() and w.isascii() and w.isdigit() and int(w) >= 1:
            return int(n), int(w)
    return None


def _count(stored: Any) -> int | None:
    value = stored_int(stored)
    return None if value is None or value < 0 else value


def limits_of(fields: dict[Any, Any]) -> QueueLimits:
    """A partition's limits hash read as QueueLimits (what is not a limit counts as none)."""
    text = {
        (k.decode(errors="replace") if isinstance(k, bytes) else str(k)): (
            v.decode(errors="replace") if isinstance(v, bytes) else v
        )
        for k, v in fields.items()
    }
    tasks = {}
    for name, value in text.items():
        if name.startswith("task:") and len(name) > 5:
            cap = _count(value)
            if cap is not None:
                tasks[name[5:]] = cap
    return QueueLimits(
        _count(text.get("concurrency")),
        parse_rate(text.get("rate")),
        _count(text.get("key_concurrency")),
        parse_rate(text.get("key_rate")),
        dict(sorted(tasks.items())),
    )


def _set_limit(
    pk: PartitionKeys, name: str, value: int | str | None, now: NowArg = None
) -> Wire:
    return Wire(
        pk,
        {
            "now": now_arg(now),
            "prefix": pk.prefix,
            "name": name,
            "value": "" if value is None else value,
        },
    )


SET_LIMIT = Contract(
    "set_limit",
    build=_set_limit,
    parse=_parse_pause,  # the same reply: 1 changed, 0 already so
)

CONTRACTS = (PURGE, REPAIR, PAUSE, SET_LIMIT)
