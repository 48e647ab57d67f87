"""What a run looks like to Python: parsed from its hash and history, never executed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Generic, cast

from typing_extensions import TypeVar

from jobqueue.anomalies import Anomaly, is_time
from jobqueue.payload import decode_payload, decode_result

_CANCELLED_FENCE = re.compile(r" cancelled \(was running, fence=(\d+)\)")
_ATTEMPT = re.compile(r" attempt=(\d+)")
# fail.lua keeps a failed attempt's traceback in its history entry, after this mark
TRACEBACK_MARK = "\n\x1e"


def _progress(value: str | None) -> float | None:
    try:
        number = float(value) if value else None
    except ValueError:
        return None
    return number if number is not None and 0 <= number <= 100 else None


def decode_meta(text: str | None) -> dict[str, str] | None:
    """A run's stored meta (jobqueue.hooks), {} when absent; None when it is not a JSON object
    of str to str (foreign data)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return None
    return value


def _dependents(text: str | None) -> tuple[tuple[str, str], ...] | None:
    """A record's 'parents' field (flow_create.lua, attach.lua): the runs waiting on it, or
    None when it is not what jobqueue writes."""
    if not text:
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in value
    ):
        return None
    return tuple((p[0], p[1]) for p in value)


def split_entry(line: str) -> tuple[str, str | None]:
    """A history entry's event line and the traceback stored with it (None: none kept, as
    in entries written before tracebacks were)."""
    event, mark, tb = line.partition(TRACEBACK_MARK)
    return (event, tb) if mark else (line, None)

FINISHED_STATES = frozenset({"done", "dead", "cancelled"})
STATES = ("pending", "running", "done", "dead", "cancelled", "waiting")
# The record's integer fields (create_run.lua, claim.lua, ...): anything else stored in one is
# shown as its default and reported as an anomaly of the run.
INT_FIELDS = (
    "attempt",
    "max_attempts",
    "fence",
    "lease_until",
    "due",
    "created",
    "started",
    "finished",
    "scheduled_for",
    "progress_at",
    "progress_attempt",
    "priority",
)
# A run's priority: 0 (the default) .. 9, higher claimed first among due runs (the same bound
# as lua/lib/priority.lua's PRIORITY_MAX).
PRIORITY_MAX = 9
TIME_FIELDS = frozenset(
    {"lease_until", "due", "created", "started", "finished", "scheduled_for", "progress_at"}
)


class QueueLimits(tuple[int | None, tuple[int, int] | None]):
    """A queue's flow limits (``queue_limits``), None where it has none: ``concurrency``, the
    most runs running at once; ``rate``, at most (N, W ms) claims; ``key_concurrency``, the
    most runs of one limit_key running at once; ``key_rate``, at most (N, W ms) claims of one
    limit_key; ``task_caps``, task name -> the most runs of it running at once.

    As a tuple it is ``(concurrency, rate)``, as it was before per-key and per-task limits:
    ``concurrency, rate = jq.queue_limits(queue)`` and ``== (3, None)`` still work; the
    others are attributes (and count in ``==`` between two QueueLimits)."""

    key_concurrency: int | None
    key_rate: tuple[int, int] | None
    task_caps: dict[str, int]

    def __new__(
        cls,
        concurrency: int | None = None,
        rate: tuple[int, int] | None = None,
        key_concurrency: int | None = None,
        key_rate: tuple[int, int] | None = None,
        task_caps: dict[str, int] | None = None,
    ) -> QueueLimits:
        self = super().__new__(cls, (concurrency, rate))
        self.key_concurrency = key_concurrency
        self.key_rate = key_rate
        self.task_caps = dict(task_caps or {})
        return self

    @property
    def concurrency(self) -> int | None:
        return self[0]

    @property
    def rate(self) -> tuple[int, int] | None:
        return self[1]

    def _more(self) -> tuple[Any, ...]:
        return (self.key_concurrency, self.key_rate, self.task_caps)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, QueueLimits):
            return tuple(self) == tuple(other) and self._more() == other._more()
        return tuple(self) == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]  # task_caps is a dict

    def __repr__(self) -> str:
        return (
            f"QueueLimits(concurrency={self[0]!r}, rate={self[1]!r}, "
            f"key_concurrency={self.key_concurrency!r}, key_rate={self.key_rate!r}, "
            f"task_caps={self.task_caps!r})"
        )


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


# What the run's task returns (``Run[int]``); a bare ``Run`` is ``Run[Any]``.
R_co = TypeVar("R_co", covariant=True, default=Any)


@dataclass(frozen=True)
class DependencyState:
    """One dependency of a run (a workflow's edge) as the run waiting on it heard of it:
    ``outcome`` 'done', 'dead', 'cancelled', 'removed' (its death removed the edge), or None
    while it is unfinished; the result's JSON (done) or the error (dead, cancelled)."""

    run_id: str
    queue: str
    policy: str
    outcome: str | None
    result_json: str | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.outcome in ("dead", "cancelled")

    @property
    def result(self) -> Any:
        return decode_result(self.result_json) if self.outcome == "done" else None


@dataclass(frozen=True)
class Run(Generic[R_co]):
    run_id: str
    queue: str
    partition: int
    state: str
    task: str
    payload: str
    attempt: int
    max_attempts: int
    fence: int
    owner: str | None
    lease_until_ms: int | None
    due_ms: int | None
    created_ms: int | None
    started_ms: int | None
    finished_ms: int | None
    job_id: str
    scheduled_for_ms: int | None
    result_json: str | None
    error: str | None
    history: list[str] = field(default_factory=list)
    # str -> str from enqueue (jobqueue.hooks)
    meta: dict[str, str] = field(default_factory=dict)
    # 0 (the default) .. 9: among due runs of a partition, higher is claimed first
    priority: int = 0
    # The deduplication key it was enqueued with (jobqueue.Dedupe), if any
    dedupe_key: str | None = None
    # The key of the queue's per-key caps and rates (Task.with_options(limit_key=...))
    limit_key: str | None = None
    # While parked by a full per-key or per-task cap: the group it waits for
    # ('key:<limit_key>' or 'task:<name>'); None otherwise
    parked: str | None = None
    # The last ctx.progress() of a holder of the run: 0..100, its message, when, which attempt
    progress: float | None = None
    progress_message: str | None = None
    progress_at_ms: int | None = None
    progress_attempt: int | None = None
    # Workflows (jobqueue.workflows): the workflow it belongs to, how many of its dependencies
    # it has not heard of yet (while waiting), and the runs that wait on it ((queue, run_id))
    flow: str | None = None
    dependencies_left: int | None = None
    dependents: tuple[tuple[str, str], ...] = ()

    @property
    def has_dependents(self) -> bool:
        return bool(self.dependents)
    # Garbage found in the record (a field that is not what jobqueue writes, a key of another
    # type): the run is still shown, with these beside it.
    anomalies: tuple[Anomaly, ...] = ()

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def result(self) -> R_co:
        """The task's return value once done (None before: check ``state``)."""
        return cast("R_co", decode_result(self.result_json))

    @property
    def args(self) -> list[Any]:
        return decode_payload(self.payload)[0]

    @property
    def kwargs(self) -> dict[str, Any]:
        return decode_payload(self.payload)[1]

    @classmethod
    def from_hash(
        cls,
        run_id: str,
        partition: int,
        fields: dict[str, str],
        history: list[str],
        queue: str = "",
        anomalies: tuple[Anomaly, ...] = (),
        *,
        key: str = "",
    ) -> Run:
        """A run from its record. Fields at their defaults are not stored (see create_run.lua),
        and the queue comes from the key the record was read from (``key``, which names the
        anomalies found). A field that is not what jobqueue writes is shown as its default and
        added to ``anomalies``."""
        found = list(anomalies)
        state = fields.get("state", "unknown")
        if state not in STATES and not found:  # a stand-in record already says why
            found.append(Anomaly(key, f"state {fields.get('state')!r} is not a run state"))
        for name in INT_FIELDS:
            value = fields.get(name)
            number = _int(value)
            if value not in (None, "") and number is None:
                found.append(Anomaly(key, f"field {name!r} is {value!r}, not an integer"))
            elif number is not None and name in TIME_FIELDS and not is_time(number):
                found.append(Anomaly(key, f"field {name!r} is {value!r}, not a time in ms"))
        priority = _int(fields.get("priority")) or 0
        if not 0 <= priority <= PRIORITY_MAX:  # claim takes it as the default, so do we
            found.append(Anomaly(key, f"field 'priority' is {priority}, not 0 to 9"))
            priority = 0
        progress = _progress(fields.get("progress"))
        if fields.get("progress") not in (None, "") and progress is None:
            found.append(
                Anomaly(key, f"field 'progress' is {fields.get('progress')!r}, not 0 to 100")
            )
        dependents = _dependents(fields.get("parents"))
        if dependents is None:
            found.append(Anomaly(key, f"field 'parents' is {fields.get('parents')!r}, not a list "
                                      "of [queue, run_id]"))
        meta = decode_meta(fields.get("meta"))
        if meta is None:
            found.append(Anomaly(key, f"field 'meta' is {fields.get('meta')!r}, not a map"))
        return cls(
            run_id=run_id,
            queue=fields.get("queue") or queue,
            partition=partition,
            state=state,
            task=fields.get("task", ""),
            payload=fields.get("payload", ""),
            attempt=_int(fields.get("attempt")) or 0,
            max_attempts=_int(fields.get("max_attempts")) or 0,
            fence=_int(fields.get("fence")) or 0,
            owner=fields.get("owner") or None,
            lease_until_ms=_int(fields.get("lease_until")),
            due_ms=_int(fields.get("due")),
            created_ms=_int(fields.get("created")),
            started_ms=_int(fields.get("started")),
            finished_ms=_int(fields.get("finished")),
            job_id=fields.get("job", ""),
            scheduled_for_ms=_int(fields.get("scheduled_for")),
            result_json=fields.get("result"),
            error=fields.get("error"),
            history=history,
            meta=meta or {},
            priority=priority,
            dedupe_key=fields.get("dedupe") or None,
            limit_key=fields.get("limit_key") or None,
            parked=(fields.get("parked") or None) if fields.get("state") == "pending" else None,
            progress=progress,
            progress_message=fields.get("progress_message") or None,
            progress_at_ms=_int(fields.get("progress_at")),
            progress_attempt=_int(fields.get("progress_attempt")),
            flow=fields.get("flow") or None,
            dependencies_left=_int(fields.get("left")),
            dependents=dependents or (),
            anomalies=tuple(found),
        )

    def timeline(self) -> list[tuple[int | None, str]]:
        """The run's story, oldest first: (ms, event). The stored history keeps only what the
        record cannot show (how earlier attempts ended); creation, the latest claim and a
        success come from the record's fields."""
        events: list[tuple[int | None, str]] = []
        if self.created_ms is not None:
            # not the due time: retries and releases move it
            events.append((self.created_ms, "created"))
        for entry in self.history:
            line = split_entry(entry)[0]
            stamp, _, text = line.partition(" ")
            # isdigit() alone takes "²", which int() refuses: such a line is shown whole.
            numeric = stamp.isascii() and stamp.isdigit()
            events.append((_int(stamp), text) if numeric else (None, line))
        if self.attempt >= 1 and self.owner and self.started_ms is not None:
            # cancel issues a new fence; its history line keeps the one this claim was given
            fence = self._cancelled_claim_fence() if self.state == "cancelled" else self.fence
            events.append(
                (
                    self.started_ms,
                    f"claimed fence={fence} attempt={self.attempt} owner={self.owner}",
                )
            )
        if self.state == "done" and self.finished_ms is not None:
            events.append((self.finished_ms, f"done fence={self.fence}"))
        events.sort(key=lambda e: -1 if e[0] is None else e[0])
        return events

    @property
    def tracebacks(self) -> list[dict[str, Any]]:
        """The tracebacks of failed attempts still in the history, oldest first: at_ms,
        attempt (None when the entry does not say) and traceback."""
        found: list[dict[str, Any]] = []
        for entry in self.history:
            line, tb = split_entry(entry)
            if tb is None:
                continue
            attempt = _ATTEMPT.search(line)
            found.append(
                {
                    "at_ms": _int(line.partition(" ")[0]),
                    "attempt": int(attempt.group(1)) if attempt else None,
                    "traceback": tb,
                }
            )
        return found

    @property
    def traceback(self) -> str | None:
        """The latest failed attempt's traceback, or None when none was kept."""
        found = self.tracebacks
        return found[-1]["traceback"] if found else None

    def _cancelled_claim_fence(self) -> int:
        for line in reversed(self.history):
            found = _CANCELLED_FENCE.search(line)
            if found:
                return int(found.group(1))
        return self.fence

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (for --json output)."""
        out = {
            k: v
            for k, v in self.__dict__.items()
            if k not in ("payload", "result_json", "anomalies")
        }
        try:
            out["args"], out["kwargs"] = decode_payload(self.payload)
        except ValueError:
            out["payload"] = self.payload
        out["result"] = self.result
        out["timeline"] = [{"at_ms": ms, "event": text} for ms, text in self.timeline()]
        out["tracebacks"] = self.tracebacks
        out["anomalies"] = [a.to_dict() for a in self.anomalies]
        out["has_dependents"] = self.has_dependents
        out["dependents"] = [{"queue": q, "run_id": r} for q, r in self.dependents]
        return out
