"""Script calls and their replies, without I/O: what the sync and asyncio clients, the worker
and the CLI share. Each ``*_call`` builds a Call for one partition; each ``parse_*`` turns the
script's reply into typed values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .keys import PartitionKeys
from .scripts import Call

NowArg = int | None


def _now(now: NowArg) -> str | int:
    return "" if now is None else int(now)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class RunSpec:
    """Everything create_run needs to write one run."""

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
    args: list[str | int] = [_now(now), pk.prefix, pk.queue]
    for s in specs:
        args += [
            s.run_id,
            s.task,
            s.payload,
            "" if s.due_at_ms is None else s.due_at_ms,
            s.delay_ms,
            s.max_attempts,
            s.lease_ms,
            s.timeout_ms,
            s.job_id,
            "" if s.scheduled_for_ms is None else s.scheduled_for_ms,
        ]
    return Call("create_run", (pk.due, pk.wake, pk.stats), tuple(args))


def parse_create(reply: Sequence[Any]) -> list[bool]:
    """Per run, in order: True when this call created it, False when it already existed."""
    return [int(x) == 1 for x in reply[1:]]


@dataclass(frozen=True)
class ClaimedRun:
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
    return Call(
        "claim",
        (pk.due, pk.leases, pk.dead, pk.stats),
        (_now(now), pk.prefix, limit, owner, lease_ms, dead_retention_ms),
    )


def parse_claim(reply: Sequence[Any]) -> ClaimResult:
    now, next_wake, count = int(reply[0]), int(reply[1]), int(reply[2])
    runs = []
    for i in range(3, 3 + count * CLAIM_STRIDE, CLAIM_STRIDE):
        r = reply[i : i + CLAIM_STRIDE]
        sched = _text(r[9])
        runs.append(
            ClaimedRun(
                run_id=_text(r[0]),
                fence=int(r[1]),
                attempt=int(r[2]),
                max_attempts=int(r[3]),
                task=_text(r[4]),
                payload=_text(r[5]),
                lease_until_ms=int(r[6]),
                timeout_ms=int(r[7]),
                job_id=_text(r[8]),
                scheduled_for_ms=int(sched) if sched else None,
                due_ms=int(r[10]),
            )
        )
    return ClaimResult(now, None if next_wake < 0 else next_wake, runs)


def heartbeat_call(
    pk: PartitionKeys, leases: Sequence[tuple[str, int]], lease_ms: int, now: NowArg = None
) -> Call:
    args: list[str | int] = [_now(now), pk.prefix, lease_ms]
    for run_id, fence in leases:
        args += [run_id, fence]
    return Call("heartbeat", (pk.leases,), tuple(args))


def parse_heartbeat(reply: Sequence[Any]) -> list[int | str]:
    """Per lease: the new expiry in ms, or the refusal reason."""
    return [x if isinstance(x, int) else _text(x) for x in reply[1:]]


@dataclass(frozen=True)
class Outcome:
    """The answer of a fenced operation: accepted, or refused with the reason."""

    accepted: bool
    status: str  # 'done', 'retry', 'dead', 'released' or the refusal reason
    current_fence: int | None = None
    retry_at_ms: int | None = None


def parse_outcome(reply: Sequence[Any]) -> Outcome:
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
    return Call(
        "complete",
        (pk.leases, pk.done, pk.stats),
        (_now(now), pk.prefix, run_id, fence, result_json, retention_ms),
    )


def fail_call(
    pk: PartitionKeys,
    run_id: str,
    fence: int,
    error: str,
    retry_delay_ms: int | None,
    dead_retention_ms: int,
    now: NowArg = None,
) -> Call:
    return Call(
        "fail",
        (pk.due, pk.leases, pk.dead, pk.stats, pk.wake),
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
    return Call("release", (pk.due, pk.leases, pk.wake), (_now(now), pk.prefix, run_id, fence))


def cancel_call(
    pk: PartitionKeys, run_id: str, retention_ms: int, reason: str, now: NowArg = None
) -> Call:
    return Call(
        "cancel",
        (pk.due, pk.leases, pk.done, pk.stats),
        (_now(now), pk.prefix, run_id, retention_ms, reason),
    )


def requeue_call(pk: PartitionKeys, run_id: str, now: NowArg = None) -> Call:
    return Call("requeue", (pk.due, pk.dead, pk.done, pk.wake), (_now(now), pk.prefix, run_id))


def parse_state_change(reply: Sequence[Any]) -> tuple[bool, str]:
    """cancel / requeue: (changed, previous state or refusal)."""
    return int(reply[0]) == 1, _text(reply[1])


def fenced_write_call(
    pk: PartitionKeys, resource: str, fence: int, value: str, run_id: str, now: NowArg = None
) -> Call:
    return Call("fenced_write", (pk.fence_resource(resource),), (_now(now), fence, value, run_id))


def parse_fenced_write(reply: Sequence[Any]) -> tuple[bool, int]:
    return int(reply[0]) == 1, int(reply[1])


# -- recurring jobs (scheduler partitions, hash tag {sched#k}) ---------------------------------


@dataclass(frozen=True)
class SchedKeys:
    """The keys of one scheduler partition; every name carries the same hash tag."""

    partition: int

    @property
    def prefix(self) -> str:
        return f"jq:{{sched#{self.partition}}}:"

    @property
    def defs(self) -> str:
        return self.prefix + "def"

    @property
    def next(self) -> str:
        return self.prefix + "next"

    @property
    def state(self) -> str:
        return self.prefix + "state"

    def all(self) -> tuple[str, str, str]:
        return (self.next, self.defs, self.state)


@dataclass(frozen=True)
class DueJob:
    job_id: str
    next_ms: int
    definition: str  # '' when the definition vanished
    state: str  # '' when the job never fired


def sched_due_call(sk: SchedKeys, lookahead_ms: int, limit: int, now: NowArg = None) -> Call:
    return Call("sched_due", sk.all(), (_now(now), lookahead_ms, limit))


def parse_sched_due(reply: Sequence[Any]) -> tuple[int, list[DueJob]]:
    jobs = [
        DueJob(
            _text(reply[i]),
            int(float(_text(reply[i + 1]))),
            _text(reply[i + 2]),
            _text(reply[i + 3]),
        )
        for i in range(1, len(reply), 4)
    ]
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


def advance_call(sk: SchedKeys, moves: Sequence[Advance], now: NowArg = None) -> Call:
    args: list[str | int] = [_now(now)]
    for m in moves:
        args += [
            m.job_id,
            m.expected_next_ms,
            "" if m.new_next_ms is None else m.new_next_ms,
            m.fired,
            m.missed,
            m.skipped,
            m.dropped,
            "" if m.last_fire_ms is None else m.last_fire_ms,
            m.through_ms,
        ]
    return Call("advance", sk.all(), tuple(args))


def parse_advance(reply: Sequence[Any]) -> list[bool]:
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
    return Call(
        "sched_define",
        sk.all(),
        (
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
    return Call("purge", (pk.dead,), ("", pk.prefix, *run_ids))


def parse_purge(reply: Sequence[Any]) -> tuple[int, int]:
    """(purged, refused because no longer dead)."""
    return int(reply[0]), int(reply[1])
