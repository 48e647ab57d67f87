"""Changing a queue's partition count P: move every run to the partition its id hashes to
under the new count, then record the count (``jobqueue repartition``).

The move crosses slots, so it cannot be atomic; it is made safe to interrupt and re-run:

* Refused while the queue has running runs (a lease in any partition) or live workers serve
  it: a worker holds its partition list for its whole life, and a run claimed mid-move would
  be copied pending and run twice. Producers and schedulers also keep the count they read at
  start; the operator stops them too (documented) and restarts every process afterwards.
* Runs are found through their indexes (``due``, ``dead``, ``done``; ZSCAN in pages, never KEYS),
  partition by partition. A run whose new partition differs is copied first (history list, record
  hash, index entry with the same score and, for a pending run, its prio entry (above the default
  priority) and the deduplication key it owns; each key's TTL re-applied from its PTTL), and only
  when every copy of a page is written are the old keys deleted (record, history, then the index
  entry last). While the old record exists it is the authority: a re-run simply writes the copy
  again. When it is gone, the old index entry says what is left to clean. So a crash anywhere
  leaves a state that a second run finishes, changing nothing else. A target record that exists
  with different contents is a conflict: both are left as they are, the count is not recorded, and
  the operator is told which run ids.
* Counters (``stats`` hashes) are cumulative per queue; dashboards and Prometheus read their
  sum. Partitions below the new count keep theirs; those of partitions that cease to exist
  are added into partition ``p % P`` (via a staging hash in the target's slot and a one-slot
  MULTI, so a re-run never counts twice). The queue's totals are thus unchanged and no
  counter goes backwards.
* The new count is written to ``jq:queues`` last: until then every client still uses (and
  refuses any other than) the old count. A move in progress is recorded in
  ``jq:queues:moving`` so that a re-run with yet another count still finds every run.
* The new layout always has the spread placement (``jobqueue.store.keys``: Placement), so a
  queue whose tags are the plain ``{q#p}`` of earlier versions moves to the spread tags, even
  with its count unchanged: that is the migration of existing queues.

Only single-key commands (and one-slot transactions), pipelined: the same code serves a single
node and a Redis Cluster. Written as steps (``plan_steps``, ``repartition_steps``) that either
client drives; ``plan`` and ``repartition`` drive them on a sync ``JobQueue``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jobqueue.anomalies import is_wrong_type, stored_int
from jobqueue.client.core import ClientCore
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError, CorruptData, OperationRefused
from jobqueue.models import PRIORITY_MAX
from jobqueue.ops.queries import Batch, workers_steps
from jobqueue.store.io import Steps, checked_commands, cmd, commands, raised, transaction
from jobqueue.store.keys import (
    MAX_PARTITIONS,
    QUEUES_KEY,
    PartitionKeys,
    bad_count,
    parse_placement,
    partition_of,
    placement_record,
    queue_partition,
    queue_partitions,
    validate_queue_name,
)
from jobqueue.store.runs import prio_score

# queue -> target count of a move that has started and not yet finished (global hash).
MOVING_KEY = "jq:queues:moving"
# Index entries per ZSCAN page and so runs per pipelined batch.
PAGE = 500
# The indexes that hold every run not running; a run is in exactly one of them.
INDEXES: tuple[str, ...] = ("due", "dead", "done")
_INDEX_STATE = {"due": "pending", "dead": "dead", "done": "done"}

Action = Literal["copy", "finish", "gone", "conflict"]


# -- planning (no I/O) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """One index entry whose run belongs in another partition."""

    run_id: str
    score: float
    index: str
    source: PartitionKeys
    target: PartitionKeys


# A layout: (partition count, spread placement).
Layout = tuple[int, bool]


def targets(queue: str, count: int) -> list[PartitionKeys]:
    """The partitions of the new layout: ``count`` of them, spread."""
    return queue_partitions(queue, count, True)


def source_partitions(
    queue: str, recorded: Layout, count: int, moving_to: Layout | None
) -> list[PartitionKeys]:
    """Every partition a run may be in: the recorded layout, the new one, and the target of
    an interrupted move (runs may already sit there); each once."""
    layouts = [recorded, *([moving_to] if moving_to else []), (count, True)]
    found = [k for n, spread in layouts for k in queue_partitions(queue, n, spread)]
    return list(dict.fromkeys(found))


def plan_page(
    source: PartitionKeys, index: str, entries: Iterable[tuple[str, float]], count: int
) -> tuple[list[Move], int]:
    """The moves among one page of index entries, and how many entries stay where they are."""
    moves, stayed = [], 0
    for run_id, score in entries:
        target = queue_partition(source.queue, partition_of(run_id, count), count, True)
        if target == source:
            stayed += 1
        else:
            moves.append(Move(run_id, score, index, source, target))
    return moves, stayed


def classify(source_fields: dict[str, str], target_fields: dict[str, str]) -> Action:
    """What to do with one move, given both records as they are now (a copy drops the
    'parked' field: the run is looked at again in its new partition)."""
    if source_fields:
        mine = {k: v for k, v in source_fields.items() if k != "parked"}
        if not target_fields or target_fields in (mine, source_fields):
            return "copy"  # not copied yet, or copied by an interrupted run: (re)write it
        return "conflict"  # the same run id with other contents: a human decides
    # The old record is gone: deleted by an interrupted run after its copy (finish the
    # clean-up), or expired / never there (a dangling index entry: drop it).
    return "finish" if target_fields else "gone"


def fold_target(partition: int, count: int) -> int:
    """Where the counters of a partition that ceases to exist are added."""
    return partition % count


def staging_key(target: PartitionKeys, source_partition: int) -> str:
    """Counters of a vanishing partition on their way into ``target``'s (same slot)."""
    return f"{target.prefix}stats:from:{source_partition}"


@dataclass(frozen=True)
class Plan:
    """What the operator confirms: the queue as it is before anything moves."""

    queue: str
    recorded: int
    count: int
    moving_to: int | None  # an interrupted move's target, if any
    runs: dict[str, int]  # entries per index (pending/dead/done) over every partition
    spread: bool = True  # the recorded layout's placement (False: the plain {q#p} tags)
    moving_spread: bool = True  # the interrupted move's placement

    @property
    def total(self) -> int:
        return sum(self.runs.values())

    def describe(self) -> str:
        resumed = f" (resuming a move to {self.moving_to})" if self.moving_to else ""
        placed = "" if self.spread or self.recorded == 1 else " (to the spread placement)"
        counts = ", ".join(f"{state} {n:,}" for state, n in self.runs.items())
        return (
            f"queue {self.queue!r}: {self.recorded} -> {self.count} partitions{placed}"
            f"{resumed}; {self.total:,} runs ({counts})"
        )

    @property
    def sources(self) -> list[PartitionKeys]:
        moving = None if self.moving_to is None else (self.moving_to, self.moving_spread)
        return source_partitions(self.queue, (self.recorded, self.spread), self.count, moving)


@dataclass
class Report:
    queue: str
    old: int
    new: int
    moved: dict[str, int] = field(default_factory=dict)  # by state
    stayed: int = 0  # runs that were already in their partition
    late: int = 0  # runs moved by the verifying second pass (written during the first)
    gone: int = 0  # index entries whose record had expired: dropped
    folded: list[tuple[int, int]] = field(default_factory=list)  # stats: (from, into)
    conflicts: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total_moved(self) -> int:
        return sum(self.moved.values())

    def count_moved(self, state: str) -> None:
        self.moved[state] = self.moved.get(state, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "from": self.old,
            "to": self.new,
            "moved": self.total_moved,
            "moved_by_state": dict(sorted(self.moved.items())),
            "stayed": self.stayed,
            "late": self.late,
            "dropped_dangling": self.gone,
            "stats_folded": [list(pair) for pair in self.folded],
            "conflicts": self.conflicts,
            "seconds": round(self.seconds, 3),
        }


# -- I/O (steps: jobqueue.store.io) ---------------------------------------------------------


def _check_count(count: int) -> None:
    if not isinstance(count, int) or not 1 <= count <= MAX_PARTITIONS:
        raise ConfigError(f"partitions must be an integer from 1 to {MAX_PARTITIONS}")


def _cardinalities(keys: list[str]) -> Steps[list[int]]:
    """ZCARD of each key, pipelined; a key of another type is refused as CorruptData before
    anything moves (the move would fail on it halfway)."""
    replies = yield commands(*(cmd("zcard", key) for key in keys))
    for key, reply in zip(keys, replies, strict=True):
        if is_wrong_type(reply):
            raise CorruptData(f"{key} is not a sorted set; nothing moved")
        if isinstance(reply, Exception):
            raise reply
    return [int(n) for n in replies]


def _refuse_if_busy(queue: str, partitions: Sequence[PartitionKeys]) -> Steps[None]:
    """Running runs or live workers: a move now could run a run twice or strand runs."""
    keys = [k.leases for k in partitions]
    running = sum((yield from _cardinalities(keys)))
    if running:
        raise OperationRefused(
            f"queue {queue!r} has {running} running runs: stop or drain its workers first "
            "(jobqueue leases / workers), then run repartition again"
        )
    # A workflow's waiting runs and undelivered outcomes are not moved (not in the indexes
    # the move reads): refused rather than stranded.
    waiting = sum((yield from _cardinalities([k.waiting for k in partitions])))
    undelivered = sum((yield from _cardinalities([k.outbox for k in partitions])))
    if waiting or undelivered:
        raise OperationRefused(
            f"queue {queue!r} has {waiting} workflow runs waiting and {undelivered} outcomes "
            "not yet delivered to them (jobqueue runs --state waiting): let the workflows "
            "finish or cancel them, then run repartition again"
        )
    registry = yield from workers_steps()
    live = [w.id for w in registry if not w.stale and queue in w.queues]
    if live:
        raise OperationRefused(
            f"{len(live)} live workers serve queue {queue!r} ({', '.join(live[:3])}"
            f"{', ...' if len(live) > 3 else ''}): stop them first, then run repartition again"
        )


def plan(jq: JobQueue, queue: str, count: int) -> Plan:
    """:func:`plan_steps` on a sync client."""
    return jq.run_steps(plan_steps(jq, queue, count))


def plan_steps(jq: ClientCore, queue: str, count: int) -> Steps[Plan]:
    """Read-only: check the move may start (else OperationRefused) and count what it covers."""
    validate_queue_name(queue)
    _check_count(count)
    stored, moving = yield commands(cmd("hget", QUEUES_KEY, queue), cmd("hget", MOVING_KEY, queue))
    for key, reply in ((QUEUES_KEY, stored), (MOVING_KEY, moving)):
        if is_wrong_type(reply):
            raise CorruptData(f"{key} is not a hash; nothing moved")
        if isinstance(reply, Exception):
            raise reply
    if stored is None:
        known = ", ".join(sorted((yield from jq._queues()))) or "none"
        raise OperationRefused(f"no queue {queue!r} recorded in Redis (known: {known})")
    recorded = parse_placement(stored)
    if recorded is None:
        raise CorruptData(f"{QUEUES_KEY} field {queue!r}: {bad_count(stored)}; nothing moved")
    # A move started by an earlier version recorded a bare count: its target had plain tags.
    moving_to = None if moving is None else parse_placement(moving)
    if moving is not None and moving_to is None:
        raise CorruptData(f"{MOVING_KEY} field {queue!r}: {bad_count(moving)}; nothing moved")
    partitions = source_partitions(queue, recorded, count, moving_to)
    yield from _refuse_if_busy(queue, partitions)
    sizes = yield from _cardinalities([getattr(k, index) for k in partitions for index in INDEXES])
    runs = {_INDEX_STATE[index]: sum(sizes[i :: len(INDEXES)]) for i, index in enumerate(INDEXES)}
    return Plan(
        queue,
        recorded[0],
        count,
        None if moving_to is None else moving_to[0],
        runs,
        spread=recorded[1],
        moving_spread=True if moving_to is None else moving_to[1],
    )


def _ttl(value: Any) -> int:
    """A PTTL reply as a TTL to re-apply: 0 for none (-1) or gone (-2)."""
    return int(value) if value is not None and int(value) > 0 else 0


def _delete_sources(pipe: Any, moves: Sequence[tuple[Move, Action]]) -> None:
    """Queue on ``pipe`` the deletes of the old keys of moves whose copies are written:
    record, history, then the index entry last (while it remains, a re-run knows there is
    something to finish)."""
    for move, _ in moves:
        pipe.delete(move.source.run(move.run_id))
        pipe.delete(move.source.history(move.run_id))
    for move, _ in moves:
        if move.index == "due":
            pipe.zrem(move.source.prio, move.run_id)
        pipe.zrem(getattr(move.source, move.index), move.run_id)


def _dedupe_owned(
    moves: Sequence[Move], replies: Sequence[Any]
) -> Steps[dict[str, tuple[str, int]]]:
    """The deduplication keys owned by runs that move (run id -> key, its TTL in ms or 0):
    a run enqueued under a key has the key's partition, so the key moves with it."""
    named = []
    for i, m in enumerate(moves):
        fields = replies[i * 5]
        key = fields.get("dedupe") if isinstance(fields, dict) else None
        if m.index == "due" and isinstance(key, str) and key:
            named.append((m, key))
    if not named:
        return {}
    found = yield commands(
        *(c for m, key in named
          for c in (cmd("get", m.source.dedupe(key)), cmd("pttl", m.source.dedupe(key))))
    )  # fmt: skip
    owned = {}
    for j, (m, key) in enumerate(named):
        holder, ttl = found[2 * j], found[2 * j + 1]
        if holder == m.run_id or holder == m.run_id.encode():
            owned[m.run_id] = (key, _ttl(ttl))
    return owned


def _move_batch(moves: Sequence[Move], report: Report) -> Steps[int]:
    """Copy, then delete, one page of moves; returns how many runs moved."""
    if not moves:
        return 0
    read = Batch()
    for m in moves:
        read.hgetall(m.source.run(m.run_id))
        read.pttl(m.source.run(m.run_id))
        read.lrange(m.source.history(m.run_id), 0, -1)
        read.pttl(m.source.history(m.run_id))
        read.hgetall(m.target.run(m.run_id))
    replies = raised((yield commands(*read.cmds)))
    owned = yield from _dedupe_owned(moves, replies)
    write = Batch()
    settled: list[tuple[Move, Action]] = []
    unparked: list[tuple[Move, str]] = []  # runs parked by a cap in their old partition
    moved = 0
    for i, m in enumerate(moves):
        fields, record_ttl, history, history_ttl, target = replies[i * 5 : i * 5 + 5]
        action = classify(fields, target)
        if action == "conflict":
            report.conflicts.append(m.run_id)
            continue
        settled.append((m, action))
        if action == "gone":
            report.gone += 1
            continue
        score = m.score
        group = (fields or target).get("parked") if m.index == "due" else None
        if group:
            # Held back by a per-key or per-task cap there (its due score a recheck): it
            # arrives at its own due time, for a claim in its new partition to look at again.
            unparked.append((m, group))
            fields = {k: v for k, v in fields.items() if k != "parked"} if fields else fields
            due = stored_int((fields or target).get("due"))
            score = m.score if due is None else due
            if action == "finish":
                write.hdel(m.target.run(m.run_id), "parked")
        if action == "copy":
            # History first, record second: a record in the target means its history is there.
            hist_key, run_key = m.target.history(m.run_id), m.target.run(m.run_id)
            write.delete(hist_key)
            if history:
                write.rpush(hist_key, *history)
                if _ttl(history_ttl):
                    write.pexpire(hist_key, _ttl(history_ttl))
            write.hset(run_key, mapping=fields)
            if _ttl(record_ttl):
                write.pexpire(run_key, _ttl(record_ttl))
            else:
                write.persist(run_key)
        write.zadd(getattr(m.target, m.index), {m.run_id: score})
        if m.run_id in owned:  # the deduplication key it owns goes with it
            key, ttl = owned[m.run_id]
            write.set(m.target.dedupe(key), m.run_id, px=ttl or None)
        level = stored_int((fields or target).get("priority")) or 0
        if m.index == "due" and 0 < level <= PRIORITY_MAX:  # its place among due runs too
            write.zadd(m.target.prio, {m.run_id: prio_score(level, int(score))})
        report.count_moved((fields or target).get("state") or _INDEX_STATE[m.index])
        moved += 1
    if settled:
        # every copy of the page is written before any old key goes
        yield from checked_commands(*write.cmds)
        if owned:  # the copies own the keys now (single-key deletes: one slot each)
            drop = Batch()
            for m, _ in settled:
                if m.run_id in owned:
                    drop.delete(m.source.dedupe(owned[m.run_id][0]))
            yield from checked_commands(*drop.cmds)
        deletes = Batch()
        _delete_sources(deletes, settled)
        yield from checked_commands(*deletes.cmds)
        if unparked:  # their waiting lines in the old partition (stale entries otherwise)
            drop = Batch()
            for m, group in unparked:
                drop.zrem(m.source.prefix + "parked:" + group, m.run_id)
                drop.zrem(m.source.parked, m.run_id)
            yield from checked_commands(*drop.cmds)
    return moved


def _move_pass(
    partitions: Sequence[PartitionKeys],
    count: int,
    page: int,
    report: Report,
    advance: Callable[[int], None] = lambda n: None,
) -> Steps[tuple[int, int]]:
    """One pass over every index of every partition: (runs moved, entries that stayed);
    ``advance(n)`` after each page of n entries."""
    moved = stayed = 0
    for source in partitions:
        for index in INDEXES:
            cursor = 0
            while True:
                # ZSCAN, not ZRANGE by rank: entries leave the index as they move, and a scan
                # still returns every entry present throughout (repeats are harmless).
                ((cursor, entries),) = raised(
                    (yield commands(cmd("zscan", getattr(source, index), cursor, count=page)))
                )
                moves, kept = plan_page(source, index, entries, count)
                moved += yield from _move_batch(moves, report)
                stayed += kept
                advance(len(moves) + kept)
                if not cursor:
                    break
    return moved, stayed


def _one(name: str, *args: Any, **kwargs: Any) -> Steps[Any]:
    """One command alone, its error raised."""
    (reply,) = raised((yield commands(cmd(name, *args, **kwargs))))
    return reply


def _fold_stats(source: PartitionKeys, count: int) -> Steps[bool]:
    """Add a vanishing partition's counters into its fold target; True if there were any."""
    target = targets(source.queue, count)[fold_target(source.partition, count)]
    staging = staging_key(target, source.partition)
    counters = yield from _one("hgetall", source.stats)
    if counters:
        # Staged in the target's slot first; the source is the authority while it exists.
        yield from _one("hset", staging, mapping=counters)
        yield from _one("delete", source.stats)
    staged = yield from _one("hgetall", staging)
    if staged:
        # One slot, one transaction: the counters are added and the staging hash deleted
        # together, so an interrupted run never adds them twice.
        tx = Batch()
        for name, value in staged.items():
            try:
                tx.hincrby(target.stats, name, int(value))
            except ValueError:
                continue  # not a counter: nothing to add
        tx.delete(staging)
        raised((yield transaction(*tx.cmds)))
    yield from _one("delete", source.wake)  # idle workers' wake tokens no one will serve
    return bool(counters or staged)


def _carry_fences(sources: Sequence[PartitionKeys], count: int) -> Steps[None]:
    """Every new partition's fence counter starts at the highest of all the old ones, so no
    claim after the move reissues a fence a run id had before it (its run may have moved, or
    its record expired and the id be created again in another partition). Raised before the
    counters of vanishing partitions are deleted: a re-run after a crash finds them again."""
    new = targets(sources[0].queue, count)
    everything = list(dict.fromkeys([*sources, *new]))
    # One key per command: partitions live in different cluster slots.
    values = raised((yield commands(*(cmd("get", k.fences) for k in everything))))
    highest = max((int(v) for v in values if v is not None), default=0)
    pipe = Batch()
    for k in new:
        if highest:
            pipe.set(k.fences, highest)  # never lower: highest is at least its current value
    for k in everything:
        if k not in new:
            pipe.delete(k.fences)
    yield from checked_commands(*pipe.cmds)


def _carry_pause(sources: Sequence[PartitionKeys], count: int) -> Steps[None]:
    """A paused queue stays paused: when any partition, old or new, is paused, every new one
    is (since the earliest pause), before the paused keys of vanishing partitions go (a
    re-run after a crash finds them again)."""
    new = targets(sources[0].queue, count)
    everything = list(dict.fromkeys([*sources, *new]))
    replies = yield commands(*(cmd("get", k.paused) for k in everything))
    # A paused key of another type is foreign data (claims refuse it): not a pause to carry.
    since = [v for v in replies if isinstance(v, (str, bytes))]
    if not since:
        return
    earliest = min(since, key=lambda v: (stored_int(v) is None, stored_int(v) or 0))
    pipe = Batch()
    for k in new:
        pipe.set(k.paused, earliest, nx=True)
    for k in everything:
        if k not in new:
            pipe.delete(k.paused)
    yield from checked_commands(*pipe.cmds)


def _carry_limits(sources: Sequence[PartitionKeys], count: int) -> Steps[None]:
    """A queue's flow limits hold on every new partition (each cap, per queue, per key or
    per task, the largest found, should partitions differ; each rate the first partition's),
    before the limits of vanishing partitions go."""
    new = targets(sources[0].queue, count)
    everything = list(dict.fromkeys([*sources, *new]))
    replies = yield commands(*(cmd("hgetall", k.limits) for k in everything))
    found = [v for v in replies if isinstance(v, dict)]
    carried: dict[str, str | int] = {}
    for fields in found:
        for name, value in fields.items():
            if name in ("rate", "key_rate"):
                if isinstance(value, str):
                    carried.setdefault(name, value)
            elif name in ("concurrency", "key_concurrency") or (
                name.startswith("task:") and len(name) > 5
            ):
                cap = stored_int(value)
                if cap is not None:
                    carried[name] = max(cap, int(carried.get(name, cap)))
    tasks = sum(name.startswith("task:") for name in carried)
    if tasks:
        carried["task_caps"] = tasks
    if not carried:
        return
    pipe = Batch()
    for k in new:
        pipe.hset(k.limits, mapping=carried)
    for k in everything:
        if k not in new:
            pipe.delete(k.limits)
    yield from checked_commands(*pipe.cmds)


def repartition(
    jq: JobQueue,
    queue: str,
    count: int,
    *,
    page: int = PAGE,
    clock: Callable[[], float] = time.monotonic,
    advance: Callable[[int], None] = lambda n: None,
) -> Report:
    """:func:`repartition_steps` on a sync client."""
    return jq.run_steps(
        repartition_steps(jq, queue, count, page=page, clock=clock, advance=advance)
    )


def repartition_steps(
    jq: ClientCore,
    queue: str,
    count: int,
    *,
    page: int = PAGE,
    clock: Callable[[], float] = time.monotonic,
    advance: Callable[[int], None] = lambda n: None,
) -> Steps[Report]:
    """Move every run of ``queue`` to its partition under ``count`` partitions, then record
    the count. Refused (OperationRefused) with running runs or live workers; safe to re-run
    after an interruption. ``advance(n)`` reports progress through the first pass (about
    ``plan(...).total`` entries in all)."""
    started = clock()
    before = yield from plan_steps(jq, queue, count)
    partitions = before.sources
    yield from _one("hset", MOVING_KEY, queue, placement_record(count, True))
    report = Report(queue, before.recorded, count)
    moved, _ = yield from _move_pass(partitions, count, page, report, advance)
    # Counted from the plan: a run moved into a partition scanned later is seen there again.
    report.stayed = max(before.total - moved - report.gone - len(report.conflicts), 0)
    # A second pass finds runs written meanwhile by a producer still using the old count
    # (or behind the scan cursor); on a quiet queue it only reads.
    report.late, _ = yield from _move_pass(partitions, count, page, report)
    if report.conflicts:
        report.conflicts = list(dict.fromkeys(report.conflicts))  # both passes saw them
        shown = ", ".join(report.conflicts[:5]) + (", ..." if len(report.conflicts) > 5 else "")
        raise OperationRefused(
            f"{len(report.conflicts)} run ids exist in two partitions with different contents "
            f"({shown}): resolve them by hand, then run repartition again; count not changed"
        )
    new = targets(queue, count)
    for source in partitions:
        if source not in new and (yield from _fold_stats(source, count)):
            report.folded.append((source.partition, fold_target(source.partition, count)))
    yield from _carry_fences(partitions, count)
    yield from _carry_pause(partitions, count)
    yield from _carry_limits(partitions, count)
    yield from _refuse_if_busy(queue, partitions)  # a worker started during the move
    yield from _one("hset", QUEUES_KEY, queue, placement_record(count, True))
    yield from _one("hdel", MOVING_KEY, queue)
    report.seconds = clock() - started
    return report
