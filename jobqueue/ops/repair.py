"""``jobqueue repair``: put every run of a queue back in the index its state belongs to.

Needed after what the scripts cannot see coming: a Redis Cluster slot moved key by key (a
script on the importing node may find an index entry whose record has not arrived yet, and
keeps it as an orphan), a partial restore, foreign writes. Each partition is read on the
node that serves it (SCAN of its records, its index entries, its orphans) and fixed in
batches by repair.lua, one atomic script per batch; re-running it is harmless.

Written as steps (``repair_queue_steps``, ``repair_partition_steps``) that either client
drives; the plain functions drive them on a sync ``JobQueue``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jobqueue.client.core import ClientCore
from jobqueue.client.sync import JobQueue
from jobqueue.errors import UnknownQueue
from jobqueue.store.admin import REPAIR, Repaired
from jobqueue.store.io import NodeScan, Scripts, Steps, cmd, commands, raised
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


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def repair_partition(
    jq: JobQueue, pk: PartitionKeys, dry_run: bool, advance: Callable[[int], None]
) -> Repaired:
    """:func:`repair_partition_steps` on a sync client."""
    return jq.run_steps(repair_partition_steps(pk, dry_run, advance))


def repair_partition_steps(
    pk: PartitionKeys, dry_run: bool, advance: Callable[[int], None]
) -> Steps[Repaired]:
    """Every run id the partition knows of, once (its records, then its index entries and
    orphans), repaired BATCH at a time: records as soon as that many are read, index entries
    once their index is read whole. ``seen`` holds every id already, so the buffer adds no
    more than that."""
    found = Repaired(0, 0, 0, 0)
    seen: set[str] = set()
    pending: list[str] = []

    def take(values: Iterable[Any], strip: int = 0) -> None:
        for value in values:
            run_id = _text(value)[strip:]
            if run_id not in seen:
                seen.add(run_id)
                pending.append(run_id)

    def repair(final: bool) -> Steps[None]:
        nonlocal found
        while len(pending) >= BATCH or (final and pending):
            batch = pending[:BATCH]
            del pending[:BATCH]
            (reply,) = yield Scripts([REPAIR.call(pk, batch, dry_run)])
            found = Repaired(*(a + b for a, b in zip(found, REPAIR.parse(reply), strict=True)))
            advance(len(batch))

    record = pk.prefix + "run:"
    cursor = 0
    while True:  # the records: SCAN on the node that serves the partition
        cursor, keys = yield NodeScan(pk.due, record + "*", cursor, CHUNK)
        take(keys, len(record))
        yield from repair(False)
        if not cursor:
            break
    for index in (pk.due, pk.leases, pk.dead, pk.done, pk.orphans):
        # Paged by offset, so an index is read whole before its entries are repaired: a
        # repair moves entries out of it, and later ones would shift below the next page.
        start = 0
        while True:
            (members,) = raised((yield commands(cmd("zrange", index, start, start + CHUNK - 1))))
            if not members:
                break
            take(members)
            start += CHUNK
        yield from repair(False)
    yield from repair(True)
    return found


def repair_queue(
    jq: JobQueue,
    queue: str,
    *,
    dry_run: bool = False,
    advance: Callable[[int], None] = lambda n: None,
) -> RepairReport:
    """:func:`repair_queue_steps` on a sync client."""
    return jq.run_steps(repair_queue_steps(jq, queue, dry_run=dry_run, advance=advance))


def repair_queue_steps(
    jq: ClientCore,
    queue: str,
    *,
    dry_run: bool = False,
    advance: Callable[[int], None] = lambda n: None,
) -> Steps[RepairReport]:
    validate_queue_name(queue)
    table = yield from jq._queue_table()
    if queue not in table.counts:
        known = ", ".join(sorted(table.counts))
        raise UnknownQueue(f"no queue {queue!r} in Redis (queues: {known})")
    count = jq.adopt_partition_count(queue, table.record(queue))
    report = RepairReport(queue, count, dry_run)
    for p in range(count):
        report.by_partition[p] = yield from repair_partition_steps(
            jq.partition_keys(queue, p), dry_run, advance
        )
    return report
