"""The worker daemon and its supervisor (``--processes``)."""

from jobqueue.worker.daemon import (
    EXIT_RECYCLED,
    EXIT_UNHEALTHY,
    MAX_REJECTED_KEPT,
    Worker,
    WorkerConfig,
    WorkerStats,
)
from jobqueue.worker.runs import RunPhase, RunView

__all__ = [
    "EXIT_RECYCLED",
    "EXIT_UNHEALTHY",
    "MAX_REJECTED_KEPT",
    "RunPhase",
    "RunView",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
]
