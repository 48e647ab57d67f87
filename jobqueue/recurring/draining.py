"""One scheduler partition drained batch after batch: the writes of batch i (creates, then its
advance) go out on a writer thread while this thread reads and plans batch i + 1, so the
client's planning and the server's script time overlap. Writes stay in order: a batch's advance
follows its creates, and batch i + 1's writes wait for batch i's. Every write is under the
scheduler's lease on the partition (``membership``): a batch whose lease is no longer trusted
is dropped, its jobs keep their next fire for whoever owns the partition."""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future, ThreadPoolExecutor

from jobqueue.recurring.buffered import BufferedRuns
from jobqueue.recurring.firing import Batch, Firing, TickReport
from jobqueue.recurring.membership import Ownership
from jobqueue.store.keys import SchedKeys

log = logging.getLogger("jobqueue.scheduler")

# Batches of one partition in one tick at most (a partition is drained in batches).
MAX_BATCHES = 10_000


class Drainer:
    """Drains the partitions this scheduler owns; holds the writer thread."""

    def __init__(self, firing: Firing, ownership: Ownership, buffered: BufferedRuns) -> None:
        self.firing = firing
        self.ownership = ownership
        self.buffered = buffered
        self._executor: ThreadPoolExecutor | None = None

    def drain(self, sk: SchedKeys, now: int | None, report: TickReport) -> None:
        """Fire everything due in ``sk``, batch after batch (sched_due.lua's cursor: the read
        of batch i + 1 starts after batch i's last job while i's writes are in flight)."""
        buffered = 0
        inflight: tuple[Batch, Future[None]] | None = None
        after: tuple[int, str] | None = None
        try:
            for _ in range(MAX_BATCHES):
                self.ownership.keep_alive(now)  # a herd takes many batches: keep the lease
                token = self.ownership.token(sk)
                if token is None:  # lost to another scheduler meanwhile: it goes on
                    break
                batch = self.firing.plan(sk, now, after)
                batch.token = token
                if inflight is not None:
                    # No "nothing advanced: stop" here: the cursor moves past jobs that cannot
                    # move yet (an overlap job not due until its fire time, a definition that
                    # vanished), so they never hide the due jobs behind them.
                    self._finish(inflight, report)
                    inflight = None
                buffered += batch.buffered
                if batch.groups:
                    inflight = (batch, self._writer().submit(self._write, batch, now))
                else:
                    report.add(batch.report)
                if batch.report.due_jobs < self.firing.batch:
                    break
                after = batch.cursor
        except BaseException:
            if inflight is not None:  # its writes end before the next partition's begin
                with contextlib.suppress(Exception):
                    inflight[1].result()
            raise
        if inflight is not None:
            self._finish(inflight, report)
        if buffered:  # a run buffered behind a predecessor that already finished: run it now
            report.released += self.buffered.release_buffered(sk, now)

    def fire(self, sk: SchedKeys, now: int | None = None) -> Batch:
        """Step one: own the partition (an empty batch when another scheduler does), read the
        due jobs, decide, create their runs (idempotent). The advance is left to
        ``Firing.advance``; stopping here is what a crash between the two looks like."""
        token = self.ownership.hold(sk, now)
        if token is None:
            return Batch(sk, 0)
        batch = self.firing.plan(sk, now)
        batch.token = token
        batch.report.runs_created = self.firing.send_creates(batch)
        return batch

    def _writer(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="jobqueue-sched-writer")
        return self._executor

    def _write(self, batch: Batch, now: int | None) -> None:
        if not self.ownership.still_held(batch.keys, now):
            # Another scheduler may own the partition by now: write nothing. The jobs keep
            # their next fire, so whoever owns the partition fires them.
            log.warning("lease of %s no longer held: batch dropped", batch.keys.prefix)
            batch.groups.clear()
            batch.report.dropped_batches += 1
            return
        batch.report.runs_created = self.firing.send_creates(batch)
        self.firing.advance(batch)

    @staticmethod
    def _finish(inflight: tuple[Batch, Future[None]], report: TickReport) -> Batch:
        batch, future = inflight
        future.result()  # the writer's error, if any, is this tick's error
        report.add(batch.report)
        return batch

    def close(self) -> None:
        """Stop the writer thread (its last writes finish first)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
