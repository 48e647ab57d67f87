"""The contracts of the recurring-job scripts: on a scheduler partition (``{sched#k}``: reading
due jobs, advancing them, defining them, forgetting buffered entries) and, for the scheduler,
on a queue partition (creating scheduled runs in a herd-friendly wire format, and buffer-one's
release of buffered runs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from jobqueue.store.contract import Contract, ContractError, NowArg, Wire, now_arg, text
from jobqueue.store.keys import PartitionKeys, SchedKeys, fire_instant

# The due time of a buffered buffer-one run: 9999-12-31T23:59:59Z, far enough that no claim takes
# it, and still a date every tool can print (it shows what is going on).
HOLD_MS = 253_402_300_799_000

# -- sched_due ---------------------------------------------------------------------------------


class DueSegment(NamedTuple):
    """Jobs that share a next fire and a definition (one job when it has an overlap policy)."""

    next_ms: int
    definition: int  # 1-based index in Due.definitions; 0 when the definition vanished
    extra: str  # '' unless overlap-policed: '<state text>|<buffered entry>'
    jobs: list[str]


@dataclass(frozen=True)
class Due:
    """A sched_due reply: the server's now, each distinct definition text once (a segment's
    index i names ``definitions[i - 1]``), and the due jobs in segments."""

    now_ms: int
    definitions: list[str]
    segments: list[DueSegment]


def _sched_due(
    sk: SchedKeys,
    lookahead_ms: int,
    limit: int,
    now: NowArg = None,
    after: tuple[int, str] | None = None,
) -> Wire:
    """``after`` = (next fire, job id) of the previous batch's last job (see sched_due.lua)."""
    cursor_next, cursor_job = ("", "") if after is None else after
    return Wire(
        sk,
        {
            "now": now_arg(now),
            "lookahead_ms": lookahead_ms,
            "limit": limit,
            "cursor_next": cursor_next,
            "cursor_job": cursor_job,
        },
    )


def _parse_sched_due(reply: Sequence[Any]) -> Due:
    ndefs = int(reply[1])
    definitions = [text(d) for d in reply[2 : 2 + ndefs]]
    segments: list[DueSegment] = []
    i = 2 + ndefs
    while i < len(reply):  # segments: next, def index, extra, count, job ids
        count = int(reply[i + 3])
        segments.append(
            DueSegment(
                int(float(text(reply[i]))),
                int(reply[i + 1]),
                text(reply[i + 2]),
                [text(j) for j in reply[i + 4 : i + 4 + count]],
            )
        )
        i += 4 + count
    return Due(int(reply[0]), definitions, segments)


SCHED_DUE = Contract(
    "sched_due",
    build=_sched_due,
    parse=_parse_sched_due,
)

# -- advance -----------------------------------------------------------------------------------

# One group's header (advance.lua), the count aside: expected next (ms), new next (ms, or ''
# when the schedule has ended), fired, missed, skipped, dropped, last fire ('' to keep, else
# '<ms> <queue>'), through (ms), buffered entry ('' for none). Jobs whose moves share it travel as
# one group.
AdvanceHeader = tuple[int, int | str, int, int, int, int, int | str, int, str]
ADVANCE_HEADER_FIELDS = 9


def _advance(
    sk: SchedKeys,
    groups: Sequence[tuple[AdvanceHeader, Sequence[str]]],
    now: NowArg = None,
    token: int = 0,
) -> Wire:
    """``groups``: (header, job ids) pairs; each pair is one group of advance.lua, applied
    only under the caller's current lease ``token`` on the partition (sched_lease.lua)."""
    tail: list[str | int] = []
    for header, jobs in groups:
        if len(header) != ADVANCE_HEADER_FIELDS:
            raise ContractError(f"advance takes {ADVANCE_HEADER_FIELDS} header fields, not "
                                f"{len(header)}")
        tail.append(len(jobs))
        tail += header
        tail += jobs
    return Wire(sk, {"now": now_arg(now), "token": token}, tail)


class Moved(IntEnum):
    """advance.lua's answer for one job (true only when it moved)."""

    REFUSED = 0  # another scheduler moved it first, paused, removed, redefined, not later
    ADVANCED = 1
    FENCED = 2  # the caller's lease token is not the partition's current one: nothing moved


def _parse_moves(reply: Sequence[Any]) -> list[Moved]:
    """{now, answer per job}."""
    return [Moved(int(x)) for x in reply[1:]]


ADVANCE = Contract(
    "advance",
    build=_advance,
    parse=_parse_moves,
)

# -- sched_define ------------------------------------------------------------------------------


def _sched_define(
    sk: SchedKeys,
    job_id: str,
    *,
    expected_definition: str | None,
    expected_next_ms: float | None,
    definition: str | None,
    next_ms: int | None,
    state: str = "",
    now: NowArg = None,
) -> Wire:
    """Put (``definition`` given) or delete (``definition`` None) one job, compare-and-set."""
    return Wire(
        sk,
        {
            "now": now_arg(now),
            "job_id": job_id,
            "action": "delete" if definition is None else "put",
            "expected_def": expected_definition or "",
            "expected_next": "" if expected_next_ms is None else expected_next_ms,
            "definition": definition or "",
            "next": "" if next_ms is None else next_ms,
            "state": state,
        },
    )


def _parse_written(reply: Any) -> bool:
    return int(reply) == 1


SCHED_DEFINE = Contract(
    "sched_define",
    build=_sched_define,
    parse=_parse_written,
)

# -- sched_create ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunGroup:
    """Scheduled runs of one queue partition that share everything but the job id and due:
    the runs of one fire time, each ``fire_run_id(job_id, scheduled_for_ms)``."""

    task: str
    payload: str
    max_attempts: int
    lease_ms: int
    timeout_ms: int
    scheduled_for_ms: int  # the fire time


def _sched_create(
    pk: PartitionKeys,
    groups: Sequence[tuple[RunGroup, Sequence[str | int]]],
    now: NowArg = None,
) -> Wire:
    """``groups``: (shared fields, flat [job_id, due, job_id, due, ...])."""
    tail: list[str | int] = []
    for g, runs in groups:
        tail += [
            len(runs) // 2,
            g.task,
            g.payload,
            g.max_attempts,
            g.lease_ms,
            g.timeout_ms,
            fire_instant(g.scheduled_for_ms),  # the script builds each run id from it
            g.scheduled_for_ms,
        ]
        tail += runs
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix}, tail)


def _parse_sched_create(reply: Sequence[Any]) -> int:
    """How many runs the call created."""
    return int(reply[1])


SCHED_CREATE = Contract(
    "sched_create",
    build=_sched_create,
    parse=_parse_sched_create,
)

# -- sched_release, sched_unhold (buffer-one) --------------------------------------------------


def _sched_release(
    pk: PartitionKeys, buffered: Sequence[tuple[str, str, int]], now: NowArg = None
) -> Wire:
    """``buffered``: (buffered run id, predecessor run id or '', real due ms)."""
    tail: list[str | int] = []
    for run_id, pred, due in buffered:
        tail += [run_id, pred, due]
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix, "hold_ms": HOLD_MS}, tail)


def _parse_sched_release(reply: Sequence[Any]) -> list[int]:
    """Per buffered run: 0 still buffered, 1 released now, 2 nothing buffered any more."""
    return [int(x) for x in reply[1:]]


SCHED_RELEASE = Contract(
    "sched_release",
    build=_sched_release,
    parse=_parse_sched_release,
)


def _sched_unhold(
    sk: SchedKeys, entries: Sequence[tuple[str, str]], now: NowArg = None
) -> Wire:
    """``entries``: (job id, the buffered entry the caller read)."""
    tail: list[str] = []
    for job_id, entry in entries:
        tail += [job_id, entry]
    return Wire(sk, {"now": now_arg(now)}, tail)


def _parse_removed(reply: Sequence[Any]) -> int:
    """How many buffered entries were forgotten."""
    return int(reply[1])


SCHED_UNHOLD = Contract(
    "sched_unhold",
    build=_sched_unhold,
    parse=_parse_removed,
)

# -- sched_lease -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    """A scheduler partition's lease as sched_lease.lua answers: whether the caller holds it,
    and the token, owner and end of the current lease."""

    now_ms: int
    held: bool
    token: int
    owner: str
    until_ms: int


def _sched_lease(
    sk: SchedKeys,
    scheduler: str,
    action: str,
    lease_ms: int,
    token: int | None = None,
    now: NowArg = None,
) -> Wire:
    """``action``: 'acquire', 'renew', 'release' or 'read' (see sched_lease.lua)."""
    return Wire(
        sk,
        {
            "now": now_arg(now),
            "scheduler": scheduler,
            "action": action,
            "lease_ms": lease_ms,
            "token": "" if token is None else token,
        },
    )


def _parse_lease(reply: Sequence[Any]) -> Lease:
    return Lease(int(reply[0]), int(reply[1]) == 1, int(reply[2]), text(reply[3]), int(reply[4]))


SCHED_LEASE = Contract(
    "sched_lease",
    build=_sched_lease,
    parse=_parse_lease,
)

CONTRACTS = (
    SCHED_DUE,
    ADVANCE,
    SCHED_DEFINE,
    SCHED_CREATE,
    SCHED_RELEASE,
    SCHED_UNHOLD,
    SCHED_LEASE,
)
