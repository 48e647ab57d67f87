"""Keeping the worker registry (``jq:workers``) true: the entries of workers that died without
withdrawing (SIGKILL, a lost host) are pruned once they missed PRUNE_AFTER_BEATS heartbeats,
by the live workers as they announce themselves, or at once by ``jobqueue workers prune``.

A pruned entry of a worker that is in fact alive (paused that long) comes back at its next
heartbeat: the registry is what operators read, never what decides a lease.

Each write is steps (``announce_steps``, ``withdraw_steps``, ``prune_silent_steps``) that
either client drives; the plain functions drive them on a sync ``JobQueue``."""

from __future__ import annotations

from collections.abc import Iterable

from jobqueue.client.sync import JobQueue
from jobqueue.ops.queries import PRUNE_AFTER_BEATS, workers
from jobqueue.store.io import Steps, cmd, commands, raised
from jobqueue.store.keys import WORKERS_KEY, WORKERS_SEEN_KEY

# Entries pruned per round trip by a live worker.
PRUNE_BATCH = 100


def prune_deadline_ms(last_seen_ms: int, lease_ms: int) -> int:
    """When a worker's entry may be pruned: PRUNE_AFTER_BEATS of its beats (a third of its
    lease each) after its last one."""
    return last_seen_ms + PRUNE_AFTER_BEATS * lease_ms // 3


def announce(jq: JobQueue, worker_id: str, entry: str, last_seen_ms: int, lease_ms: int) -> None:
    """:func:`announce_steps` on a sync client."""
    jq.run_steps(announce_steps(worker_id, entry, last_seen_ms, lease_ms))


def announce_steps(worker_id: str, entry: str, last_seen_ms: int, lease_ms: int) -> Steps[None]:
    """Write a worker's registry entry (JSON) and when it may be pruned: one round trip."""
    raised((yield commands(
        cmd("hset", WORKERS_KEY, worker_id, entry),
        cmd("zadd", WORKERS_SEEN_KEY, {worker_id: prune_deadline_ms(last_seen_ms, lease_ms)}),
    )))  # fmt: skip


def withdraw(jq: JobQueue, worker_ids: Iterable[str]) -> None:
    """:func:`withdraw_steps` on a sync client."""
    jq.run_steps(withdraw_steps(worker_ids))


def withdraw_steps(worker_ids: Iterable[str]) -> Steps[None]:
    """Remove the workers' entries: one round trip, none for no id."""
    ids = list(worker_ids)
    if not ids:
        return
    raised((yield commands(cmd("hdel", WORKERS_KEY, *ids), cmd("zrem", WORKERS_SEEN_KEY, *ids))))


def prune_silent(jq: JobQueue, now_ms: int, keep: str = "") -> list[str]:
    """:func:`prune_silent_steps` on a sync client."""
    return jq.run_steps(prune_silent_steps(now_ms, keep))


def prune_silent_steps(now_ms: int, keep: str = "") -> Steps[list[str]]:
    """Prune the entries whose workers missed PRUNE_AFTER_BEATS heartbeats by ``now_ms``
    (server time), at most PRUNE_BATCH of them; ``keep`` (the caller's own id) never. The
    pruned ids."""
    (due,) = raised((yield commands(
        cmd("zrangebyscore", WORKERS_SEEN_KEY, "-inf", now_ms, start=0, num=PRUNE_BATCH)
    )))  # fmt: skip
    ids = (i.decode("utf-8", "replace") if isinstance(i, bytes) else str(i) for i in due)
    gone = [i for i in ids if i != keep]
    yield from withdraw_steps(gone)
    return gone


def prune_stale(jq: JobQueue) -> list[str]:
    """``jobqueue workers prune``: every entry stale now (3 missed heartbeats), whichever
    version wrote it. The pruned ids, sorted."""
    gone = sorted(w.id for w in workers(jq) if w.stale)
    withdraw(jq, gone)
    return gone
