"""jobqueue: a Redis-backed distributed job scheduler and task queue."""

__version__ = "0.2.0"

from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue, RunHandle
from jobqueue.errors import (
    ConfigError,
    ConnectionFailed,
    JobQueueError,
    NotDurable,
    OperationRefused,
    PayloadError,
    RunNotFound,
    RunTimeout,
    ServerRefused,
    UnknownTask,
)
from jobqueue.models import Run
from jobqueue.settings import Settings
from jobqueue.tasks import Task

__all__ = [
    "ConfigError",
    "ConnectionFailed",
    "JobQueue",
    "JobQueueError",
    "NotDurable",
    "OperationRefused",
    "PayloadError",
    "Request",
    "Run",
    "RunHandle",
    "RunNotFound",
    "RunTimeout",
    "ServerRefused",
    "Settings",
    "Task",
    "UnknownTask",
    "__version__",
]
