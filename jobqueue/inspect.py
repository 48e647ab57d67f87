"""Read-only views of queues, leases, runs and workers: the data behind the ops CLI (and any
dashboard). Never blocks the server: bounded ZRANGEs and pipelined HMGETs, no KEYS."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis

from .anomalies import Anomaly, Listing, checked, unique
from .base import not_a_record
from .client import JobQueue
from .errors import UnknownQueue
from .keys import WORKERS_KEY, PartitionKeys, validate_queue_name
from .models import Run
from .recurring import ScheduleInfo

# A worker heartbeats every lease/3; three missed beats and it is probably gone.
STALE_AFTER_BEATS = 3


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _partitions(jq: JobQueue, queue: str | None) -> list[PartitionKeys]:
    if queue is not None:
        validate_queue_name(queue)  # bad input (exit 2), not an unknown queue (exit 1)
    recorded = jq.queues()
    if queue and queue not in recorded:
        known = ", ".join(sorted(recorded)) or "none yet"
        raise UnknownQueue(f"no queue {queue!r} in Redis (known: {known})")
    queues = {queue: recorded[queue]} if queue else recorded
    return [PartitionKeys(q, p) for q, count in sorted(queues.items()) for p in range(count)]


def workers(jq: JobQueue) -> list[WorkerInfo]:
    now = jq.server_time_ms()
    out = []
    for raw in jq.redis.hvals(WORKERS_KEY):
        try:
            info = json.loads(raw)
            seen_ago = now - int(info["last_seen_ms"])
            lease_ms = int(info.get("lease_ms", 30_000))
            out.append(
                WorkerInfo(
                    id=str(info["id"]),
                    host=str(info.get("host", "?")),
                    pid=int(info.get("pid", 0)),
                    queues=list(info.get("queues", [])),
                    concurrency=int(info.get("concurrency", 0)),
                    in_flight=int(info.get("in_flight", 0)),
                    started_ms=int(info.get("started_ms", 0)),
                    last_seen_ms=int(info["last_seen_ms"]),
                    seen_ago_ms=seen_ago,
                    stale=seen_ago > STALE_AFTER_BEATS * lease_ms / 3,
                )
            )
        except (ValueError, KeyError, TypeError):
            continue  # a corrupt registry entry is not worth a crash at 3 a.m.
    return sorted(out, key=lambda w: w.id)


def _int_or(text: str | None, default: int | None) -> Any:
    """A number field of a run record; a garbage value (corrupt record) shows as the default
    instead of crashing the listing."""
    try:
        return int(text) if text else default
    except ValueError:
        return default


def leases(
    jq: JobQueue,
    queue: str | None = None,
    *,
    expired_only: bool = False,
    worker: str | None = None,
    limit: int = 1000,
) -> list[Lease]:
    now = jq.server_time_ms()
    parts = _partitions(jq, queue)
    pipe = jq.redis.pipeline(transaction=False)
    for k in parts:
        if expired_only:
            pipe.zrangebyscore(k.leases, "-inf", now, start=0, num=limit, withscores=True)
        else:
            pipe.zrange(k.leases, 0, limit - 1, withscores=True)
    entries = [
        (k, rid, int(score))
        for k, rows in zip(parts, pipe.execute(), strict=True)
        for rid, score in rows
    ]
    pipe = jq.redis.pipeline(transaction=False)
    for k, rid, _ in entries:
        pipe.hmget(k.run(rid), "task", "owner", "fence", "attempt", "started")
    hosts = {w.id: w for w in workers(jq)}
    out = []
    for (k, rid, until), (task, owner, fence, attempt, started) in zip(
        entries, pipe.execute(), strict=True
    ):
        if worker and owner != worker and not (owner or "").startswith(worker):
            continue
        w = hosts.get(owner or "")
        out.append(
            Lease(
                run_id=rid,
                queue=k.queue,
                partition=k.partition,
                task=task or "?",
                owner=owner or "?",
                host=w.host if w else None,
                pid=w.pid if w else None,
                fence=_int_or(fence, 0),
                attempt=_int_or(attempt, 0),
                lease_until_ms=until,
                remaining_ms=until - now,
                running_for_ms=None if (t := _int_or(started, None)) is None else now - t,
            )
        )
    out.sort(key=lambda lease: lease.remaining_ms)
    return out[:limit]


def stats(jq: JobQueue, queue: str | None = None) -> list[PartitionStats]:
    now = jq.server_time_ms()
    parts = _partitions(jq, queue)
    pipe = jq.redis.pipeline(transaction=False)
    for k in parts:
        pipe.zcount(k.due, "-inf", now)
        pipe.zcount(k.due, f"({now}", "+inf")
        pipe.zcard(k.leases)
        pipe.zcount(k.leases, "-inf", now)
        pipe.zcard(k.dead)
        pipe.zcount(k.done, now - 60_000, "+inf")
        pipe.zcount(k.done, now - 3_600_000, "+inf")
        pipe.zrange(k.due, 0, 0, withscores=True)
        pipe.hgetall(k.stats)
    replies = pipe.execute()
    out = []
    for i, k in enumerate(parts):
        r = replies[i * 9 : (i + 1) * 9]
        oldest = r[7][0][1] if r[7] and r[7][0][1] <= now else None
        out.append(
            PartitionStats(
                queue=k.queue,
                partition=k.partition,
                due_now=r[0],
                scheduled_later=r[1],
                running=r[2],
                expired_leases=r[3],
                dead=r[4],
                done_last_minute=r[5],
                done_last_hour=r[6],
                oldest_due_age_ms=None if oldest is None else now - int(oldest),
                counters={name: int(v) for name, v in r[8].items()},
                oldest_due_ms=None if oldest is None else int(oldest),
            )
        )
    return out


_STATE_INDEX = {
    "pending": "due",
    "running": "leases",
    "dead": "dead",
    "done": "done",
    "cancelled": "done",
}


def runs(
    jq: JobQueue,
    *,
    state: str | None = None,
    queue: str | None = None,
    job: str | None = None,
    limit: int = 50,
) -> list[Run]:
    """Runs from the indexes (newest finished first; pending by due time), read in one
    pipeline. A job filter matches the job id (the run id before '@')."""
    indexes = [_STATE_INDEX[state]] if state else ["leases", "due", "dead", "done"]
    parts = _partitions(jq, queue)
    pipe = jq.redis.pipeline(transaction=False)
    plan = []
    for k in parts:
        for index in dict.fromkeys(indexes):
            key = getattr(k, index)
            # Scan further than limit when filtering, still bounded.
            window = limit * 20 if (job or state == "cancelled" or state == "done") else limit
            if index in ("done", "dead"):
                pipe.zrevrange(key, 0, window - 1)
            else:
                pipe.zrange(key, 0, window - 1)
            plan.append((k, index))
    replies = pipe.execute()
    ids = [(k, index, rid) for (k, index), rows in zip(plan, replies, strict=True) for rid in rows]
    if job:
        ids = [(k, i, rid) for k, i, rid in ids if rid.rpartition("@")[0] == job or rid == job]
    pipe = jq.redis.pipeline(transaction=False)
    for k, _, rid in ids:
        pipe.hgetall(k.run(rid))
    out = []
    for (k, index, rid), reply in zip(ids, pipe.execute(raise_on_error=False), strict=True):
        # A listed key that is not a run record (claim.lua dead-letters such keys) is shown,
        # so that an operator can purge the listing, instead of failing the whole listing.
        fields = not_a_record(reply, "dead" if index == "dead" else "unknown")
        if not fields or (state and fields.get("state") != state):
            continue
        out.append((k, rid, fields))
        if len(out) >= limit:
            break
    # The history of the runs that have one (the record's 'hist' flag), in one more round
    # trip: a listing shows the same run as `show` does, its timeline included.
    pipe = jq.redis.pipeline(transaction=False)
    with_history = [(k, rid) for k, rid, fields in out if fields.get("hist")]
    for k, rid in with_history:
        pipe.lrange(k.history(rid), 0, -1)
    found = pipe.execute(raise_on_error=False) if with_history else []
    histories = {
        (k.queue, k.partition, rid): lines if isinstance(lines, list) else []
        for (k, rid), lines in zip(with_history, found, strict=True)
    }
    return [
        Run.from_hash(rid, k.partition, f, histories.get((k.queue, k.partition, rid), []), k.queue)
        for k, rid, f in out
    ]


def schedules(
    jq: JobQueue, *, limit: int = 1000, scan_count: int = 500
) -> Listing[ScheduleInfo]:
    """Recurring jobs, at most ``limit``, sorted by job id. Read with HSCAN in pages and
    pipelined ZSCORE/HGET per page, so a store of millions of jobs never blocks the server
    (``Recurring.list_jobs`` reads whole hashes: fine for a few jobs, not for an operator's
    listing). A definition that is not usable is an anomaly of the listing, not a row."""
    out: list[ScheduleInfo] = []
    found: list[Anomaly] = []
    seen: set[str] = set()  # HSCAN may return an entry twice across pages
    r = jq.redis
    store = jq.recurring
    for sk in store.all_keys():
        cursor: int = 0
        while len(out) < limit:
            try:
                cursor, page = r.hscan(sk.defs, cursor, count=scan_count)
            except redis.exceptions.ResponseError as exc:
                checked(exc, sk.defs, "hash", found, None)
                break
            items = [(j, t) for j, t in page.items() if j not in seen][: limit - len(out)]
            seen.update(j for j, _ in items)
            pipe = r.pipeline(transaction=False)
            for job_id, _ in items:
                pipe.zscore(sk.next, job_id)
                pipe.hget(sk.state, job_id)
            replies = pipe.execute(raise_on_error=False)
            for i, (job_id, text) in enumerate(items):
                score = checked(replies[2 * i], sk.next, "sorted set", found, None)
                state = checked(replies[2 * i + 1], sk.state, "hash", found, None)
                info = store.stored_info(sk, job_id, text, score, state)
                if isinstance(info, Anomaly):
                    found.append(info)
                else:
                    out.append(info)
            if int(cursor) == 0:
                break
        if len(out) >= limit:
            break
    return Listing(sorted(out, key=lambda i: i.job_id), unique(found))


@dataclass(frozen=True)
class TopSnapshot:
    """One frame of ``jobqueue top``: everything it shows, read at server time ``now_ms``."""

    now_ms: int
    stats: list[PartitionStats]
    leases: list[Lease]
    workers: list[WorkerInfo]

    def to_dict(self) -> dict[str, Any]:
        return {
            "now_ms": self.now_ms,
            "stats": [s.to_dict() for s in self.stats],
            "leases": [lease.to_dict() for lease in self.leases],
            "workers": [w.to_dict() for w in self.workers],
        }


def top_snapshot(jq: JobQueue, queue: str | None = None, *, lease_limit: int = 10) -> TopSnapshot:
    """Queue stats, the leases with least time left and the worker registry, in a few
    pipelined round trips (each bounded as in :func:`stats`, :func:`leases`)."""
    now = jq.server_time_ms()
    return TopSnapshot(
        now_ms=now,
        stats=stats(jq, queue),
        leases=leases(jq, queue, limit=lease_limit),
        workers=workers(jq),
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
) -> list[Throughput]:
    """Per queue, finished and dead runs per bucket over the last ``window_ms``, counted from
    the done and dead indexes (scored by finish time), so the history exists as soon as the
    runs do, with no sampler. One ZCOUNT per bucket and partition (O(log n) each), all in one
    pipeline; the done index is trimmed by retention, so a window longer than
    ``done_retention_s`` undercounts its oldest buckets."""
    now = jq.server_time_ms() if now_ms is None else now_ms
    buckets = max(1, -(-window_ms // bucket_ms))
    start = now - buckets * bucket_ms
    parts = _partitions(jq, queue)
    pipe = jq.redis.pipeline(transaction=False)
    for k in parts:
        for index in (k.done, k.dead):
            for i in range(buckets):
                low = start + i * bucket_ms
                pipe.zcount(index, low, f"({low + bucket_ms}")
    replies = iter(pipe.execute())
    per_queue: dict[str, Throughput] = {}
    for k in parts:
        finished = [int(next(replies)) for _ in range(buckets)]
        dead = [int(next(replies)) for _ in range(buckets)]
        seen = per_queue.get(k.queue)
        if seen is not None:
            finished = [a + b for a, b in zip(seen.finished, finished, strict=True)]
            dead = [a + b for a, b in zip(seen.dead, dead, strict=True)]
        per_queue[k.queue] = Throughput(k.queue, start, bucket_ms, finished, dead)
    return [per_queue[q] for q in sorted(per_queue)]
