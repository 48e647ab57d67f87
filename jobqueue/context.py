"""What a running task can know about its run, and the fenced-write helper for side effects."""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, cast

from jobqueue.errors import ConfigError, FlowFinished, JobQueueError

_current: contextvars.ContextVar[RunContext] = contextvars.ContextVar("jobqueue_run")

# The worker's fenced-write call: (resource, value, fence, run_id, ttl seconds or None) -> written.
Writer = Callable[[str, str, int, str, "float | None"], bool]
# The worker's progress call: (run_id, fence, progress, message) -> written.
Reporter = Callable[[str, int, float, str], bool]
# The worker's add_to_flow call: (run_id, queue, fence, [(default run id, signature)]) -> run
# ids.
Adder = Callable[[str, str, int, "list[tuple[str, Any]]"], "list[str]"]
PROGRESS_MESSAGE_MAX_CHARS = 500
# The meta of a run enqueued without any: one shared read-only map, not a dict per run.
NO_META: Mapping[str, str] = MappingProxyType({})


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
    meta: Mapping[str, str] = field(default_factory=lambda: NO_META)
    _writer: Writer | None = field(default=None, repr=False)
    _reporter: Reporter | None = field(default=None, repr=False)
    _adder: Adder | None = field(default=None, repr=False)
    _added: int = field(default=0, repr=False)  # runs added so far (their default run ids)
    # An add_to_flow that raised: the attempt must not be committed done (see add_to_flow).
    add_error: BaseException | None = field(default=None, repr=False)

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


    def progress(self, value: float, message: str | None = None) -> bool:
        """Record how far this run is (``value`` from 0 to 100) and optionally what it is
        doing, on the run record (``show``, ``runs --json``, the dashboard). Fenced like
        fenced_write: False, and nothing written, once this attempt no longer holds the run.
        One Redis call each: report at a human pace, not per item."""
        if self._reporter is None:
            raise JobQueueError("progress is only available inside a worker")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"progress must be a number from 0 to 100, got {value!r}")
        if not (0 <= value <= 100):  # NaN fails this too
            raise ValueError(f"progress must be from 0 to 100, got {value!r}")
        if message is not None and not isinstance(message, str):
            raise TypeError(f"progress message must be a str, got {type(message).__name__}")
        if message is not None and not _is_unicode(message):
            raise ValueError("progress message holds text that is not valid Unicode (a lone "
                             "surrogate)")  # fmt: skip
        if message is not None and len(message) > PROGRESS_MESSAGE_MAX_CHARS:
            raise ValueError(
                f"progress message has {len(message)} characters; at most "
                f"{PROGRESS_MESSAGE_MAX_CHARS}"
            )
        return self._reporter(self.run_id, self.fence, float(value), message or "")


    def add_to_flow(self, *steps: Any) -> list[str]:
        """Add runs (signatures: ``task.s(...)``) that the runs waiting on this one wait on
        too, with the same policy: a batch's child adding more children, a workflow step
        adding work its next step must wait for. Returns their run ids: given with
        ``with_options(run_id=...)``, else ``<this run id>+<n>`` (n counting this attempt's
        additions from 1), so a retried attempt that adds the same runs in the same order
        adds nothing twice. FlowFinished when no run waits on this one any more (nothing is
        added). When it raises, this attempt cannot be committed done: the worker retries it
        (or buries it on its last attempt) even if the task goes on and returns, since the
        runs waiting on it may be waiting on runs that were never created."""
        if self._adder is None:
            raise JobQueueError("add_to_flow is only available inside a worker")
        named = []
        for step in steps:
            self._added += 1
            named.append((f"{self.run_id}+{self._added}", step))
        try:
            return self._adder(self.run_id, self.queue, self.fence, named)
        except (FlowFinished, ConfigError):
            raise  # refused before anything was written
        except BaseException as exc:
            if self.add_error is None:
                self.add_error = exc
            raise


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _FromWorker:
    """What ``FROM_WORKER`` is: a stand-in with no attributes, for a function called
    directly (outside a worker) that declared ``ctx: RunContext = FROM_WORKER``."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        raise JobQueueError(
            f"ctx.{name}: this call got no RunContext (a worker gives one when it runs the "
            "task; the function was called directly)"
        )

    def __repr__(self) -> str:
        return "FROM_WORKER"


# The default for a ``ctx`` parameter declared after a task's other parameters, e.g.
# ``def import_file(path: str, ctx: RunContext = FROM_WORKER)``: type checkers then do not
# ask for it in ``enqueue`` (they leave out only a first ``ctx``), and the worker passes the
# run's RunContext in its place.
FROM_WORKER: RunContext = cast("RunContext", _FromWorker())


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
