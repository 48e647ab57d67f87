"""Keeping leases, on the worker's event loop: the keeper heartbeats every lease the worker
holds in one pipeline (one round trip per master) every third of the shortest lease, so two
beats may be lost before one expires; it stops a run whose heartbeat is refused (fenced out,
cancelled), and one whose lease ran out without a heartbeat reaching Redis (self-fencing:
another worker may hold it by now); it refreshes this worker's entry in the registry
(``jq:workers``). At shutdown the runs still running are handed back (``release``) without
counting an attempt."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from typing import Any

import redis

from jobqueue.errors import JobQueueError
from jobqueue.ops import workers as registry
from jobqueue.runtime.logs import run_fields
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import HEARTBEAT, RELEASE
from jobqueue.worker.executing import Executor
from jobqueue.worker.runs import HEARTBEATED, InFlight, run_event
from jobqueue.worker.shared import Shared, in_thread

log = logging.getLogger("jobqueue.worker")

# How often the keeper looks at timeouts and lease deadlines (at most; a third of the
# shortest lease when that is less).
KEEPER_TICK_S = 0.05
# A failed heartbeat round is tried again this soon (at most a third of the shortest lease).
HEARTBEAT_RETRY_S = 1.0


class Presence:
    """This worker's entry in the registry ``jq:workers``, which ``jobqueue workers`` lists
    (stale after three missed heartbeats). Sync calls: made on a thread, once a beat."""

    def __init__(self, shared: Shared) -> None:
        self._s = shared
        self._jq = shared.jq
        self._id = shared.worker_id
        self.started_ms = 0
        self._pruned_ms = 0  # server time of this worker's last pruning of the registry

    def announce(self, server_now_ms: int | None) -> None:
        s = self._s
        if server_now_ms is None:
            server_now_ms = self._jq.server_time_ms()
        info = {
            "id": self._id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": s.queues,
            "tasks": s.tasks.names(),
            "concurrency": s.config.concurrency,
            "started_ms": self.started_ms,
            "last_seen_ms": server_now_ms,
            "in_flight": len(s.table),
            "lease_ms": s.lease_ms,
            "stopping": s.stopping.is_set(),
        }
        registry.announce(self._jq, self._id, json.dumps(info), server_now_ms, s.lease_ms)
        # Once a lease, the entries of workers that died without withdrawing go.
        if server_now_ms - self._pruned_ms >= s.lease_ms:
            self._pruned_ms = server_now_ms
            gone = registry.prune_silent(self._jq, server_now_ms, keep=self._id)
            if gone:
                log.info(
                    "pruned %d silent workers from the registry: %s", len(gone), ", ".join(gone)
                )

    def withdraw(self) -> None:
        # If Redis is gone the entry stays; the CLI flags it stale by its last_seen, and the
        # live workers prune it later.
        with contextlib.suppress(redis.exceptions.RedisError):
            registry.withdraw(self._jq, [self._id])


class LeaseKeeper:
    """Every tick (KEEPER_TICK_S): the executor's timeouts, the lease deadlines, and a
    heartbeat round when one is due (sent as a task of its own, so that a slow round delays
    no tick)."""

    def __init__(self, shared: Shared, executor: Executor, presence: Presence) -> None:
        self._s = shared
        self._executor = executor
        self._presence = presence
        self._round_sent = 0.0  # when the last heartbeat round was sent (clock.monotonic())
        self._beating: asyncio.Task[None] | None = None
        # Set when a round ends: a beat that came due meanwhile goes out at once, not at the
        # next tick (on a fake clock, the next tick waits for the test to move the clock).
        self._beat_ended = asyncio.Event()
        self._next_beat = 0.0

    def beat_interval(self) -> float:
        """A third of the shortest lease held: two heartbeats may be lost before it expires."""
        lease_ms = self._s.lease_ms
        shortest = self._s.table.shortest_lease_ms()
        return min(shortest or lease_ms, lease_ms) / 3000

    async def run(self) -> None:
        """The keeper's ticks, until cancelled (the worker has stopped)."""
        clock = self._s.clock
        try:
            while True:
                now = clock.monotonic()
                interval = self.beat_interval()
                try:
                    self.tick(now, interval)
                except Exception:
                    # The keeper keeps every lease alive: it must not die of a surprise.
                    log.exception("keeper tick failed; carrying on")
                # The next tick counts from this one's start: a slow tick does not delay it.
                ended = self._beat_ended if self._beating is not None else None
                await self._s.sleep(
                    now + min(KEEPER_TICK_S, interval) - clock.monotonic(), until=ended
                )
        finally:
            if self._beating is not None:
                self._beating.cancel()

    def tick(self, now: float, interval: float) -> None:
        # A run claimed since the last round, with a shorter lease than any before, needs
        # its first beat within a third of that lease from its claim, not at the beat
        # planned for the longer ones.
        due = self._s.table.renewal_due(self._round_sent)
        if due is not None:
            self._next_beat = min(self._next_beat, due)
        self._executor.enforce_timeouts(now)
        self.enforce_deadlines(now)
        if now >= self._next_beat and self._beating is None:
            self._next_beat = now + interval
            self._beat_ended.clear()
            self._beating = asyncio.ensure_future(self._beat(now, interval))

    async def _beat(self, now: float, interval: float) -> None:
        try:
            await self.heartbeat()
        except (JobQueueError, redis.exceptions.RedisError) as exc:
            log.warning("heartbeat failed (%s); retrying", exc)
            self._next_beat = now + min(interval, HEARTBEAT_RETRY_S)
        except Exception:
            log.exception("heartbeat round failed; retrying")
            self._next_beat = now + min(interval, HEARTBEAT_RETRY_S)
        finally:
            self._beating = None
            self._beat_ended.set()

    async def heartbeat(self) -> None:
        """Extend every lease held, one call per partition, one round trip per master: a
        master that does not answer holds back its own leases only (their runs are
        self-fenced when the lease passes, see enforce_deadlines)."""
        s = self._s
        groups: dict[PartitionKeys, list[InFlight]] = {}
        for e in s.table.in_phase(HEARTBEATED):
            groups.setdefault(e.keys, []).append(e)
        now_ms = s.clock.now_ms()
        calls = [
            HEARTBEAT.call(k, [(e.run.run_id, e.run.fence) for e in es], s.lease_ms, now=now_ms)
            for k, es in groups.items()
        ]
        server_now = None
        sent = self._round_sent = s.clock.monotonic()
        started = time.perf_counter()
        replies = await s.io.run_each(calls)
        if calls:
            s.metrics.heartbeat(time.perf_counter() - started)
        failures: list[Exception] = []
        renewed: list[InFlight] = []
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
                    renewed.append(e)
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
        if renewed and s.permits is not None and s.permits.limited:
            await s.permits.extend(renewed)  # (exact limits: their permits live on too)
        await in_thread(self._presence.announce, server_now)

    def _lost(self, entry: InFlight, reason: str) -> None:
        if not self._s.table.lost(entry, reason):
            return
        self._s.metrics.lease_lost(entry.keys.queue, reason)
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
        entry.stop_code(f"lease lost: {reason}")
        self._report_lost(entry, reason)

    def enforce_deadlines(self, now: float) -> None:
        """Self-fencing: a run whose lease ran out without a heartbeat reaching Redis (its
        master down, a partition) may be another worker's by now. Its code is told to stop
        (ctx.cancelled) now rather than when Redis answers again; its commit, if any, is
        judged by the fence as always."""
        for e in self._s.table.lease_ran_out(now):
            self._s.metrics.lease_lost(e.keys.queue, "expired")
            log.warning(
                "lease of run_id=%s fence=%d attempt=%d ran out without a heartbeat reaching "
                "Redis; stopping the work (another worker may hold the run now)",
                e.run.run_id,
                e.run.fence,
                e.run.attempt,
                extra=run_fields(e.run),
            )
            e.stop_code("lease expired: no heartbeat reached Redis")
            self._report_lost(e, "expired")

    def _report_lost(self, entry: InFlight, reason: str) -> None:
        hooks = self._s.hooks
        if hooks and not entry.lost_reported:
            entry.lost_reported = True
            what = "cancelled" if reason == "cancelled" else "lease-lost"
            hooks.event(run_event(entry, what, reason=reason))

    def release_calls(self, entries: list[InFlight]) -> list[Any]:
        """The release calls handing ``entries`` back (see report_released)."""
        now_ms = self._s.clock.now_ms()
        return [RELEASE.call(e.keys, e.run.run_id, e.run.fence, now=now_ms) for e in entries]

    def report_released(self, entries: list[InFlight], replies: list[Any]) -> None:
        for e, reply in zip(entries, replies, strict=True):
            if isinstance(reply, Exception):
                log.warning("release of run_id=%s failed (%s); its lease will expire",
                            e.run.run_id, reply)
                continue
            outcome = RELEASE.parse(reply)
            if outcome.accepted:
                self._s.stats.released += 1
            # The attempt is handed back uncounted (show says attempt N-1): say so, once.
            log.info(
                "released run_id=%s fence=%d attempt=%d: %s",
                e.run.run_id,
                e.run.fence,
                e.run.attempt,
                "not counted" if outcome.accepted else f"refused ({outcome.status})",
                extra=run_fields(e.run),
            )
