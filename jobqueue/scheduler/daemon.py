"""The scheduler daemon: turns recurring jobs into runs, exactly once per fire time, with any
number of instances running at once. They share the scheduler partitions: each tick starts
with a rebalance (``membership.Ownership``) that keeps this instance's leases on about K/N of
them, and only those are ticked.

One tick, per scheduler partition ``{sched#k}`` this instance owns, batch after batch:

1. ``sched_due.lua`` reads the server clock and the jobs whose next fire <= now + lookahead
   (one round trip; each distinct definition text once, jobs in segments sharing next fire and
   definition);
2. :func:`plan_fires` (pure, once per segment) computes the fire times in
   ``[next, now + lookahead]`` in the job's zone (``cron``: DST policy included), applies the
   misfire policy to the late ones (``misfire.apply_misfire``) and says where the next fire
   moves; :func:`apply_overlap` (pure) applies the overlap policy of the jobs that have one,
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
next batch run here (see :meth:`Scheduler.tick`). The lookahead grows for a herd too big to be
created within it at the measured rate (:meth:`Scheduler.lookahead_for`).

Jobs with an overlap policy other than ``allow`` are not looked ahead: whether their previous
run is still unfinished is decided when a fire time comes, not a lookahead earlier, in the
queue that previous run went to (recorded in the job's state). They are fired by the first tick
after their fire time, up to a tick gap late: that is why the grace is never below two tick
intervals (``misfire.effective_grace_ms``).
``buffer-one``'s waiting run is created held and released by ``sched_release.lua`` once its
predecessor has finished (see :meth:`Scheduler.release_held`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from types import FrameType
from typing import TYPE_CHECKING, Any

import redis

from jobqueue.errors import ConfigError, JobQueueError
from jobqueue.policy.cron import (
    Schedule,
    fire_times_between,
    next_fire_after,
    period_ms,
)
from jobqueue.policy.jitter import jitter_ms, job_hash
from jobqueue.policy.misfire import (
    DEFAULT_GRACE_MS,
    MisfirePolicy,
    apply_misfire,
    effective_grace_ms,
    parse_policy,
)
from jobqueue.runtime.metrics import NO_METRICS, Metrics
from jobqueue.runtime.signals import SignalRelay
from jobqueue.scheduler.membership import DEFAULT_PARTITION_LEASE_S, Ownership
from jobqueue.schedules.recurring import Definition, JobState, Overlap, Recurring, SyncReport
from jobqueue.store.keys import (
    PartitionKeys,
    SchedKeys,
    fire_run_id,
    partition_of,
    validate_queue_name,
)
from jobqueue.store.schedules import (
    ADVANCE,
    HOLD_MS,
    SCHED_CREATE,
    SCHED_DUE,
    SCHED_RELEASE,
    SCHED_UNHOLD,
    AdvanceHeader,
    Moved,
    RunGroup,
)
from jobqueue.store.scripts import Call

if TYPE_CHECKING:
    from jobqueue.client.sync import JobQueue

log = logging.getLogger("jobqueue.scheduler")

DEFAULT_LOOKAHEAD_MS = 60_000
DEFAULT_BATCH = 1000
DEFAULT_INTERVAL_S = 1.0
# Fire times one job may create in one tick (a 1 ms interval with a 60 s lookahead would
# otherwise make 60,000); the rest follow in the next ticks.
MAX_FIRES_PER_TICK = 1000
# Counting late fire times of a cron schedule past this many is an estimate (by its period).
LATE_SCAN_LIMIT = 100_000
UNFINISHED = frozenset({"pending", "running"})
# Scheduled runs per sched_create call: large enough to amortise the call, small enough that
# one script never blocks the server for long (about 10 ms).
CREATE_CHUNK = 1000
ADVANCE_CHUNK = 1000
# The lookahead grows (up to --max-lookahead, by default this many times --lookahead) so that
# the jobs firing within it can be created before their fire time: jobs due within
# max_lookahead / creation rate x the margin.
MAX_LOOKAHEAD_FACTOR = 10
LOOKAHEAD_MARGIN = 1.5
# Runs/s assumed before this scheduler measured its own (--create-rate): a conservative
# share of what one scheduler process measured here against one Redis (bench/scheduler.py;
# its sittings: docs/performance.md).
DEFAULT_CREATE_RATE = 20_000.0
# A partition's drain counts as a measurement of the creation rate from this many runs on.
RATE_SAMPLE_RUNS = 1000


def retry_delay(failures: int) -> float:
    """Seconds to wait after the n-th failure in a row (1 s, 2 s, ... up to 30 s)."""
    return min(30.0, 0.5 * 2.0 ** min(failures, 6))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- pure decisions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirePlan:
    """What one tick does for one job (before the overlap policy)."""

    job_id: str
    expected_next_ms: int
    fires: list[int]
    missed: int
    dropped: int
    new_next_ms: int | None  # None: the schedule has ended
    through_ms: int


def _count_fires(schedule: Schedule, lo: int, hi: int, anchor: int | None) -> int:
    """Fire times in ``(lo, hi]``: exact for intervals, estimated past LATE_SCAN_LIMIT for cron."""
    if hi <= lo:
        return 0
    if schedule.every_ms is not None:
        first = next_fire_after(schedule, lo, anchor)
        return 0 if first > hi else (hi - first) // schedule.every_ms + 1
    fires = fire_times_between(schedule, lo, hi, limit=LATE_SCAN_LIMIT, anchor_ms=anchor)
    if len(fires) < LATE_SCAN_LIMIT:
        return len(fires)
    return len(fires) + (hi - fires[-1]) // period_ms(schedule)


def _last_fires(schedule: Schedule, lo: int, hi: int, k: int, anchor: int | None) -> list[int]:
    """The last ``k`` fire times in ``(lo, hi]``, without walking the whole range."""
    if k <= 0 or hi <= lo:
        return []
    window = (k + 1) * period_ms(schedule)
    while True:
        start = max(lo, hi - window)
        fires = fire_times_between(schedule, start, hi, anchor_ms=anchor)
        if len(fires) >= k or start == lo:
            return fires[-k:]
        window *= 4


@lru_cache(maxsize=8192)
def _plan_core(
    schedule: Schedule,
    anchor: int | None,
    end: int | None,
    policy: MisfirePolicy,
    next_ms: int,
    now_ms: int,
    horizon_ms: int,
    grace_ms: int,
    max_fires: int,
) -> tuple[tuple[int, ...], int, int, int | None, int]:
    """Shared by every job with the same timing and next fire in one tick (a herd: cheap)."""
    if end is not None:
        horizon_ms = min(horizon_ms, end)
    lo = next_ms - 1  # fire times >= next are unhandled
    late_end = now_ms - grace_ms - 1  # late: now - t > grace
    late_end = min(late_end, horizon_ms)
    late_count, tail = 0, []
    truncated = False  # more late fire times to fire than max_fires: the rest next tick
    if late_end > lo:
        match policy.kind:
            case "fire-all":
                tail = _last_fires(schedule, lo, late_end, policy.cap, anchor)
            case "fire-once":
                tail = _last_fires(schedule, lo, late_end, 1, anchor)
            case "deadline":
                start = max(lo, now_ms - policy.deadline_ms - 1)
                tail = fire_times_between(
                    schedule, start, late_end, limit=max_fires, anchor_ms=anchor
                )
                if len(tail) == max_fires and tail[-1] < late_end:
                    # Still within the deadline but over this tick's budget: handle fire
                    # times only through the last one fired; the next tick continues there
                    # (those that pass the deadline meanwhile are missed then, not now).
                    truncated = True
                    late_end = tail[-1]
            case _:
                tail = []
        late_count = _count_fires(schedule, lo, late_end, anchor)
    on_lo = max(lo, late_end)
    on_time = (
        fire_times_between(schedule, on_lo, horizon_ms, limit=max_fires, anchor_ms=anchor)
        if horizon_ms > on_lo and not truncated
        else []
    )
    decision = apply_misfire(policy, tail + on_time, now_ms, grace_ms)
    hidden = late_count - len(tail)  # late fire times never handed to apply_misfire
    missed = decision.missed + hidden
    dropped = decision.dropped_by_cap + (hidden if policy.kind == "fire-all" else 0)
    if truncated:
        through = late_end
    elif len(on_time) == max_fires:
        through = on_time[-1]
    else:
        through = max(horizon_ms, lo)
    new_next: int | None = next_fire_after(schedule, through, anchor)
    if end is not None and new_next is not None and new_next > end:
        new_next = None
    return tuple(decision.fire), missed, dropped, new_next, through


def plan_fires(
    defn: Definition,
    next_ms: int,
    now_ms: int,
    lookahead_ms: int = DEFAULT_LOOKAHEAD_MS,
    grace_ms: int = DEFAULT_GRACE_MS,
    max_fires: int = MAX_FIRES_PER_TICK,
) -> FirePlan | None:
    """Which fire times of one job get a run this tick, and where its next fire moves.

    Fire times in ``[next_ms, now + lookahead]`` are considered (``now`` alone for jobs with
    an overlap policy); those late by more than ``grace_ms`` go through the misfire policy.
    None when nothing is due yet (only possible without lookahead).
    """
    horizon = now_ms + (lookahead_ms if defn.overlap == "allow" else 0)
    if next_ms > horizon and (defn.end_ms is None or next_ms <= defn.end_ms):
        return None
    fires, missed, dropped, new_next, through = _plan_core(
        defn.schedule,
        defn.start_ms,
        defn.end_ms,
        parse_policy(defn.misfire),
        next_ms,
        now_ms,
        horizon,
        grace_ms,
        max_fires,
    )
    return FirePlan(defn.job_id, next_ms, list(fires), missed, dropped, new_next, through)


def apply_overlap(
    overlap: Overlap, fires: Sequence[int], previous_state: str | None, buffered: bool = False
) -> tuple[list[int], int]:
    """(fire times kept, number skipped) given the state of the job's previous run and, for
    ``buffer-one``, whether a buffered run is already waiting.

    * ``allow``: every fire time runs;
    * ``forbid``: nothing while the previous run is pending or running; otherwise only the
      latest fire time (the runs of several would overlap each other);
    * ``buffer-one``: at most one run waits: nothing while one is buffered, otherwise the
      latest fire time, whose run is held until the previous one finishes (see
      :meth:`Scheduler.release_held`).
    """
    if overlap == "allow" or not fires:
        return list(fires), 0
    blocked = previous_state in UNFINISHED if overlap == "forbid" else buffered
    if blocked:
        return [], len(fires)
    return list(fires[-1:]), len(fires) - 1


# -- the daemon ---------------------------------------------------------------------------------


@dataclass
class TickReport:
    """What one tick did, summed over partitions and batches."""

    now_ms: int = 0
    due_jobs: int = 0  # jobs read as due (one that cannot move yet may be read again)
    runs_requested: int = 0
    runs_created: int = 0
    advanced: int = 0
    conflicts: int = 0
    missed: int = 0
    skipped: int = 0
    dropped: int = 0
    released: int = 0
    create_failures: int = 0  # jobs whose runs could not be created (kept for the next tick)
    failed_partitions: int = 0  # scheduler partitions skipped this tick (their master down)
    fenced: int = 0  # jobs whose advance was refused: another scheduler took the partition
    partitions: int = 0  # scheduler partitions this scheduler owned and ticked
    dropped_batches: int = 0  # batches not written: the lease could not be trusted any more

    def add(self, other: TickReport) -> None:
        self.now_ms = max(self.now_ms, other.now_ms)
        for name in (
            "due_jobs",
            "runs_requested",
            "runs_created",
            "advanced",
            "conflicts",
            "missed",
            "skipped",
            "dropped",
            "released",
            "create_failures",
            "failed_partitions",
            "fenced",
            "partitions",
            "dropped_batches",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Batch:
    """Step one of a tick for one scheduler partition: runs created, advance still to do."""

    keys: SchedKeys
    now_ms: int
    groups: dict[AdvanceHeader, list[str]] = field(default_factory=dict)
    report: TickReport = field(default_factory=TickReport)
    cursor: tuple[int, str] | None = None  # (next, job) of the last job read
    creates: list[Call] = field(default_factory=list)
    create_jobs: list[list[str]] = field(default_factory=list)  # the job ids of each create
    held: int = 0  # buffer-one entries this batch records
    token: int = 0  # the scheduler's lease token on the partition (advance.lua's fence)


@dataclass
class _DefInfo:
    """What a batch needs of one distinct definition text, worked out once."""

    tmpl: Definition
    payload: str
    keys: list[PartitionKeys]  # the queue's partitions


def _header(
    plan: FirePlan, fires: Sequence[int], skipped: int, held: str, queue: str
) -> AdvanceHeader:
    return (
        plan.expected_next_ms,
        "" if plan.new_next_ms is None else plan.new_next_ms,
        len(fires),
        plan.missed,
        skipped,
        plan.dropped,
        f"{fires[-1]} {queue}" if fires else "",
        plan.through_ms,
        held,
    )


class Scheduler:
    """``Scheduler(jq).run()`` until stopped; ``tick(now=...)`` for one pass (tests, tools)."""

    def __init__(
        self,
        jq: JobQueue,
        *,
        lookahead: float = DEFAULT_LOOKAHEAD_MS / 1000,
        interval: float = DEFAULT_INTERVAL_S,
        grace: float = DEFAULT_GRACE_MS / 1000,
        batch: int = DEFAULT_BATCH,
        max_fires: int = MAX_FIRES_PER_TICK,
        store: Recurring | None = None,
        install_signal_handlers: bool = True,
        metrics: Metrics = NO_METRICS,
        declared: Sequence[Definition] | None = None,
        prune: bool = False,
        partition_lease: float = DEFAULT_PARTITION_LEASE_S,
        scheduler_id: str | None = None,
        max_lookahead: float | None = None,
        create_rate: float = DEFAULT_CREATE_RATE,
    ) -> None:
        """``declared``: the app's code-declared schedules (``jq.declared_schedules`` when
        None), written by :meth:`run` at start; ``prune`` also removes the code-declared ones
        no longer declared. ``partition_lease``: how long this scheduler's lease on each
        scheduler partition it owns lasts without renewal (see ``membership``).
        ``max_lookahead``: how far the lookahead may grow so that a herd is created before
        its fire time (MAX_LOOKAHEAD_FACTOR x ``lookahead`` when None: no growth with no
        lookahead), at the creation rate this scheduler measures (``create_rate`` runs/s
        until it has measured one); see :meth:`lookahead_for`."""
        if lookahead < 0 or interval <= 0 or grace < 0 or batch < 1 or max_fires < 1:
            raise ValueError("lookahead and grace >= 0, interval > 0, batch and max_fires >= 1")
        if not partition_lease > 0 or not create_rate > 0:
            raise ValueError("partition_lease > 0 and create_rate > 0")
        self.jq = jq
        self.store = store or jq.recurring
        self.lookahead_ms = int(lookahead * 1000)
        most = MAX_LOOKAHEAD_FACTOR * lookahead if max_lookahead is None else max_lookahead
        if most < 0:
            raise ValueError("max_lookahead >= 0")
        self.max_lookahead_ms = max(self.lookahead_ms, int(most * 1000))
        # This tick's lookahead (lookahead_for), and the creation rate measured (runs/s).
        self.effective_lookahead_ms = self.lookahead_ms
        self.create_rate: float | None = None
        self.assumed_rate = create_rate
        self.interval = interval
        # Never below two tick intervals: overlap jobs (not looked ahead) and every job with a
        # lookahead shorter than the interval are handled up to a tick gap after their fire
        # time, and a healthy scheduler must not count those as misfires.
        self.grace_ms = effective_grace_ms(int(grace * 1000), int(interval * 1000))
        self.batch = batch
        self.max_fires = max_fires
        self.install_signal_handlers = install_signal_handlers
        self.total = TickReport()
        self.metrics = metrics
        self._stopping = threading.Event()
        self._signals = SignalRelay(self._signalled, "jobqueue-sched-signals")
        self._executor: ThreadPoolExecutor | None = None
        self.ownership = Ownership(
            jq,
            self.store,
            int(partition_lease * 1000),
            info=self._registry_info(),
        )
        if scheduler_id is not None:
            self.ownership.id = scheduler_id
        # Scheduler partitions skipped after a failure: keys -> (until, consecutive failures).
        self._cooldown: dict[SchedKeys, tuple[float, int]] = {}
        self.declared = list(jq.declared_schedules if declared is None else declared)
        self.prune = prune

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

    @property
    def id(self) -> str:
        return self.ownership.id

    def _registry_info(self) -> dict[str, Any]:
        """What the registry shows of this scheduler besides its partitions."""
        return {
            "lookahead_ms": self.effective_lookahead_ms,
            "base_lookahead_ms": self.lookahead_ms,
            "max_lookahead_ms": self.max_lookahead_ms,
            "interval_ms": int(self.interval * 1000),
            "rate": None if self.create_rate is None else round(self.create_rate),
        }

    def lookahead_for(self, jobs_ahead: int) -> int:
        """The lookahead (ms) that lets this scheduler create ``jobs_ahead`` runs (the jobs
        of its partitions firing within --max-lookahead) before they fire: the time that
        takes at its creation rate, with a margin, never below --lookahead nor above
        --max-lookahead. A top-of-hour herd of 5,000,000 at 46,000 runs/s needs ~109 s:
        its creation then starts ~163 s before the hour instead of 60 s."""
        rate = self.create_rate or self.assumed_rate
        needed = int(jobs_ahead / rate * LOOKAHEAD_MARGIN * 1000)
        return min(self.max_lookahead_ms, max(self.lookahead_ms, needed))

    def _plan_lookahead(self, keys: Sequence[SchedKeys], now: int | None) -> None:
        """Set this tick's lookahead from the jobs of ``keys`` firing within --max-lookahead
        (one ZCOUNT per partition, pipelined per master)."""
        if self.max_lookahead_ms <= self.lookahead_ms or not keys:
            self.effective_lookahead_ms = self.lookahead_ms
            return
        horizon = (self.ownership.now_ms if now is None else now) + self.max_lookahead_ms
        ahead = 0
        for sk in keys:
            try:
                ahead += int(self.jq.redis.zcount(sk.next, "(-inf", horizon))
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                continue  # its master down: counted when it is back
        self.effective_lookahead_ms = self.lookahead_for(ahead)
        self.ownership.info = self._registry_info()

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
        self._plan_lookahead(keys, now)
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
            except (
                JobQueueError,
                redis.exceptions.RedisError,
                redis.exceptions.RedisClusterException,
            ) as exc:
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
        report.released += self.release_held(sk, now)
        started, before = time.monotonic(), report.runs_requested
        self._drain(sk, now, report)
        runs = report.runs_requested - before
        if runs >= RATE_SAMPLE_RUNS:
            sample = runs / max(time.monotonic() - started, 1e-6)
            rate = self.create_rate
            self.create_rate = sample if rate is None else 0.5 * rate + 0.5 * sample
            self.ownership.info = self._registry_info()

    def _drain(self, sk: SchedKeys, now: int | None, report: TickReport) -> None:
        held = 0
        inflight: tuple[Batch, Future[None]] | None = None
        after: tuple[int, str] | None = None
        try:
            for _ in range(10_000):  # bounded: a partition is drained in batches
                self.ownership.keep_alive(now)  # a herd takes many batches: keep the lease
                token = self.ownership.token(sk)
                if token is None:  # lost to another scheduler meanwhile: it goes on
                    break
                batch = self._plan(sk, now, after)
                batch.token = token
                if inflight is not None:
                    # No "nothing advanced: stop" here: the cursor moves past jobs that cannot
                    # move yet (an overlap job not due until its fire time, a definition that
                    # vanished), so they never hide the due jobs behind them.
                    self._finish(inflight, report)
                    inflight = None
                held += batch.held
                if batch.groups:
                    inflight = (batch, self._writer().submit(self._write, batch, now))
                else:
                    report.add(batch.report)
                if batch.report.due_jobs < self.batch:
                    break
                after = batch.cursor
        except BaseException:
            if inflight is not None:  # its writes end before the next partition's begin
                with contextlib.suppress(Exception):
                    inflight[1].result()
            raise
        if inflight is not None:
            self._finish(inflight, report)
        if held:  # a run buffered behind a predecessor that already finished: run it now
            report.released += self.release_held(sk, now)

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
        batch.report.runs_created = self._send_creates(batch)
        self.advance(batch)

    @staticmethod
    def _finish(inflight: tuple[Batch, Future[None]], report: TickReport) -> Batch:
        batch, future = inflight
        future.result()  # the writer's error, if any, is this tick's error
        report.add(batch.report)
        return batch

    def close(self) -> None:
        """Stop the writer thread and give the partitions up (``run`` does this when it
        returns), so that the other schedulers take them over at once."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        try:
            self.ownership.leave()
        except (JobQueueError, redis.exceptions.RedisError, redis.exceptions.RedisClusterException
                ) as exc:  # fmt: skip
            log.warning("could not give the scheduler partitions up (%s): they are taken over "
                        "when their leases expire", exc)  # fmt: skip

    def fire(self, sk: SchedKeys, now: int | None = None) -> Batch:
        """Step one: own the partition (an empty batch when another scheduler does), read the
        due jobs, decide, create their runs (idempotent). The advance is left to
        :meth:`advance`; stopping here is what a crash between the two looks like."""
        token = self.ownership.hold(sk, now)
        if token is None:
            return Batch(sk, 0)
        batch = self._plan(sk, now)
        batch.token = token
        batch.report.runs_created = self._send_creates(batch)
        return batch

    def _plan(
        self, sk: SchedKeys, now: int | None = None, after: tuple[int, str] | None = None
    ) -> Batch:
        """Read the due jobs (after ``after``, see sched_due.lua) and decide: the create calls
        and the advance groups, nothing written yet.

        The hot path of a herd: one parsed definition, payload and plan per distinct
        (definition text, next fire); per job only its jitter, its queue partition and two
        list appends. Runs go out grouped (sched_create.lua), advances too (advance.lua).
        """
        due = SCHED_DUE.parse(
            self.jq.scripts.run(
                SCHED_DUE.call(sk, self.effective_lookahead_ms, self.batch, now, after)
            )
        )
        now_ms = due.now_ms
        batch = Batch(sk, now_ms)
        report = batch.report
        report.now_ms = now_ms
        if not due.segments:
            return batch
        infos = self._definitions(due.definitions)
        runs: dict[tuple[PartitionKeys, int, int], list[str | int]] = {}
        groups = batch.groups
        policed: list[tuple[str, _DefInfo, FirePlan, str]] = []
        for next_ms, idx, extra, jobs in due.segments:
            count = len(jobs)
            report.due_jobs += count
            batch.cursor = (next_ms, jobs[-1])
            info = infos[idx]
            if info is None:
                if idx == 0:
                    log.warning("recurring jobs %s have a next fire but no definition", jobs)
                continue
            plan = plan_fires(
                info.tmpl,
                next_ms,
                now_ms,
                self.effective_lookahead_ms,
                self.grace_ms,
                self.max_fires,
            )
            if plan is None:
                continue
            if extra:  # an overlap policy: one job per segment, decided in _police
                policed.append((jobs[0], info, plan, extra))
                continue
            groups.setdefault(_header(plan, plan.fires, 0, "", info.tmpl.queue), []).extend(jobs)
            report.runs_requested += len(plan.fires) * count
            report.missed += plan.missed * count
            report.dropped += plan.dropped * count
            if not plan.fires:
                continue
            # Per job: its jitter and its queue partition; the rest is shared by the segment.
            keys, window = info.keys, info.tmpl.jitter_ms
            nkeys = len(keys)
            for fire in plan.fires:
                if nkeys == 1:
                    flat = runs.setdefault((keys[0], idx, fire), [])
                    if window:
                        for job in jobs:
                            flat += (job, fire + job_hash(job) % window)
                    else:
                        for job in jobs:
                            flat += (job, fire)
                    continue
                for job in jobs:
                    pk = keys[partition_of(job, nkeys)]
                    jitter = job_hash(job) % window if window else 0
                    runs.setdefault((pk, idx, fire), []).extend((job, fire + jitter))
        if policed:
            self._police(batch, policed, infos, runs)
        batch.creates, batch.create_jobs = self._create_calls(runs, infos, now)
        return batch

    def _definitions(self, texts: Sequence[Any]) -> list[_DefInfo | None]:
        """Index 0 is 'no definition'; an unusable text is logged and its jobs left alone."""
        out: list[_DefInfo | None] = [None]
        limit = self.jq.settings.max_payload_bytes
        for raw in texts:
            text = _text(raw)
            try:
                tmpl = Definition.from_json("", text)
                self.jq.register_queue(tmpl.queue)
                keys = self.jq.all_partition_keys(tmpl.queue)
                out.append(_DefInfo(tmpl, tmpl.payload(limit), keys))
            except (ValueError, KeyError, TypeError) as exc:
                log.error("unusable recurring job definition %.200s: %s", text, exc)
                out.append(None)
        return out

    def _police(
        self,
        batch: Batch,
        jobs: list[tuple[str, _DefInfo, FirePlan, str]],
        infos: list[_DefInfo | None],
        runs: dict[tuple[PartitionKeys, int, int], list[str | int]],
    ) -> None:
        """Jobs with an overlap policy: decide from the state of their previous run, looked up
        in the queue that run went to (the job's queue may have changed since)."""
        lasts: list[tuple[int | None, str]] = []
        usable = []
        for entry in jobs:
            text = entry[3].partition("|")[0]
            try:
                state = JobState.parse(text)
            except ValueError:
                # Its overlap decision needs the previous fire: leave the job alone (not
                # advanced, so nothing is lost) and say so; `schedules show` names it too.
                log.error("recurring job %s: unusable state %.100r; not fired", entry[0], text)
                continue
            usable.append(entry)
            lasts.append((state.last_fire_ms, state.last_queue or entry[1].tmpl.queue))
        jobs = usable
        previous = self._previous_states(
            [(job, queue, last) for (job, _, _, _), (last, queue) in zip(jobs, lasts, strict=True)]
        )
        index_of = {id(info): i for i, info in enumerate(infos) if info is not None}
        report = batch.report
        for (job, info, plan, extra), (last, last_queue), prev in zip(
            jobs, lasts, previous, strict=True
        ):
            tmpl = info.tmpl
            buffered = bool(extra.partition("|")[2])
            fires, skipped = apply_overlap(tmpl.overlap, plan.fires, prev, buffered)
            keys = info.keys
            pk = keys[0] if len(keys) == 1 else keys[partition_of(job, len(keys))]
            held = ""
            jitter = jitter_ms(job, tmpl.jitter_ms)
            for fire in fires:
                due = fire + jitter
                if tmpl.overlap == "buffer-one":
                    # Always recorded, held only while the predecessor is unfinished: a crash
                    # before the advance recomputes the same fire, finds the run created, and
                    # records it then; the release pass sorts out which ones still wait.
                    pred = -1 if last is None else last
                    held = f"{fire} {pred} {due} {tmpl.queue}"
                    if pred >= 0 and last_queue != tmpl.queue:
                        held += f" {last_queue}"  # the predecessor is in another queue
                    if prev in UNFINISHED:
                        due = HOLD_MS
                    batch.held += 1
                runs.setdefault((pk, index_of[id(info)], fire), []).extend((job, due))
            header = _header(plan, fires, skipped, held, tmpl.queue)
            batch.groups.setdefault(header, []).append(job)
            report.runs_requested += len(fires)
            report.missed += plan.missed
            report.skipped += skipped
            report.dropped += plan.dropped

    def _create_calls(
        self,
        runs: dict[tuple[PartitionKeys, int, int], list[str | int]],
        infos: list[_DefInfo | None],
        now: int | None,
    ) -> tuple[list[Call], list[list[str]]]:
        """sched_create calls of at most CREATE_CHUNK runs each, and each one's job ids."""
        by_pk: dict[PartitionKeys, list[tuple[RunGroup, list[str | int]]]] = {}
        for (pk, idx, fire), flat in runs.items():
            info = infos[idx]
            assert info is not None
            tmpl = info.tmpl
            group = RunGroup(
                task=tmpl.task,
                payload=info.payload,
                max_attempts=tmpl.max_attempts,
                lease_ms=tmpl.lease_ms,
                timeout_ms=tmpl.timeout_ms,
                scheduled_for_ms=fire,
            )
            by_pk.setdefault(pk, []).append((group, flat))
        calls: list[Call] = []
        jobs: list[list[str]] = []

        def send(pk: PartitionKeys, chunk: list[tuple[RunGroup, Sequence[str | int]]]) -> None:
            calls.append(SCHED_CREATE.call(pk, chunk, now))
            jobs.append([str(job) for _, part in chunk for job in part[0::2]])

        for pk, groups in by_pk.items():
            chunk: list[tuple[RunGroup, Sequence[str | int]]] = []
            size = 0
            for group, flat in groups:
                for start in range(0, len(flat), 2 * CREATE_CHUNK):
                    part = flat[start : start + 2 * CREATE_CHUNK]
                    chunk.append((group, part))
                    size += len(part) // 2
                    if size >= CREATE_CHUNK:
                        send(pk, chunk)
                        chunk, size = [], 0
            if chunk:
                send(pk, chunk)
        return calls, jobs

    def _send_creates(self, batch: Batch) -> int:
        """One pipelined round trip (one per master on a cluster); how many runs were created.
        The jobs of a create that did not land (its master down, its slot moving) are left out
        of the batch's advance: their next fire stays, and a later tick fires them again
        (creation is idempotent), while every other job goes on."""
        if not batch.creates:
            return 0
        created, failed, error = 0, set(), None
        replies = self.jq.scripts.run_each(batch.creates)
        for jobs, reply in zip(batch.create_jobs, replies, strict=True):
            if isinstance(reply, Exception):
                failed.update(jobs)
                error = reply
            else:
                created += SCHED_CREATE.parse(reply)
        if failed:
            log.warning(
                "runs of %d recurring jobs not created (%s); their fires are kept for the next "
                "tick",
                len(failed),
                error,
            )
            for header, group in list(batch.groups.items()):
                kept = [job for job in group if job not in failed]
                if kept:
                    batch.groups[header] = kept
                else:
                    del batch.groups[header]
            batch.report.create_failures += len(failed)
        return created

    def advance(self, batch: Batch) -> None:
        """Step two: compare-and-set every job's next fire forward, with its counters."""
        if not batch.groups:
            return
        # At most ADVANCE_CHUNK jobs per group (advance.lua unpacks them onto the Lua stack).
        chunks: list[tuple[AdvanceHeader, list[str]]] = [
            (header, jobs[i : i + ADVANCE_CHUNK])
            for header, jobs in batch.groups.items()
            for i in range(0, len(jobs), ADVANCE_CHUNK)
        ]
        call = ADVANCE.call(batch.keys, chunks, batch.now_ms, batch.token)
        flags = ADVANCE.parse(self.jq.scripts.run(call))
        batch.report.advanced = flags.count(Moved.ADVANCED)
        batch.report.fenced = flags.count(Moved.FENCED)
        batch.report.conflicts = len(flags) - batch.report.advanced
        if batch.report.fenced:
            log.warning(
                "advance of %d jobs in %s refused: another scheduler owns the partition now",
                batch.report.fenced,
                batch.keys.prefix,
            )

    def _run_keys(self, job: str, queue: str) -> PartitionKeys | None:
        """The partition of ``queue`` that holds the job's runs (None: an unusable queue name,
        e.g. a corrupt state text, which is logged)."""
        try:
            count = self.jq.register_queue(validate_queue_name(queue))
        except (ValueError, JobQueueError) as exc:
            log.error("recurring job %s: unusable queue %r: %s", job, queue, exc)
            return None
        return self.jq.partition_keys(queue, partition_of(job, count))

    def _previous_states(self, jobs: list[tuple[str, str, int | None]]) -> list[str | None]:
        """The state of each job's previous run, given (job, queue of that run, its fire)
        (None: none, or expired)."""
        out: list[str | None] = [None] * len(jobs)
        wanted = []
        for i, (job, queue, last) in enumerate(jobs):
            pk = None if last is None else self._run_keys(job, queue)
            if pk is not None and last is not None:
                wanted.append((i, pk.run(fire_run_id(job, last))))
        if not wanted:
            return out
        pipe = self.jq.redis.pipeline(transaction=False)
        for _i, key in wanted:
            pipe.hget(key, "state")
        for (i, _), state in zip(wanted, pipe.execute(), strict=True):
            out[i] = None if state is None else _text(state)
        return out

    def release_held(self, sk: SchedKeys, now: int | None = None) -> int:
        """buffer-one: release the held runs whose predecessor has finished (sched_release.lua,
        one atomic check-and-release in the run's slot), then forget the entries whose run no
        longer waits (compare-and-set). Returns how many runs were released.

        A predecessor in another queue (the job's queue changed between the two fires) is in
        another slot: its state is read first, and the held run is released (with no
        predecessor to check in its own slot) only once that state is finished. Finished is
        final but for an operator's requeue, which the one-slot check cannot prevent either.
        """
        entries = {_text(k): _text(v) for k, v in self.jq.redis.hgetall(sk.held).items()}
        if not entries:
            return 0
        by_pk: dict[PartitionKeys, list[tuple[str, str, tuple[str, str, int]]]] = {}
        # (predecessor's partition, held run's partition, job, held text, held run)
        elsewhere: list[tuple[PartitionKeys, PartitionKeys, str, str, tuple[str, str, int]]] = []
        for job, text in entries.items():
            try:
                fire_s, pred_s, due_s, queue, *rest = text.split(" ")
                fire, pred, due = int(fire_s), int(pred_s), int(due_s)
                pred_queue = rest[0] if rest else queue
                if len(rest) > 1:
                    raise ValueError("too many fields")
                count = self.jq.register_queue(queue)
            except (ValueError, JobQueueError) as exc:
                log.error("recurring job %s: unusable held entry %r: %s", job, text, exc)
                continue
            pk = self.jq.partition_keys(queue, partition_of(job, count))
            pred_id = "" if pred < 0 else fire_run_id(job, pred)
            held = (fire_run_id(job, fire), pred_id, due)
            if pred_id and pred_queue != queue:
                pred_pk = self._run_keys(job, pred_queue)
                if pred_pk is None:
                    continue
                elsewhere.append((pred_pk, pk, job, text, held))
                continue
            by_pk.setdefault(pk, []).append((job, text, held))
        if elsewhere:
            pipe = self.jq.redis.pipeline(transaction=False)
            for pred_pk, _pk, _job, _held_text, (_, pred_id, _) in elsewhere:
                pipe.hget(pred_pk.run(pred_id), "state")
            for (_, pk, job, text, (run_id, _, due)), state in zip(
                elsewhere, pipe.execute(), strict=True
            ):
                if state is None or _text(state) not in UNFINISHED:
                    by_pk.setdefault(pk, []).append((job, text, (run_id, "", due)))
        calls = [
            SCHED_RELEASE.call(pk, [h for _, _, h in items], now) for pk, items in by_pk.items()
        ]
        released, done = 0, []
        for (pk, items), reply in zip(by_pk.items(), self.jq.scripts.run_each(calls), strict=True):
            if isinstance(reply, Exception):  # its master down: released at a later tick
                log.warning("held runs in %s not released yet (%s)", pk.prefix, reply)
                continue
            for (job, text, _), result in zip(items, SCHED_RELEASE.parse(reply), strict=True):
                released += result == 1
                if result:
                    done.append((job, text))
        if done:
            self.jq.scripts.run(SCHED_UNHOLD.call(sk, done, now))
        return released

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
            except (
                JobQueueError,
                redis.exceptions.RedisError,
                redis.exceptions.RedisClusterException,
            ) as exc:
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
