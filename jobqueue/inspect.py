"""Read-only views of queues, leases, runs and workers: the data behind the ops CLI (and any
dashboard). Never blocks the server: bounded ZRANGEs and pipelined HMGETs, no KEYS."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from .client import JobQueue
from .keys import WORKERS_KEY, PartitionKeys
from .models import Run

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
    recorded = jq.queues()
    queues = {queue: recorded.get(queue, jq.partitions_of(queue))} if queue else recorded
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
                fence=int(fence or 0),
                attempt=int(attempt or 0),
                lease_until_ms=until,
                remaining_ms=until - now,
                running_for_ms=now - int(started) if started else None,
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
            plan.append(k)
    ids = [(k, rid) for k, rows in zip(plan, pipe.execute(), strict=True) for rid in rows]
    if job:
        ids = [(k, rid) for k, rid in ids if rid.rpartition("@")[0] == job or rid == job]
    pipe = jq.redis.pipeline(transaction=False)
    for k, rid in ids:
        pipe.hgetall(k.run(rid))
    out = []
    for (k, rid), fields in zip(ids, pipe.execute(), strict=True):
        if not fields or (state and fields.get("state") != state):
            continue
        out.append(Run.from_hash(rid, k.partition, fields, []))
        if len(out) >= limit:
            break
    return out
