"""The partitions a reading function reads: those of one queue, or of every queue, from the
counts recorded in Redis (``jq:queues``): as steps either client drives (``partitions_steps``),
or read on a sync client (``partitions_of``)."""

from __future__ import annotations

from jobqueue.anomalies import Anomaly
from jobqueue.client.core import ClientCore
from jobqueue.client.sync import JobQueue
from jobqueue.errors import UnknownQueue
from jobqueue.store.io import Steps
from jobqueue.store.keys import PartitionKeys, validate_queue_name

Partitions = tuple[list[PartitionKeys], list[Anomaly]]


def partitions_of(jq: JobQueue, queue: str | None) -> Partitions:
    """:func:`partitions_steps` on a sync client."""
    return jq.run_steps(partitions_steps(jq, queue))


def partitions_steps(jq: ClientCore, queue: str | None) -> Steps[Partitions]:
    """The partitions to read, from the counts recorded in Redis, and the anomalies of
    ``jq:queues`` (a queue whose count is not usable has no partitions to read: never
    ``range(99999999)``)."""
    if queue is not None:
        validate_queue_name(queue)  # bad input (exit 2), not an unknown queue (exit 1)
    table = yield from jq._queue_table()
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
