"""Task registration, shared by the sync and asyncio clients: the ``@jq.task`` decorator,
tasks declared by name (their code elsewhere), recurring jobs declared in code, and the run
options given with a task (``task.with_options(...)``). No I/O here."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, overload

from jobqueue.context import RunContext
from jobqueue.errors import PayloadError, UnknownTask
from jobqueue.hooks import Hooks, Middleware
from jobqueue.recurring.declarations import add_declarations, declare, declare_task_schedules
from jobqueue.recurring.definitions import Definition
from jobqueue.settings import Settings
from jobqueue.tasks import (
    RUN_OPTIONS,
    AioAsyncTask,
    AioTask,
    AsyncTask,
    Registry,
    RunOptions,
    Task,
    make_options,
)

P = ParamSpec("P")
R = TypeVar("R")


class TaskDecorator(Protocol):
    """What ``@jq.task(...)`` with options gives: a decorator typed like the bare one."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[RunContext, P], Coroutine[Any, Any, R]], /
    ) -> AsyncTask[P, R]: ...

    @overload
    def __call__(self, func: Callable[Concatenate[RunContext, P], R], /) -> Task[P, R]: ...

    @overload
    def __call__(self, func: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncTask[P, R]: ...

    @overload
    def __call__(self, func: Callable[P, R], /) -> Task[P, R]: ...


class AioTaskDecorator(Protocol):
    """What ``@ajq.task(...)`` with options gives, on an AsyncJobQueue."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[RunContext, P], Coroutine[Any, Any, R]], /
    ) -> AioAsyncTask[P, R]: ...

    @overload
    def __call__(self, func: Callable[Concatenate[RunContext, P], R], /) -> AioTask[P, R]: ...

    @overload
    def __call__(self, func: Callable[P, Coroutine[Any, Any, R]], /) -> AioAsyncTask[P, R]: ...

    @overload
    def __call__(self, func: Callable[P, R], /) -> AioTask[P, R]: ...


TaskRef = Task[Any, Any] | Callable[..., Any] | str

def check_args_sequence(args: Any, what: str = "args") -> None:
    """A str or bytes is a sequence too, and would be stored split into characters."""
    if isinstance(args, str | bytes | bytearray | memoryview):
        raise PayloadError(
            f"{what} must be a list or tuple of arguments, not {type(args).__name__} "
            f"{args!r:.40}: for one argument pass [value]"
        )



class TaskRegistration:
    # The classes of the tasks registered here: of a sync and of an ``async def`` function
    # (an AsyncJobQueue's tasks are awaited to enqueue).
    task_classes: tuple[type[Task[Any, Any]], type[Task[Any, Any]]] = (Task, AsyncTask)

    def __init__(self, *, settings: Settings | None, tasks: TaskRegistration | None) -> None:
        self.settings = settings or Settings()
        self.registry: Registry = Registry() if tasks is None else tasks.registry
        # Middleware (jobqueue.hooks): enqueue hooks here, run hooks in workers on this queue.
        self.hooks: Hooks = Hooks() if tasks is None else tasks.hooks
        # The recurring jobs this app declares in code, in declaration order (written by the
        # scheduler at start).
        self.declared_schedules: list[Definition] = (
            [] if tasks is None else tasks.declared_schedules
        )

    def use(self, middleware: Middleware) -> None:
        """Register middleware (see jobqueue.hooks), after those already registered."""
        self.hooks = self.hooks.plus((middleware,))

    # -- tasks -----------------------------------------------------------------------------

    # A first parameter typed RunContext is the worker's ``ctx``, not an argument to enqueue.
    @overload
    def task(
        self, func: Callable[Concatenate[RunContext, P], Coroutine[Any, Any, R]], /
    ) -> AsyncTask[P, R]: ...

    @overload
    def task(self, func: Callable[Concatenate[RunContext, P], R], /) -> Task[P, R]: ...

    @overload
    def task(self, func: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncTask[P, R]: ...

    @overload
    def task(self, func: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        lease: float | None = None,
        backoff: float | None = None,
        backoff_cap: float | None = None,
        cron: str | None = None,
        every: float | None = None,
        tz: str | None = None,
        misfire: str | None = None,
        jitter: float | None = None,
        overlap: str | None = None,
        schedules: Sequence[dict[str, Any]] | None = None,
    ) -> TaskDecorator: ...

    def task(  # type: ignore[misc]  # mypy cannot match a positional-only optional
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        lease: float | None = None,
        backoff: float | None = None,
        backoff_cap: float | None = None,
        cron: str | None = None,
        every: float | None = None,
        tz: str | None = None,
        misfire: str | None = None,
        jitter: float | None = None,
        overlap: str | None = None,
        schedules: Sequence[dict[str, Any]] | None = None,
    ) -> Any:
        """Register a function as a task: ``@jq.task`` or ``@jq.task(name=..., queue=...)``.

        ``cron=``/``every=`` (with ``tz``, ``misfire``, ``jitter``, ``overlap``) also declare a
        recurring job named after the task, and ``schedules=[{"id": ..., "cron": ...}, ...]``
        several; they are validated here and written by the scheduler at start."""
        schedule = {
            "cron": cron,
            "every": every,
            "tz": tz,
            "misfire": misfire,
            "jitter": jitter,
            "overlap": overlap,
        }

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            task = self._register(
                name or f.__name__,
                f,
                queue,
                max_attempts,
                timeout,
                lease,
                backoff,
                backoff_cap,
                add=False,
            )
            if not schedules and all(v is None for v in schedule.values()):
                self.registry.add(task)
                return task
            # Schedules validated before the task is registered: a refused one leaves nothing
            # behind (a retry of the decorator is not "already registered").
            defns = declare_task_schedules(self, task, schedule, schedules)
            self.registry.add(task)
            add_declarations(self, defns)
            return task

        return register(func) if func is not None else register

    def declare_schedule(self, job_id: str, task: TaskRef, **options: Any) -> Definition:
        """Declare a recurring job in code (the options of ``jq.schedule``): validated now,
        written by ``jobqueue scheduler --app`` at start, removed there with ``--prune`` once
        no longer declared."""
        check_args_sequence(options.get("args", ()))
        return declare(self, job_id, task, **options)

    def declare_task(
        self,
        name: str,
        *,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        lease: float | None = None,
    ) -> Task[Any, Any]:
        """Make a task known by name where its code is not importable (an app that only
        enqueues, workers elsewhere)."""
        return self._register(name, None, queue, max_attempts, timeout, lease, None, None)

    def _register(
        self,
        name: str,
        func: Callable[..., Any] | None,
        queue: str | None,
        max_attempts: int | None,
        timeout: float | None,
        lease: float | None,
        backoff: float | None,
        backoff_cap: float | None,
        add: bool = True,
    ) -> Task[Any, Any]:
        """The task; ``add``: registered too (the decorator adds it once its schedules are
        validated)."""
        options = make_options(
            queue=queue or self.settings.default_queue,
            max_attempts=self.settings.default_max_attempts
            if max_attempts is None
            else max_attempts,
            timeout=timeout,
            lease=lease,
            backoff_base=backoff,
            backoff_cap=backoff_cap,
        )
        plain, coroutine = self.task_classes
        is_async = func is not None and inspect.iscoroutinefunction(func)
        kind = coroutine if is_async else plain
        task: Task[Any, Any] = kind(name=name, options=options, func=func, enqueuer=self)
        if add:
            self.registry.add(task)
        return task

    def resolve_task(self, ref: TaskRef) -> Task[Any, Any]:
        if isinstance(ref, Task):
            return ref
        if isinstance(ref, str):
            return self.registry.get(ref)
        name = getattr(ref, "__name__", None)
        if isinstance(name, str) and name in self.registry and self.registry.get(name).func is ref:
            return self.registry.get(name)
        raise UnknownTask(f"{ref!r} is not a registered task: decorate it with @jq.task")

    def _enqueue_options(
        self, ref: TaskRef, kwargs: Mapping[str, Any]
    ) -> tuple[Task[Any, Any], RunOptions]:
        """The task of ``enqueue(task, *args, **kwargs)`` and its run's options, which come
        from ``task.with_options(...)`` only: every keyword is the task's argument. For a task
        whose code is not here (declared by name) no signature tells whether a keyword named
        like a run option is an argument; without ``with_options`` it is refused, so that a
        call meant to set the run's options never makes a run with wrong arguments."""
        task = self.resolve_task(ref)
        if task.run_options is not None:
            return task, task.run_options
        named = [n for n in RUN_OPTIONS if n in kwargs] if task.func is None else []
        if named:
            shown = ", ".join(f"{n}=..." for n in named)
            raise PayloadError(
                f"{shown.replace('...', '')} for task {task.name!r}, whose code is not here: "
                f"run options come with the task, "
                f"jq.resolve_task({task.name!r}).with_options({shown}).enqueue(...); for "
                f"arguments of these names, jq.resolve_task({task.name!r}).with_options()"
                f".enqueue({shown})"
            )
        return task, RunOptions()

    # -- partitions ------------------------------------------------------------------------

