"""The scheduler daemon: turns recurring jobs into runs, exactly once per fire time, with any
number of instances running at once. They share the scheduler partitions: each tick starts
with a rebalance (``membership.Ownership``) that keeps this instance's leases on about K/N of
them, and only those are ticked.

One tick, per scheduler partition ``{sched#k}`` this instance owns, batch after batch:

1. ``sched_due.lua`` reads the server clock and the jobs whose next fire <= now + lookahead
   (one round trip; each distinct definition text once, jobs in segments sharing next fire and
   definition);
2. ``planning.plan_fires`` (pure, once per segment) computes the fire times in
   ``[next, now + lookahead]`` in the job's zone (``cron``: DST policy included), applies the
   misfire policy to the late ones (``misfire.apply_misfire``) and says where the next fire
   moves; ``planning.apply_overlap`` (pure) applies the overlap policy of the jobs that have one,
   given the state of their previous run;
3. the runs are created with ``sched_create.lua`` in the queue's slot (``{q#p}``), idempotent
   by run id ``<job_id>@<fire instant>``, due at fire + jitter;
4. ``advance.lua`` moves each job's next fire forward in the scheduler slot, compare-and-set
   against the next fire read in step 1 and never backwards, under this instance's lease token
   (refused whole when another took the partition over), and adds the tick's counters.

Steps 3 and 4 are in different slots, so they cannot be one transaction; they do not need to
be. A scheduler that dies between them leaves the next fire where it was: whoever owns the
partition next computes the same fire times, ``sched_create`` finds those runs already there,
and the advance happens then: nothing lost, nothing doubled. An owner that stalled past its
lease and wakes mid-tick writes nothing once it sees its lease is gone, and its advance is
fenced; what it created meanwhile are the new owner's run ids (a no-op), so each tick's
counters are added once. Steps 3-4 of one batch run on a writer thread while steps 1-2 of the
next batch run here (``draining``). The lookahead grows for a herd too big to be created
within it at the measured rate (``lookahead``).

Jobs with an overlap policy other than ``allow`` are not looked ahead: whether their previous
run is still unfinished is decided when a fire time comes, not a lookahead earlier, in the
queue that previous run went to (recorded in the job's state). They are fired by the first tick
after their fire time, up to a tick gap late: that is why the misfire grace is never below two
tick intervals (``misfire.effective_misfire_grace_ms``).
``buffer-one``'s waiting run is created buffered (due at a far hold time) and released by
``sched_release.lua`` once its predecessor has finished (``buffered``).

The modules: ``firing`` (steps 1-4 of a batch), ``draining`` (a partition's batches and the
writer thread), ``buffered`` (overlap lookups, buffered runs), ``lookahead``, ``membership`` (leases
of the partitions); this one runs the loop: start-up, ticks, retries, signals.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING

import redis

from jobqueue.errors import ConfigError, JobQueueError
from jobqueue.recurring.buffered import BufferedRuns
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.definitions import Definition
from jobqueue.recurring.draining import Drainer
from jobqueue.recurring.firing import Batch, Firing, TickReport
from jobqueue.recurring.lookahead import Lookahead
from jobqueue.recurring.membership import Ownership
from jobqueue.recurring.sync import Recurring, SyncReport
from jobqueue.runtime.metrics import NO_METRICS, Metrics
from jobqueue.runtime.signals import SignalRelay
from jobqueue.store.keys import SchedKeys

if TYPE_CHECKING:
    from jobqueue.client.sync import JobQueue

log = logging.getLogger("jobqueue.scheduler")

# What a tick, a start-up or a hand-over may meet and survive: Redis away, refusing, moving.
TICK_ERRORS = (JobQueueError, redis.exceptions.RedisError, redis.exceptions.RedisClusterException)


def retry_delay(failures: int) -> float:
    """Seconds to wait after the n-th failure in a row (1 s, 2 s, ... up to 30 s)."""
    return min(30.0, 0.5 * 2.0 ** min(failures, 6))


class Scheduler:
    """``Scheduler(jq, SchedulerConfig(...)).run()`` until stopped; ``tick(now=...)`` for one
    pass (tests, tools)."""

    def __init__(
        self,
        jq: JobQueue,
        config: SchedulerConfig | None = None,
        *,
        store: Recurring | None = None,
        declared: Sequence[Definition] | None = None,
        metrics: Metrics = NO_METRICS,
        install_signal_handlers: bool = True,
        scheduler_id: str | None = None,
    ) -> None:
        """``config``: how it runs (``SchedulerConfig()`` when None). ``store``: the
        definitions store (``jq.recurring``, or one expecting ``config.partitions`` when that
        is set). ``declared``: the app's code-declared schedules (``jq.declared_schedules``
        when None), written by :meth:`run` at start (``config.prune``: also removing the
        code-declared ones no longer declared)."""
        self.config = cfg = config or SchedulerConfig()
        self.jq = jq
        if store is None:
            store = Recurring(jq, cfg.partitions) if cfg.partitions else jq.recurring
        self.store = store
        self.interval = cfg.interval
        self.install_signal_handlers = install_signal_handlers
        self.total = TickReport()
        self.metrics = metrics
        self._stopping = threading.Event()
        self._signals = SignalRelay(self._signalled, "jobqueue-sched-signals")
        self.lookahead = Lookahead(cfg)
        self.ownership = Ownership(
            jq, self.store, cfg.partition_lease_ms, info=self.lookahead.registry_info()
        )
        if scheduler_id is not None:
            self.ownership.id = scheduler_id
        self.buffered = BufferedRuns(jq)
        self.firing = Firing(jq, cfg, self.lookahead, self.buffered)
        self.drainer = Drainer(self.firing, self.ownership, self.buffered)
        # Scheduler partitions skipped after a failure: keys -> (until, consecutive failures).
        self._cooldown: dict[SchedKeys, tuple[float, int]] = {}
        self.declared = list(jq.declared_schedules if declared is None else declared)
        self.prune = cfg.prune

    # -- what it is (tests and tools read these) ---------------------------------------------

    @property
    def id(self) -> str:
        return self.ownership.id

    @property
    def lookahead_ms(self) -> int:
        return self.lookahead.base_ms

    @property
    def max_lookahead_ms(self) -> int:
        return self.lookahead.max_ms

    @property
    def effective_lookahead_ms(self) -> int:
        """This tick's lookahead (it grows for a herd)."""
        return self.lookahead.effective_ms

    @property
    def create_rate(self) -> float | None:
        """The creation rate this scheduler measured (runs/s; None: not yet)."""
        return self.lookahead.rate

    @property
    def misfire_grace_ms(self) -> int:
        return self.firing.misfire_grace_ms

    @property
    def batch(self) -> int:
        return self.firing.batch

    def lookahead_for(self, jobs_ahead: int) -> int:
        return self.lookahead.lookahead_for(jobs_ahead)

    # -- code-declared schedules -----------------------------------------------------------

    def sync_declared(self) -> SyncReport:
        """Upsert the declared schedules; with ``prune``, remove the code-declared ones no
        longer declared (never those added at run time, which a declaration with the same id
        does not replace either: a warning names it). Each change is logged."""
        report = self.store.sync(self.declared, prune=self.prune)
        for job_id in report.ignored:
            log.warning(
                "%s is a runtime schedule (jq.schedule / CLI): the declaration in code is "
                "ignored; remove one of them",
                job_id,
            )
        for what, jobs in (
            ("created", report.created),
            ("updated (applies from its next fire)", report.updated),
            ("removed (no longer declared in code)", report.removed),
        ):
            for job_id in jobs:
                log.info("declared recurring job %s %s", job_id, what)
        if self.declared or report.removed:
            log.info(
                "declared schedules synced: %d created, %d updated, %d unchanged, %d removed, "
                "%d ignored",
                len(report.created),
                len(report.updated),
                len(report.unchanged),
                len(report.removed),
                len(report.ignored),
            )
        return report

    # -- one tick --------------------------------------------------------------------------

    def tick(self, now: int | None = None) -> TickReport:
        """Rebalance the scheduler partitions among the live schedulers (``membership``), then
        fire everything due in each partition this one owns (batch after batch), and release
        buffered runs whose predecessor finished.

        The writes of batch i (creates, then its advance) go out on a writer thread while this
        thread reads and plans batch i + 1, so the client's planning and the server's script
        time overlap. The read of i + 1 starts after batch i's last job (sched_due.lua's
        cursor) while i's advance is still in flight. Writes stay in order: a batch's advance
        follows its creates, and batch i + 1's writes wait for batch i's.
        """
        report = TickReport()
        keys = self.ownership.rebalance(now)
        report.partitions = len(keys)
        self.lookahead.plan(self.jq, keys, self.ownership.now_ms if now is None else now)
        self.ownership.info = self.lookahead.registry_info()
        failure: Exception | None = None
        worked = 0
        clock = time.monotonic()
        for sk in keys:
            cooling = self._cooldown.get(sk)
            if cooling is not None and cooling[0] > clock:
                report.failed_partitions += 1
                continue
            try:
                self._tick_partition(sk, now, report)
            except TICK_ERRORS as exc:
                # This partition's master down, its slot moving: skip it a while, the others
                # go on (a ConfigError of the whole setup is raised by the caller's retry).
                if isinstance(exc, ConfigError):
                    raise
                failures = (cooling[1] if cooling else 0) + 1
                self._cooldown[sk] = (clock + retry_delay(failures), failures)
                report.failed_partitions += 1
                failure = exc
                log.warning(
                    "scheduler partition %s failed (%s: %s); skipped for %.1fs, the others go "
                    "on",
                    sk.prefix,
                    type(exc).__name__,
                    " ".join(str(exc).split()),
                    retry_delay(failures),
                )
                continue
            worked += 1
            if cooling is not None:
                del self._cooldown[sk]
                log.info("scheduler partition %s works again", sk.prefix)
        self.total.add(report)
        self.metrics.scheduler_tick(report)
        if failure is not None and worked == 0:
            raise failure  # nothing worked: the run loop's back-off applies
        return report


    def _tick_partition(self, sk: SchedKeys, now: int | None, report: TickReport) -> None:
        # Release first: a fire that comes after the buffered run's predecessor finished
        # must not be skipped as "one already waiting".
        report.released += self.buffered.release_buffered(sk, now)
        started, before = time.monotonic(), report.runs_requested
        self.drainer.drain(sk, now, report)
        if self.lookahead.measure(report.runs_requested - before, time.monotonic() - started):
            self.ownership.info = self.lookahead.registry_info()

    def fire(self, sk: SchedKeys, now: int | None = None) -> Batch:
        """Steps 1-3 for one batch, without the advance (see ``Drainer.fire``)."""
        return self.drainer.fire(sk, now)

    def advance(self, batch: Batch) -> None:
        """Step 4: compare-and-set every job's next fire forward, with its counters."""
        self.firing.advance(batch)

    def release_buffered(self, sk: SchedKeys, now: int | None = None) -> int:
        """buffer-one: release the buffered runs whose predecessor has finished."""
        return self.buffered.release_buffered(sk, now)

    def close(self) -> None:
        """Stop the writer thread and give the partitions up (``run`` does this when it
        returns), so that the other schedulers take them over at once."""
        self.drainer.close()
        try:
            self.ownership.leave()
        except TICK_ERRORS as exc:
            log.warning("could not give the scheduler partitions up (%s): they are taken over "
                        "when their leases expire", exc)  # fmt: skip

    # -- the loop --------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Nothing that takes a lock: stop() sets an Event, whose lock this (main) thread may
        # hold at this very instant inside _stopping.wait() (see jobqueue.runtime.signals).
        self._signals.notify(signum)

    def _signalled(self, signum: int) -> None:
        log.info("signal %s: stopping after this tick", signum)
        self.stop()

    def _start_up(self) -> None:
        """What run() does once before its first tick: both touch Redis (the partition count
        is recorded with HSETNX, the declarations are written), so both are retried like a
        tick while Redis is unreachable or refuses writes."""
        log.info(
            "scheduler started: lookahead %.1fs, interval %.2fs, %d partition(s)",
            self.lookahead_ms / 1000,
            self.interval,
            self.store.record_partitions(),
        )
        self.sync_declared()

    def run(self, max_ticks: int | None = None) -> int:
        """Tick every ``interval`` seconds until stopped; Redis outages and refusals (OOM,
        READONLY after a failover, ...) are logged and retried, never fatal (a scheduler must
        not silently stop). A configuration mistake found at start-up is raised."""
        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            self._signals.start()
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        try:
            return self._run(max_ticks)
        finally:
            self._signals.close()

    def _run(self, max_ticks: int | None) -> int:
        ticks, failures, started_up = 0, 0, False
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                if not started_up:
                    self._start_up()
                    started_up = True
                report = self.tick()
                failures = 0
                if report.runs_requested or report.conflicts:
                    log.debug(
                        "tick: %d due, %d runs (%d new), %d advanced, %d conflicts",
                        report.due_jobs,
                        report.runs_requested,
                        report.runs_created,
                        report.advanced,
                        report.conflicts,
                    )
            # Any redis-py error too: a restarting server (ConnectionError), a full one under
            # noeviction (OOM) or a replica after a failover (READONLY) are ResponseErrors or
            # cluster errors from direct reads and writes, and none may end the daemon.
            except TICK_ERRORS as exc:
                if isinstance(exc, ConfigError) and not started_up:
                    raise  # e.g. partitions configured against what Redis records: no retry
                failures += 1
                delay = retry_delay(failures)
                what = "tick" if started_up else "start-up"
                log.warning(
                    "%s failed (%s: %s); retrying in %.1fs",
                    what,
                    type(exc).__name__,
                    " ".join(str(exc).split()),
                    delay,
                )
                # An Event wait: stop() (the SIGTERM handler) ends the back-off at once.
                self._stopping.wait(delay)
                continue
            ticks += 1
            if max_ticks is not None and ticks >= max_ticks:
                break
            self._stopping.wait(max(0.0, self.interval - (time.monotonic() - started)))
        self.close()
        log.info("scheduler stopped after %d ticks", ticks)
        return 0
