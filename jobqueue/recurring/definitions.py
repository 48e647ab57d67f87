"""What a recurring job is: its definition (``Definition``, validated completely when it is made,
see ``jobqueue.recurring.declarations``: a bad one raises and writes nothing), its counters
(``JobState``), its id and the scheduler partition it lives in.

Storage (scheduler partition k of K, hash tag ``{sched#k}``, k = fnv1a_32(job_id) % K):

    jq:{sched#k}:def    hash   job_id -> definition (compact JSON, defaults omitted)
    jq:{sched#k}:next   zset   job_id -> next fire instant (ms); absent while paused or ended
    jq:{sched#k}:state  hash   job_id -> 'fired missed skipped dropped last through [last_queue]'
    jq:{sched#k}:held   hash   job_id -> 'fire pred_fire due queue [pred_queue]': buffer-one's
                               buffered runs (the key name is historical: it stays
                               'held' so that old and new schedulers share it)
    jq:sched:config     hash   partitions -> K, and the placement: 'K' (the tags {sched#k})
                               or 'K spread' (global, plain commands only); moving -> the
                               target of a `schedules repartition` in progress
    jq:schedulers       hash   scheduler id -> its registry entry (``recurring.registry``)
    jq:{sched#k}:owner  hash   the lease of the scheduler that owns partition k (owner,
                               token, until)
    jq:sched:declared   set    job ids synced from code declarations (global, plain commands)

``last`` is the latest fire instant that got a run (-1: none yet), ``through`` the instant up
to which fire times have been handled and ``last_queue`` the queue of the last fire's run
(absent: the definition's queue). A buffered entry's ``pred_queue`` is the predecessor's queue
when it differs from the buffered run's (the job's queue changed in between). Scheduled runs are
``<job_id>@<fire instant, UTC>`` (``store.keys.fire_run_id``), so a job id must not
contain '@'.

Upsert: ``schedule`` on an existing job keeps its next fire when the timing (cron, every, tz,
start, end) is unchanged; otherwise the new timing applies from the first fire after both now
and every fire time already handled, so a change neither repeats nor drops a fire.

Declared in code (``@jq.task(cron=...)``, ``jq.declare_schedule``): validated at declaration,
written by the scheduler at start (``jobqueue.recurring.sync``) with ``origin: "code"`` in the
definition, which is what ``--prune`` requires before removing one. A declaration never
replaces a schedule added at run time under the same id: the scheduler leaves that one as it
is and warns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, Protocol

from jobqueue.anomalies import (
    MAX_TIME_MS,
    is_time,
)
from jobqueue.errors import (
    BackfillInFuture,
    ConfigError,
    CorruptData,
    RecurringError,
)
from jobqueue.payload import encode_payload
from jobqueue.policy.cron import (
    Schedule,
    ScheduleError,
    format_fire_instant,
)
from jobqueue.policy.hashing import fnv1a_32
from jobqueue.policy.misfire import MisfireError, parse_policy
from jobqueue.settings import Settings
from jobqueue.store.keys import (
    SchedKeys,
    validate_queue_name,
    validate_run_id,
)
from jobqueue.tasks import Registry, Task

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

Overlap = Literal["allow", "forbid", "buffer-one"]
OVERLAP_POLICIES: tuple[Overlap, ...] = ("allow", "forbid", "buffer-one")
DEFAULT_OVERLAP: Overlap = "allow"


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



def _str(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
