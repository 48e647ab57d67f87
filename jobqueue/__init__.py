"""jobqueue: a Redis-backed distributed job scheduler and task queue."""

__version__ = "0.2.0"

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobqueue.client.base import Request
    from jobqueue.client.sync import JobQueue
    from jobqueue.context import FROM_WORKER, RunContext, current_run
    from jobqueue.errors import (
        BackfillInFuture,
        ConfigError,
        ConnectionFailed,
        FlowAborted,
        FlowConflict,
        FlowFinished,
        GroupFull,
        JobQueueError,
        NotDurable,
        OperationRefused,
        PayloadError,
        PoolExhausted,
        RecurringError,
        RunCancelled,
        RunFailed,
        RunNotFound,
        RunTimeout,
        ServerRefused,
        UnknownSchedule,
        UnknownTask,
    )
    from jobqueue.handles import RunHandle
    from jobqueue.models import Run
    from jobqueue.settings import Settings
    from jobqueue.tasks import Dedupe, Task
    from jobqueue.worker import Worker, WorkerStats

# Each public name and its module, imported at first use: ``import jobqueue`` (and the
# ``jobqueue --help`` that imports it) loads neither redis-py nor the worker.
_HOMES = {
    "Request": "jobqueue.client.base",
    "RunContext": "jobqueue.context",
    "FROM_WORKER": "jobqueue.context",
    "current_run": "jobqueue.context",
    "JobQueue": "jobqueue.client.sync",
    "RunHandle": "jobqueue.handles",
    "Run": "jobqueue.models",
    "Settings": "jobqueue.settings",
    "Dedupe": "jobqueue.tasks",
    "Task": "jobqueue.tasks",
    "Worker": "jobqueue.worker",
    "WorkerStats": "jobqueue.worker",
    **{
        name: "jobqueue.errors"
        for name in (
            "BackfillInFuture", "ConfigError", "ConnectionFailed", "FlowAborted", "FlowConflict",
            "FlowFinished", "GroupFull", "JobQueueError", "NotDurable",
            "OperationRefused", "PayloadError", "PoolExhausted", "RecurringError", "RunCancelled",
            "RunFailed", "RunNotFound", "RunTimeout", "ServerRefused", "UnknownSchedule",
            "UnknownTask",
        )
    },
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'jobqueue' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "FROM_WORKER",
    "BackfillInFuture",
    "ConfigError",
    "ConnectionFailed",
    "Dedupe",
    "FlowAborted",
    "FlowConflict",
    "FlowFinished",
    "GroupFull",
    "JobQueue",
    "JobQueueError",
    "NotDurable",
    "OperationRefused",
    "PayloadError",
    "PoolExhausted",
    "RecurringError",
    "Request",
    "Run",
    "RunCancelled",
    "RunContext",
    "RunFailed",
    "RunHandle",
    "RunNotFound",
    "RunTimeout",
    "ServerRefused",
    "Settings",
    "Task",
    "UnknownSchedule",
    "UnknownTask",
    "Worker",
    "WorkerStats",
    "__version__",
    "current_run",
]
