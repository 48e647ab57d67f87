"""What ``jobqueue check`` says about the schedulers (when recurring jobs or schedulers exist,
and the user may read jobqueue's keys): whether every scheduler partition has an owner while
schedulers run, and whether the largest herd of the next 24 hours can be created within the
lookahead the schedulers can use, at the creation rate they measured (or the one assumed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from jobqueue.errors import JobQueueError
from jobqueue.policy.cron import format_fire_instant
from jobqueue.policy.health import Check, ok, warn
from jobqueue.recurring.config import (
    DEFAULT_CREATE_RATE,
    DEFAULT_LOOKAHEAD_MS,
    LOOKAHEAD_MARGIN,
    MAX_LOOKAHEAD_FACTOR,
)
from jobqueue.recurring.definitions import SCHED_CONFIG_KEY
from jobqueue.recurring.membership import read_members, read_owners
from jobqueue.recurring.registry import SCHEDULERS_KEY
from jobqueue.store.io import Steps, checked_commands, cmd, commands, raised
from jobqueue.store.keys import SchedKeys

if TYPE_CHECKING:
    from jobqueue.client.sync import JobQueue

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Herd:
    """The most jobs firing within one window of ``width_ms`` found, and where it starts."""

    jobs: int
    at_ms: int
    width_ms: int


def _counts(
    jq: JobQueue, keys: Sequence[SchedKeys], windows: Sequence[tuple[int, int]]
) -> list[int]:
    """Jobs with a next fire in each [lo, hi] window, summed over the partitions (ZCOUNT,
    pipelined)."""
    replies = jq.run_steps(
        checked_commands(*[cmd("zcount", sk.next, lo, hi) for sk in keys for lo, hi in windows])
    )
    n = len(windows)
    return [sum(int(replies[k * n + i]) for k in range(len(keys))) for i in range(n)]


def largest_herd(
    jq: JobQueue, keys: Sequence[SchedKeys], now_ms: int, width_ms: int
) -> Herd:
    """The largest number of jobs firing within any ``width_ms`` of the next 24 h: the busiest
    hours first (24 ZCOUNTs a partition), then half-overlapping windows of ``width_ms / 2``
    over the two busiest (a herd within ``width_ms`` always falls in two adjacent ones)."""
    hours = [(now_ms + i * HOUR_MS, now_ms + (i + 1) * HOUR_MS) for i in range(24)]
    per_hour = _counts(jq, keys, hours)
    best = Herd(0, now_ms, width_ms)
    half = max(1, width_ms // 2)
    busiest = sorted(range(24), key=lambda i: -per_hour[i])[:2]
    for i in busiest:
        if not per_hour[i]:
            continue
        lo = max(now_ms, hours[i][0] - width_ms)
        edges = list(range(lo, hours[i][1] + width_ms, half))
        windows = [(a, a + half - 1) for a in edges]
        counts = _counts(jq, keys, windows)
        for j in range(len(windows)):
            jobs = counts[j] + (counts[j + 1] if j + 1 < len(windows) else 0)
            if jobs > best.jobs:
                best = Herd(jobs, windows[j][0], width_ms)
    return best


def _fmt(n: float) -> str:
    return f"{round(n):,}"


def checks(jq: JobQueue, create_rate: float | None = None) -> list[Check]:
    """The scheduler lines of ``jobqueue check`` (none when no recurring job and no scheduler
    was ever seen)."""
    try:
        return _checks(jq, create_rate)
    except (JobQueueError, redis.exceptions.RedisError, redis.exceptions.RedisClusterException
            ) as exc:  # fmt: skip
        return [warn("schedulers", f"schedulers unknown: not read ({exc})")]


def _ever_seen_steps() -> Steps[bool]:
    """Whether a recurring job or a scheduler was ever seen (the second EXISTS only when the
    first finds nothing)."""
    for key in (SCHED_CONFIG_KEY, SCHEDULERS_KEY):
        (found,) = raised((yield commands(cmd("exists", key))))
        if found:
            return True
    return False


def _checks(jq: JobQueue, create_rate: float | None) -> list[Check]:
    try:
        if not jq.run_steps(_ever_seen_steps()):
            return []
    except redis.exceptions.NoPermissionError:
        return []  # a user who may not read jobqueue's keys: nothing to say of schedulers
    now = jq.server_time_ms()
    keys = jq.recurring.all_keys()
    owners = read_owners(jq, keys)
    members = read_members(jq, now)
    live = [m for m in members if m.live]
    jobs = sum(o.jobs for o in owners)
    out: list[Check] = []
    unowned = [o.partition for o in owners if not o.held(now)]
    where = f"{len(keys)} scheduler partition(s), {_fmt(jobs)} recurring job(s) scheduled"
    if not live:
        out.append(ok("schedulers", f"no scheduler running ({where}): recurring jobs fire "
                      "only while one runs"))  # fmt: skip
    elif unowned:
        shown = ", ".join(str(p) for p in unowned[:10]) + (", ..." if len(unowned) > 10 else "")
        out.append(warn("schedulers", f"scheduler partition(s) {shown} of {len(keys)} have no "
                        f"owner while {len(live)} scheduler(s) run: their jobs do not fire "
                        "until one takes them (a lease just expired, or their master is "
                        "unreachable); see `jobqueue schedules partitions`"))  # fmt: skip
    else:
        shares = sorted((len(m.partitions) for m in live), reverse=True)
        out.append(ok("schedulers", f"{len(live)} scheduler(s) share {where}; partitions "
                      f"owned: {', '.join(str(s) for s in shares)}"))  # fmt: skip
    if jobs:
        out.append(herd_check(jq, keys, now, live, create_rate))
    return out


def herd_check(
    jq: JobQueue, keys: Sequence[SchedKeys], now: int, live: Sequence[Any],
    create_rate: float | None,
) -> Check:
    """Can the largest herd be created before it fires? The schedulers' lookahead (up to
    their --max-lookahead) is how early creation can start; the rate is what they measured
    (summed: they work on their own partitions at once), else ``create_rate`` per scheduler."""
    base = max((m.base_lookahead_ms for m in live), default=DEFAULT_LOOKAHEAD_MS)
    most = max((m.max_lookahead_ms for m in live), default=base * MAX_LOOKAHEAD_FACTOR)
    herd = largest_herd(jq, keys, now, max(base, 1000))
    measured = [m.rate for m in live if m.rate]
    if measured:
        rate, source = sum(measured), f"measured by {len(measured)} scheduler(s)"
    else:
        rate = (create_rate or DEFAULT_CREATE_RATE) * max(1, len(live))
        source = "assumed: no scheduler has measured one yet"
    needed_s = herd.jobs / rate
    what = (f"largest herd of the next 24 h: {_fmt(herd.jobs)} jobs firing within "
            f"{herd.width_ms / 1000:g} s of {format_fire_instant(herd.at_ms)}; created at "
            f"{_fmt(rate)} runs/s ({source}) in {needed_s:,.0f} s")  # fmt: skip
    if needed_s * LOOKAHEAD_MARGIN <= most / 1000:
        return ok("herd", f"{what}, within the {most / 1000:g} s the lookahead may grow to")
    wanted = (
        f", or reach {_fmt(math.ceil(herd.jobs * LOOKAHEAD_MARGIN / (most / 1000)))} runs/s "
        "with more schedulers and masters (`jobqueue capacity`)" if most > 0 else ""
    )
    return warn("herd", f"{what}: more than the {most / 1000:g} s the lookahead may grow to "
                "(with its margin), so runs will be created after their fire time. Raise "
                "--lookahead or --max-lookahead, spread the jobs' fire times (cron minutes, "
                f"not only jitter){wanted}")  # fmt: skip
