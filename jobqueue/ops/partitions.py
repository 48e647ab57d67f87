"""The partitions a reading function reads: those of one queue, or of every queue, from the
counts recorded in Redis (``jq:queues``)."""

from __future__ import annotations

from jobqueue.anomalies import Anomaly
from jobqueue.client.sync import JobQueue
from jobqueue.errors import UnknownQueue
from jobqueue.store.keys import PartitionKeys, validate_queue_name


def partitions_of(jq: JobQueue, queue: str | None) -> tuple[list[PartitionKeys], list[Anomaly]]:
    """The partitions to read, from the counts recorded in Redis, and the anomalies of
    ``jq:queues`` (a queue whose count is not usable has no partitions to read: never
    ``range(99999999)``)."""
    if queue is not None:
        validate_queue_name(queue)  # bad input (exit 2), not an unknown queue (exit 1)
    table = jq.queue_table()
    if queue is None:
        queues = table.counts
    elif queue in table.counts:
        queues = {queue: table.counts[queue]}
    elif queue in table.unusable:
        return [], [table.unusable[queue]]
    elif not table.readable:  # jq:queues cannot be read: nothing says the queue is unknown
        return [], table.anomalies
    else:
        known = ", ".join(sorted(table.counts)) or "none yet"
        raise UnknownQueue(f"no queue {queue!r} in Redis (known: {known})")
    parts = [k for q in sorted(queues) for k in table.partitions(q)]
    return parts, (table.anomalies if queue is None else [])
