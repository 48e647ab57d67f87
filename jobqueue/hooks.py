"""Middleware: app code that runs at enqueue, around each run and at a run's notable events.

One shape for sync and async code: every method is a plain (sync) method, called in the
thread or task where the event happens. Register a ``Middleware`` on the ``JobQueue`` /
``AsyncJobQueue`` (``jq.use(m)``: enqueue hooks there, and run hooks in every worker built on
that queue) or on one ``Worker`` (``Worker(jq, middleware=[m])``: run hooks of that worker
only). Hooks run in registration order.

A hook that raises never loses a run nor stops the worker: the exception is logged (logger
``jobqueue.hooks``, with its traceback) and the work goes on as if that hook were absent: an
enqueue is still written (without the meta changes of the hook that raised), a run still
runs and its outcome stands, events still reach the other hooks. Only meta beyond its limits
is an error: the enqueue raises ``MetaError`` and nothing is written.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobqueue.context import RunContext
from jobqueue.errors import ConfigError, JobQueueError

log = logging.getLogger("jobqueue.hooks")

META_MAX_ITEMS = 16
META_MAX_KEY_CHARS = 64
META_MAX_BYTES = 4096  # the whole map as stored (compact JSON, UTF-8)


class MetaError(JobQueueError, ValueError):
    """A run's meta is not a small map of str to str (see the META_MAX_* limits)."""


@dataclass
class EnqueueRequest:
    """What ``before_enqueue`` sees of a run about to be created; a hook may add to ``meta``
    (str -> str), which is stored with the run and given to its attempts as ``ctx.meta``."""

    task: str
    queue: str
    run_id: str
    args: list[Any] | tuple[Any, ...]
    kwargs: Mapping[str, Any]
    meta: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunEvent:
    """A notable event of one attempt, as the worker saw it: ``outcome`` is ``retry`` (with
    ``retry_at_ms``), ``dead``, ``cancelled`` or ``lease-lost`` (``reason`` says which
    refusal: ``fenced``, ``unknown``, ...); ``error`` and ``traceback`` are the failure's,
    when there was one."""

    run_id: str
    task: str
    queue: str
    fence: int
    attempt: int
    max_attempts: int
    outcome: str
    meta: Mapping[str, str] = field(default_factory=dict)
    error: str = ""
    traceback: str = ""
    retry_at_ms: int | None = None
    reason: str = ""


class Middleware:
    """Override what you need; every method does nothing by default. Keep them quick: run
    hooks run in the task's thread or event loop, event hooks in the worker's committing or
    heartbeat thread."""

    def before_enqueue(self, request: EnqueueRequest) -> None:
        """Before a run is created by enqueue or enqueue_many (not by the scheduler)."""

    def before_run(self, ctx: RunContext) -> None:
        """In the run's thread (sync task) or asyncio task (async task), before its code."""

    def after_run(self, ctx: RunContext, error: BaseException | None) -> None:
        """Where before_run ran, once the code has returned (error None) or raised."""

    def on_retry_scheduled(self, event: RunEvent) -> None:
        """A failed attempt was accepted and the run will run again at retry_at_ms."""

    def on_dead(self, event: RunEvent) -> None:
        """A failed attempt was accepted and the run is dead (attempts exhausted, Fatal)."""

    def on_cancelled(self, event: RunEvent) -> None:
        """The run was cancelled while this worker ran it."""

    def on_lease_lost(self, event: RunEvent) -> None:
        """This worker lost the run's lease (another holder has it, or it is gone)."""


class Hooks:
    """The middleware chain, each call guarded (see the module's doc)."""

    __slots__ = ("items",)

    def __init__(self, middleware: Iterable[Middleware] = ()) -> None:
        self.items: tuple[Middleware, ...] = tuple(middleware)

    def __bool__(self) -> bool:
        return bool(self.items)

    def plus(self, middleware: Iterable[Middleware]) -> Hooks:
        """This chain, then ``middleware``; ConfigError for anything but Middleware (a
        stray object would log an error at every enqueue and run instead)."""
        added = tuple(middleware)
        for m in added:
            if not isinstance(m, Middleware):
                raise ConfigError(
                    f"middleware must be a jobqueue.hooks.Middleware, got {type(m).__name__}"
                )
        return Hooks((*self.items, *added))

    def before_enqueue(self, request: EnqueueRequest) -> None:
        for m in self.items:
            kept = dict(request.meta)
            if not _guarded(m, "before_enqueue", request):
                request.meta = kept  # a hook that raised changes nothing

    def before_run(self, ctx: RunContext) -> None:
        for m in self.items:
            _guarded(m, "before_run", ctx)

    def after_run(self, ctx: RunContext, error: BaseException | None) -> None:
        for m in reversed(self.items):  # the innermost first, like nested context managers
            _guarded(m, "after_run", ctx, error)

    def event(self, event: RunEvent) -> None:
        name = _EVENT_METHODS.get(event.outcome)
        if name is not None:
            for m in self.items:
                _guarded(m, name, event)


_EVENT_METHODS = {
    "retry": "on_retry_scheduled",
    "dead": "on_dead",
    "cancelled": "on_cancelled",
    "lease-lost": "on_lease_lost",
}


def _guarded(m: Middleware, name: str, *args: Any) -> bool:
    try:
        getattr(m, name)(*args)
    except Exception:
        log.exception("middleware %s.%s raised; ignored", type(m).__name__, name)
        return False
    return True


def encode_meta(meta: Mapping[str, str]) -> str:
    """A run's meta as stored: compact JSON, '' when empty. Raises MetaError beyond the
    limits (META_MAX_ITEMS entries, keys of 1..META_MAX_KEY_CHARS characters, META_MAX_BYTES
    in all) or for anything but str keys and values."""
    if not isinstance(meta, Mapping):
        raise MetaError(f"meta must be a mapping of str to str, got {type(meta).__name__}")
    if not meta:
        return ""
    if len(meta) > META_MAX_ITEMS:
        raise MetaError(f"meta has {len(meta)} entries; at most {META_MAX_ITEMS} are allowed")
    for key, value in meta.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise MetaError(f"meta maps str to str; got {key!r}: {value!r}")
        if not 1 <= len(key) <= META_MAX_KEY_CHARS:
            raise MetaError(f"meta key {key!r} must have 1 to {META_MAX_KEY_CHARS} characters")
    text = json.dumps(dict(meta), separators=(",", ":"), ensure_ascii=False)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > META_MAX_BYTES:
        raise MetaError(f"meta is {size} bytes as JSON; at most {META_MAX_BYTES} are allowed")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise MetaError("meta holds text that is not valid Unicode (a lone surrogate)") from None
    return text
