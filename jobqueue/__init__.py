"""jobqueue: a Redis-backed distributed job scheduler and task queue."""

__version__ = "0.2.0"

from typing import TYPE_CHECKING, Any

from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.errors import (
    ConfigError,
    ConnectionFailed,
    JobQueueError,
    NotDurable,
    OperationRefused,
    PayloadError,
    PoolExhausted,
    RunCancelled,
    RunFailed,
    RunNotFound,
    RunTimeout,
    ServerRefused,
    UnknownTask,
)
from jobqueue.handles import RunHandle
from jobqueue.models import Run
from jobqueue.settings import Settings
from jobqueue.tasks import Dedupe, Task

if TYPE_CHECKING:
    from jobqueue.worker import Worker, WorkerStats


def __getattr__(name: str) -> Any:
    # Imported at first use: an app that only enqueues never loads the worker.
    if name == "Worker":
        from jobqueue.worker import Worker

        return Worker
    if name == "WorkerStats":
        from jobqueue.worker import WorkerStats

        return WorkerStats
    raise AttributeError(f"module 'jobqueue' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "ConnectionFailed",
    "Dedupe",
    "JobQueue",
    "JobQueueError",
    "NotDurable",
    "OperationRefused",
    "PayloadError",
    "PoolExhausted",
    "Request",
    "Run",
    "RunCancelled",
    "RunFailed",
    "RunHandle",
    "RunNotFound",
    "RunTimeout",
    "ServerRefused",
    "Settings",
    "Task",
    "UnknownTask",
    "Worker",
    "WorkerStats",
    "__version__",
]
