"""The read functions the CLI and the dashboard go through. ``jobqueue.inspect`` is their
documented name; they live in jobqueue.client.queries."""

from jobqueue.client.queries import (
    PARTITION_CHUNK,
    RECORD_CHUNK,
    STALE_AFTER_BEATS,
    Lease,
    PartitionStats,
    QueueTotals,
    Throughput,
    TopSnapshot,
    WorkerInfo,
    all_anomalies,
    leases,
    queue_totals,
    runs,
    schedules,
    stats,
    throughput,
    top_snapshot,
    workers,
)

__all__ = [
    "PARTITION_CHUNK",
    "RECORD_CHUNK",
    "STALE_AFTER_BEATS",
    "Lease",
    "PartitionStats",
    "QueueTotals",
    "Throughput",
    "TopSnapshot",
    "WorkerInfo",
    "all_anomalies",
    "leases",
    "queue_totals",
    "runs",
    "schedules",
    "stats",
    "throughput",
    "top_snapshot",
    "workers",
]
