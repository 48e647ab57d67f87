"""The worker daemon and its supervisor (``--processes``)."""

from jobqueue.worker.daemon import (
    EXIT_UNHEALTHY,
    MAX_REJECTED_KEPT,
    Worker,
    WorkerStats,
)

__all__ = ["EXIT_UNHEALTHY", "MAX_REJECTED_KEPT", "Worker", "WorkerStats"]
