"""The schedulers' registry and the leases of the scheduler partitions, as read: who runs
(``jq:schedulers``, one entry per scheduler, refreshed every tick) and who owns which partition
(``jq:{sched#k}:owner``), as I/O-free steps for both clients (``await
ajq.run_steps(members_steps())`` on an AsyncJobQueue), and the registry's writes. The leases
themselves are taken by ``jobqueue.recurring.membership``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from jobqueue.anomalies import Anomaly, Listing, checked
from jobqueue.recurring.config import DEFAULT_PARTITION_LEASE_S
from jobqueue.store.io import Steps, checked_commands, cmd, commands, server_time_steps
from jobqueue.store.keys import SchedKeys

SCHEDULERS_KEY = "jq:schedulers"


@dataclass(frozen=True)
class SchedulerInfo:
    """One registry entry, as ``jobqueue schedules partitions`` shows it."""

    id: str
    host: str
    pid: int
    started_ms: int
    seen_ms: int
    lease_ms: int
    partitions: list[int]
    lookahead_ms: int  # this tick's (it grows for a herd)
    rate: float | None  # runs/s this scheduler measured creating a herd (None: not yet)
    seen_ago_ms: int = 0
    base_lookahead_ms: int = 0  # --lookahead
    max_lookahead_ms: int = 0  # --max-lookahead

    @property
    def live(self) -> bool:
        return self.seen_ago_ms <= self.lease_ms

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "live": self.live}


def parse_member(name: str, raw: Any, now_ms: int) -> SchedulerInfo:
    """A registry entry; ValueError (and friends) when it is not one a scheduler writes."""
    info = json.loads(raw)
    if not isinstance(info, dict):
        raise TypeError("not a JSON object")
    parts = info.get("partitions", [])
    if not isinstance(parts, list) or not all(type(p) is int for p in parts):
        raise TypeError(f"partitions is {parts!r}, not a list of integers")
    rate = info.get("rate")
    if rate is not None and not (isinstance(rate, int | float) and math.isfinite(rate)):
        raise TypeError(f"rate is {rate!r}, not a number")
    seen = int(info["seen_ms"])
    return SchedulerInfo(
        id=str(info.get("id", name)),
        host=str(info.get("host", "?")),
        pid=int(info.get("pid", 0)),
        started_ms=int(info.get("started_ms", 0)),
        seen_ms=seen,
        lease_ms=int(info.get("lease_ms", DEFAULT_PARTITION_LEASE_S * 1000)),
        partitions=sorted(parts),
        lookahead_ms=int(info.get("lookahead_ms", 0)),
        rate=None if rate is None else float(rate),
        seen_ago_ms=now_ms - seen,
        base_lookahead_ms=int(info.get("base_lookahead_ms") or info.get("lookahead_ms") or 0),
        max_lookahead_ms=int(info.get("max_lookahead_ms") or info.get("lookahead_ms") or 0),
    )




def members_steps(now_ms: int | None = None) -> Steps[Listing[SchedulerInfo]]:
    """The registry; an entry that is not one a scheduler writes is an anomaly."""
    now = yield from server_time_steps(now_ms)
    found: list[Anomaly] = []
    (reply,) = yield commands(cmd("hgetall", SCHEDULERS_KEY))
    entries = checked(reply, SCHEDULERS_KEY, "hash", found, {})
    out = []
    for name, raw in sorted(entries.items()):
        try:
            out.append(parse_member(name, raw, now))
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            what = f"{type(exc).__name__}: {exc}"[:120]
            found.append(Anomaly(SCHEDULERS_KEY, f"field {name!r} is not a scheduler ({what})"))
    return Listing(sorted(out, key=lambda m: m.id), found)


def register_steps(scheduler_id: str, entry: str) -> Steps[None]:
    """Write one scheduler's registry entry."""
    yield from checked_commands(cmd("hset", SCHEDULERS_KEY, scheduler_id, entry))


def forget_steps(*scheduler_ids: str) -> Steps[None]:
    """Delete registry entries (a scheduler that left, or one long gone)."""
    if scheduler_ids:
        yield from checked_commands(cmd("hdel", SCHEDULERS_KEY, *scheduler_ids))


@dataclass(frozen=True)
class PartitionOwner:
    """Who owns one scheduler partition, as read (``jobqueue schedules partitions``)."""

    partition: int
    prefix: str
    owner: str  # '' when none
    token: int
    until_ms: int
    jobs: int  # recurring jobs with a next fire in the partition
    node: str | None = None  # on a cluster: the master serving its slot
    anomalies: tuple[Anomaly, ...] = ()

    def held(self, now_ms: int) -> bool:
        return bool(self.owner) and self.until_ms >= now_ms

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["anomalies"] = [a.to_dict() for a in self.anomalies]
        return d


def _whole(value: Any) -> int | None:
    text = value.decode() if isinstance(value, bytes) else value
    if isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 18:
        return int(text)
    return None




def owners_steps(keys: Sequence[SchedKeys]) -> Steps[list[PartitionOwner]]:
    """Each partition's lease and job count, in one round trip; garbage is an anomaly of its
    row. ``node`` is left None (the sync ``membership.read_owners`` names the masters)."""
    if not keys:
        return []
    replies = yield commands(
        *(c for sk in keys for c in (cmd("hmget", sk.owner, "owner", "token", "until"),
                                     cmd("zcard", sk.next)))
    )  # fmt: skip
    out = []
    for i, sk in enumerate(keys):
        found: list[Anomaly] = []
        lease = checked(replies[2 * i], sk.owner, "hash", found, [None, None, None])
        jobs = checked(replies[2 * i + 1], sk.next, "sorted set", found, 0)
        owner = lease[0].decode() if isinstance(lease[0], bytes) else (lease[0] or "")
        token, until = _whole(lease[1]), _whole(lease[2])
        for name, raw, value in (("token", lease[1], token), ("until", lease[2], until)):
            if raw is not None and value is None:
                found.append(Anomaly(sk.owner, f"field {name!r} is {raw!r}, not an integer"))
        out.append(
            PartitionOwner(
                sk.partition, sk.prefix, str(owner), token or 0, until or 0, int(jobs), None,
                tuple(found),
            )
        )
    return out
