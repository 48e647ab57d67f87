"""The task registry: the only way a name stored in Redis becomes code that runs.

A worker executes a run only if its task name is in the registry it was given; nothing is ever
imported from a string found in Redis (invariant 6 in docs/design.md).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar

from jobqueue.errors import ConfigError, UnknownTask
from jobqueue.policy.timeutil import seconds_to_ms
from jobqueue.store.keys import validate_queue_name

P = ParamSpec("P")
R = TypeVar("R")

_TASK_NAME_MAX = 200


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


@dataclass
class Task(Generic[P, R]):
    """A registered function. Calling it calls the function; ``enqueue`` runs it elsewhere."""

    name: str
    options: TaskOptions
    func: Callable[P, R] | None = None
    enqueuer: Any = field(default=None, repr=False)

    @functools.cached_property
    def is_async(self) -> bool:
        """Whether the function is ``async def`` (looked up once, not per run)."""
        return self.func is not None and inspect.iscoroutinefunction(self.func)

    @functools.cached_property
    def wants_ctx(self) -> bool:
        """Whether the function declares a ``ctx`` parameter (looked up once, not per run)."""
        return self.func is not None and "ctx" in inspect.signature(self.func).parameters

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self.func is None:
            raise UnknownTask(f"task {self.name!r} is declared here but its code is not")
        return self.func(*args, **kwargs)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Shorthand for ``jq.enqueue(task, ...)`` on the JobQueue it was registered with."""
        if self.enqueuer is None:
            raise ConfigError(f"task {self.name!r} is not attached to a JobQueue")
        return self.enqueuer.enqueue(self, *args, **kwargs)


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
