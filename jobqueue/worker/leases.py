"""Keeping leases: the keeper heartbeats every lease the worker holds in one pipeline (one
round trip per master) every third of the shortest lease, so two beats may be lost before one
expires; it stops a run whose heartbeat is refused (fenced out, cancelled), and one whose
lease ran out without a heartbeat reaching Redis (self-fencing: another worker may hold it
by now); it refreshes this worker's entry in the registry (``jq:workers``). At shutdown the
runs still running are handed back (``release``) without counting an attempt."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from jobqueue.client import workers as registry
from jobqueue.client.sync import JobQueue
from jobqueue.errors import JobQueueError
from jobqueue.hooks import Hooks
from jobqueue.runtime.clock import Clock
from jobqueue.runtime.logs import run_fields
from jobqueue.runtime.metrics import Metrics
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import HEARTBEAT, RELEASE
from jobqueue.worker.runs import HEARTBEATED, InFlight, RunTable, WorkerStats, run_event

log = logging.getLogger("jobqueue.worker")

# How often the keeper looks at timeouts and lease deadlines (at most; a third of the
# shortest lease when that is less).
KEEPER_TICK_S = 0.05
# A failed heartbeat round is tried again this soon (at most a third of the shortest lease).
HEARTBEAT_RETRY_S = 1.0


class Presence:
    """This worker's entry in the registry ``jq:workers``, which ``jobqueue workers`` lists
    (stale after three missed heartbeats)."""

    def __init__(
        self,
        jq: JobQueue,
        worker_id: str,
        queues: list[str],
        concurrency: int,
        lease_ms: int,
        table: RunTable,
        stopping: threading.Event,
        *,
        tasks: list[str] | None = None,
    ) -> None:
        self._jq = jq
        self._id = worker_id
        self._tasks = tasks or []
        self._queues = queues
        self._concurrency = concurrency
        self._lease_ms = lease_ms
        self._table = table
        self._stopping = stopping
        self.started_ms = 0
        self._pruned_ms = 0  # server time of this worker's last pruning of the registry

    def announce(self, server_now_ms: int | None) -> None:
        if server_now_ms is None:
            server_now_ms = self._jq.server_time_ms()
        info = {
            "id": self._id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": self._queues,
            "tasks": self._tasks,
            "concurrency": self._concurrency,
            "started_ms": self.started_ms,
            "last_seen_ms": server_now_ms,
            "in_flight": len(self._table),
            "lease_ms": self._lease_ms,
            "stopping": self._stopping.is_set(),
        }
        registry.announce(self._jq, self._id, json.dumps(info), server_now_ms, self._lease_ms)
        # Once a lease, the entries of workers that died without withdrawing go.
        if server_now_ms - self._pruned_ms >= self._lease_ms:
            self._pruned_ms = server_now_ms
            gone = registry.prune_silent(self._jq, server_now_ms, keep=self._id)
            if gone:
                log.info(
                    "pruned %d silent workers from the registry: %s", len(gone), ", ".join(gone)
                )

    def withdraw(self, own_wake_key: str) -> None:
        # If Redis is gone the entry stays; the CLI flags it stale by its last_seen, and the
        # live workers prune it later.
        with contextlib.suppress(redis.exceptions.RedisError):
            registry.withdraw(self._jq, [self._id])
            self._jq.redis.delete(own_wake_key)


class LeaseKeeper:
    def __init__(
        self,
        jq: JobQueue,
        table: RunTable,
        stats: WorkerStats,
        metrics: Metrics,
        clock: Clock,
        presence: Presence,
        *,
        lease_ms: int,
        stopped: threading.Event,
        on_tick: Callable[[float], None],
        stop_code: Callable[[InFlight], None],
        hooks: Hooks | None = None,
    ) -> None:
        """``on_tick(now)`` runs at every tick (the timeouts); ``stop_code(entry)`` cancels
        a run's async task (a sync run only sees ctx.cancelled)."""
        self._jq = jq
        self._table = table
        self._stats = stats
        self._metrics = metrics
        self._clock = clock
        self._presence = presence
        self._lease_ms = lease_ms
        self._stopped = stopped
        self._on_tick = on_tick
        self._stop_code = stop_code
        self._hooks = hooks or Hooks()
        self._round_sent = 0.0  # when the last heartbeat round was sent (clock.monotonic())

    def beat_interval(self) -> float:
        """A third of the shortest lease held: two heartbeats may be lost before it expires."""
        shortest = self._table.shortest_lease_ms()
        return min(shortest or self._lease_ms, self._lease_ms) / 3000

    def run(self) -> None:
        """The keeper thread, until the worker has stopped."""
        clock = self._clock
        next_beat = 0.0
        while not self._stopped.is_set():
            now = clock.monotonic()
            interval = self.beat_interval()
            # A run claimed since the last round, with a shorter lease than any before, needs
            # its first beat within a third of that lease from its claim, not at the beat
            # planned for the longer ones.
            due = self._table.renewal_due(self._round_sent)
            if due is not None:
                next_beat = min(next_beat, due)
            try:
                self._on_tick(now)
                self.enforce_deadlines(now)
                if now >= next_beat:
                    try:
                        self.heartbeat()
                        next_beat = now + interval
                    except (JobQueueError, redis.exceptions.RedisError) as exc:
                        log.warning("heartbeat failed (%s); retrying", exc)
                        next_beat = now + min(interval, HEARTBEAT_RETRY_S)
            except Exception:
                # This thread keeps every lease alive: it must not die of a surprise.
                log.exception("keeper iteration failed; carrying on")
                next_beat = now + min(interval, HEARTBEAT_RETRY_S)
            # The next tick counts from this one's start: a slow round does not delay it.
            clock.wait(self._stopped, now + min(KEEPER_TICK_S, interval) - clock.monotonic())

    def heartbeat(self) -> None:
        """Extend every lease held, one call per partition, one round trip per master: a
        master that does not answer holds back its own leases only (their runs are
        self-fenced when the lease passes, see enforce_deadlines)."""
        groups: dict[PartitionKeys, list[InFlight]] = {}
        for e in self._table.in_phase(HEARTBEATED):
            groups.setdefault(e.keys, []).append(e)
        now_ms = self._clock.now_ms()
        calls = [
            HEARTBEAT.call(
                k, [(e.run.run_id, e.run.fence) for e in es], self._lease_ms, now=now_ms
            )
            for k, es in groups.items()
        ]
        server_now = None
        sent = self._round_sent = self._clock.monotonic()
        started = time.perf_counter()
        replies = self._jq.scripts.run_each(calls)
        if calls:
            self._metrics.heartbeat(time.perf_counter() - started)
        failures: list[Exception] = []
        for es, reply in zip(groups.values(), replies, strict=True):
            if isinstance(reply, Exception):
                failures.append(reply)
                continue
            beats = HEARTBEAT.parse(reply)
            server_now = beats.now_ms
            for e, answer in zip(es, beats.answers, strict=True):
                if isinstance(answer, str):
                    self._lost(e, answer)
                else:
                    e.granted = sent
                    e.lease_deadline = sent + (answer - server_now) / 1000
        if failures:
            if len(failures) == len(calls):
                raise failures[0]
            log.warning(
                "heartbeats of %d of %d partitions failed (%s); their leases run out unless "
                "a later beat lands",
                len(failures),
                len(calls),
                failures[0],
            )
        self._presence.announce(server_now)

    def _lost(self, entry: InFlight, reason: str) -> None:
        if not self._table.lost(entry, reason):
            return
        self._metrics.lease_lost(entry.keys.queue, reason)
        run = entry.run
        log.warning(
            "fenced out: heartbeat of run_id=%s fence=%d attempt=%d refused (%s); "
            "stopping the work, its commit will be refused",
            run.run_id,
            run.fence,
            run.attempt,
            reason,
            extra=run_fields(run),
        )
        entry.ctx.cancel(f"lease lost: {reason}")
        self._stop_code(entry)
        self._report_lost(entry, reason)

    def enforce_deadlines(self, now: float) -> None:
        """Self-fencing: a run whose lease ran out without a heartbeat reaching Redis (its
        master down, a partition) may be another worker's by now. Its code is told to stop
        (ctx.cancelled) now rather than when Redis answers again; its commit, if any, is
        judged by the fence as always."""
        for e in self._table.lease_ran_out(now):
            self._metrics.lease_lost(e.keys.queue, "expired")
            log.warning(
                "lease of run_id=%s fence=%d attempt=%d ran out without a heartbeat reaching "
                "Redis; stopping the work (another worker may hold the run now)",
                e.run.run_id,
                e.run.fence,
                e.run.attempt,
                extra=run_fields(e.run),
            )
            e.ctx.cancel("lease expired: no heartbeat reached Redis")
            self._stop_code(e)
            self._report_lost(e, "expired")

    def _report_lost(self, entry: InFlight, reason: str) -> None:
        if self._hooks and not entry.lost_reported:
            entry.lost_reported = True
            what = "cancelled" if reason == "cancelled" else "lease-lost"
            self._hooks.event(run_event(entry, what, reason=reason))

    def release_calls(self, entries: list[InFlight]) -> list[Any]:
        """The release calls handing ``entries`` back (see report_released)."""
        now_ms = self._clock.now_ms()
        return [RELEASE.call(e.keys, e.run.run_id, e.run.fence, now=now_ms) for e in entries]

    def report_released(self, entries: list[InFlight], replies: list[Any]) -> None:
        for e, reply in zip(entries, replies, strict=True):
            outcome = RELEASE.parse(reply)
            if outcome.accepted:
                self._stats.released += 1
            # The attempt is handed back uncounted (show says attempt N-1): say so, once.
            log.info(
                "released run_id=%s fence=%d attempt=%d: %s",
                e.run.run_id,
                e.run.fence,
                e.run.attempt,
                "not counted" if outcome.accepted else f"refused ({outcome.status})",
                extra=run_fields(e.run),
            )
