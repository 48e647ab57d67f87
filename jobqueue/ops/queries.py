"""Read-only views of queues, leases, runs and workers: the data behind the ops CLI (and any
dashboard). Never blocks the server: bounded ZRANGEs and pipelined HMGETs, no KEYS.

Each is written once as steps (``jobqueue.store.io``: ``stats_steps``, ``leases_steps``,
``workers_steps``, ``runs_steps``, ``schedules_steps``, ``throughput_steps``,
``top_snapshot_steps``), which either client drives: ``await ajq.run_steps(stats_steps(ajq))``
on an ``AsyncJobQueue``; the plain functions (``stats(jq)``, ...) drive them on a sync
``JobQueue``.

Foreign or corrupt data in jobqueue's keys (a key of another type, a garbage field, a queue
whose partition count is not usable) never fails a listing: each function returns a
:class:`~jobqueue.anomalies.Listing`, whose rows carry the anomalies found in them and whose
``anomalies`` hold those that are no row's (see ``jobqueue.anomalies``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from jobqueue.anomalies import (
    Anomaly,
    Listing,
    checked,
    score_ms,
    stored_int,
    unique,
)
from jobqueue.client.core import ClientCore
from jobqueue.client.sync import JobQueue
from jobqueue.ops.listing import RunPage, RunQuery, runs_page_steps
from jobqueue.ops.partitions import partitions_steps
from jobqueue.recurring.info import ScheduleInfo
from jobqueue.recurring.steps import LIST_SCAN_COUNT
from jobqueue.store.admin import limits_of, parse_rate
from jobqueue.store.io import Cmd, Steps, cmd, commands, server_time_steps
from jobqueue.store.keys import WORKERS_KEY, PartitionKeys

# A worker heartbeats every lease/3; three missed beats and it is probably gone.
STALE_AFTER_BEATS = 3
# A worker's entry is pruned from the registry once it missed this many heartbeats (by the
# live workers, or at once by `jobqueue workers prune` when stale).
PRUNE_AFTER_BEATS = 10
# Partitions per pipelined round trip: a queue of MAX_PARTITIONS never builds one huge
# pipeline (and reply) in memory.
PARTITION_CHUNK = 512
# Run records read per round trip by `runs`, which stops reading once it has `limit` rows.
RECORD_CHUNK = 500


@dataclass(frozen=True)
class Lease:
    run_id: str
    queue: str
    partition: int
    task: str
    owner: str
    host: str | None
    pid: int | None
    fence: int
    attempt: int
    lease_until_ms: int
    remaining_ms: int  # negative: expired, waiting to be reclaimed
    running_for_ms: int | None
    anomalies: tuple[Anomaly, ...] = ()

    @property
    def expired(self) -> bool:
        return self.remaining_ms < 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "expired": self.expired}


@dataclass(frozen=True)
class PartitionStats:
    queue: str
    partition: int
    due_now: int
    scheduled_later: int
    running: int
    expired_leases: int
    dead: int
    done_last_minute: int
    done_last_hour: int
    oldest_due_age_ms: int | None
    counters: dict[str, int]
    # Absolute due time of the oldest due run, so a view can show it relative and absolute.
    oldest_due_ms: int | None = None
    # Keys of this partition that could not be read as jobqueue writes them (counted as 0).
    anomalies: tuple[Anomaly, ...] = ()
    slot: int | None = None  # the Redis Cluster slot of its keys (its hash tag's)
    node: str | None = None  # on a cluster: the master serving that slot (host:port)
    paused: bool = False  # claims take nothing here (pause_queue) until resumed
    paused_since_ms: int | None = None  # when it was paused (None: not paused, or unreadable)
    concurrency_limit: int | None = None  # the most runs running at once here (None: none)
    rate_limit: int | None = None  # at most this many claims here in any rate_window_ms
    rate_window_ms: int | None = None
    # Per key and per task (set_queue_concurrency per_key / task, set_queue_rate per_key)
    key_concurrency_limit: int | None = None
    key_rate_limit: int | None = None
    key_rate_window_ms: int | None = None
    task_caps: dict[str, int] = field(default_factory=dict)
    parked: int = 0  # due runs parked by a full per-key or per-task cap (in the counts above)
    waiting: int = 0  # workflow runs waiting for their dependencies (not due: in no count above)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    started_ms: int
    last_seen_ms: int
    seen_ago_ms: int
    stale: bool
    # the tasks it has code for (None: an entry of a version that did not say)
    tasks: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Batch:
    """What ``add(batch, item)`` queues commands on, as on a pipeline (``batch.zcard(key)``):
    each call is recorded as a command of one round trip (``jobqueue.store.io.Commands``)."""

    def __init__(self) -> None:
        self.cmds: list[Cmd] = []

    def __len__(self) -> int:
        return len(self.cmds)

    def __getattr__(self, name: str) -> Callable[..., None]:
        def record(*args: Any, **kwargs: Any) -> None:
            self.cmds.append(cmd(name, *args, **kwargs))

        return record


def pipelined(
    jq: JobQueue, items: Sequence[Any], add: Callable[[Any, Any], None], chunk: int
) -> list[list[Any]]:
    """:func:`pipelined_steps` on a sync client."""
    return jq.run_steps(pipelined_steps(items, add, chunk))


def pipelined_steps(
    items: Sequence[Any], add: Callable[[Any, Any], None], chunk: int
) -> Steps[list[list[Any]]]:
    """``add(batch, item)`` queues each item's commands; returns each item's replies, errors
    in place (the caller decides what a WRONGTYPE means), ``chunk`` items per round trip."""
    out: list[list[Any]] = []
    for start in range(0, len(items), chunk):
        batch = Batch()
        sizes = []
        for item in items[start : start + chunk]:
            before = len(batch)
            add(batch, item)
            sizes.append(len(batch) - before)
        replies = (yield commands(*batch.cmds)) if batch.cmds else []
        at = 0
        for size in sizes:
            out.append(replies[at : at + size])
            at += size
    return out


def workers(jq: JobQueue) -> Listing[WorkerInfo]:
    """:func:`workers_steps` on a sync client."""
    return jq.run_steps(workers_steps())


def workers_steps(now: int | None = None) -> Steps[Listing[WorkerInfo]]:
    """The worker registry; an entry that is not one a worker writes is an anomaly."""
    now = yield from server_time_steps(now)
    out = []
    found: list[Anomaly] = []
    (reply,) = yield commands(cmd("hgetall", WORKERS_KEY))
    entries = checked(reply, WORKERS_KEY, "hash", found, {})
    for name, raw in sorted(entries.items()):
        try:
            info = json.loads(raw)
            if not isinstance(info, dict):
                raise TypeError("not a JSON object")
            for name_ in ("queues", "tasks"):
                if not isinstance(info.get(name_, []), list):  # list("abc") would "work"
                    raise TypeError(f"{name_} is {info[name_]!r}, not a list")
            seen_ago = now - int(info["last_seen_ms"])
            lease_ms = int(info.get("lease_ms", 30_000))
            out.append(
                WorkerInfo(
                    id=str(info["id"]),
                    host=str(info.get("host", "?")),
                    pid=int(info.get("pid", 0)),
                    queues=[str(q) for q in info.get("queues", [])],
                    concurrency=int(info.get("concurrency", 0)),
                    in_flight=int(info.get("in_flight", 0)),
                    started_ms=int(info.get("started_ms", 0)),
                    last_seen_ms=int(info["last_seen_ms"]),
                    seen_ago_ms=seen_ago,
                    stale=seen_ago > STALE_AFTER_BEATS * lease_ms / 3,
                    tasks=None if "tasks" not in info else [str(t) for t in info["tasks"]],
                )
            )
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            # Not worth a crash at 3 a.m., nor silence: listed beside the workers.
            what = f"{type(exc).__name__}: {exc}"[:120]
            found.append(Anomaly(WORKERS_KEY, f"field {name!r} is not a worker entry ({what})"))
    return Listing(sorted(out, key=lambda w: w.id), found)


def _int_or(
    text: str | None, default: int | None, key: str, name: str, found: list[Anomaly]
) -> Any:
    """A number field of a run record; a garbage value shows as the default and is recorded
    as an anomaly, instead of crashing the listing."""
    try:
        return int(text) if text else default
    except ValueError:
        found.append(Anomaly(key, f"field {name!r} is {text!r}, not an integer"))
        return default


def leases(
    jq: JobQueue,
    queue: str | None = None,
    *,
    expired_only: bool = False,
    worker: str | None = None,
    limit: int = 1000,
) -> Listing[Lease]:
    """:func:`leases_steps` on a sync client."""
    return jq.run_steps(
        leases_steps(jq, queue, expired_only=expired_only, worker=worker, limit=limit)
    )


def leases_steps(
    jq: ClientCore,
    queue: str | None = None,
    *,
    expired_only: bool = False,
    worker: str | None = None,
    limit: int = 1000,
) -> Steps[Listing[Lease]]:
    """The runs held by a lease, the least time left first (at most ``limit``; ``worker``:
    only those whose owner is, or starts with, that id)."""
    now = yield from server_time_steps()
    parts, found = yield from partitions_steps(jq, queue)

    def add(pipe: Any, k: PartitionKeys) -> None:
        # One more than the limit: a partition holding more says so.
        if expired_only:
            pipe.zrangebyscore(k.leases, "-inf", now, start=0, num=limit + 1, withscores=True)
        else:
            pipe.zrange(k.leases, 0, limit, withscores=True)

    entries = []
    truncated = False
    for k, (rows,) in zip(
        parts, (yield from pipelined_steps(parts, add, PARTITION_CHUNK)), strict=True
    ):
        rows = checked(rows, k.leases, "sorted set", found, [])
        if len(rows) > limit:
            truncated, rows = True, rows[:limit]
        for rid, score in rows:
            until = score_ms(score)
            if until is None:
                found.append(Anomaly(k.leases, f"member {rid!r} has score {score!r}"))
                continue
            entries.append((k, rid, until))

    def fields(pipe: Any, entry: tuple[PartitionKeys, str, int]) -> None:
        k, rid, _ = entry
        pipe.hmget(k.run(rid), "task", "owner", "fence", "attempt", "started")

    hosts = {w.id: w for w in (yield from workers_steps())}
    out = []
    for (k, rid, until), (reply,) in zip(
        entries, (yield from pipelined_steps(entries, fields, RECORD_CHUNK)), strict=True
    ):
        key = k.run(rid)
        mine: list[Anomaly] = []
        task, owner, fence, attempt, started = checked(reply, key, "hash", mine, [None] * 5)
        if worker and owner != worker and not (owner or "").startswith(worker):
            continue
        w = hosts.get(owner or "")
        fence_n = _int_or(fence, 0, key, "fence", mine)
        attempt_n = _int_or(attempt, 0, key, "attempt", mine)
        started_ms = _int_or(started, None, key, "started", mine)
        out.append(
            Lease(
                run_id=rid,
                queue=k.queue,
                partition=k.partition,
                task=task or "?",
                owner=owner or "?",
                host=w.host if w else None,
                pid=w.pid if w else None,
                fence=fence_n,
                attempt=attempt_n,
                lease_until_ms=until,
                remaining_ms=until - now,
                running_for_ms=None if started_ms is None else now - started_ms,
                anomalies=tuple(mine),
            )
        )
    out.sort(key=lambda lease: lease.remaining_ms)
    return Listing(out[:limit], unique(found), truncated or len(out) > limit)


def stats(jq: JobQueue, queue: str | None = None) -> Listing[PartitionStats]:
    """:func:`stats_steps` on a sync client."""
    return jq.run_steps(stats_steps(jq, queue))


def stats_steps(jq: ClientCore, queue: str | None = None) -> Steps[Listing[PartitionStats]]:
    """Per partition of ``queue`` (None: of every queue): its runs by index, counters, pause
    and limits, and on a cluster the master serving it."""
    now = yield from server_time_steps()
    parts, found = yield from partitions_steps(jq, queue)

    def add(pipe: Any, k: PartitionKeys) -> None:
        # due now: a score below now + 1 (its fraction orders runs of one ms: create_run.lua)
        pipe.zcount(k.due, "-inf", f"({now + 1}")
        pipe.zcount(k.due, now + 1, "+inf")
        pipe.zcard(k.leases)
        pipe.zcount(k.leases, "-inf", now)
        pipe.zcard(k.dead)
        pipe.zcount(k.done, now - 60_000, "+inf")
        pipe.zcount(k.done, now - 3_600_000, "+inf")
        pipe.zrange(k.due, 0, 0, withscores=True)
        pipe.hgetall(k.stats)
        pipe.get(k.paused)
        pipe.hgetall(k.limits)
        pipe.zcard(k.prio)  # read for its type: claim refuses a partition whose prio is foreign
        pipe.zcard(k.parked)
        pipe.zcard(k.waiting)

    out = []
    # On a cluster client: the master of a key, from its cached slot map (no I/O).
    locate = getattr(getattr(jq, "redis", None), "get_node_from_key", None)
    for k, r in zip(
        parts, (yield from pipelined_steps(parts, add, PARTITION_CHUNK)), strict=True
    ):
        mine: list[Anomaly] = []
        zset_keys = (k.due, k.due, k.leases, k.leases, k.dead, k.done, k.done)
        counts = [checked(r[i], key, "sorted set", mine, 0) for i, key in enumerate(zset_keys)]
        first = checked(r[7], k.due, "sorted set", mine, [])
        oldest = score_ms(first[0][1]) if first else None
        if first and oldest is None:
            mine.append(Anomaly(k.due, f"member {first[0][0]!r} has score {first[0][1]!r}"))
        if oldest is not None and oldest > now:
            oldest = None  # nothing due yet
        counters = {}
        for name, value in checked(r[8], k.stats, "hash", mine, {}).items():
            number = stored_int(value)
            if number is None:
                mine.append(Anomaly(k.stats, f"field {name!r} is {value!r}, not a counter"))
            else:
                counters[name] = number
        paused = checked(r[9], k.paused, "string", mine, None)
        fields = checked(r[10], k.limits, "hash", mine, {})
        limit, rate = fields.get("concurrency"), fields.get("rate")
        flow = limits_of(fields)
        parked = checked(r[12], k.parked, "sorted set", mine, 0)
        waiting = checked(r[13], k.waiting, "sorted set", mine, 0)
        if limit is not None and stored_int(limit) is None:
            mine.append(Anomaly(k.limits, f"field 'concurrency' is {limit!r}, not a limit"))
        checked(r[11], k.prio, "sorted set", mine, 0)
        rate_n, rate_w = parse_rate(rate) or (None, None)
        if rate is not None and rate_n is None:
            mine.append(Anomaly(k.limits, f"field 'rate' is {rate!r}, not a rate"))
        out.append(
            PartitionStats(
                queue=k.queue,
                partition=k.partition,
                due_now=counts[0],
                scheduled_later=counts[1],
                running=counts[2],
                expired_leases=counts[3],
                dead=counts[4],
                done_last_minute=counts[5],
                done_last_hour=counts[6],
                oldest_due_age_ms=None if oldest is None else now - oldest,
                counters=counters,
                oldest_due_ms=oldest,
                anomalies=tuple(unique(mine)),
                slot=k.slot,
                node=_node_name(locate, k.due),
                paused=paused is not None,
                paused_since_ms=None if paused is None else stored_int(paused),
                concurrency_limit=stored_int(limit),
                rate_limit=rate_n,
                rate_window_ms=rate_w,
                key_concurrency_limit=flow.key_concurrency,
                key_rate_limit=None if flow.key_rate is None else flow.key_rate[0],
                key_rate_window_ms=None if flow.key_rate is None else flow.key_rate[1],
                task_caps=flow.task_caps,
                parked=parked,
                waiting=waiting,
            )
        )
    return Listing(out, found)


def _node_name(locate: Callable[[str], Any] | None, key: str) -> str | None:
    """The cluster master serving a key (None on a single server, or a slot with no master)."""
    if locate is None:
        return None
    try:
        return str(locate(key).name)
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, AttributeError):
        return None


@dataclass(frozen=True)
class MasterLoad:
    """What one cluster master carries of the queues' partitions (``jobqueue queues``)."""

    node: str
    partitions: int
    due_now: int
    scheduled_later: int
    running: int
    share: float  # its partitions / the fair share (partitions / masters)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def master_names(jq: JobQueue) -> list[str]:
    """The masters of a cluster client (from its cached slot map), none on a single server."""
    primaries = getattr(jq.redis, "get_primaries", None)
    return [n.name for n in primaries()] if primaries else []


def master_loads(rows: Sequence[PartitionStats], masters: Sequence[str]) -> list[MasterLoad]:
    """Partitions and runs per master, every master listed (one without partitions too), the
    busiest first; ``share`` 1.0 is an even spread."""
    by: dict[str, list[PartitionStats]] = {m: [] for m in masters}
    for row in rows:
        if row.node is not None:
            by.setdefault(row.node, []).append(row)
    fair = len(rows) / max(len(by), 1)
    loads = [
        MasterLoad(
            node,
            len(mine),
            sum(r.due_now for r in mine),
            sum(r.scheduled_later for r in mine),
            sum(r.running for r in mine),
            round(len(mine) / fair, 2) if fair else 0.0,
        )
        for node, mine in by.items()
    ]
    return sorted(loads, key=lambda m: (-m.partitions, m.node))


def runs(
    jq: JobQueue,
    *,
    state: str | None = None,
    queue: str | None = None,
    job: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    **filters: Any,
) -> RunPage:
    """A page of runs (newest finished first; pending by due time): ``listing.runs_page``
    with its filters (``task``, ``prefix``, ``error``, ``since_ms``, ``until_ms``,
    ``order``) by keyword. The page says how many runs the listing holds and gives the
    cursor of the next page: it never stops short without saying so."""
    return jq.run_steps(
        runs_steps(jq, state=state, queue=queue, job=job, limit=limit, cursor=cursor, **filters)
    )


def runs_steps(
    jq: ClientCore,
    *,
    state: str | None = None,
    queue: str | None = None,
    job: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    **filters: Any,
) -> Steps[RunPage]:
    """:func:`runs` as steps, for either client."""
    query = RunQuery(state=state, queue=queue, job=job, **filters)
    return (yield from runs_page_steps(jq, query, cursor=cursor, limit=limit))


def schedules(
    jq: JobQueue, *, limit: int = 1000, scan_count: int = LIST_SCAN_COUNT
) -> Listing[ScheduleInfo]:
    """Recurring jobs, at most ``limit``, sorted by job id, read page by page (HSCAN) as
    ``jq.list_schedules`` reads them; a definition that is not usable is an anomaly of the
    listing, not a row (shown by the caller, not logged)."""
    return jq.run_steps(schedules_steps(jq, limit=limit, scan_count=scan_count))


def schedules_steps(
    jq: ClientCore, *, limit: int = 1000, scan_count: int = LIST_SCAN_COUNT
) -> Steps[Listing[ScheduleInfo]]:
    """:func:`schedules` as steps, for either client."""
    return (yield from jq.recurring.list_steps(limit, scan_count))


@dataclass(frozen=True)
class TopSnapshot:
    """One frame of ``jobqueue top``: everything it shows, read at server time ``now_ms``."""

    now_ms: int
    stats: list[PartitionStats]
    leases: list[Lease]
    workers: list[WorkerInfo]
    # Everything found that is not what jobqueue writes, rows' and listings' alike.
    anomalies: list[Anomaly] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "now_ms": self.now_ms,
            "stats": [s.to_dict() for s in self.stats],
            "leases": [lease.to_dict() for lease in self.leases],
            "workers": [w.to_dict() for w in self.workers],
            "anomalies": [a.to_dict() for a in self.anomalies],
        }


def top_snapshot(jq: JobQueue, queue: str | None = None, *, lease_limit: int = 10) -> TopSnapshot:
    """:func:`top_snapshot_steps` on a sync client."""
    return jq.run_steps(top_snapshot_steps(jq, queue, lease_limit=lease_limit))


def top_snapshot_steps(
    jq: ClientCore, queue: str | None = None, *, lease_limit: int = 10
) -> Steps[TopSnapshot]:
    """Queue stats, the leases with least time left and the worker registry, in a few
    pipelined round trips (each bounded as in :func:`stats`, :func:`leases`)."""
    now = yield from server_time_steps()
    rows = yield from stats_steps(jq, queue)
    held = yield from leases_steps(jq, queue, limit=lease_limit)
    registry = yield from workers_steps()
    return TopSnapshot(
        now_ms=now,
        stats=rows,
        leases=held,
        workers=registry,
        anomalies=all_anomalies(rows, held, registry),
    )


def all_anomalies(*listings: Sequence[Any]) -> list[Anomaly]:
    """Every anomaly of some listings (a plain list has none of its own), their rows'
    included, each once."""
    found: list[Anomaly] = []
    for listing in listings:
        found += getattr(listing, "anomalies", [])
        for row in listing:
            found += getattr(row, "anomalies", ())
    return unique(found)


@dataclass(frozen=True)
class QueueTotals:
    """One queue's partitions added up (a dashboard's row; the CLI lists partitions)."""

    queue: str
    partitions: int
    due_now: int
    scheduled_later: int
    running: int
    expired_leases: int
    dead: int
    done_last_minute: int
    done_last_hour: int
    oldest_due_age_ms: int | None  # the latest any due run of the queue is
    anomalies: tuple[Anomaly, ...] = ()  # its partitions'
    paused_partitions: int = 0  # all of them after pause_queue, none after resume_queue
    # Per partition, as set_queue_concurrency sets it (the largest if partitions differ).
    concurrency_limit: int | None = None
    rate_limit: int | None = None  # per partition, in rate_window_ms (partition 0's)
    rate_window_ms: int | None = None
    # Per key and per task, per partition (partition 0's)
    key_concurrency_limit: int | None = None
    key_rate_limit: int | None = None
    key_rate_window_ms: int | None = None
    task_caps: dict[str, int] = field(default_factory=dict)
    parked: int = 0  # due runs parked by a full per-key or per-task cap, all partitions
    waiting: int = 0  # workflow runs waiting for their dependencies, all partitions

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def queue_totals(per_partition: list[PartitionStats]) -> list[QueueTotals]:
    """Add up :func:`stats` rows per queue (pure: no Redis call)."""
    grouped: dict[str, list[PartitionStats]] = {}
    for s in per_partition:
        grouped.setdefault(s.queue, []).append(s)
    out = []
    for queue, rows in sorted(grouped.items()):
        ages = [s.oldest_due_age_ms for s in rows if s.oldest_due_age_ms is not None]
        limits = [s.concurrency_limit for s in rows if s.concurrency_limit is not None]
        out.append(
            QueueTotals(
                queue=queue,
                partitions=len(rows),
                due_now=sum(s.due_now for s in rows),
                scheduled_later=sum(s.scheduled_later for s in rows),
                running=sum(s.running for s in rows),
                expired_leases=sum(s.expired_leases for s in rows),
                dead=sum(s.dead for s in rows),
                done_last_minute=sum(s.done_last_minute for s in rows),
                done_last_hour=sum(s.done_last_hour for s in rows),
                oldest_due_age_ms=max(ages) if ages else None,
                anomalies=tuple(unique(a for s in rows for a in s.anomalies)),
                paused_partitions=sum(s.paused for s in rows),
                concurrency_limit=max(limits, default=None),
                rate_limit=rows[0].rate_limit,
                rate_window_ms=rows[0].rate_window_ms,
                key_concurrency_limit=rows[0].key_concurrency_limit,
                key_rate_limit=rows[0].key_rate_limit,
                key_rate_window_ms=rows[0].key_rate_window_ms,
                task_caps=rows[0].task_caps,
                parked=sum(s.parked for s in rows),
                waiting=sum(s.waiting for s in rows),
            )
        )
    return out


@dataclass(frozen=True)
class Throughput:
    """Runs that finished per time bucket, oldest bucket first: bucket i covers
    [start_ms + i * bucket_ms, start_ms + (i + 1) * bucket_ms)."""

    queue: str
    start_ms: int
    bucket_ms: int
    finished: list[int]  # left through the done index: completed or cancelled
    dead: list[int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def throughput(
    jq: JobQueue,
    queue: str | None = None,
    *,
    window_ms: int = 3_600_000,
    bucket_ms: int = 60_000,
    now_ms: int | None = None,
) -> Listing[Throughput]:
    """:func:`throughput_steps` on a sync client."""
    return jq.run_steps(
        throughput_steps(jq, queue, window_ms=window_ms, bucket_ms=bucket_ms, now_ms=now_ms)
    )


def throughput_steps(
    jq: ClientCore,
    queue: str | None = None,
    *,
    window_ms: int = 3_600_000,
    bucket_ms: int = 60_000,
    now_ms: int | None = None,
) -> Steps[Listing[Throughput]]:
    """Per queue, finished and dead runs per bucket over the last ``window_ms``, counted from
    the done and dead indexes (scored by finish time), so the history exists as soon as the
    runs do, with no sampler. One ZCOUNT per index and partition over the whole window, then
    one per bucket only where that found runs (O(log n) each), pipelined: what is read follows
    what Redis holds, not the partition count. The done index is trimmed by retention, so a
    window longer than ``done_retention_s`` undercounts its oldest buckets."""
    now = yield from server_time_steps(now_ms)
    buckets = max(1, -(-window_ms // bucket_ms))
    start = now - buckets * bucket_ms
    end = f"({start + buckets * bucket_ms}"
    parts, found = yield from partitions_steps(jq, queue)

    def whole(pipe: Any, k: PartitionKeys) -> None:
        pipe.zcount(k.done, start, end)
        pipe.zcount(k.dead, start, end)

    busy: list[tuple[str, str]] = []  # (queue, index key) with runs in the window
    for k, (done, dead) in zip(
        parts, (yield from pipelined_steps(parts, whole, PARTITION_CHUNK)), strict=True
    ):
        if checked(done, k.done, "sorted set", found, 0):
            busy.append((k.queue, k.done))
        if checked(dead, k.dead, "sorted set", found, 0):
            busy.append((k.queue, k.dead))

    def per_bucket(pipe: Any, item: tuple[str, str]) -> None:
        for i in range(buckets):
            low = start + i * bucket_ms
            pipe.zcount(item[1], low, f"({low + bucket_ms}")

    per_queue = {
        k.queue: Throughput(k.queue, start, bucket_ms, [0] * buckets, [0] * buckets)
        for k in parts
    }
    for (name, key), counts in zip(
        busy, (yield from pipelined_steps(busy, per_bucket, PARTITION_CHUNK // 8)), strict=True
    ):
        row = per_queue[name]
        into = row.dead if key.endswith(":dead") else row.finished
        for i, n in enumerate(counts):
            into[i] += checked(n, key, "sorted set", found, 0)
    return Listing([per_queue[q] for q in sorted(per_queue)], unique(found))
