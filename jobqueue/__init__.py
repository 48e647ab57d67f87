"""jobqueue: a Redis-backed distributed job scheduler and task queue."""

__version__ = "0.2.0"

from .base import Request
from .client import JobQueue, RunHandle
from .errors import (
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
from .models import Run
from .settings import Settings
from .tasks import Task

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
