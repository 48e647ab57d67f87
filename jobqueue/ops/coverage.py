"""``jobqueue check``'s reader for ``jobqueue.policy.coverage``: the task names of a bounded
sample of each queue's due runs (the oldest, by due time), and the live workers."""

from __future__ import annotations

from collections import Counter

import redis

from jobqueue.client.core import ClientCore
from jobqueue.client.sync import JobQueue
from jobqueue.errors import JobQueueError
from jobqueue.ops.queries import workers
from jobqueue.policy.coverage import NAME, LiveWorker, coverage
from jobqueue.policy.health import Check, warn
from jobqueue.store.io import Steps, cmd, commands

# Due runs read per partition, and partitions read per queue, at most: the check's cost is
# bounded whatever the queues hold.
SAMPLE_PER_PARTITION = 200
SAMPLE_PARTITIONS = 64


def due_tasks(jq: JobQueue) -> dict[str, Counter[str]]:
    """:func:`due_tasks_steps` on a sync client."""
    return jq.run_steps(due_tasks_steps(jq))


def due_tasks_steps(jq: ClientCore) -> Steps[dict[str, Counter[str]]]:
    """Queue -> how many of its sampled due runs each task has."""
    out: dict[str, Counter[str]] = {}
    for queue in sorted((yield from jq._queues())):
        keys = jq.all_partition_keys(queue)[:SAMPLE_PARTITIONS]
        ids = yield commands(*(cmd("zrange", pk.due, 0, SAMPLE_PER_PARTITION - 1) for pk in keys))
        asked = [
            cmd("hget", pk.run(run_id), "task")
            for pk, found in zip(keys, ids, strict=True)
            if isinstance(found, list)  # a foreign key of another type: not this check's
            for run_id in found
        ]
        names = (yield commands(*asked)) if asked else []
        out[queue] = Counter(n for n in names if isinstance(n, str) and n)
    return out


def run(jq: JobQueue) -> list[Check]:
    """The lines of ``jobqueue check`` about workers and tasks: none for a user who may not
    read jobqueue's keys (as the schedulers' lines)."""
    try:
        return _run(jq)
    except redis.exceptions.NoPermissionError:
        return []
    except (JobQueueError, redis.exceptions.RedisError, redis.exceptions.RedisClusterException
            ) as exc:  # fmt: skip
        return [warn(NAME, f"workers and tasks unknown: not read ({exc})")]


def _run(jq: JobQueue) -> list[Check]:
    live = [
        LiveWorker(w.id, tuple(w.queues), None if w.tasks is None else frozenset(w.tasks))
        for w in workers(jq)
        if not w.stale
    ]
    return coverage(due_tasks(jq), live)
