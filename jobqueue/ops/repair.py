"""``jobqueue repair``: put every run of a queue back in the index its state belongs to.

Needed after what the scripts cannot see coming: a Redis Cluster slot moved key by key (a
script on the importing node may find an index entry whose record has not arrived yet, and
keeps it as an orphan), a partial restore, foreign writes. Each partition is read on the
node that serves it (SCAN of its records, its index entries, its orphans) and fixed in
batches by repair.lua, one atomic script per batch; re-running it is harmless."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from jobqueue.client.sync import JobQueue
from jobqueue.errors import UnknownQueue
from jobqueue.store.admin import REPAIR, Repaired
from jobqueue.store.keys import PartitionKeys, validate_queue_name

BATCH = 200  # run ids per repair.lua call
CHUNK = 1000  # index entries read per ZRANGE


@dataclass
class RepairReport:
    queue: str
    partitions: int
    dry_run: bool
    by_partition: dict[int, Repaired] = field(default_factory=dict)

    @property
    def totals(self) -> Repaired:
        sums = [sum(col) for col in zip(*self.by_partition.values(), strict=True)]
        return Repaired(*sums) if sums else Repaired(0, 0, 0, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "partitions": self.partitions,
            "dry_run": self.dry_run,
            "totals": self.totals._asdict(),
            "by_partition": {p: r._asdict() for p, r in self.by_partition.items()},
        }


def _node_client(jq: JobQueue, pk: PartitionKeys) -> Any:
    """The client of the node that serves the partition (SCAN is per node on a cluster)."""
    locate = getattr(jq.redis, "get_node_from_key", None)
    if locate is None:
        return jq.redis
    return jq.redis.get_redis_connection(locate(pk.due))


def run_ids(jq: JobQueue, pk: PartitionKeys) -> Iterator[str]:
    """Every run id the partition knows of, once: its records, its index entries, its
    orphans."""
    seen: set[str] = set()
    node = _node_client(jq, pk)
    record = pk.prefix + "run:"
    for key in node.scan_iter(match=record + "*", count=CHUNK):
        run_id = _text(key)[len(record) :]
        if run_id not in seen:
            seen.add(run_id)
            yield run_id
    for index in (pk.due, pk.leases, pk.dead, pk.done, pk.orphans):
        start = 0
        while members := jq.redis.zrange(index, start, start + CHUNK - 1):
            for member in members:
                run_id = _text(member)
                if run_id not in seen:
                    seen.add(run_id)
                    yield run_id
            start += CHUNK


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def repair_partition(
    jq: JobQueue, pk: PartitionKeys, dry_run: bool, advance: Callable[[int], None]
) -> Repaired:
    found = Repaired(0, 0, 0, 0)
    ids = run_ids(jq, pk)
    while batch := list(itertools.islice(ids, BATCH)):
        reply = REPAIR.parse(jq.scripts.run(REPAIR.call(pk, batch, dry_run)))
        found = Repaired(*(a + b for a, b in zip(found, reply, strict=True)))
        advance(len(batch))
    return found


def repair_queue(
    jq: JobQueue,
    queue: str,
    *,
    dry_run: bool = False,
    advance: Callable[[int], None] = lambda n: None,
) -> RepairReport:
    validate_queue_name(queue)
    table = jq.queue_table()
    if queue not in table.counts:
        known = ", ".join(sorted(table.counts))
        raise UnknownQueue(f"no queue {queue!r} in Redis (queues: {known})")
    count = jq.adopt_partition_count(queue, table.record(queue))
    report = RepairReport(queue, count, dry_run)
    for p in range(count):
        report.by_partition[p] = repair_partition(
            jq, jq.partition_keys(queue, p), dry_run, advance
        )
    return report
