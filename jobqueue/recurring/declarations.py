"""Recurring jobs as the app declares them: ``make_definition`` validates everything about one
(a bad one raises RecurringError and nothing is written), and the declarations in code
(``@jq.task(cron=...)``, ``jq.declare_schedule``), written by the scheduler at start
(``jobqueue.recurring.sync``)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from jobqueue.errors import (
    RecurringError,
)
from jobqueue.policy.cron import (
    ScheduleError,
    parse_schedule,
    period_ms,
)
from jobqueue.policy.misfire import MisfireError, parse_policy
from jobqueue.policy.timeutil import Instant, instant_to_ms
from jobqueue.recurring.definitions import (
    DEFAULT_MISFIRE,
    DEFAULT_OVERLAP,
    DEFAULT_TZ,
    ORIGIN_CODE,
    OVERLAP_POLICIES,
    Declarer,
    Definition,
    TaskSource,
    validate_job_id,
)
from jobqueue.store.keys import (
    validate_queue_name,
)
from jobqueue.tasks import Task, validate_task_name


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
    writes it at start (``recurring.sync.Recurring.sync``). Nothing touches Redis here."""
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
