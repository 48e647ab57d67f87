"""Steps 1-4 of a tick for one batch of one scheduler partition (see ``jobqueue.recurring.daemon``):
read the due jobs (``sched_due.lua``), plan their fires (``planning``), create their runs
(``sched_create.lua``, idempotent by run id) and move their next fires forward
(``advance.lua``, compare-and-set, fenced by the lease token). The hot path of a herd."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobqueue.policy.jitter import jitter_ms, job_hash
from jobqueue.policy.misfire import (
    effective_misfire_grace_ms,
)
from jobqueue.recurring.buffered import BufferedRuns
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.definitions import Definition, JobState
from jobqueue.recurring.lookahead import Lookahead
from jobqueue.recurring.planning import UNFINISHED, FirePlan, apply_overlap, plan_fires
from jobqueue.store.keys import (
    PartitionKeys,
    SchedKeys,
    partition_of,
)
from jobqueue.store.schedules import (
    ADVANCE,
    HOLD_MS,
    SCHED_CREATE,
    SCHED_DUE,
    AdvanceHeader,
    Moved,
    RunGroup,
)
from jobqueue.store.scripts import Call

if TYPE_CHECKING:
    from jobqueue.client.sync import JobQueue

log = logging.getLogger("jobqueue.scheduler")


# Scheduled runs per sched_create call: large enough to amortise the call, small enough that
# one script never blocks the server for long (about 10 ms).
CREATE_CHUNK = 1000
ADVANCE_CHUNK = 1000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
    buffered: int = 0  # buffer-one entries this batch records
    token: int = 0  # the scheduler's lease token on the partition (advance.lua's fence)


@dataclass
class _DefInfo:
    """What a batch needs of one distinct definition text, worked out once."""

    tmpl: Definition
    payload: str
    keys: list[PartitionKeys]  # the queue's partitions


def _header(
    plan: FirePlan, fires: Sequence[int], skipped: int, entry: str, queue: str
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
        entry,
    )



class Firing:
    """One scheduler's batches: :meth:`plan` (steps 1-2: read and decide, nothing written),
    :meth:`send_creates` (3) and :meth:`advance` (4)."""

    def __init__(
        self, jq: JobQueue, config: SchedulerConfig, lookahead: Lookahead, buffered: BufferedRuns
    ) -> None:
        self.jq = jq
        self.batch = config.batch
        self.max_fires = config.max_fires
        # Never below two tick intervals: overlap jobs (not looked ahead) and every job with a
        # lookahead shorter than the interval are handled up to a tick gap after their fire
        # time, and a healthy scheduler must not count those as misfires.
        self.misfire_grace_ms = effective_misfire_grace_ms(
            int(config.misfire_grace * 1000), int(config.interval * 1000)
        )
        self.lookahead = lookahead
        self.buffered = buffered

    def plan(
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
                SCHED_DUE.call(sk, self.lookahead.effective_ms, self.batch, now, after)
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
                self.lookahead.effective_ms,
                self.misfire_grace_ms,
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
        previous = self.buffered.previous_states(
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
            entry_text = ""  # the buffer-one entry advance.lua records ('': none)
            jitter = jitter_ms(job, tmpl.jitter_ms)
            for fire in fires:
                due = fire + jitter
                if tmpl.overlap == "buffer-one":
                    # Always recorded, buffered only while the predecessor is unfinished: a crash
                    # before the advance recomputes the same fire, finds the run created, and
                    # records it then; the release pass sorts out which ones still wait.
                    pred = -1 if last is None else last
                    entry_text = f"{fire} {pred} {due} {tmpl.queue}"
                    if pred >= 0 and last_queue != tmpl.queue:
                        entry_text += f" {last_queue}"  # the predecessor is in another queue
                    if prev in UNFINISHED:
                        due = HOLD_MS
                    batch.buffered += 1
                runs.setdefault((pk, index_of[id(info)], fire), []).extend((job, due))
            header = _header(plan, fires, skipped, entry_text, tmpl.queue)
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

    def send_creates(self, batch: Batch) -> int:
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
