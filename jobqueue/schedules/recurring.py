"""Recurring jobs: the definitions store (schedule, unschedule, pause, resume, trigger, backfill,
list), validated completely at declaration: a bad definition raises and writes nothing.

Storage (scheduler partition k of K, hash tag ``{sched#k}``, k = fnv1a_32(job_id) % K):

    jq:{sched#k}:def    hash   job_id -> definition (compact JSON, defaults omitted)
    jq:{sched#k}:next   zset   job_id -> next fire instant (ms); absent while paused or ended
    jq:{sched#k}:state  hash   job_id -> 'fired missed skipped dropped last through [last_queue]'
    jq:{sched#k}:held   hash   job_id -> 'fire pred_fire due queue [pred_queue]' (buffer-one)
    jq:sched:config     hash   partitions -> K, and the placement: 'K' (the tags {sched#k})
                               or 'K spread' (global, plain commands only); moving -> the
                               target of a `schedules repartition` in progress
    jq:schedulers       hash   scheduler id -> its registry entry (``scheduler.membership``)
    jq:{sched#k}:owner  hash   the lease of the scheduler that owns partition k (owner,
                               token, until)
    jq:sched:declared   set    job ids synced from code declarations (global, plain commands)

``last`` is the latest fire instant that got a run (-1: none yet), ``through`` the instant up
to which fire times have been handled and ``last_queue`` the queue of the last fire's run
(absent: the definition's queue). A held entry's ``pred_queue`` is the predecessor's queue when
it differs from the held run's (the job's queue changed in between). Scheduled runs are
``<job_id>@<fire instant, UTC>`` (see ``cron.format_fire_instant``), so a job id must not
contain '@'.

Upsert: ``schedule`` on an existing job keeps its next fire when the timing (cron, every, tz,
start, end) is unchanged; otherwise the new timing applies from the first fire after both now
and every fire time already handled, so a change neither repeats nor drops a fire.

Declared in code (``@jq.task(cron=...)``, ``jq.declare_schedule``): validated at declaration,
written by the scheduler at start (:meth:`Recurring.sync`) with ``origin: "code"`` in the
definition, which is what ``--prune`` requires before removing one. A declaration never
replaces a schedule added at run time under the same id: the scheduler leaves that one as it
is and warns.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import redis

from jobqueue.anomalies import (
    MAX_TIME_MS,
    Anomaly,
    Listing,
    checked,
    is_time,
    is_wrong_type,
    score_ms,
    unique,
)
from jobqueue.client.base import Planned
from jobqueue.errors import ConfigError, CorruptData, OperationRefused
from jobqueue.policy.cron import (
    Schedule,
    ScheduleError,
    fire_times_between,
    format_fire_instant,
    next_fire_after,
    parse_schedule,
    period_ms,
)
from jobqueue.policy.hashing import fnv1a_32
from jobqueue.policy.jitter import jitter_ms
from jobqueue.policy.misfire import MisfireError, parse_policy
from jobqueue.policy.timeutil import Instant, instant_to_ms
from jobqueue.store import ops
from jobqueue.store.keys import (
    MAX_PARTITIONS,
    bad_count,
    parse_placement,
    placement_record,
    validate_partition_count,
    validate_queue_name,
    validate_run_id,
)
from jobqueue.store.ops import RunSpec, SchedKeys
from jobqueue.store.payload import encode_payload
from jobqueue.tasks import Task

if TYPE_CHECKING:
    from jobqueue.client.base import ClientBase
    from jobqueue.client.sync import JobQueue, RunHandle

SCHED_CONFIG_KEY = "jq:sched:config"
# Job ids ever synced from code declarations (global, plain commands only): where --prune
# looks for candidates, so it never scans every definition. Each candidate is removed only if
# its stored definition still says origin "code" (jq.schedule at run time makes it "").
DECLARED_KEY = "jq:sched:declared"
ORIGIN_CODE = "code"
ENV_SCHED_PARTITIONS = "JOBQUEUE_SCHED_PARTITIONS"
# jq:sched:config's field naming the target of a `schedules repartition` in progress.
MOVING_FIELD = "moving"
# Scheduler partitions per cluster master when nothing configures K (see default_partitions).
PER_MASTER = 4
DEFAULT_MISFIRE = "fire-once"
MAX_BACKFILL = 10_000
_CAS_ATTEMPTS = 20

Overlap = Literal["allow", "forbid", "buffer-one"]
OVERLAP_POLICIES: tuple[Overlap, ...] = ("allow", "forbid", "buffer-one")


class RecurringError(ConfigError):
    """A recurring job definition that cannot be accepted: the message names the bad value."""


class BackfillInFuture(RecurringError):
    """A backfill whose end is after the server's now: fire times still to come are the
    scheduler's to create at their time, not runs to make due now."""


class UnknownSchedule(OperationRefused, LookupError):
    """No recurring job with that id."""


class RuntimeOwned(Exception):
    """Internal to :meth:`Recurring.sync`: the id belongs to a schedule added at run time."""


def validate_job_id(job_id: str) -> str:
    try:
        validate_run_id(job_id)
    except ValueError as exc:
        raise RecurringError(f"invalid job id: {exc}") from None
    if "@" in job_id:
        raise RecurringError(
            f"invalid job id {job_id!r}: '@' is reserved (run ids are <job_id>@<fire time>)"
        )
    return job_id


def refuse_future_end(job_id: str, end_ms: int, now_ms: int) -> None:
    """Backfill covers past fire times only: raise BackfillInFuture for an end after now."""
    if end_ms > now_ms:
        raise BackfillInFuture(
            f"backfill of {job_id!r}: end {format_fire_instant(end_ms)} is after the "
            f"server's now ({format_fire_instant(now_ms)}); backfill covers past fire times "
            "only (the scheduler creates the later ones at their time)"
        )


def sched_partition_of(job_id: str, partitions: int) -> int:
    return 0 if partitions <= 1 else fnv1a_32(job_id) % partitions


def sched_keys(partition: int, count: int, spread: bool) -> SchedKeys:
    """Scheduler partition ``partition`` of ``count``, with its placement."""
    return SchedKeys(partition, count if spread and count > 1 else 0)


@lru_cache(maxsize=65536)
def schedule_of(cron: str | None, every_ms: int | None, tz: str) -> Schedule:
    """Schedules are validated on construction (croniter work): build each one once."""
    return Schedule(cron=cron, every_ms=every_ms, tz=tz)


@dataclass(frozen=True)
class Definition:
    """One recurring job, as stored. Build it with :func:`make_definition` (validated)."""

    job_id: str
    task: str
    queue: str
    cron: str | None = None
    every_ms: int | None = None
    tz: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    misfire: str = DEFAULT_MISFIRE
    jitter_ms: int = 0
    overlap: Overlap = "allow"
    max_attempts: int = 3
    lease_ms: int = 0
    timeout_ms: int = 0
    start_ms: int | None = None
    end_ms: int | None = None
    paused: bool = False
    origin: str = ""  # ORIGIN_CODE: declared in code (synced, and pruned only with --prune)

    @property
    def schedule(self) -> Schedule:
        return schedule_of(self.cron, self.every_ms, self.tz)

    @property
    def timing(self) -> tuple[Any, ...]:
        """What decides the fire times: a change here moves the next fire."""
        return (self.cron, self.every_ms, self.tz, self.start_ms, self.end_ms)

    def payload(self, limit: int) -> str:
        return encode_payload(list(self.args), dict(self.kwargs), limit)

    def to_json(self) -> str:
        data: dict[str, Any] = {"task": self.task, "queue": self.queue}
        if self.cron is not None:
            data["cron"] = self.cron
        else:
            data["every_ms"] = self.every_ms
        optional: dict[str, Any] = {
            "tz": (self.tz, "UTC"),
            "args": (list(self.args), []),
            "kwargs": (self.kwargs, {}),
            "misfire": (self.misfire, DEFAULT_MISFIRE),
            "jitter_ms": (self.jitter_ms, 0),
            "overlap": (self.overlap, "allow"),
            "max_attempts": (self.max_attempts, 3),
            "lease_ms": (self.lease_ms, 0),
            "timeout_ms": (self.timeout_ms, 0),
            "start_ms": (self.start_ms, None),
            "end_ms": (self.end_ms, None),
            "paused": (self.paused, False),
            "origin": (self.origin, ""),
        }
        for name, (value, default) in optional.items():
            if value != default:
                data[name] = value
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, job_id: str, text: str) -> Definition:
        return _definition_from_json(job_id, text)


@lru_cache(maxsize=131072)
def _definition_from_json(job_id: str, text: str) -> Definition:
    """Parsed definitions are immutable: a scheduler re-reading the same text reuses them.

    Each field must be what :meth:`Definition.to_json` writes (CorruptData otherwise, a
    ValueError): a garbage field would otherwise surface later, as a TypeError in a listing or
    a schedule that raises in the middle of a scheduler's tick. Fields it does not know are
    ignored (a newer version may add some)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CorruptData(f"definition is not valid JSON: {exc}") from None
    except RecursionError:
        raise CorruptData("definition is JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise CorruptData("definition is not a JSON object")
    for name, kinds in _DEFINITION_TYPES.items():
        if name in data and not _is(data[name], kinds):
            raise CorruptData(f"definition field {name!r} is {data[name]!r}: wrong type")
    for name in ("task", "queue"):
        if name not in data:
            raise CorruptData(f"definition has no {name!r}")
    defn = Definition(
        job_id=job_id,
        task=data["task"],
        queue=data["queue"],
        cron=data.get("cron"),
        every_ms=data.get("every_ms"),
        tz=data.get("tz", "UTC"),
        args=tuple(data.get("args", ())),
        kwargs=dict(data.get("kwargs", {})),
        misfire=data.get("misfire", DEFAULT_MISFIRE),
        jitter_ms=data.get("jitter_ms", 0),
        overlap=data.get("overlap", "allow"),
        max_attempts=data.get("max_attempts", 3),
        lease_ms=data.get("lease_ms", 0),
        timeout_ms=data.get("timeout_ms", 0),
        start_ms=data.get("start_ms"),
        end_ms=data.get("end_ms"),
        paused=data.get("paused", False),
        origin=data.get("origin", ""),
    )
    try:
        validate_queue_name(defn.queue)
        _ = defn.schedule  # cron, interval and zone (cached per distinct schedule)
        parse_policy(defn.misfire)
    except (ConfigError, ScheduleError, MisfireError) as exc:
        raise CorruptData(f"definition is not usable: {exc}") from None
    if defn.overlap not in OVERLAP_POLICIES:
        raise CorruptData(f"definition has an unknown overlap policy {defn.overlap!r}")
    if min(defn.jitter_ms, defn.lease_ms, defn.timeout_ms) < 0 or defn.max_attempts < 1:
        raise CorruptData("definition has a negative duration or max_attempts below 1")
    durations = (defn.every_ms or 0, defn.jitter_ms, defn.lease_ms, defn.timeout_ms)
    instants = (defn.start_ms, defn.end_ms)
    if max(durations) > MAX_TIME_MS or not all(t is None or is_time(t) for t in instants):
        # Fire times computed from it would overflow a date, mid-tick or mid-command.
        raise CorruptData("definition has a time or duration beyond year 9999")
    return defn


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    """isinstance, except that a bool is not an int here (JSON true is not a count)."""
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)


# What to_json writes, by field (None where the field may be null).
_DEFINITION_TYPES: dict[str, tuple[type, ...]] = {
    "task": (str,),
    "queue": (str,),
    "cron": (str, type(None)),
    "every_ms": (int, type(None)),
    "tz": (str,),
    "args": (list,),
    "kwargs": (dict,),
    "misfire": (str,),
    "jitter_ms": (int,),
    "overlap": (str,),
    "max_attempts": (int,),
    "lease_ms": (int,),
    "timeout_ms": (int,),
    "start_ms": (int, type(None)),
    "end_ms": (int, type(None)),
    "paused": (bool,),
    "origin": (str,),
}


@dataclass(frozen=True)
class JobState:
    """A job's counters and cursors, as ``advance.lua`` keeps them."""

    fired: int = 0
    missed: int = 0
    skipped: int = 0
    dropped: int = 0
    last_fire_ms: int | None = None
    through_ms: int | None = None
    # The queue the last fire's run went to; None (texts written before it was recorded, or
    # by a caller that did not say) means the definition's queue. Overlap policies look the
    # previous run up there, so a queue change does not hide a run still running.
    last_queue: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> JobState:
        if not text:
            return cls()
        parts = text.split()
        f = [int(x) for x in parts[:6]] + [0, 0, 0, 0, -1, -1][len(parts[:6]) :]
        return cls(
            f[0],
            f[1],
            f[2],
            f[3],
            None if f[4] < 0 else f[4],
            None if f[5] < 0 else f[5],
            parts[6] if len(parts) > 6 else None,
        )

    def text(self) -> str:
        last = -1 if self.last_fire_ms is None else self.last_fire_ms
        through = -1 if self.through_ms is None else self.through_ms
        queue = "" if self.last_queue is None else f" {self.last_queue}"
        return f"{self.fired} {self.missed} {self.skipped} {self.dropped} {last} {through}{queue}"


@dataclass(frozen=True)
class ScheduleInfo:
    """What ``get_schedule`` and ``list_schedules`` return."""

    definition: Definition
    next_fire_ms: int | None
    state: JobState
    # Garbage met beside a usable definition (counters, next fire): shown with the job.
    anomalies: tuple[Anomaly, ...] = ()

    @property
    def job_id(self) -> str:
        return self.definition.job_id

    def to_dict(self) -> dict[str, Any]:
        d = self.definition
        return {
            "job_id": d.job_id,
            "task": d.task,
            "queue": d.queue,
            "cron": d.cron,
            "every_s": None if d.every_ms is None else d.every_ms / 1000,
            "tz": d.tz,
            "misfire": d.misfire,
            "jitter_s": d.jitter_ms / 1000,
            "overlap": d.overlap,
            "paused": d.paused,
            "origin": d.origin or "runtime",
            "next_fire": None
            if self.next_fire_ms is None
            else format_fire_instant(self.next_fire_ms),
            "next_fire_ms": self.next_fire_ms,
            "last_fire": None
            if self.state.last_fire_ms is None
            else format_fire_instant(self.state.last_fire_ms),
            "fired": self.state.fired,
            "missed": self.state.missed,
            "skipped_by_overlap": self.state.skipped,
            "dropped_by_cap": self.state.dropped,
            "anomalies": [a.to_dict() for a in self.anomalies],
        }


def run_id_for(job_id: str, fire_ms: int) -> str:
    return f"{job_id}@{format_fire_instant(fire_ms)}"


def fire_spec(defn: Definition, fire_ms: int, payload: str) -> RunSpec:
    """The run of one fire time: due = nominal + the job's deterministic jitter."""
    return RunSpec(
        run_id=run_id_for(defn.job_id, fire_ms),
        task=defn.task,
        payload=payload,
        due_at_ms=fire_ms + jitter_ms(defn.job_id, defn.jitter_ms),
        max_attempts=defn.max_attempts,
        lease_ms=defn.lease_ms,
        timeout_ms=defn.timeout_ms,
        job_id=defn.job_id,
        scheduled_for_ms=fire_ms,
    )


def first_fire_after(defn: Definition, after_ms: int) -> int | None:
    """The first fire strictly after ``after_ms`` within start/end, or None when it has ended."""
    try:
        fire = next_fire_after(defn.schedule, after_ms, defn.start_ms)
    except ScheduleError:
        return None
    if defn.end_ms is not None and fire > defn.end_ms:
        return None
    return fire


def _seconds_to_ms(value: float | None, what: str, *, allow_zero: bool) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise RecurringError(f"invalid {what} {value!r}: expected a number of seconds")
    if not math.isfinite(value * 1000):  # inf, or so large that its milliseconds overflow
        raise RecurringError(f"invalid {what} {value!r}: out of range (not a finite number of ms)")
    if value < 0 or (value == 0 and not allow_zero):
        rule = "must not be negative" if allow_zero else "must be positive"
        raise RecurringError(f"invalid {what} {value!r}: {rule}")
    return round(value * 1000)


def make_definition(
    jq: ClientBase,
    job_id: str,
    task: Task[Any, Any] | Any,
    *,
    cron: str | None = None,
    every: float | None = None,
    tz: str = "UTC",
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    misfire: str = DEFAULT_MISFIRE,
    jitter: float | None = None,
    overlap: str = "allow",
    queue: str | None = None,
    start_at: Instant | None = None,
    end_at: Instant | None = None,
    max_attempts: int | None = None,
) -> Definition:
    """Validate everything about a recurring job; raise RecurringError naming what is wrong."""
    validate_job_id(job_id)
    if isinstance(task, str) and task not in jq.registry and not jq.registry.names():
        # No registry at all: a process that only schedules by name (the CLI, an ops script)
        # for workers elsewhere. With one, a name it does not know is refused as enqueue
        # refuses it: its runs would only ever be dead-lettered as "unknown task".
        from jobqueue.tasks import validate_task_name

        task_name, options = validate_task_name(task), None
    else:
        resolved = jq.resolve_task(task)
        task_name, options = resolved.name, resolved.options
    try:
        schedule = parse_schedule(cron, every, tz)
        policy = parse_policy(misfire)
    except (ScheduleError, MisfireError) as exc:
        raise RecurringError(f"job {job_id!r}: {exc}") from None
    jitter_window = _seconds_to_ms(jitter, "jitter", allow_zero=True)
    period = period_ms(schedule)
    if jitter_window and jitter_window >= period:
        raise RecurringError(
            f"job {job_id!r}: jitter {jitter_window / 1000:g} s must be shorter than the "
            f"schedule's period {period / 1000:g} s (runs would overtake each other)"
        )
    if overlap not in OVERLAP_POLICIES:
        raise RecurringError(
            f"job {job_id!r}: unknown overlap policy {overlap!r}: expected one of "
            + ", ".join(OVERLAP_POLICIES)
        )
    start_ms = None if start_at is None else instant_to_ms(start_at)
    end_ms = None if end_at is None else instant_to_ms(end_at)
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise RecurringError(f"job {job_id!r}: end_at is before start_at")
    attempts = max_attempts or (options.max_attempts if options else None)
    attempts = attempts or jq.settings.default_max_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise RecurringError(f"job {job_id!r}: max_attempts must be an integer >= 1")
    defn = Definition(
        job_id=job_id,
        task=task_name,
        queue=validate_queue_name(
            queue or (options.queue if options else None) or jq.settings.default_queue
        ),
        cron=schedule.cron,
        every_ms=schedule.every_ms,
        tz=schedule.tz,
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        misfire=str(policy),
        jitter_ms=jitter_window,
        overlap=overlap,
        max_attempts=attempts,
        lease_ms=options.lease_ms if options else 0,
        timeout_ms=options.timeout_ms if options else 0,
        start_ms=start_ms,
        end_ms=end_ms,
    )
    defn.payload(jq.settings.max_payload_bytes)  # raises PayloadError on bad arguments
    return defn


# -- schedules declared in code ------------------------------------------------------------------

# What a declaration may set (the keyword arguments of ``jq.schedule`` but ``now``).
DECLARATION_OPTIONS = frozenset(
    {
        "cron",
        "every",
        "tz",
        "args",
        "kwargs",
        "misfire",
        "jitter",
        "overlap",
        "queue",
        "start_at",
        "end_at",
        "max_attempts",
    }
)


def declare(jq: ClientBase, job_id: str, task: Task[Any, Any] | Any, **options: Any) -> Definition:
    """Validate a code-declared recurring job now (a bad cron, zone, jitter or policy raises
    RecurringError here, at import time) and add it to ``jq.declared_schedules``; the scheduler
    writes it at start (:meth:`Recurring.sync`). Nothing touches Redis here."""
    (defn,) = plan_declarations(jq, [(job_id, task, options)])
    add_declarations(jq, [defn])
    return defn


def plan_declarations(
    jq: ClientBase, items: Sequence[tuple[str, Task[Any, Any] | Any, dict[str, Any]]]
) -> list[Definition]:
    """Validate declarations (job id, task, options) without declaring any: all or nothing."""
    out: list[Definition] = []
    taken = {d.job_id for d in jq.declared_schedules}
    for job_id, task, options in items:
        unknown = sorted(set(options) - DECLARATION_OPTIONS)
        if unknown:
            raise RecurringError(f"job {job_id!r}: unknown schedule option(s) {', '.join(unknown)}")
        defn = replace(make_definition(jq, job_id, task, **options), origin=ORIGIN_CODE)
        if defn.job_id in taken:
            raise RecurringError(f"recurring job {job_id!r} is declared twice")
        taken.add(defn.job_id)
        out.append(defn)
    return out


def add_declarations(jq: ClientBase, defns: Sequence[Definition]) -> None:
    """Add validated declarations (:func:`plan_declarations`) to ``jq.declared_schedules``."""
    jq.declared_schedules.extend(defns)


def declare_task_schedules(
    jq: ClientBase,
    task: Task[Any, Any],
    schedule: dict[str, Any],
    schedules: Sequence[dict[str, Any]] | None,
) -> list[Definition]:
    """``@jq.task(cron=...)`` (job id = task name) and ``@jq.task(schedules=[{...}, ...])``
    (each a dict of ``jq.schedule`` options plus ``"id"``, required when there are several),
    validated all together and not declared: see :func:`add_declarations` (the decorator
    registers the task only once its schedules are known to be valid)."""
    items: list[dict[str, Any]] = []
    if any(v is not None for v in schedule.values()):
        items.append({k: v for k, v in schedule.items() if v is not None})
    for item in schedules or ():
        if not isinstance(item, dict):
            raise RecurringError(f"task {task.name!r}: each schedule must be a dict of options")
        items.append(dict(item))
    planned: list[tuple[str, Task[Any, Any] | Any, dict[str, Any]]] = []
    for item in items:
        job_id = item.pop("id", None)
        if job_id is None:
            if len(items) > 1:
                raise RecurringError(f"task {task.name!r} has several schedules: give each an 'id'")
            job_id = task.name
        planned.append((str(job_id), task, item))
    return plan_declarations(jq, planned)


@dataclass
class SyncReport:
    """What :meth:`Recurring.sync` did, by job id."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    # Declared in code under the id of a schedule added at run time: left as it is.
    ignored: list[str] = field(default_factory=list)


class Recurring:
    """The definitions store of one JobQueue (``jq.schedule(...)`` and friends delegate here)."""

    def __init__(self, jq: JobQueue, partitions: int | None = None) -> None:
        self.jq = jq
        self._wanted = partitions
        self._partitions: int | None = None
        self._spread = False

    # -- partitions ------------------------------------------------------------------------

    @property
    def partitions(self) -> int:
        """K, recorded in Redis (HSETNX) by the first writer; a process configured otherwise
        is refused. Writers (and the scheduler daemon at start) use this; readers use
        :meth:`read_partitions`, which records nothing."""
        if self._partitions is None:
            wanted = self._configured()
            first = placement_record(wanted or self.default_partitions(), True)
            pipe = self.jq.redis.pipeline(transaction=False)
            pipe.hsetnx(SCHED_CONFIG_KEY, "partitions", first)
            pipe.hget(SCHED_CONFIG_KEY, "partitions")
            written, stored = pipe.execute(raise_on_error=False)
            if isinstance(written, Exception) and not is_wrong_type(written):
                raise written  # refused by the server (OOM, READONLY): not the data's fault
            self._partitions, self._spread = self._adopt(stored, wanted)
        return self._partitions

    def default_partitions(self) -> int:
        """K when nothing configures it: 1 on a single server (its one thread runs every
        script anyway; a second scheduler stands by), PER_MASTER x the masters on a cluster,
        so that the partitions, placed evenly, put the same share of the jobs on each master
        and up to that many schedulers can share the work."""
        primaries = getattr(self.jq.redis, "get_primaries", None)
        if primaries is None:
            return 1
        return min(MAX_PARTITIONS, PER_MASTER * max(1, len(primaries())))

    def read_partitions(self) -> int:
        """K as recorded, else as configured: nothing recorded means no definition was ever
        written, so there is nothing to find in any partition. Writes nothing, so a command
        that only reads (or is refused) leaves Redis as it was."""
        if self._partitions is not None:
            return self._partitions
        wanted = self._configured()
        try:
            stored = self.jq.redis.hget(SCHED_CONFIG_KEY, "partitions")
        except redis.exceptions.ResponseError as exc:
            stored = exc
        if stored is None:
            return wanted or 1  # not kept: the first write records it, and may find another
        self._partitions, self._spread = self._adopt(stored, wanted)
        return self._partitions

    def forget(self) -> None:
        """Read K and its placement again at the next use (after `schedules repartition`)."""
        self._partitions, self._spread = None, False

    def refresh(self) -> None:
        """Before a write: K and its placement as Redis records them now (another process
        may have changed them with `jobqueue schedules repartition` since this one read
        them), and refused while such a change is in progress."""
        try:
            stored, moving = self.jq.redis.hmget(SCHED_CONFIG_KEY, ["partitions", MOVING_FIELD])
        except redis.exceptions.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            raise CorruptData(
                f"{SCHED_CONFIG_KEY} is not a hash: recurring jobs cannot be read"
            ) from None
        if moving is not None:
            raise OperationRefused(
                f"the scheduler partitions are being changed to {_str(moving)!r} (jobqueue "
                "schedules repartition): try again once it has finished"
            )
        if stored is not None:
            self._partitions, self._spread = self._adopt(stored, self._configured())

    def _configured(self) -> int | None:
        """K as this process is configured (argument, else $JOBQUEUE_SCHED_PARTITIONS)."""
        wanted = self._wanted
        env = os.environ.get(ENV_SCHED_PARTITIONS)
        if wanted is None and env:
            if not (env.isascii() and env.isdigit()):
                raise ConfigError(f"${ENV_SCHED_PARTITIONS} is {env!r}: not a whole number")
            wanted = int(env)
        if wanted is not None:
            validate_partition_count(wanted, "scheduler")
        return wanted

    def _adopt(self, stored: Any, wanted: int | None) -> tuple[int, bool]:
        """The recorded K and placement (an HGET reply), checked against the configured K."""
        if is_wrong_type(stored):
            raise CorruptData(f"{SCHED_CONFIG_KEY} is not a hash: recurring jobs cannot be read")
        if isinstance(stored, Exception):
            raise stored
        placed = parse_placement(stored)
        if placed is None:
            raise CorruptData(
                f"{SCHED_CONFIG_KEY} field 'partitions': {bad_count(stored)}; set it right "
                "before using recurring jobs"
            )
        count, spread = placed
        if wanted is not None and wanted != count:
            raise ConfigError(
                f"recurring jobs use {count} scheduler partitions in Redis but {wanted} "
                f"are configured here; changing it needs a migration: `jobqueue schedules "
                f"repartition {wanted}` (see its --help)"
            )
        return count, spread

    def keys(self, job_id: str) -> SchedKeys:
        count = self.read_partitions()
        return sched_keys(sched_partition_of(job_id, count), count, self._spread)

    def all_keys(self) -> list[SchedKeys]:
        count = self.read_partitions()
        return [sched_keys(k, count, self._spread) for k in range(count)]

    # -- reading ---------------------------------------------------------------------------

    def _read(self, job_id: str) -> tuple[str | None, int | None, str | None]:
        sk = self.keys(job_id)
        pipe = self.jq.redis.pipeline(transaction=False)
        pipe.hget(sk.defs, job_id)
        pipe.zscore(sk.next, job_id)
        pipe.hget(sk.state, job_id)
        replies = pipe.execute(raise_on_error=False)
        kinds = ((sk.defs, "hash"), (sk.next, "sorted set"), (sk.state, "hash"))
        for (key, kind), reply in zip(kinds, replies, strict=True):
            if is_wrong_type(reply):
                raise CorruptData(f"{key} is not a {kind}: cannot read {job_id!r}")
            if isinstance(reply, Exception):
                raise reply
        text, score, state = replies
        if score is not None and score_ms(score) is None:
            raise CorruptData(f"{sk.next} member {job_id!r} has score {score!r}, not a time")
        return _str(text), score_ms(score), _str(state)

    def stored_info(
        self, sk: SchedKeys, job_id: str, text: str, next_fire: Any, state: Any
    ) -> ScheduleInfo | Anomaly:
        """A stored job as read, or the Anomaly that says why its definition is not usable.
        A garbage next fire or counters text is an anomaly of the row instead."""
        try:
            defn = Definition.from_json(job_id, text)
        except CorruptData as exc:
            return Anomaly(sk.defs, f"field {job_id!r}: {exc}")
        anomalies: list[Anomaly] = []
        fire = score_ms(next_fire)
        if next_fire is not None and fire is None:
            anomalies.append(Anomaly(sk.next, f"member {job_id!r} has score {next_fire!r}"))
        try:
            counters = JobState.parse(_str(state))
            times = (counters.last_fire_ms, counters.through_ms)
            if not all(t is None or is_time(t) for t in times):
                raise ValueError("a time out of range")
        except ValueError:
            counters = JobState()
            anomalies.append(
                Anomaly(sk.state, f"field {job_id!r} is {_str(state)!r}, not counters")
            )
        return ScheduleInfo(defn, fire, counters, tuple(anomalies))

    def get(self, job_id: str) -> ScheduleInfo | None:
        """The job, None if there is none; CorruptData if its definition is not usable."""
        text, next_ms, state = self._read(validate_job_id(job_id))
        if text is None:
            return None
        info = self.stored_info(self.keys(job_id), job_id, text, next_ms, state)
        if isinstance(info, Anomaly):
            raise CorruptData(f"recurring job {job_id!r} cannot be read: {info}")
        return info

    def require(self, job_id: str) -> ScheduleInfo:
        info = self.get(job_id)
        if info is None:
            raise UnknownSchedule(f"no recurring job {job_id!r}")
        return info

    def list_jobs(self) -> Listing[ScheduleInfo]:
        """Every job, sorted; definitions that are not usable are left out, as anomalies of
        the listing (reads whole hashes: ``jobqueue.inspect.schedules`` pages instead)."""
        out: list[ScheduleInfo] = []
        found: list[Anomaly] = []
        r = self.jq.redis
        for sk in self.all_keys():
            pipe = r.pipeline(transaction=False)
            pipe.hgetall(sk.defs)
            pipe.zrange(sk.next, 0, -1, withscores=True)
            pipe.hgetall(sk.state)
            defs, nexts, states = pipe.execute(raise_on_error=False)
            defs = checked(defs, sk.defs, "hash", found, {})
            next_of = {_str(j): s for j, s in checked(nexts, sk.next, "sorted set", found, [])}
            state_of = {_str(j): s for j, s in checked(states, sk.state, "hash", found, {}).items()}
            for raw_id, text in defs.items():
                job_id = _str(raw_id) or ""
                info = self.stored_info(
                    sk, job_id, _str(text) or "", next_of.get(job_id), state_of.get(job_id)
                )
                if isinstance(info, Anomaly):
                    found.append(info)
                else:
                    out.append(info)
        return Listing(sorted(out, key=lambda i: i.job_id), unique(found))

    # -- writing ---------------------------------------------------------------------------

    def _now(self, now: int | None) -> int:
        return self.jq.server_time_ms() if now is None else int(now)

    def _put(self, job_id: str, build: Any, now: int | None) -> ScheduleInfo:
        """Read, let ``build(old_info, now)`` decide (definition, next), write with CAS; retry
        when a scheduler or another client changed the job in between."""
        self.refresh()
        for _ in range(_CAS_ATTEMPTS):
            sk = self.keys(job_id)
            text, next_ms, state_text = self._read(job_id)
            old = None if text is None else self.stored_info(sk, job_id, text, next_ms, state_text)
            if isinstance(old, Anomaly):
                raise CorruptData(f"recurring job {job_id!r} cannot be changed: {old}")
            defn, new_next = build(old, self._now(now))
            if self._partitions is None:
                # This process's first write, now known to be valid: K is recorded (HSETNX),
                # then everything is read again, in case another process recorded another K.
                _ = self.partitions
                continue
            call = ops.sched_define_call(
                sk,
                job_id,
                expected_definition=text,
                expected_next_ms=next_ms,
                definition=None if defn is None else defn.to_json(),
                next_ms=new_next,
            )
            if ops.parse_sched_define(self.jq.scripts.run(call)):
                state = old.state if old else JobState()
                if defn is None:  # deleted: report what was there
                    if old is None:
                        raise UnknownSchedule(f"no recurring job {job_id!r}")
                    return old
                return ScheduleInfo(defn, new_next, state)
        raise OperationRefused(f"recurring job {job_id!r} kept changing; gave up after retries")

    def schedule(self, defn: Definition, now: int | None = None) -> ScheduleInfo:
        """Create or update (upsert) a validated definition."""
        return self._upsert(defn, now, code=False)

    def _upsert(self, defn: Definition, now: int | None, *, code: bool) -> ScheduleInfo:
        """``code``: a declaration in code, which never replaces a schedule added at run time
        (raises RuntimeOwned instead, checked in the same compare-and-set as the write)."""

        def build(old: ScheduleInfo | None, t: int) -> tuple[Definition, int | None]:
            if old is None:
                return defn, first_fire_after(defn, t)
            if code and old.definition.origin != ORIGIN_CODE:
                raise RuntimeOwned(defn.job_id)
            new = replace(defn, paused=old.definition.paused)
            if new.paused:
                return new, None
            if old.definition.timing == new.timing and old.next_fire_ms is not None:
                return new, old.next_fire_ms
            return new, first_fire_after(new, max(t, old.state.through_ms or t))

        return self._put(defn.job_id, build, now)

    def sync(
        self, declared: Sequence[Definition], prune: bool = False, now: int | None = None
    ) -> SyncReport:
        """Write the code-declared definitions (upsert: an unchanged one is not written at all,
        so its next fire stays; a changed one applies from its next fire), and with ``prune``
        remove the code-declared ones no longer declared. Schedules added at run time
        (``jq.schedule``, the CLI) are never pruned, nor replaced by a declaration with the
        same id: that declaration is left out (``report.ignored``)."""
        report = SyncReport()
        names = {d.job_id for d in declared}
        r = self.jq.redis
        for defn in declared:
            info = self.get(defn.job_id)
            if info is not None and info.definition.origin != ORIGIN_CODE:
                report.ignored.append(defn.job_id)
                continue
            if info is not None and replace(defn, paused=info.definition.paused).to_json() == (
                info.definition.to_json()
            ):
                report.unchanged.append(defn.job_id)
            else:
                try:
                    self._upsert(defn, now, code=True)
                except RuntimeOwned:  # jq.schedule took the id between the read and the write
                    report.ignored.append(defn.job_id)
                    continue
                (report.created if info is None else report.updated).append(defn.job_id)
            # After the write: a crash in between leaves a definition prune never sees (safe).
            r.sadd(DECLARED_KEY, defn.job_id)
        if prune:
            known = sorted(_str(j) or "" for j in r.smembers(DECLARED_KEY))
            for job_id in known:
                if job_id not in names:
                    if self._remove_declared(job_id):
                        report.removed.append(job_id)
                    r.srem(DECLARED_KEY, job_id)
        return report

    def _remove_declared(self, job_id: str) -> bool:
        """Delete the job only if its stored definition still comes from code."""
        removed = False

        def build(old: ScheduleInfo | None, t: int) -> tuple[Definition | None, int | None]:
            nonlocal removed
            if old is None or old.definition.origin != ORIGIN_CODE:
                removed = False
                return (None, None) if old is None else (old.definition, old.next_fire_ms)
            removed = True
            return None, None

        try:
            self._put(job_id, build, 0)
        except UnknownSchedule:
            return False
        return removed

    def unschedule(self, job_id: str) -> bool:
        """Remove a job's definition, next fire and counters; runs already created stay."""
        validate_job_id(job_id)
        if self._read(job_id)[0] is None:
            return False  # nothing there: nothing recorded either
        _ = self.partitions  # a write: K is recorded first
        self.refresh()
        sk = self.keys(job_id)
        for _ in range(_CAS_ATTEMPTS):
            # Compared with the stored text as it is, not parsed: a definition that is not
            # usable (foreign data) can still be removed, which is the way out of it.
            text, next_ms, _state = self._read(job_id)
            if text is None:
                return False
            call = ops.sched_define_call(
                sk,
                job_id,
                expected_definition=text,
                expected_next_ms=next_ms,
                definition=None,
                next_ms=None,
            )
            if ops.parse_sched_define(self.jq.scripts.run(call)):
                return True
        raise OperationRefused(f"recurring job {job_id!r} kept changing; gave up after retries")

    def pause(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        self.require(job_id)

        def build(old: ScheduleInfo | None, t: int) -> tuple[Definition, None]:
            if old is None:
                raise UnknownSchedule(f"no recurring job {job_id!r}")
            return replace(old.definition, paused=True), None

        return self._put(job_id, build, now)

    def resume(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        """Fire times that passed while paused are not fired (use backfill for those)."""
        self.require(job_id)

        def build(old: ScheduleInfo | None, t: int) -> tuple[Definition, int | None]:
            if old is None:
                raise UnknownSchedule(f"no recurring job {job_id!r}")
            if not old.definition.paused:
                return old.definition, old.next_fire_ms
            new = replace(old.definition, paused=False)
            return new, first_fire_after(new, max(t, old.state.through_ms or t))

        return self._put(job_id, build, now)

    def _create(self, defn: Definition, specs: list[RunSpec], now: int | None) -> list[bool]:
        if not specs:
            return []
        self.jq.register_queue(defn.queue)
        planned = [Planned(self.jq.keys_for(defn.queue, s.run_id), s) for s in specs]
        return self.jq._create(planned, now)

    def trigger(self, job_id: str, now: int | None = None) -> RunHandle:
        """Run the job now, outside its schedule, with its own run id
        ``<job_id>@manual-<now>``; the schedule is untouched."""
        from jobqueue.client.sync import RunHandle

        defn = self.require(job_id).definition
        t = self._now(now)
        spec = RunSpec(
            run_id=f"{job_id}@manual-{format_fire_instant(t)}",
            task=defn.task,
            payload=defn.payload(self.jq.settings.max_payload_bytes),
            due_at_ms=t,
            max_attempts=defn.max_attempts,
            lease_ms=defn.lease_ms,
            timeout_ms=defn.timeout_ms,
            job_id=job_id,
            scheduled_for_ms=t,
        )
        (created,) = self._create(defn, [spec], now)
        return RunHandle(self.jq, spec.run_id, defn.queue, created)

    def backfill(
        self, job_id: str, start: Instant, end: Instant, now: int | None = None
    ) -> list[RunHandle]:
        """Create the runs of every fire time in [start, end] (same run ids as the scheduler
        would use, so fire times that already ran create nothing); due at once.

        ``end`` must not be after the server's now (BackfillInFuture, nothing written): a
        future fire time's run created now would run early, and at its time the scheduler
        would find it already there and create nothing."""
        from jobqueue.client.sync import RunHandle

        defn = self.require(job_id).definition
        start_ms, end_ms = instant_to_ms(start), instant_to_ms(end)
        if end_ms < start_ms:
            raise RecurringError("backfill: end is before start")
        refuse_future_end(job_id, end_ms, self._now(now))
        fires = fire_times_between(
            defn.schedule, start_ms - 1, end_ms, limit=MAX_BACKFILL + 1, anchor_ms=defn.start_ms
        )
        if len(fires) > MAX_BACKFILL:
            raise RecurringError(
                f"backfill of {job_id!r} covers more than {MAX_BACKFILL:,} fire times; "
                "split the range"
            )
        payload = defn.payload(self.jq.settings.max_payload_bytes)
        specs = [replace(fire_spec(defn, f, payload), due_at_ms=None) for f in fires]
        created = self._create(defn, specs, now)
        return [
            RunHandle(self.jq, s.run_id, defn.queue, c) for s, c in zip(specs, created, strict=True)
        ]


def _str(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
