"""The scheduler daemon: turns recurring jobs into runs, exactly once per fire time, with any
number of instances running at once.

One tick, per scheduler partition ``{sched#k}``:

1. ``sched_due.lua`` reads the server clock and the jobs whose next fire <= now + lookahead,
   with their definitions and counters (one round trip);
2. :func:`plan_fires` (pure) computes each job's fire times in ``[next, now + lookahead]`` in
   its zone (``cron``: DST policy included), applies the misfire policy to the late ones
   (``misfire.apply_misfire``) and says where the next fire moves; :func:`apply_overlap`
   (pure) applies the overlap policy, given the state of the job's previous run;
3. the runs are created with ``create_run.lua`` in the queue's slot (``{q#p}``), idempotent by
   run id ``<job_id>@<fire instant>``, due at fire + jitter;
4. ``advance.lua`` moves each job's next fire forward in the scheduler slot, compare-and-set
   against the next fire read in step 1 and never backwards, and adds the tick's counters.

Steps 3 and 4 are in different slots, so they cannot be one transaction; they do not need to
be. A scheduler that dies between them leaves the next fire where it was: the next tick (of any
instance) computes the same fire times, ``create_run`` finds those runs already there, and the
advance happens then: nothing lost, nothing doubled. Two instances racing on one tick both
create (the second creation is a no-op) and only one advance is accepted, so each tick's
counters are added once.

Jobs with an overlap policy other than ``allow`` are not looked ahead: whether their previous
run is still unfinished is decided when a fire time comes, not a lookahead earlier.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import FrameType
from typing import TYPE_CHECKING

from . import ops
from .base import Planned
from .cron import Schedule, fire_times_between, format_fire_instant, next_fire_after, period_ms
from .errors import ConnectionFailed, JobQueueError
from .jitter import jitter_ms
from .keys import PartitionKeys, partition_of
from .misfire import DEFAULT_GRACE_MS, MisfirePolicy, apply_misfire, parse_policy
from .ops import Advance, DueJob, RunSpec, SchedKeys
from .recurring import Definition, JobState, Overlap, Recurring

if TYPE_CHECKING:
    from .client import JobQueue

log = logging.getLogger("jobqueue.scheduler")

DEFAULT_LOOKAHEAD_MS = 60_000
DEFAULT_BATCH = 1000
# Fire times one job may create in one tick (a 1 ms interval with a 60 s lookahead would
# otherwise make 60,000); the rest follow in the next ticks.
MAX_FIRES_PER_TICK = 1000
# Counting late fire times of a cron schedule past this many is an estimate (by its period).
LATE_SCAN_LIMIT = 100_000
UNFINISHED = frozenset({"pending", "running"})


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
    if late_end > lo:
        late_count = _count_fires(schedule, lo, late_end, anchor)
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
            case _:
                tail = []
    on_lo = max(lo, late_end)
    on_time = (
        fire_times_between(schedule, on_lo, horizon_ms, limit=max_fires, anchor_ms=anchor)
        if horizon_ms > on_lo
        else []
    )
    decision = apply_misfire(policy, tail + on_time, now_ms, grace_ms)
    hidden = late_count - len(tail)  # late fire times never handed to apply_misfire
    missed = decision.missed + hidden
    dropped = decision.dropped_by_cap + (hidden if policy.kind == "fire-all" else 0)
    through = on_time[-1] if len(on_time) == max_fires else max(horizon_ms, lo)
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
    overlap: Overlap, fires: Sequence[int], previous_state: str | None
) -> tuple[list[int], int]:
    """(fire times kept, number skipped) given the state of the job's previous run.

    * ``allow``: every fire time runs;
    * ``forbid``: nothing while the previous run is pending or running; otherwise only the
      latest fire time (the runs of several would overlap each other);
    * ``buffer-one``: at most one run waits: nothing while the previous run has not started,
      otherwise the latest fire time.
    """
    if overlap == "allow" or not fires:
        return list(fires), 0
    blocked = previous_state in UNFINISHED if overlap == "forbid" else previous_state == "pending"
    if blocked:
        return [], len(fires)
    return list(fires[-1:]), len(fires) - 1


# -- the daemon ---------------------------------------------------------------------------------


@dataclass
class TickReport:
    """What one tick did, summed over partitions and batches."""

    now_ms: int = 0
    due_jobs: int = 0
    runs_requested: int = 0
    runs_created: int = 0
    advanced: int = 0
    conflicts: int = 0
    missed: int = 0
    skipped: int = 0
    dropped: int = 0

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
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Batch:
    """Step one of a tick for one scheduler partition: runs created, advance still to do."""

    keys: SchedKeys
    now_ms: int
    jobs: list[DueJob]
    moves: list[Advance] = field(default_factory=list)
    report: TickReport = field(default_factory=TickReport)


@lru_cache(maxsize=4096)
def _fire_instant(ms: int) -> str:
    return format_fire_instant(ms)


class Scheduler:
    """``Scheduler(jq).run()`` until stopped; ``tick(now=...)`` for one pass (tests, tools)."""

    def __init__(
        self,
        jq: JobQueue,
        *,
        lookahead: float = DEFAULT_LOOKAHEAD_MS / 1000,
        interval: float = 1.0,
        grace: float = DEFAULT_GRACE_MS / 1000,
        batch: int = DEFAULT_BATCH,
        max_fires: int = MAX_FIRES_PER_TICK,
        store: Recurring | None = None,
        install_signal_handlers: bool = True,
    ) -> None:
        if lookahead < 0 or interval <= 0 or grace < 0 or batch < 1 or max_fires < 1:
            raise ValueError("lookahead and grace >= 0, interval > 0, batch and max_fires >= 1")
        self.jq = jq
        self.store = store or jq.recurring
        self.lookahead_ms = int(lookahead * 1000)
        self.interval = interval
        self.grace_ms = int(grace * 1000)
        self.batch = batch
        self.max_fires = max_fires
        self.install_signal_handlers = install_signal_handlers
        self.total = TickReport()
        self._stopping = threading.Event()

    # -- one tick --------------------------------------------------------------------------

    def tick(self, now: int | None = None) -> TickReport:
        """Fire everything due in every partition (batch after batch)."""
        report = TickReport()
        for sk in self.store.all_keys():
            for _ in range(10_000):  # bounded: a partition is drained in batches
                batch = self.fire(sk, now)
                self.advance(batch)
                report.add(batch.report)
                if len(batch.jobs) < self.batch or batch.report.advanced == 0:
                    break
        self.total.add(report)
        return report

    def fire(self, sk: SchedKeys, now: int | None = None) -> Batch:
        """Step one: read the due jobs, decide, create their runs (idempotent). The advance is
        left to :meth:`advance`; stopping here is what a crash between the two looks like."""
        reply = self.jq.scripts.run(ops.sched_due_call(sk, self.lookahead_ms, self.batch, now))
        now_ms, jobs = ops.parse_sched_due(reply)
        batch = Batch(sk, now_ms, jobs)
        batch.report.now_ms = now_ms
        batch.report.due_jobs = len(jobs)
        # A herd shares its definition text (job ids live outside it): parse, plan and encode
        # the payload once per (text, next fire), then only the run id and jitter per job.
        plans: list[tuple[str, Definition, JobState, FirePlan | None]] = []
        shared: dict[tuple[str, int], FirePlan | None] = {}
        for job in jobs:
            if not job.definition:
                log.warning("recurring job %s has a next fire but no definition", job.job_id)
                continue
            try:
                tmpl = Definition.from_json("", job.definition)
                key = (job.definition, job.next_ms)
                if key not in shared:
                    shared[key] = plan_fires(
                        tmpl, job.next_ms, now_ms, self.lookahead_ms, self.grace_ms, self.max_fires
                    )
            except (ValueError, KeyError, TypeError) as exc:
                log.error("recurring job %s: unusable definition: %s", job.job_id, exc)
                continue
            if shared[key] is not None:
                plans.append((job.job_id, tmpl, JobState.parse(job.state), shared[key]))
        previous = self._previous_states([(j, d, s) for j, d, s, _ in plans])
        planned: list[Planned] = []
        payloads: dict[int, str] = {}  # by id() of the shared parsed definition
        limit = self.jq.settings.max_payload_bytes
        for job_id, tmpl, _state, plan in plans:
            assert plan is not None
            fires, skipped = apply_overlap(tmpl.overlap, plan.fires, previous.get(job_id))
            if fires:
                payload = payloads.get(id(tmpl))
                if payload is None:
                    payload = payloads[id(tmpl)] = tmpl.payload(limit)
                count = self.jq.register_queue(tmpl.queue)
                pk = PartitionKeys(tmpl.queue, partition_of(job_id, count))
                jitter = jitter_ms(job_id, tmpl.jitter_ms)
                for fire in fires:
                    spec = RunSpec(
                        run_id=f"{job_id}@{_fire_instant(fire)}",
                        task=tmpl.task,
                        payload=payload,
                        due_at_ms=fire + jitter,
                        max_attempts=tmpl.max_attempts,
                        lease_ms=tmpl.lease_ms,
                        timeout_ms=tmpl.timeout_ms,
                        job_id=job_id,
                        scheduled_for_ms=fire,
                    )
                    planned.append(Planned(pk, spec))
            batch.moves.append(
                Advance(
                    job_id=job_id,
                    expected_next_ms=plan.expected_next_ms,
                    new_next_ms=plan.new_next_ms,
                    fired=len(fires),
                    missed=plan.missed,
                    skipped=skipped,
                    dropped=plan.dropped,
                    last_fire_ms=fires[-1] if fires else None,
                    through_ms=plan.through_ms,
                )
            )
            batch.report.runs_requested += len(fires)
            batch.report.missed += plan.missed
            batch.report.skipped += skipped
            batch.report.dropped += plan.dropped
        if planned:
            batch.report.runs_created = sum(self.jq._create(planned, now))
        return batch

    def advance(self, batch: Batch) -> None:
        """Step two: compare-and-set every job's next fire forward, with its counters."""
        if not batch.moves:
            return
        reply = self.jq.scripts.run(ops.advance_call(batch.keys, batch.moves, batch.now_ms))
        accepted = ops.parse_advance(reply)
        batch.report.advanced = sum(accepted)
        batch.report.conflicts = len(accepted) - batch.report.advanced

    def _previous_states(
        self, jobs: list[tuple[str, Definition, JobState]]
    ) -> dict[str, str | None]:
        """The state of each overlap-policed job's previous run (None: none, or expired)."""
        wanted = [
            (j, d, s.last_fire_ms)
            for j, d, s in jobs
            if d.overlap != "allow" and s.last_fire_ms is not None
        ]
        if not wanted:
            return {}
        pipe = self.jq.redis.pipeline(transaction=False)
        for job_id, defn, last in wanted:
            assert last is not None
            count = self.jq.register_queue(defn.queue)
            run_id = f"{job_id}@{_fire_instant(last)}"
            pipe.hget(PartitionKeys(defn.queue, partition_of(run_id, count)).run(run_id), "state")
        states = pipe.execute()
        return {j: s for (j, _, _), s in zip(wanted, states, strict=True)}

    # -- the loop --------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: stopping after this tick", signum)
        self.stop()

    def run(self, max_ticks: int | None = None) -> int:
        """Tick every ``interval`` seconds until stopped; Redis outages are logged and
        retried, never fatal (a scheduler must not silently stop)."""
        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        log.info(
            "scheduler started: lookahead %.1fs, interval %.2fs, %d partition(s)",
            self.lookahead_ms / 1000,
            self.interval,
            self.store.partitions,
        )
        ticks, failures = 0, 0
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
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
            except (ConnectionFailed, JobQueueError) as exc:
                failures += 1
                log.warning("tick failed (%s); retrying", exc)
                self._stopping.wait(min(30.0, 0.5 * 2 ** min(failures, 6)))
                continue
            ticks += 1
            if max_ticks is not None and ticks >= max_ticks:
                break
            self._stopping.wait(max(0.0, self.interval - (time.monotonic() - started)))
        log.info("scheduler stopped after %d ticks", ticks)
        return 0
