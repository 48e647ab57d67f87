"""What a running task can know about its run, and the fenced-write helper for side effects."""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from jobqueue.errors import JobQueueError

_current: contextvars.ContextVar[RunContext] = contextvars.ContextVar("jobqueue_run")

# The worker's fenced-write call: (resource, value, fence, run_id, ttl seconds or None) -> written.
Writer = Callable[[str, str, int, str, "float | None"], bool]


class CancelFlag:
    """Set once when the run should stop. Cheaper than a threading.Event (one per run, and
    most runs are never cancelled); the Event for ``wait`` is made only if someone waits."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def set(self) -> None:
        self._set = True
        if self._event is not None:
            self._event.set()

    def is_set(self) -> bool:
        return self._set

    def __bool__(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` unless cancelled; True when cancelled."""
        if self._event is None:
            self._event = threading.Event()
            if self._set:
                self._event.set()
        return self._event.wait(timeout)


@dataclass
class RunContext:
    """Passed to a task that declares a ``ctx`` parameter; also ``jobqueue.current_run()``.

    ``cancelled`` is set when the run's lease was lost (fenced out, cancelled) or it timed out:
    a long task should check it and stop, since its commit will be refused anyway.
    """

    run_id: str
    fence: int
    attempt: int
    max_attempts: int
    task: str
    queue: str
    job_id: str
    scheduled_for_ms: int | None
    cancelled: CancelFlag = field(default_factory=CancelFlag)
    cancel_reason: str | None = None
    # str -> str given at enqueue (jobqueue.hooks), the same for every attempt
    meta: dict[str, str] = field(default_factory=dict)
    _writer: Writer | None = field(default=None, repr=False)

    @property
    def scheduled_for(self) -> datetime | None:
        if self.scheduled_for_ms is None:
            return None
        return datetime.fromtimestamp(self.scheduled_for_ms / 1000, UTC)

    @property
    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    def cancel(self, reason: str) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()

    def fenced_write(self, resource: str, value: str, *, ttl: float | None = None) -> bool:
        """Write ``value`` to a Redis resource (kept in this run's partition) if this attempt
        still holds its run's lease and no newer fence has written the resource. Returns
        False otherwise: this attempt is stale and must not apply its side effect elsewhere
        either. ``ttl`` (seconds) makes the resource expire that long after each accepted
        write, for resources per run; without it the resource is kept until deleted."""
        if self._writer is None:
            raise JobQueueError("fenced_write is only available inside a worker")
        if ttl is not None and not (ttl > 0 and math.isfinite(ttl)):
            raise ValueError(f"fenced_write ttl must be positive seconds, got {ttl!r}")
        return self._writer(resource, value, self.fence, self.run_id, ttl)


def current_run() -> RunContext:
    """The context of the run executing in this thread or task."""
    try:
        return _current.get()
    except LookupError:
        raise JobQueueError("current_run() called outside a running task") from None


def bind(ctx: RunContext) -> contextvars.Token[RunContext]:
    return _current.set(ctx)


def unbind(token: contextvars.Token[RunContext]) -> None:
    _current.reset(token)
