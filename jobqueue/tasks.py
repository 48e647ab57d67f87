"""The task registry: the only way a name stored in Redis becomes code that runs.

A worker executes a run only if its task name is in the registry it was given; nothing is ever
imported from a string found in Redis (invariant 6 in docs/design.md).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar

from jobqueue.errors import ConfigError, PayloadError, UnknownTask
from jobqueue.handles import AsyncRunHandle, RunHandle
from jobqueue.policy.timeutil import Delay, Instant, seconds_to_ms
from jobqueue.store.keys import validate_queue_name
from jobqueue.workflows.canvas import Dependency, Signature, check_policy, dependency_target

P = ParamSpec("P")
R = TypeVar("R")
P2 = ParamSpec("P2")
R2 = TypeVar("R2")

_TASK_NAME_MAX = 200


DEDUPE_MODES = ("throttle", "debounce")


@dataclass(frozen=True)
class Dedupe:
    """A run's deduplication key (``task.with_options(dedupe=Dedupe("user:42"))``): while a
    run enqueued with the same key in the same queue owns it, ``throttle`` drops the new
    enqueue and ``debounce`` gives the owning run, still pending, the new arguments, meta and
    due time. Without ``ttl`` a run owns its key until its first claim; with ``ttl``
    (seconds) for that long after its enqueue. The handle's ``outcome`` says which happened,
    and its ``run_id`` is the run that owns the key."""

    key: str
    mode: str = "throttle"
    ttl: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ConfigError(f"dedupe key must be a non-empty string, not {self.key!r}")
        if self.mode not in DEDUPE_MODES:
            raise ConfigError(f"dedupe mode must be 'throttle' or 'debounce', not {self.mode!r}")
        if self.ttl is not None:
            seconds_to_ms(self.ttl, "dedupe ttl")

    @property
    def ttl_ms(self) -> int | None:
        return None if self.ttl is None else seconds_to_ms(self.ttl, "dedupe ttl")


@dataclass(frozen=True)
class TaskOptions:
    queue: str
    max_attempts: int
    timeout_ms: int = 0  # 0: no timeout
    lease_ms: int = 0  # 0: the worker's lease
    backoff_base_ms: int | None = None
    backoff_cap_ms: int | None = None

    def __post_init__(self) -> None:
        validate_queue_name(self.queue)
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or (self.max_attempts < 1)
        ):
            raise ConfigError(f"max_attempts must be an integer >= 1, not {self.max_attempts!r}")


@dataclass(frozen=True)
class RunOptions:
    """Where and when one run goes, apart from the task's arguments (see ``Task.with_options``).
    None: the task's queue, due now, a random run id."""

    run_id: str | None = None
    delay: Delay | None = None
    at: Instant | None = None
    queue: str | None = None
    priority: int | None = None  # 0 (the default) .. 9: higher is claimed first among due runs
    dedupe: Dedupe | None = None
    limit_key: str | None = None  # the key of the queue's per-key caps and rates
    # runs created before that this one waits on (run ids or handles), and what the death of
    # one of them does (see jobqueue.workflows.canvas.POLICIES)
    depends_on: tuple[Any, ...] | None = None
    on_failure: str | None = None

    def merged(self, **changes: Any) -> RunOptions:
        """These options with ``changes`` (None changes nothing)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


# The names of a run's options. Given with ``task.with_options(...)``, never among the task's
# own keyword arguments (a task may have a parameter called ``queue``): a keyword of these
# names that the task does not take is refused at enqueue, pointing to ``with_options``.
RUN_OPTIONS = tuple(f.name for f in dataclasses.fields(RunOptions))


@dataclass
class Task(Generic[P, R]):
    """A registered function. Calling it calls the function; ``enqueue`` runs it elsewhere.

    ``P`` and ``R`` are the function's parameters and result (an ``async def``'s awaited
    result), so that type checkers check ``enqueue``'s arguments and type its handle."""

    name: str
    options: TaskOptions
    func: Callable[P, Any] | None = None
    enqueuer: Any = field(default=None, repr=False)
    # Set by with_options: this run's options; its keyword arguments are then all the task's.
    run_options: RunOptions | None = field(default=None, repr=False)

    def with_options(
        self,
        *,
        run_id: str | None = None,
        delay: Delay | None = None,
        at: Instant | None = None,
        queue: str | None = None,
        priority: int | None = None,
        dedupe: Dedupe | None = None,
        limit_key: str | None = None,
        depends_on: Sequence[Any] | None = None,
        on_failure: str | None = None,
    ) -> Self:
        """This task with run options, for ``enqueue`` (here or ``jq.enqueue``):
        ``send_invoice.with_options(queue="urgent", delay=60).enqueue(42, amount=990)``.
        ``priority`` (0, the default, to 9): among the runs due in its queue partition, a
        higher one is claimed first. ``dedupe`` (a :class:`Dedupe`): at most one run per key
        at a time (``enqueue`` only). ``limit_key`` (text, e.g. ``"customer:42"``): the key the
        queue's per-key caps and rates count this run under. ``depends_on`` (run ids or
        handles of runs created before): the run waits for them to finish (a one-step
        workflow, see docs/workflows.md), each edge with the policy ``on_failure`` ('fail' by
        default); it takes ``run_id`` and ``queue`` only. Checked when the run is
        enqueued."""
        base = self.run_options or RunOptions()
        if isinstance(depends_on, str):
            raise ConfigError("depends_on is a list of run ids or handles, not one text")
        merged = base.merged(
            run_id=run_id, delay=delay, at=at, queue=queue, priority=priority, dedupe=dedupe,
            limit_key=limit_key, depends_on=None if depends_on is None else tuple(depends_on),
            on_failure=on_failure,
        )
        return dataclasses.replace(self, run_options=merged)

    @functools.cached_property
    def is_async(self) -> bool:
        """Whether the function is ``async def`` (looked up once, not per run)."""
        return self.func is not None and inspect.iscoroutinefunction(self.func)

    @functools.cached_property
    def wants_ctx(self) -> bool:
        """Whether the function declares a ``ctx`` parameter (looked up once, not per run)."""
        return self.func is not None and "ctx" in inspect.signature(self.func).parameters

    @functools.cached_property
    def ctx_index(self) -> int | None:
        """Where ``ctx`` stands among the function's positional parameters (None: it takes
        ``ctx`` by keyword only, or none). The worker passes it there when the arguments
        reach that far, so that the arguments around it stay positional: ``f(ctx, day)``
        enqueued as ``f.enqueue("mon")`` is called ``f(ctx, "mon")``."""
        if self.func is None:
            return None
        positional = [
            p.name
            for p in inspect.signature(self.func).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        return positional.index("ctx") if "ctx" in positional else None

    def call_with(self, ctx: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Call the function for one run: with ``ctx`` where it declares it."""
        if not self.wants_ctx:
            return self(*args, **kwargs)
        at = self.ctx_index
        if at is not None and len(args) >= at:
            return self(*args[:at], ctx, *args[at:], **kwargs)
        return self(*args, ctx=ctx, **kwargs)

    @functools.cached_property
    def call_signature(self) -> inspect.Signature | None:
        """The arguments an enqueue passes: the function's signature without ``ctx`` (the
        worker gives it); None when the code is not here."""
        if self.func is None:
            return None
        sig = inspect.signature(self.func)
        return sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "ctx"])

    def check_arguments(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], *, for_run: bool = False
    ) -> None:
        """PayloadError when the function could not be called with these arguments (checked
        at enqueue, so a mistaken call is refused at once instead of failing every attempt).
        ``for_run``: the arguments of a run, where a keyword named like a run option that the
        function does not take was meant for ``with_options``: the error says so."""
        sig = self.call_signature
        if sig is None:
            return
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            taken = self.keyword_names
            misplaced = [
                n for n in RUN_OPTIONS
                if for_run and n in kwargs and taken is not None and n not in taken
            ]
            hint = ""
            if misplaced:
                shown = ", ".join(f"{n}=..." for n in misplaced)
                hint = f" (run options come with the task: {self.name}.with_options({shown}))"
            raise PayloadError(f"arguments do not fit task {self.name}{sig}: {exc}{hint}") from None

    @functools.cached_property
    def keyword_names(self) -> frozenset[str] | None:
        """The names the function takes by keyword, or None when it takes any (``**kwargs``)
        or its code is not here."""
        if self.func is None:
            return None
        params = inspect.signature(self.func).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return frozenset(p.name for p in params if p.kind is not p.POSITIONAL_ONLY)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self.func is None:
            raise UnknownTask(f"task {self.name!r} is declared here but its code is not")
        result: R = self.func(*args, **kwargs)
        return result

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> RunHandle[R]:
        """Shorthand for ``jq.enqueue(task, ...)`` on the JobQueue it was registered with."""
        handle: RunHandle[R] = self._enqueuer().enqueue(self, *args, **kwargs)
        return handle

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Signature[R]:
        """A signature: this task with these arguments, as a step of a workflow
        (``jq.chain``, ``jq.group``, ``jq.chord``, ``jq.workflow``)."""
        return Signature(self, tuple(args), dict(kwargs), **self._step_options())

    def receiving(
        self: Task[Concatenate[Any, P2], R2], *args: P2.args, **kwargs: P2.kwargs
    ) -> Signature[R2]:
        """A signature that gets its dependencies' results first in its arguments: in a
        chain the previous step's result, in a chord or a workflow the list of its
        dependencies' results (in the order given; None for a failed one). The arguments
        given here follow."""
        return Signature(self, tuple(args), dict(kwargs), receives=True, **self._step_options())

    def _step_options(self) -> dict[str, Any]:
        """The run id and queue ``with_options`` gave (a step takes no other run option)."""
        opts = self.run_options
        if opts is None:
            return {}
        if (opts.delay is not None or opts.at is not None or opts.dedupe is not None
                or opts.priority is not None or opts.limit_key is not None):
            raise ConfigError("a workflow's step takes run_id, queue and depends_on options only")
        out: dict[str, Any] = {"run_id": opts.run_id, "queue": opts.queue}
        if opts.depends_on:
            policy = check_policy(opts.on_failure or "fail")
            out["dependencies"] = tuple(
                Dependency(dependency_target(t), policy) for t in opts.depends_on
            )
        return out

    def waiting_step(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Signature[R]:
        """This run as a one-step workflow, for an enqueue with ``depends_on`` (a random run
        id when none is given, as an enqueue gives)."""
        options = self._step_options()
        options["run_id"] = options.get("run_id") or os.urandom(16).hex()
        return Signature(self, tuple(args), dict(kwargs), **options)

    def _enqueuer(self) -> Any:
        if self.enqueuer is None:
            raise ConfigError(f"task {self.name!r} is not attached to a JobQueue")
        return self.enqueuer


class AsyncTask(Task[P, R]):
    """A task whose function is ``async def``: calling it gives the coroutine."""

    def __call__(  # type: ignore[override]  # the coroutine of R, as the function gives
        self, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R]:
        if self.func is None:
            raise UnknownTask(f"task {self.name!r} is declared here but its code is not")
        coroutine: Coroutine[Any, Any, R] = self.func(*args, **kwargs)
        return coroutine


class AioTask(Task[P, R]):
    """A task registered on an ``AsyncJobQueue``: ``await task.enqueue(...)``."""

    def enqueue(  # type: ignore[override]  # the same call, awaited: the asyncio client's
        self, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, AsyncRunHandle[R]]:
        """Shorthand for ``await ajq.enqueue(task, ...)`` on the AsyncJobQueue it was
        registered with."""
        handle: Coroutine[Any, Any, AsyncRunHandle[R]] = self._enqueuer().enqueue(
            self, *args, **kwargs
        )
        return handle


class AioAsyncTask(AioTask[P, R], AsyncTask[P, R]):
    """An ``async def`` task registered on an ``AsyncJobQueue``."""


def validate_task_name(name: str) -> str:
    if (
        not isinstance(name, str)
        or not name
        or len(name) > _TASK_NAME_MAX
        or any(c.isspace() or ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in name)
    ):
        raise ConfigError(
            f"invalid task name {name!r}: 1-{_TASK_NAME_MAX} characters, no spaces or controls"
        )
    return name


def make_options(
    *,
    queue: str,
    max_attempts: int,
    timeout: float | None,
    lease: float | None,
    backoff_base: float | None = None,
    backoff_cap: float | None = None,
) -> TaskOptions:
    return TaskOptions(
        queue=queue,
        max_attempts=max_attempts,
        timeout_ms=0 if timeout is None else seconds_to_ms(timeout, "timeout"),
        lease_ms=0 if lease is None else seconds_to_ms(lease, "lease"),
        backoff_base_ms=None if backoff_base is None else seconds_to_ms(backoff_base, "backoff"),
        backoff_cap_ms=None if backoff_cap is None else seconds_to_ms(backoff_cap, "backoff_cap"),
    )


class Registry:
    """Task name -> Task. Registering a second, different function under a name is an error."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task[Any, Any]] = {}

    def add(self, task: Task[Any, Any]) -> None:
        validate_task_name(task.name)
        existing = self._tasks.get(task.name)
        if existing is not None and existing.func is not None and existing.func is not task.func:
            raise ConfigError(f"task name {task.name!r} is already registered to another function")
        self._tasks[task.name] = task

    def get(self, name: str) -> Task[Any, Any]:
        try:
            return self._tasks[name]
        except KeyError:
            known = ", ".join(sorted(self._tasks)) or "none"
            raise UnknownTask(f"unknown task {name!r} (registered: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def all(self) -> list[Task[Any, Any]]:
        return list(self._tasks.values())
