"""Changing the scheduler partition count K: move every recurring job (definition, next fire,
counters, buffered buffer-one entry) to the scheduler partition its id hashes to under the new
count, with the spread placement, then record the count (``jobqueue schedules
repartition K``). The pattern of ``jobqueue.ops.repartition`` (a queue's P):

* Refused while schedulers run: a registry entry refreshed within its lease, or a partition
  whose lease has not expired. A scheduler started during the move is caught by the same check
  before the count is recorded. Clients that write schedules (``jq.schedule``, the CLI) are
  refused while ``jq:sched:config`` names a move in progress (field ``moving``), and re-read K
  before every write afterwards.
* Jobs are found through the definitions (HSCAN in pages, never KEYS) of every partition they
  may be in: the recorded layout, an interrupted move's target, the new one. A job whose
  partition changes is copied first (counters, buffered entry, next fire, definition last), and
  only when every copy of a page is written are the old fields deleted (the definition last:
  while it exists it is the authority and a re-run copies again). So a crash anywhere leaves a
  state the same command finishes when run again; a run on a finished move changes nothing. A
  job found in two partitions with different definitions is a conflict: both are left, the
  count is not recorded, and the ids are named.
* The new count is recorded last, with the spread placement (``jobqueue.store.keys``), and
  the leases of the partitions that ceased to exist are deleted.

Single-key commands only, pipelined: the same code serves a single server and a cluster.
Written as steps (``plan_steps``, ``repartition_steps``) that either client drives; ``plan``
and ``repartition`` drive them on a sync ``JobQueue``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jobqueue.anomalies import is_wrong_type
from jobqueue.client.core import ClientCore
from jobqueue.client.sync import JobQueue
from jobqueue.errors import CorruptData, OperationRefused
from jobqueue.ops.queries import Batch
from jobqueue.recurring.definitions import (
    MOVING_FIELD,
    SCHED_CONFIG_KEY,
    sched_keys,
    sched_partition_of,
)
from jobqueue.recurring.registry import members_steps, owners_steps
from jobqueue.store.io import Steps, checked_commands, cmd, commands, raised, server_time_steps
from jobqueue.store.keys import (
    SchedKeys,
    bad_count,
    parse_placement,
    placement_record,
    validate_partition_count,
)

PAGE = 500  # definitions per HSCAN page, so jobs per pipelined batch

Action = Literal["copy", "conflict"]


def layout(count: int, spread: bool) -> list[SchedKeys]:
    return [sched_keys(k, count, spread) for k in range(count)]


def sources(
    recorded: tuple[int, bool], count: int, moving: tuple[int, bool] | None
) -> list[SchedKeys]:
    """Every partition a job may be in: the recorded layout, an interrupted move's target,
    the new one; each once (by key prefix: partition 0 has one tag in every layout)."""
    out: dict[str, SchedKeys] = {}
    for n, spread in (recorded, *([moving] if moving else []), (count, True)):
        for sk in layout(n, spread):
            out.setdefault(sk.prefix, sk)
    return list(out.values())


def target_of(job_id: str, count: int) -> SchedKeys:
    return sched_keys(sched_partition_of(job_id, count), count, True)


@dataclass(frozen=True)
class Plan:
    """What the operator confirms: the store as it is before anything moves."""

    recorded: int
    spread: bool
    count: int
    moving_to: tuple[int, bool] | None
    jobs: int  # definitions over every partition

    @property
    def partitions(self) -> list[SchedKeys]:
        return sources((self.recorded, self.spread), self.count, self.moving_to)

    def describe(self) -> str:
        resumed = f" (resuming a move to {self.moving_to[0]})" if self.moving_to else ""
        return (
            f"scheduler partitions: {self.recorded} -> {self.count}{resumed}; "
            f"{self.jobs:,} recurring jobs"
        )


@dataclass
class Report:
    old: int
    new: int
    moved: int = 0
    stayed: int = 0
    late: int = 0  # jobs moved by the verifying second pass (written during the first)
    conflicts: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": self.old,
            "to": self.new,
            "moved": self.moved,
            "stayed": self.stayed,
            "late": self.late,
            "conflicts": self.conflicts,
            "seconds": round(self.seconds, 3),
        }


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _config_steps() -> Steps[tuple[tuple[int, bool], tuple[int, bool] | None]]:
    """The recorded layout and an interrupted move's target."""
    (reply,) = yield commands(cmd("hmget", SCHED_CONFIG_KEY, ["partitions", MOVING_FIELD]))
    if is_wrong_type(reply):
        raise CorruptData(f"{SCHED_CONFIG_KEY} is not a hash; nothing moved")
    if isinstance(reply, Exception):
        raise reply
    stored, moving = reply
    if stored is None:
        raise OperationRefused("no scheduler partition count recorded: no recurring job yet")
    recorded = parse_placement(_text(stored))
    if recorded is None:
        raise CorruptData(f"{SCHED_CONFIG_KEY} field 'partitions': {bad_count(stored)}; "
                          "nothing moved")  # fmt: skip
    moving_to = None if moving is None else parse_placement(_text(moving))
    if moving is not None and moving_to is None:
        raise CorruptData(f"{SCHED_CONFIG_KEY} field {MOVING_FIELD!r}: {bad_count(moving)}; "
                          "nothing moved")  # fmt: skip
    return recorded, moving_to


def refuse_if_running_steps(partitions: Sequence[SchedKeys]) -> Steps[None]:
    """Live schedulers, or partitions still leased: a move now would strand jobs or fire
    them from two layouts."""
    now = yield from server_time_steps()
    live = [m.id for m in (yield from members_steps(now)) if m.live]
    leased = [o.partition for o in (yield from owners_steps(partitions)) if o.held(now)]
    if live or leased:
        who = ", ".join(live[:3]) + (", ..." if len(live) > 3 else "")
        raise OperationRefused(
            f"{len(live)} scheduler(s) running ({who or 'leases not yet expired'}): stop "
            "every scheduler first (a stopped one gives its partitions up; a killed one's "
            "leases expire within --partition-lease), then run this again"
        )


def plan(jq: JobQueue, count: int) -> Plan:
    """:func:`plan_steps` on a sync client."""
    return jq.run_steps(plan_steps(count))


def plan_steps(count: int) -> Steps[Plan]:
    """Read-only: check the move may start (else OperationRefused) and count the jobs."""
    validate_partition_count(count, "scheduler")
    recorded, moving_to = yield from _config_steps()
    partitions = sources(recorded, count, moving_to)
    yield from refuse_if_running_steps(partitions)
    replies = yield commands(*(cmd("hlen", sk.defs) for sk in partitions))
    for sk, reply in zip(partitions, replies, strict=True):
        if is_wrong_type(reply):
            raise CorruptData(f"{sk.defs} is not a hash; nothing moved")
        if isinstance(reply, Exception):
            raise reply
    return Plan(recorded[0], recorded[1], count, moving_to, sum(int(n) for n in replies))


def _move_page(source: SchedKeys, page: dict[str, str], count: int,
               report: Report) -> Steps[tuple[int, int]]:  # fmt: skip
    """Copy, then delete, one page of definitions; (moved, stayed)."""
    moves = [(job, text, target_of(job, count)) for job, text in page.items()]
    moves = [(job, text, t) for job, text, t in moves if t.prefix != source.prefix]
    stayed = len(page) - len(moves)
    if not moves:
        return 0, stayed
    read = Batch()
    for job, _, target in moves:
        read.zscore(source.next, job)
        read.hget(source.state, job)
        read.hget(source.buffered, job)
        read.hget(target.defs, job)
    replies = raised((yield commands(*read.cmds)))
    write = Batch()
    settled = []
    for i, (job, text, target) in enumerate(moves):
        score, state, buffered, there = replies[4 * i : 4 * i + 4]
        if there is not None and _text(there) != text:
            report.conflicts.append(job)  # the same id defined differently: a human decides
            continue
        # Counters and buffered entry first, the definition last: a definition in the target
        # means the rest of the job is there.
        if state is not None:
            write.hset(target.state, job, state)
        if buffered is not None:
            write.hset(target.buffered, job, buffered)
        if score is not None:
            write.zadd(target.next, {job: score})
        write.hset(target.defs, job, text)
        settled.append((job, target))
    if not settled:
        return 0, stayed
    # every copy of the page is written before any old field goes
    yield from checked_commands(*write.cmds)
    delete = Batch()
    _delete_sources(delete, source, [job for job, _ in settled])
    yield from checked_commands(*delete.cmds)
    return len(settled), stayed


def _delete_sources(batch: Batch, source: SchedKeys, jobs: Sequence[str]) -> None:
    """Queue on ``batch`` the deletes of the old fields of jobs whose copies are written;
    the definitions last (while one exists, a re-run copies its job again)."""
    for job in jobs:
        batch.zrem(source.next, job)
        batch.hdel(source.state, job)
        batch.hdel(source.buffered, job)
    for job in jobs:
        batch.hdel(source.defs, job)


def _move_pass(
    partitions: Sequence[SchedKeys], count: int, page: int, report: Report,
    advance: Callable[[int], None] = lambda n: None,
) -> Steps[tuple[int, int]]:  # fmt: skip
    moved = stayed = 0
    for source in partitions:
        cursor = 0
        while True:
            # HSCAN, not HGETALL: a definition moved meanwhile is simply not seen again,
            # and every definition present throughout is seen at least once.
            ((cursor, found),) = raised(
                (yield commands(cmd("hscan", source.defs, cursor, count=page)))
            )
            defs = {_text(k) or "": _text(v) or "" for k, v in found.items()}
            m, s = yield from _move_page(source, defs, count, report)
            moved, stayed = moved + m, stayed + s
            advance(len(defs))
            if not cursor:
                break
    return moved, stayed


def repartition(
    jq: JobQueue,
    count: int,
    *,
    page: int = PAGE,
    clock: Callable[[], float] = time.monotonic,
    advance: Callable[[int], None] = lambda n: None,
) -> Report:
    """:func:`repartition_steps` on a sync client."""
    return jq.run_steps(repartition_steps(jq, count, page=page, clock=clock, advance=advance))


def repartition_steps(
    jq: ClientCore,
    count: int,
    *,
    page: int = PAGE,
    clock: Callable[[], float] = time.monotonic,
    advance: Callable[[int], None] = lambda n: None,
) -> Steps[Report]:
    """Move every recurring job to its scheduler partition under ``count``, then record the
    count; ``jq`` (either client) then re-reads it. Refused (OperationRefused) while
    schedulers run; safe to re-run after an interruption (it finishes the move)."""
    started = clock()
    before = yield from plan_steps(count)
    partitions = before.partitions
    moving = placement_record(count, True)
    raised((yield commands(cmd("hset", SCHED_CONFIG_KEY, MOVING_FIELD, moving))))
    report = Report(before.recorded, count)
    report.moved, _ = yield from _move_pass(partitions, count, page, report, advance)
    # Counted from the plan: a job moved into a partition scanned later is seen there again.
    report.stayed = max(before.jobs - report.moved - len(report.conflicts), 0)
    # A second pass finds jobs written meanwhile by a client that read K before the move.
    report.late, _ = yield from _move_pass(partitions, count, page, report)
    if report.conflicts:
        report.conflicts = list(dict.fromkeys(report.conflicts))
        shown = ", ".join(report.conflicts[:5]) + (", ..." if len(report.conflicts) > 5 else "")
        raise OperationRefused(
            f"{len(report.conflicts)} recurring jobs are defined in two partitions with "
            f"different definitions ({shown}): resolve them by hand, then run this again; "
            "count not changed"
        )
    yield from refuse_if_running_steps(partitions)  # a scheduler started during the move
    new = {sk.prefix for sk in layout(count, True)}
    record = Batch()
    for sk in partitions:
        if sk.prefix not in new:
            record.delete(sk.owner)  # a lease of a partition that no longer exists
    record.hset(SCHED_CONFIG_KEY, "partitions", placement_record(count, True))
    record.hdel(SCHED_CONFIG_KEY, MOVING_FIELD)
    yield from checked_commands(*record.cmds)
    jq.recurring.forget()
    report.seconds = clock() - started
    return report
