"""The scheduler's own script calls (no I/O): scheduled-run creation in a herd-friendly wire
format, and buffer-one's release of held runs. The definitions-side calls (sched_due, advance,
sched_define) live in ``ops`` with the other scripts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobqueue.store.contract import contract
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.ops import NowArg, SchedKeys
from jobqueue.store.scripts import Call

_SCHED_CREATE, _SCHED_RELEASE = contract("sched_create"), contract("sched_release")
_SCHED_UNHOLD, _ADVANCE = contract("sched_unhold"), contract("advance")
_SCHED_LEASE = contract("sched_lease")

# The due time of a held buffer-one run: 9999-12-31T23:59:59Z, far enough that no claim takes
# it, and still a date every tool can print (it shows what is going on).
HOLD_MS = 253_402_300_799_000


@dataclass(frozen=True)
class RunGroup:
    """Scheduled runs of one queue partition that share everything but the job id and due."""

    task: str
    payload: str
    max_attempts: int
    lease_ms: int
    timeout_ms: int
    suffix: str  # '@<fire instant>': the run id is job_id + suffix
    scheduled_for_ms: int


def _now(now: NowArg) -> str | int:
    return "" if now is None else int(now)


def sched_create_call(
    pk: PartitionKeys,
    groups: Sequence[tuple[RunGroup, Sequence[str | int]]],
    now: NowArg = None,
) -> Call:
    """``groups``: (shared fields, flat [job_id, due, job_id, due, ...])."""
    args: list[str | int] = [_now(now), pk.prefix]
    for g, runs in groups:
        args += [
            len(runs) // 2,
            g.task,
            g.payload,
            g.max_attempts,
            g.lease_ms,
            g.timeout_ms,
            g.suffix,
            g.scheduled_for_ms,
        ]
        args += runs
    return _SCHED_CREATE.call(pk, args)


def parse_sched_create(reply: Sequence[Any]) -> int:
    """How many runs the call created."""
    return int(reply[1])


def sched_release_call(
    pk: PartitionKeys, held: Sequence[tuple[str, str, int]], now: NowArg = None
) -> Call:
    """``held``: (held run id, predecessor run id or '', real due ms)."""
    args: list[str | int] = [_now(now), pk.prefix, HOLD_MS]
    for run_id, pred, due in held:
        args += [run_id, pred, due]
    return _SCHED_RELEASE.call(pk, args)


def parse_sched_release(reply: Sequence[Any]) -> list[int]:
    """Per held run: 0 still held, 1 released now, 2 nothing held any more."""
    return [int(x) for x in reply[1:]]


def sched_unhold_call(
    sk: SchedKeys, entries: Sequence[tuple[str, str]], now: NowArg = None
) -> Call:
    args: list[str | int] = [_now(now)]
    for job_id, text in entries:
        args += [job_id, text]
    return _SCHED_UNHOLD.call(sk, args)


def advance_groups_call(
    sk: SchedKeys,
    groups: Sequence[tuple[Sequence[Any], Sequence[str]]],
    now: NowArg = None,
    token: int = 0,
) -> Call:
    """advance.lua with the moves already grouped: (header, job ids) pairs (the scheduler's
    hot path; ``ops.advance_call`` builds the same from one Advance per job), under the
    caller's lease ``token``."""
    args: list[str | int] = [_now(now), token]
    for header, jobs in groups:
        args.append(len(jobs))
        args += header
        args += jobs
    return _ADVANCE.call(sk, args)


@dataclass(frozen=True)
class Lease:
    """A scheduler partition's lease as sched_lease.lua answers: whether the caller holds it,
    and the token, owner and end of the current lease."""

    now_ms: int
    held: bool
    token: int
    owner: str
    until_ms: int


def sched_lease_call(
    sk: SchedKeys, scheduler: str, action: str, lease_ms: int, token: int | None = None,
    now: NowArg = None,
) -> Call:
    """``action``: 'acquire', 'renew' or 'release' (see sched_lease.lua)."""
    return _SCHED_LEASE.call(
        sk, (_now(now), scheduler, action, lease_ms, "" if token is None else token)
    )


def parse_sched_lease(reply: Sequence[Any]) -> Lease:
    owner = reply[3].decode() if isinstance(reply[3], bytes) else str(reply[3])
    return Lease(int(reply[0]), int(reply[1]) == 1, int(reply[2]), owner, int(reply[4]))
