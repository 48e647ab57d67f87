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
``<job_id>@<fire instant, UTC>`` (``store.keys.fire_run_id``), so a job id must not
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
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

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
from jobqueue.errors import ConfigError, CorruptData, OperationRefused
from jobqueue.payload import encode_payload
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
from jobqueue.settings import Settings
from jobqueue.store.io import (
    Cmd,
    Scripts,
    Steps,
    cmd,
    commands,
    raised,
    run_steps,
    server_time_steps,
)
from jobqueue.store.keys import (
    MAX_PARTITIONS,
    SchedKeys,
    bad_count,
    fire_run_id,
    parse_placement,
    placement_record,
    validate_partition_count,
    validate_queue_name,
    validate_run_id,
)
from jobqueue.store.runs import RunSpec
from jobqueue.store.schedules import SCHED_DEFINE
from jobqueue.store.scripts import ScriptRunner
from jobqueue.tasks import Registry, Task, validate_task_name

T = TypeVar("T")

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
DEFAULT_TZ = "UTC"
MAX_BACKFILL = 10_000
_CAS_ATTEMPTS = 20
# Definitions read per HSCAN page by listings.
LIST_SCAN_COUNT = 500

Overlap = Literal["allow", "forbid", "buffer-one"]
OVERLAP_POLICIES: tuple[Overlap, ...] = ("allow", "forbid", "buffer-one")
DEFAULT_OVERLAP: Overlap = "allow"


class RecurringError(ConfigError):
    """A recurring job definition that cannot be accepted: the message names the bad value."""


class BackfillInFuture(RecurringError):
    """A backfill whose end is after the server's now: fire times still to come are the
    scheduler's to create at their time, not runs to make due now."""


class UnknownSchedule(OperationRefused, LookupError):
    """No recurring job with that id."""


class RuntimeOwned(Exception):
    """Internal to :meth:`Recurring.sync`: the id belongs to a schedule added at run time."""


class TaskSource(Protocol):
    """What a definition is validated against: a client's tasks and settings."""

    @property
    def registry(self) -> Registry: ...

    @property
    def settings(self) -> Settings: ...

    def resolve_task(self, ref: Any) -> Task[Any, Any]: ...


class Declarer(TaskSource, Protocol):
    """A client that keeps the recurring jobs its app declares in code."""

    @property
    def declared_schedules(self) -> list[Definition]: ...


class SyncConnection(Protocol):
    """What :class:`Recurring` runs its operations on (a connected JobQueue)."""

    @property
    def redis(self) -> Any: ...

    @property
    def scripts(self) -> ScriptRunner: ...


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
    tz: str = DEFAULT_TZ
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    misfire: str = DEFAULT_MISFIRE
    jitter_ms: int = 0
    overlap: Overlap = DEFAULT_OVERLAP
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
            "tz": (self.tz, DEFAULT_TZ),
            "args": (list(self.args), []),
            "kwargs": (self.kwargs, {}),
            "misfire": (self.misfire, DEFAULT_MISFIRE),
            "jitter_ms": (self.jitter_ms, 0),
            "overlap": (self.overlap, DEFAULT_OVERLAP),
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
        tz=data.get("tz", DEFAULT_TZ),
        args=tuple(data.get("args", ())),
        kwargs=dict(data.get("kwargs", {})),
        misfire=data.get("misfire", DEFAULT_MISFIRE),
        jitter_ms=data.get("jitter_ms", 0),
        overlap=data.get("overlap", DEFAULT_OVERLAP),
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


class FiresAround(NamedTuple):
    """A job's fire instants around now: the last one passed (None: none yet), the next one
    (None: it has ended), and whether the next one's run is created already (early, up to
    the schedulers' lookahead)."""

    last_ms: int | None
    next_ms: int | None
    next_created: bool


def _last_fire_by(schedule: Schedule, now_ms: int, anchor_ms: int | None) -> int | None:
    """The latest fire instant at or before ``now_ms`` (looking back at most about 1,000
    periods), or None."""
    span = max(period_ms(schedule), 1_000)
    for factor in (2, 16, 128, 1024):
        lo = now_ms - factor * span
        fires = fire_times_between(schedule, lo, now_ms, anchor_ms=anchor_ms)
        if fires:
            return fires[-1]
    return None


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

    def fires_around(self, now_ms: int) -> FiresAround:
        """The fire instants on either side of ``now_ms`` (the schedulers create runs up to a
        lookahead early, so the last fire handled, ``state.last_fire_ms``, may be ahead)."""
        d, last = self.definition, self.state.last_fire_ms
        if last is None or last <= now_ms:
            return FiresAround(last, self.next_fire_ms, False)
        # Runs are created ahead: the next fire is among those, the last one passed before.
        schedule = d.schedule
        ahead = fire_times_between(schedule, now_ms, last, limit=1000, anchor_ms=d.start_ms)
        # A fire passed counts only if some run was created for one (not a fire from before
        # the job existed): more fired than created ahead.
        passed = _last_fire_by(schedule, now_ms, d.start_ms)
        if self.state.fired <= len(ahead):
            passed = None
        return FiresAround(passed, ahead[0] if ahead else last, True)

    def to_dict(self, now_ms: int | None = None) -> dict[str, Any]:
        """Its fields as JSON. ``next_fire_ms`` is the next fire no run was created for yet
        and ``last_fire`` the latest one a run was created for (it may be ahead: runs are
        created a lookahead early); with ``now_ms``, also the fires on either side of now:
        ``last_fired_ms`` (None: none yet), ``next_due_ms`` (None: ended) and
        ``next_due_created`` (its run is created already)."""
        d = self.definition
        around = {} if now_ms is None else self._around_dict(now_ms)
        return {**self._fields(d), **around}

    def _around_dict(self, now_ms: int) -> dict[str, Any]:
        around = self.fires_around(now_ms)
        return {
            "last_fired_ms": around.last_ms,
            "next_due_ms": around.next_ms,
            "next_due_created": around.next_created,
        }

    def _fields(self, d: Definition) -> dict[str, Any]:
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


def fire_spec(defn: Definition, fire_ms: int, payload: str) -> RunSpec:
    """The run of one fire time: due = nominal + the job's deterministic jitter."""
    return RunSpec(
        run_id=fire_run_id(defn.job_id, fire_ms),
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
    jq: TaskSource,
    job_id: str,
    task: Task[Any, Any] | Any,
    *,
    cron: str | None = None,
    every: float | None = None,
    tz: str = DEFAULT_TZ,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    misfire: str = DEFAULT_MISFIRE,
    jitter: float | None = None,
    overlap: str = DEFAULT_OVERLAP,
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
        # refuses it: its runs would only ever be handed back by its workers, then buried.
        task_name, options = validate_task_name(task), None
    else:
        resolved = jq.resolve_task(task)
        task_name, options = resolved.name, resolved.options
        # Arguments that could never bind would fail every fire's run: refused now.
        resolved.check_arguments(args, kwargs or {})
    try:  # the definition stores them as JSON (to_json): refused now, not at the write
        json.dumps([list(args), kwargs or {}], ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise RecurringError(
            f"job {job_id!r}: arguments not JSON-serialisable as a recurring job stores them "
            f"(plain JSON: str, int, float, bool, None, lists, dicts with string keys): {exc}"
        ) from None
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


def declare(jq: Declarer, job_id: str, task: Task[Any, Any] | Any, **options: Any) -> Definition:
    """Validate a code-declared recurring job now (a bad cron, zone, jitter or policy raises
    RecurringError here, at import time) and add it to ``jq.declared_schedules``; the scheduler
    writes it at start (:meth:`Recurring.sync`). Nothing touches Redis here."""
    (defn,) = plan_declarations(jq, [(job_id, task, options)])
    add_declarations(jq, [defn])
    return defn


def plan_declarations(
    jq: Declarer, items: Sequence[tuple[str, Task[Any, Any] | Any, dict[str, Any]]]
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


def add_declarations(jq: Declarer, defns: Sequence[Definition]) -> None:
    """Add validated declarations (:func:`plan_declarations`) to ``jq.declared_schedules``."""
    jq.declared_schedules.extend(defns)


def declare_task_schedules(
    jq: Declarer,
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


def trigger_spec(defn: Definition, now_ms: int, max_payload_bytes: int) -> RunSpec:
    """The run of ``jq.trigger``: now, outside the schedule, with its own run id
    ``<job_id>@manual-<now>``; the schedule is untouched."""
    return RunSpec(
        run_id=fire_run_id(defn.job_id, now_ms, manual=True),
        task=defn.task,
        payload=defn.payload(max_payload_bytes),
        due_at_ms=now_ms,
        max_attempts=defn.max_attempts,
        lease_ms=defn.lease_ms,
        timeout_ms=defn.timeout_ms,
        job_id=defn.job_id,
        scheduled_for_ms=now_ms,
    )


def backfill_specs(
    defn: Definition, start: Instant, end: Instant, now_ms: int, max_payload_bytes: int
) -> list[RunSpec]:
    """The runs of every fire time in [start, end] (the run ids the scheduler would use, so
    fire times that already ran create nothing), due at once. ``end`` must not be after
    ``now_ms`` (BackfillInFuture): a future fire time's run created now would run early, and
    at its time the scheduler would find it already there and create nothing."""
    start_ms, end_ms = instant_to_ms(start), instant_to_ms(end)
    if end_ms < start_ms:
        raise RecurringError("backfill: end is before start")
    refuse_future_end(defn.job_id, end_ms, now_ms)
    fires = fire_times_between(
        defn.schedule, start_ms - 1, end_ms, limit=MAX_BACKFILL + 1, anchor_ms=defn.start_ms
    )
    if len(fires) > MAX_BACKFILL:
        raise RecurringError(
            f"backfill of {defn.job_id!r} covers more than {MAX_BACKFILL:,} fire times; "
            "split the range"
        )
    payload = defn.payload(max_payload_bytes)
    return [replace(fire_spec(defn, f, payload), due_at_ms=None) for f in fires]


class RecurringSteps:
    """The definitions store as I/O-free operations (``Steps``, see ``jobqueue.store.io``),
    driven by the sync client (:class:`Recurring`) and by the asyncio one alike. It keeps one
    thing between operations: K, the scheduler partition count, once known."""

    def __init__(self, partitions: int | None = None, client: Any = None) -> None:
        self._wanted = partitions
        self._partitions: int | None = None
        self._spread = False
        self._client = client  # only asked for the cluster's masters (default_partitions)

    # -- partitions ------------------------------------------------------------------------

    def record_partitions_steps(self) -> Steps[int]:
        """K, recorded in Redis (HSETNX) by the first writer; a process configured otherwise
        is refused. Every write records it first, and the scheduler daemon at start."""
        if self._partitions is None:
            wanted = self.configured()
            first = placement_record(wanted or self.default_partitions(), True)
            written, stored = yield commands(
                cmd("hsetnx", SCHED_CONFIG_KEY, "partitions", first),
                cmd("hget", SCHED_CONFIG_KEY, "partitions"),
            )
            if isinstance(written, Exception) and not is_wrong_type(written):
                raise written  # refused by the server (OOM, READONLY): not the data's fault
            self._partitions, self._spread = self._adopt(stored, wanted)
        return self._partitions

    def default_partitions(self) -> int:
        """K when nothing configures it: 1 on a single server (its one thread runs every
        script anyway; a second scheduler stands by), PER_MASTER x the masters on a cluster,
        so that the partitions, placed evenly, put the same share of the jobs on each master
        and up to that many schedulers can share the work."""
        primaries = getattr(self.topology_client(), "get_primaries", None)  # cached slot map
        if primaries is None:
            return 1
        return min(MAX_PARTITIONS, PER_MASTER * max(1, len(primaries())))

    def topology_client(self) -> Any:
        """The client whose topology (a cluster's masters) decides the default K."""
        return self._client

    def read_partitions_steps(self) -> Steps[int]:
        """K as recorded, else as configured: nothing recorded means no definition was ever
        written, so there is nothing to find in any partition. Writes nothing, so a command
        that only reads (or is refused) leaves Redis as it was."""
        if self._partitions is not None:
            return self._partitions
        wanted = self.configured()
        (stored,) = yield commands(cmd("hget", SCHED_CONFIG_KEY, "partitions"))
        if stored is None:
            return wanted or 1  # not kept: the first write records it, and may find another
        self._partitions, self._spread = self._adopt(stored, wanted)
        return self._partitions

    def forget(self) -> None:
        """Read K and its placement again at the next use (after `schedules repartition`)."""
        self._partitions, self._spread = None, False

    def refresh_steps(self) -> Steps[None]:
        """Before a write: K and its placement as Redis records them now (another process
        may have changed them with `jobqueue schedules repartition` since this one read
        them), and refused while such a change is in progress."""
        (reply,) = yield commands(cmd("hmget", SCHED_CONFIG_KEY, "partitions", MOVING_FIELD))
        if is_wrong_type(reply):
            raise CorruptData(f"{SCHED_CONFIG_KEY} is not a hash: recurring jobs cannot be read")
        if isinstance(reply, Exception):
            raise reply
        stored, moving = reply
        if moving is not None:
            raise OperationRefused(
                f"the scheduler partitions are being changed to {_str(moving)!r} (jobqueue "
                "schedules repartition): try again once it has finished"
            )
        if stored is not None:
            self._partitions, self._spread = self._adopt(stored, self.configured())

    def configured(self) -> int | None:
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

    def keys_steps(self, job_id: str) -> Steps[SchedKeys]:
        count = yield from self.read_partitions_steps()
        return sched_keys(sched_partition_of(job_id, count), count, self._spread)

    def all_keys_steps(self) -> Steps[list[SchedKeys]]:
        count = yield from self.read_partitions_steps()
        return [sched_keys(k, count, self._spread) for k in range(count)]

    # -- reading ---------------------------------------------------------------------------

    def read_steps(self, job_id: str) -> Steps[tuple[str | None, int | None, str | None]]:
        """A job's stored definition text, next fire and counters text (None: absent)."""
        sk = yield from self.keys_steps(job_id)
        replies = yield commands(
            cmd("hget", sk.defs, job_id),
            cmd("zscore", sk.next, job_id),
            cmd("hget", sk.state, job_id),
        )
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

    @staticmethod
    def stored_info(
        sk: SchedKeys, job_id: str, text: str, next_fire: Any, state: Any
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

    def get_steps(self, job_id: str) -> Steps[ScheduleInfo | None]:
        """The job, None if there is none; CorruptData if its definition is not usable."""
        text, next_ms, state = yield from self.read_steps(validate_job_id(job_id))
        if text is None:
            return None
        sk = yield from self.keys_steps(job_id)
        info = self.stored_info(sk, job_id, text, next_ms, state)
        if isinstance(info, Anomaly):
            raise CorruptData(f"recurring job {job_id!r} cannot be read: {info}")
        return info

    def require_steps(self, job_id: str) -> Steps[ScheduleInfo]:
        info = yield from self.get_steps(job_id)
        if info is None:
            raise UnknownSchedule(f"no recurring job {job_id!r}")
        return info

    def list_steps(
        self, limit: int | None = None, scan_count: int = LIST_SCAN_COUNT
    ) -> Steps[Listing[ScheduleInfo]]:
        """Recurring jobs (at most ``limit``; None: all), sorted by job id. Read with HSCAN in
        pages and pipelined ZSCORE/HGET per page, so a store of millions of jobs never blocks
        the server. A definition that is not usable is an anomaly of the listing, not a row;
        garbage beside a usable one, an anomaly of its row."""
        out: list[ScheduleInfo] = []
        found: list[Anomaly] = []
        seen: set[str] = set()  # HSCAN may return an entry twice across pages
        wanted = math.inf if limit is None else limit
        for sk in (yield from self.all_keys_steps()):
            cursor: int = 0
            while len(out) < wanted:
                (page,) = yield commands(cmd("hscan", sk.defs, cursor, count=scan_count))
                if checked(page, sk.defs, "hash", found, None) is None:
                    break
                cursor, entries = page
                items = [(j, t) for j, t in entries.items() if j not in seen]
                if limit is not None:
                    items = items[: limit - len(out)]
                seen.update(j for j, _ in items)
                replies = (
                    (yield commands(
                        *(c for job_id, _ in items
                          for c in (cmd("zscore", sk.next, job_id), cmd("hget", sk.state, job_id)))
                    ))
                    if items
                    else []
                )
                for i, (job_id, text) in enumerate(items):
                    score = checked(replies[2 * i], sk.next, "sorted set", found, None)
                    state = checked(replies[2 * i + 1], sk.state, "hash", found, None)
                    info = self.stored_info(sk, job_id, text, score, state)
                    if isinstance(info, Anomaly):
                        found.append(info)
                    else:
                        out.append(info)
                if int(cursor) == 0:
                    break
            if len(out) >= wanted:
                break
        truncated = False
        if len(out) >= wanted:  # stopped at the limit: say whether definitions were left
            keys = yield from self.all_keys_steps()
            sizes = yield commands(*(cmd("hlen", sk.defs) for sk in keys))
            truncated = sum(n for n in sizes if isinstance(n, int)) > len(seen)
        return Listing(sorted(out, key=lambda i: i.job_id), unique(found), truncated)

    # -- writing ---------------------------------------------------------------------------

    def put_steps(self, job_id: str, build: Any, now: int | None) -> Steps[ScheduleInfo]:
        """Read, let ``build(old_info, now)`` decide (definition, next), write with CAS; retry
        when a scheduler or another client changed the job in between."""
        yield from self.refresh_steps()
        for _ in range(_CAS_ATTEMPTS):
            text, next_ms, state_text = yield from self.read_steps(job_id)
            sk = yield from self.keys_steps(job_id)
            old = None if text is None else self.stored_info(sk, job_id, text, next_ms, state_text)
            if isinstance(old, Anomaly):
                raise CorruptData(f"recurring job {job_id!r} cannot be changed: {old}")
            defn, new_next = build(old, (yield from server_time_steps(now)))
            if self._partitions is None:
                # This process's first write, now known to be valid: K is recorded (HSETNX),
                # then everything is read again, in case another process recorded another K.
                yield from self.record_partitions_steps()
                continue
            call = SCHED_DEFINE.call(
                sk,
                job_id,
                expected_definition=text,
                expected_next_ms=next_ms,
                definition=None if defn is None else defn.to_json(),
                next_ms=new_next,
            )
            (reply,) = yield Scripts([call])
            if SCHED_DEFINE.parse(reply):
                state = old.state if old else JobState()
                if defn is None:  # deleted: report what was there
                    if old is None:
                        raise UnknownSchedule(f"no recurring job {job_id!r}")
                    return old
                return ScheduleInfo(defn, new_next, state)
        raise OperationRefused(f"recurring job {job_id!r} kept changing; gave up after retries")

    def schedule_steps(self, defn: Definition, now: int | None = None) -> Steps[ScheduleInfo]:
        """Create or update (upsert) a validated definition."""
        return (yield from self.upsert_steps(defn, now, code=False))

    def upsert_steps(
        self, defn: Definition, now: int | None, *, code: bool
    ) -> Steps[ScheduleInfo]:
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

        return (yield from self.put_steps(defn.job_id, build, now))

    def remove_declared_steps(self, job_id: str) -> Steps[bool]:
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
            yield from self.put_steps(job_id, build, 0)
        except UnknownSchedule:
            return False
        return removed

    def unschedule_steps(self, job_id: str) -> Steps[bool]:
        """Remove a job's definition, next fire and counters; runs already created stay."""
        validate_job_id(job_id)
        if (yield from self.read_steps(job_id))[0] is None:
            return False  # nothing there: nothing recorded either
        yield from self.record_partitions_steps()  # a write: K is recorded first
        yield from self.refresh_steps()
        sk = yield from self.keys_steps(job_id)
        for _ in range(_CAS_ATTEMPTS):
            # Compared with the stored text as it is, not parsed: a definition that is not
            # usable (foreign data) can still be removed, which is the way out of it.
            text, _next_ms, _state = yield from self.read_steps(job_id)
            if text is None:
                return False
            # The score as stored, not as parsed: a foreign fractional score (0.5) read as a
            # whole ms never matched, and the job could not be removed at all.
            (stored_score,) = yield commands(cmd("zscore", sk.next, job_id))
            call = SCHED_DEFINE.call(
                sk,
                job_id,
                expected_definition=text,
                expected_next_ms=stored_score,
                definition=None,
                next_ms=None,
            )
            (reply,) = yield Scripts([call])
            if SCHED_DEFINE.parse(reply):
                return True
        raise OperationRefused(f"recurring job {job_id!r} kept changing; gave up after retries")

    def pause_steps(self, job_id: str, now: int | None = None) -> Steps[ScheduleInfo]:
        yield from self.require_steps(job_id)

        def build(old: ScheduleInfo | None, t: int) -> tuple[Definition, None]:
            if old is None:
                raise UnknownSchedule(f"no recurring job {job_id!r}")
            return replace(old.definition, paused=True), None

        return (yield from self.put_steps(job_id, build, now))

    def resume_steps(self, job_id: str, now: int | None = None) -> Steps[ScheduleInfo]:
        """Fire times that passed while paused are not fired (use backfill for those)."""
        yield from self.require_steps(job_id)

        def build(old: ScheduleInfo | None, t: int) -> tuple[Definition, int | None]:
            if old is None:
                raise UnknownSchedule(f"no recurring job {job_id!r}")
            if not old.definition.paused:
                return old.definition, old.next_fire_ms
            new = replace(old.definition, paused=False)
            return new, first_fire_after(new, max(t, old.state.through_ms or t))

        return (yield from self.put_steps(job_id, build, now))


class Recurring(RecurringSteps):
    """The definitions store on a sync connection (``jq.recurring``; the scheduler daemon's
    and the CLI's): each method runs the operation of the same name ``..._steps``."""

    def __init__(self, conn: SyncConnection, partitions: int | None = None) -> None:
        super().__init__(partitions)
        self.conn = conn

    def topology_client(self) -> Any:
        return self.conn.redis  # connected at first use, not when the client is made

    def run(self, steps: Steps[T]) -> T:
        return run_steps(steps, self.conn.redis, self.conn.scripts)

    @property
    def partitions(self) -> int:
        """K as recorded, else as configured: reads, never writes (see
        :meth:`record_partitions`)."""
        return self.read_partitions()

    def record_partitions(self) -> int:
        return self.run(self.record_partitions_steps())

    def read_partitions(self) -> int:
        return self.run(self.read_partitions_steps())

    def keys(self, job_id: str) -> SchedKeys:
        return self.run(self.keys_steps(job_id))

    def all_keys(self) -> list[SchedKeys]:
        return self.run(self.all_keys_steps())

    def get(self, job_id: str) -> ScheduleInfo | None:
        return self.run(self.get_steps(job_id))

    def require(self, job_id: str) -> ScheduleInfo:
        return self.run(self.require_steps(job_id))

    def list_jobs(
        self, limit: int | None = None, scan_count: int = LIST_SCAN_COUNT
    ) -> Listing[ScheduleInfo]:
        return self.run(self.list_steps(limit, scan_count))

    def schedule(self, defn: Definition, now: int | None = None) -> ScheduleInfo:
        return self.run(self.schedule_steps(defn, now))

    def unschedule(self, job_id: str) -> bool:
        return self.run(self.unschedule_steps(job_id))

    def pause(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        return self.run(self.pause_steps(job_id, now))

    def resume(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        return self.run(self.resume_steps(job_id, now))

    def sync(
        self, declared: Sequence[Definition], prune: bool = False, now: int | None = None
    ) -> SyncReport:
        """Write the code-declared definitions (upsert: an unchanged one is not written at all,
        so its next fire stays; a changed one applies from its next fire), and with ``prune``
        remove the code-declared ones no longer declared. Schedules added at run time
        (``jq.schedule``, the CLI) are never pruned, nor replaced by a declaration with the
        same id: that declaration is left out (``report.ignored``). The scheduler daemon's
        (sync) start-up step."""
        report = SyncReport()
        names = {d.job_id for d in declared}
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
                    self.run(self.upsert_steps(defn, now, code=True))
                except RuntimeOwned:  # jq.schedule took the id between the read and the write
                    report.ignored.append(defn.job_id)
                    continue
                (report.created if info is None else report.updated).append(defn.job_id)
            # After the write: a crash in between leaves a definition prune never sees (safe).
            self.run(_write(cmd("sadd", DECLARED_KEY, defn.job_id)))
        if prune:
            (members,) = self.run(_write(cmd("smembers", DECLARED_KEY)))
            for job_id in sorted(_str(j) or "" for j in members):
                if job_id not in names:
                    if self.run(self.remove_declared_steps(job_id)):
                        report.removed.append(job_id)
                    self.run(_write(cmd("srem", DECLARED_KEY, job_id)))
        return report


def _write(*cmds: Cmd) -> Steps[list[Any]]:
    """Plain commands whose error replies are raised (the server refused: OOM, READONLY)."""
    return raised((yield commands(*cmds)))


def _str(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
