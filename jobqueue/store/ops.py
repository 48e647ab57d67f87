"""Script calls and their replies, without I/O: what the sync and asyncio clients, the worker
and the CLI share. Each ``*_call`` builds a Call for one partition; each ``parse_*`` turns the
script's reply into typed values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from jobqueue.anomalies import stored_int
from jobqueue.store.contract import contract
from jobqueue.store.keys import PartitionKeys, spread_tag
from jobqueue.store.scripts import Call

NowArg = int | None

_CREATE, _CLAIM, _HEARTBEAT, _COMPLETE = (
    contract(n) for n in ("create_run", "claim", "heartbeat", "complete")
)
_FAIL, _RELEASE, _CANCEL, _REQUEUE = (contract(n) for n in ("fail", "release", "cancel", "requeue"))
_FENCED_WRITE, _PURGE, _REPAIR = contract("fenced_write"), contract("purge"), contract("repair")
_SCHED_DUE, _ADVANCE, _SCHED_DEFINE = (
    contract(n) for n in ("sched_due", "advance", "sched_define")
)


def _now(now: NowArg) -> str | int:
    return "" if now is None else int(now)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(slots=True)
class RunSpec:
    """Everything create_run needs to write one run (not frozen: built once per enqueued run,
    and a frozen dataclass costs several microseconds more to build)."""

    run_id: str
    task: str
    payload: str
    due_at_ms: int | None = None
    delay_ms: int = 0
    max_attempts: int = 3
    lease_ms: int = 0
    timeout_ms: int = 0
    job_id: str = ""
    scheduled_for_ms: int | None = None


def create_call(pk: PartitionKeys, specs: Sequence[RunSpec], now: NowArg = None) -> Call:
    """Runs in order; consecutive runs sharing task, attempts, lease and timeout form one
    group whose shared fields are sent once (create_run.lua)."""
    args: list[str | int] = [_now(now), pk.prefix]
    i, n = 0, len(specs)
    while i < n:
        first = specs[i]
        head = (first.task, first.max_attempts, first.lease_ms, first.timeout_ms)
        j = i + 1
        while j < n and (
            specs[j].task == head[0]
            and specs[j].max_attempts == head[1]
            and specs[j].lease_ms == head[2]
            and specs[j].timeout_ms == head[3]
        ):
            j += 1
        args += [j - i, *head]
        for s in specs[i:j]:
            args += [
                s.run_id,
                s.payload,
                "" if s.due_at_ms is None else s.due_at_ms,
                s.delay_ms,
                s.job_id,
                "" if s.scheduled_for_ms is None else s.scheduled_for_ms,
            ]
        i = j
    return _CREATE.call(pk, args)


def parse_create(reply: Sequence[Any]) -> list[bool]:
    """Per run, in order: True when this call created it, False when it already existed."""
    return [int(x) == 1 for x in reply[1:]]


class ClaimedRun(NamedTuple):
    """One claimed run (a tuple: built per run on the worker's hot path)."""

    run_id: str
    fence: int
    attempt: int
    max_attempts: int
    task: str
    payload: str
    lease_until_ms: int
    timeout_ms: int
    job_id: str
    scheduled_for_ms: int | None
    due_ms: int


@dataclass(frozen=True)
class ClaimResult:
    now_ms: int
    next_wake_ms: int | None
    runs: list[ClaimedRun]


CLAIM_STRIDE = 11


def claim_call(
    pk: PartitionKeys,
    limit: int,
    owner: str,
    lease_ms: int,
    dead_retention_ms: int,
    now: NowArg = None,
) -> Call:
    return _CLAIM.call(pk, (_now(now), pk.prefix, limit, owner, lease_ms, dead_retention_ms))


def parse_claim(reply: Sequence[Any]) -> ClaimResult:
    now, next_wake, count = int(reply[0]), int(reply[1]), int(reply[2])
    if count and isinstance(reply[3], bytes):  # a client without decode_responses
        reply = [*reply[:3], *(_text(x) if isinstance(x, bytes) else x for x in reply[3:])]
    runs = []
    for i in range(3, 3 + count * CLAIM_STRIDE, CLAIM_STRIDE):
        rid, fence, attempt, most, task, payload, until, timeout, job, sched, due = reply[
            i : i + CLAIM_STRIDE
        ]
        runs.append(
            ClaimedRun(
                rid,
                int(fence),
                int(attempt),
                int(most),
                task,
                payload,
                int(until),
                int(timeout),
                job,
                # Informational only: a garbage value in a record must not fail the claim.
                # isdigit() alone took "²", which int() refuses: strictly ASCII digits.
                stored_int(sched),
                int(due),
            )
        )
    return ClaimResult(now, None if next_wake < 0 else next_wake, runs)


def heartbeat_call(
    pk: PartitionKeys, leases: Sequence[tuple[str, int]], lease_ms: int, now: NowArg = None
) -> Call:
    args: list[str | int] = [_now(now), pk.prefix, lease_ms]
    for run_id, fence in leases:
        args += [run_id, fence]
    return _HEARTBEAT.call(pk, args)


def parse_heartbeat(reply: Sequence[Any]) -> list[int | str]:
    """Per lease: the new expiry in ms, or the refusal reason."""
    return [x if isinstance(x, int) else _text(x) for x in reply[1:]]


class Outcome(NamedTuple):
    """The answer of a fenced operation: accepted, or refused with the reason (a tuple: one
    per committed run)."""

    accepted: bool
    status: str  # 'done', 'retry', 'dead', 'released' or the refusal reason
    current_fence: int | None = None
    retry_at_ms: int | None = None


def parse_outcome(reply: Sequence[Any]) -> Outcome:
    """The outcome of a one-run fenced call (complete's batched reply of one included)."""
    if len(reply) == 1 and isinstance(reply[0], list | tuple):
        reply = reply[0]
    status = _text(reply[1])
    if int(reply[0]) == 1:
        retry_at = int(reply[2]) if status == "retry" else None
        return Outcome(True, status, retry_at_ms=retry_at)
    fence = int(reply[2]) if len(reply) > 2 else None
    return Outcome(False, status, current_fence=fence)


def complete_call(
    pk: PartitionKeys,
    run_id: str,
    fence: int,
    result_json: str,
    retention_ms: int,
    now: NowArg = None,
) -> Call:
    """One run's completion (its reply parses with ``parse_outcome``)."""
    return complete_many_call(pk, [(run_id, fence, result_json)], retention_ms, now)


def complete_many_call(
    pk: PartitionKeys,
    items: Sequence[tuple[str, int, str]],
    retention_ms: int,
    now: NowArg = None,
) -> Call:
    """Completions of several runs of one partition: (run_id, fence, result JSON) each."""
    args: list[str | int] = [_now(now), pk.prefix, retention_ms]
    for run_id, fence, result_json in items:
        args += [run_id, fence, result_json]
    return _COMPLETE.call(pk, args)


def parse_outcomes(reply: Sequence[Any]) -> list[Outcome]:
    """A batched script's outcomes, one per run (complete.lua)."""
    return [parse_outcome(r) for r in reply]


def fail_call(
    pk: PartitionKeys,
    run_id: str,
    fence: int,
    error: str,
    retry_delay_ms: int | None,
    dead_retention_ms: int,
    now: NowArg = None,
) -> Call:
    return _FAIL.call(
        pk,
        (
            _now(now),
            pk.prefix,
            run_id,
            fence,
            error,
            "" if retry_delay_ms is None else retry_delay_ms,
            dead_retention_ms,
        ),
    )


def release_call(pk: PartitionKeys, run_id: str, fence: int, now: NowArg = None) -> Call:
    return _RELEASE.call(pk, (_now(now), pk.prefix, run_id, fence))


def cancel_call(
    pk: PartitionKeys, run_id: str, retention_ms: int, reason: str, now: NowArg = None
) -> Call:
    return _CANCEL.call(pk, (_now(now), pk.prefix, run_id, retention_ms, reason))


def requeue_call(pk: PartitionKeys, run_id: str, now: NowArg = None) -> Call:
    return _REQUEUE.call(pk, (_now(now), pk.prefix, run_id))


def parse_state_change(reply: Sequence[Any]) -> tuple[bool, str]:
    """cancel / requeue: (changed, previous state or refusal)."""
    return int(reply[0]) == 1, _text(reply[1])


def fenced_write_call(
    pk: PartitionKeys,
    resource: str,
    fence: int,
    value: str,
    run_id: str,
    ttl_ms: int = 0,
    now: NowArg = None,
) -> Call:
    return _FENCED_WRITE.call_with(
        {"resource": pk.fence_resource(resource), "run": pk.run(run_id)},
        (_now(now), fence, value, run_id, ttl_ms),
    )


def parse_fenced_write(reply: Sequence[Any]) -> tuple[bool, int]:
    return int(reply[0]) == 1, int(reply[1])


# -- recurring jobs (scheduler partitions, hash tag {sched#k}) ---------------------------------


@dataclass(frozen=True)
class SchedKeys:
    """The keys of one scheduler partition; every name carries the same hash tag. ``spread``:
    the partition count K when the store is recorded with the spread placement (see
    ``jobqueue.store.keys``), 0 for the tags ``{sched#k}``."""

    partition: int
    spread: int = 0

    @property
    def prefix(self) -> str:
        return f"jq:{{{spread_tag('sched', self.partition, self.spread)}}}:"

    @property
    def owner(self) -> str:
        """The lease by which one scheduler owns the partition (sched_lease.lua)."""
        return self.prefix + "owner"

    @property
    def defs(self) -> str:
        return self.prefix + "def"

    @property
    def next(self) -> str:
        return self.prefix + "next"

    @property
    def state(self) -> str:
        return self.prefix + "state"

    @property
    def held(self) -> str:
        """buffer-one: job_id -> 'held_fire predecessor_fire' while its run waits."""
        return self.prefix + "held"


@dataclass(frozen=True)
class DueJob:
    job_id: str
    next_ms: int
    definition: str  # '' when the definition vanished
    state: str  # '' when the job never fired


def sched_due_call(
    sk: SchedKeys,
    lookahead_ms: int,
    limit: int,
    now: NowArg = None,
    after: tuple[int, str] | None = None,
) -> Call:
    """``after`` = (next fire, job id) of the previous batch's last job (see sched_due.lua)."""
    cursor: tuple[str | int, str] = ("", "") if after is None else after
    return _SCHED_DUE.call(sk, (_now(now), lookahead_ms, limit, *cursor))


def parse_sched_due(reply: Sequence[Any]) -> tuple[int, list[DueJob]]:
    """(now, due jobs); ``state`` is the '<state>|<held>' text of overlap-policed jobs only."""
    ndefs = int(reply[1])
    defs = ["", *(_text(d) for d in reply[2 : 2 + ndefs])]
    jobs: list[DueJob] = []
    i = 2 + ndefs
    while i < len(reply):  # segments: next, def index, extra, count, job ids
        next_ms, text, extra = int(float(_text(reply[i]))), defs[int(reply[i + 1])], reply[i + 2]
        count = int(reply[i + 3])
        jobs += (
            DueJob(_text(j), next_ms, text, _text(extra)) for j in reply[i + 4 : i + 4 + count]
        )
        i += 4 + count
    return int(reply[0]), jobs


@dataclass(frozen=True)
class Advance:
    """One job's compare-and-set move of its next fire time, with what the tick counted."""

    job_id: str
    expected_next_ms: int
    new_next_ms: int | None
    fired: int = 0
    missed: int = 0
    skipped: int = 0
    dropped: int = 0
    last_fire_ms: int | None = None
    through_ms: int = 0
    held: str = ""  # buffer-one: 'held_fire predecessor_fire' to record, '' for none


def advance_call(
    sk: SchedKeys, moves: Sequence[Advance], now: NowArg = None, token: int = 0
) -> Call:
    """Moves that share everything but the job id travel as one group (advance.lua), under
    the caller's lease ``token`` on the partition."""
    groups: dict[tuple[str | int, ...], list[str]] = {}
    for m in moves:
        header = (
            m.expected_next_ms,
            "" if m.new_next_ms is None else m.new_next_ms,
            m.fired,
            m.missed,
            m.skipped,
            m.dropped,
            "" if m.last_fire_ms is None else m.last_fire_ms,
            m.through_ms,
            m.held,
        )
        groups.setdefault(header, []).append(m.job_id)
    args: list[str | int] = [_now(now), token]
    for fields, jobs in groups.items():
        args += [len(jobs), *fields, *jobs]
    return _ADVANCE.call(sk, args)


def parse_advance(reply: Sequence[Any]) -> list[bool]:
    """Per job: advanced (a refusal is 0, or 2 when the caller's token was not current)."""
    return [int(x) == 1 for x in reply[1:]]


def sched_define_call(
    sk: SchedKeys,
    job_id: str,
    *,
    expected_definition: str | None,
    expected_next_ms: int | None,
    definition: str | None,
    next_ms: int | None,
    state: str = "",
) -> Call:
    """Put (``definition`` given) or delete (``definition`` None) one job, compare-and-set."""
    return _SCHED_DEFINE.call(
        sk,
        (
            "",
            job_id,
            "delete" if definition is None else "put",
            expected_definition or "",
            "" if expected_next_ms is None else expected_next_ms,
            definition or "",
            "" if next_ms is None else next_ms,
            state,
        ),
    )


def parse_sched_define(reply: Any) -> bool:
    return int(reply) == 1


def purge_call(pk: PartitionKeys, run_ids: Sequence[str]) -> Call:
    return _PURGE.call(pk, ("", pk.prefix, *run_ids))


def parse_purge(reply: Sequence[Any]) -> tuple[int, int]:
    """(purged, refused because no longer dead)."""
    return int(reply[0]), int(reply[1])


def repair_call(
    pk: PartitionKeys, run_ids: Sequence[str], dry_run: bool = False, now: NowArg = None
) -> Call:
    return _REPAIR.call(pk, (_now(now), pk.prefix, "1" if dry_run else "0", *run_ids))


class Repaired(NamedTuple):
    indexed: int  # records given their missing index entry
    orphaned: int  # index entries without a record, moved to the orphans index
    unorphaned: int  # orphans whose record is back, put back in place
    unchanged: int


def parse_repair(reply: Sequence[Any]) -> Repaired:
    return Repaired(*(int(x) for x in reply[:4]))
