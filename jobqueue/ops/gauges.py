"""The history of each queue's gauges (runs due now, running, how late the oldest due run is),
kept in Redis by the dashboards so that every replica shows the same and a restart loses
nothing.

Redis holds only the present of these gauges (the indexes), so a dashboard samples them
(``queries.stats``) and writes a point per minute; throughput needs no sampling
(``queries.throughput`` counts the finish times). Two resolutions per queue, each a hash of
fixed slots, so the bound holds by construction whatever writes and however often:

- ``jq:gauges:m:<queue>``: slot ``minute % 60`` -> the point of that minute, so at most 60
  fields, the last hour; expires an hour after its last write.
- ``jq:gauges:h:<queue>``: slot ``hour % 168`` -> the point of that hour, at most 168
  fields, the last week; each gauge is the largest of the hour's minute points (a peak an
  hourly reading would miss stays seen); expires a week after its last write.

A point names its own time (``t``), so a slot still holding the point of the hour (or week)
before is told apart and left out. Several dashboards sampling at once write one point per
minute: the first to take ``jq:gauges:sampled:<minute>`` (SET NX, expiring after 2 minutes)
samples that minute, and a second write of the same minute could only replace the same slot.
Every command names one key, so the keys may sit on any slot of a cluster.

Reading never writes; what is not a point jobqueue writes (a key of another type, a field
that is not a slot, a value that is not a point) is an anomaly of the listing, never an
error. Writing skips a queue whose key is of another type (reported by the next read).

Each operation is steps (``claim_minute_steps``, ``record_steps``, ``history_steps``) that
either client drives; the plain functions drive them on a sync ``JobQueue``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobqueue.anomalies import Anomaly, Listing, checked, is_time, unique
from jobqueue.client.sync import JobQueue
from jobqueue.ops.queries import PARTITION_CHUNK, QueueTotals, pipelined_steps
from jobqueue.store.io import Steps, cmd, commands, raised
from jobqueue.store.keys import gauges_claim_key, gauges_key

MINUTE_MS = 60_000
CLAIM_TTL_MS = 2 * MINUTE_MS  # outlives its minute: a late sampler of the same minute skips
_FOREIGN = object()  # what a read of a key of another type gives: the queue is skipped


@dataclass(frozen=True)
class Resolution:
    name: str  # the key's segment: 'm' or 'h'
    step_ms: int
    slots: int  # points kept: the window is step_ms * slots

    @property
    def window_ms(self) -> int:
        return self.step_ms * self.slots

    def slot(self, at_ms: int) -> int:
        return (at_ms // self.step_ms) % self.slots


MINUTES = Resolution("m", MINUTE_MS, 60)
HOURS = Resolution("h", 60 * MINUTE_MS, 168)


@dataclass(frozen=True)
class GaugePoint:
    at_ms: int  # server time of the sample (minutes); the hour's start (hours)
    due_now: int
    running: int
    late_ms: int  # how long the oldest due run had waited past its due time (0: none due)

    def to_json(self) -> str:
        return json.dumps(
            {"t": self.at_ms, "due": self.due_now, "running": self.running,
             "late_ms": self.late_ms},
            separators=(",", ":"),
        )  # fmt: skip

    @classmethod
    def parse(cls, text: Any) -> GaugePoint | None:
        """A point as ``to_json`` writes it, or None for anything else."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError):
            return None
        if not isinstance(data, dict) or set(data) != {"t", "due", "running", "late_ms"}:
            return None
        values = [data["t"], data["due"], data["running"], data["late_ms"]]
        if not all(type(v) is int and v >= 0 for v in values) or not is_time(values[0]):
            return None
        return cls(*values)

    def peak(self, other: GaugePoint | None) -> GaugePoint:
        """This point and ``other`` (same time slot) merged: the largest of each gauge."""
        if other is None:
            return self
        return GaugePoint(
            self.at_ms,
            max(self.due_now, other.due_now),
            max(self.running, other.running),
            max(self.late_ms, other.late_ms),
        )


@dataclass(frozen=True)
class GaugeHistory:
    """One queue's points within the window, oldest first."""

    queue: str
    points: list[GaugePoint]
    anomalies: tuple[Anomaly, ...] = ()


def point_of(totals: QueueTotals, at_ms: int) -> GaugePoint:
    return GaugePoint(at_ms, totals.due_now, totals.running, totals.oldest_due_age_ms or 0)


def claim_minute(jq: JobQueue, now_ms: int) -> bool:
    """:func:`claim_minute_steps` on a sync client."""
    return jq.run_steps(claim_minute_steps(now_ms))


def claim_minute_steps(now_ms: int) -> Steps[bool]:
    """Whether the caller is the one to sample the minute of ``now_ms`` (the first caller in
    that minute, among every dashboard on this Redis)."""
    key = gauges_claim_key(now_ms // MINUTE_MS)
    (taken,) = raised((yield commands(cmd("set", key, "1", nx=True, px=CLAIM_TTL_MS))))
    return bool(taken)


def record(jq: JobQueue, at_ms: int, totals: Sequence[QueueTotals]) -> list[Anomaly]:
    """:func:`record_steps` on a sync client."""
    return jq.run_steps(record_steps(at_ms, totals))


def record_steps(at_ms: int, totals: Sequence[QueueTotals]) -> Steps[list[Anomaly]]:
    """Write each queue's point of the minute of ``at_ms`` and fold it into its hour's point;
    two pipelined round trips whatever the number of queues. Returns what it could not write:
    a queue whose key is of another type is skipped, its keys left as they are."""
    hour_start = at_ms - at_ms % HOURS.step_ms
    found: list[Anomaly] = []

    def read(pipe: Any, row: QueueTotals) -> None:
        # The minute's slot is read for its key's type only: a key of another type is never
        # written, not even its expiry (PEXPIRE takes any type).
        pipe.hget(gauges_key(row.queue, MINUTES.name), str(MINUTES.slot(at_ms)))
        pipe.hget(gauges_key(row.queue, HOURS.name), str(HOURS.slot(at_ms)))

    writes: list[tuple[QueueTotals, GaugePoint, GaugePoint]] = []
    read_replies = yield from pipelined_steps(list(totals), read, PARTITION_CHUNK)
    for row, replies in zip(totals, read_replies, strict=True):
        in_minute, stored = [
            checked(reply, gauges_key(row.queue, res.name), "hash", found, _FOREIGN)
            for res, reply in zip((MINUTES, HOURS), replies, strict=True)
        ]
        if in_minute is _FOREIGN or stored is _FOREIGN:
            continue
        minute = point_of(row, at_ms)
        before = GaugePoint.parse(stored)
        # A slot holding another hour (a week ago) or garbage starts the hour afresh.
        same_hour = before if before is not None and before.at_ms == hour_start else None
        hour = GaugePoint(hour_start, minute.due_now, minute.running, minute.late_ms)
        writes.append((row, minute, hour.peak(same_hour)))

    def write(pipe: Any, item: tuple[QueueTotals, GaugePoint, GaugePoint]) -> None:
        row, minute, hour = item
        for res, point in ((MINUTES, minute), (HOURS, hour)):
            key = gauges_key(row.queue, res.name)
            pipe.hset(key, str(res.slot(at_ms)), point.to_json())
            pipe.pexpire(key, res.window_ms)

    written = yield from pipelined_steps(writes, write, PARTITION_CHUNK)
    for (row, _, _), replies in zip(writes, written, strict=True):
        for res, reply in zip((MINUTES, MINUTES, HOURS, HOURS), replies, strict=True):
            checked(reply, gauges_key(row.queue, res.name), "hash", found, None)
    return unique(found)


def history(
    jq: JobQueue, queues: Sequence[str], resolution: Resolution, now_ms: int
) -> Listing[GaugeHistory]:
    """:func:`history_steps` on a sync client."""
    return jq.run_steps(history_steps(queues, resolution, now_ms))


def history_steps(
    queues: Sequence[str], resolution: Resolution, now_ms: int
) -> Steps[Listing[GaugeHistory]]:
    """Each queue's points of the last ``resolution.window_ms`` before ``now_ms`` (one HGETALL
    per queue, pipelined), each row with the anomalies of its key."""

    def read(pipe: Any, queue: str) -> None:
        pipe.hgetall(gauges_key(queue, resolution.name))

    out = []
    replies = yield from pipelined_steps(list(queues), read, PARTITION_CHUNK)
    for queue, (reply,) in zip(queues, replies, strict=True):
        key = gauges_key(queue, resolution.name)
        found: list[Anomaly] = []
        points = []
        for field, text in checked(reply, key, "hash", found, {}).items():
            point = GaugePoint.parse(text)
            if not (field.isascii() and field.isdigit() and int(field) < resolution.slots):
                found.append(Anomaly(key, f"field {field!r} is not a slot (0 to "
                                          f"{resolution.slots - 1})"))  # fmt: skip
            elif point is None:
                found.append(Anomaly(key, f"field {field!r} is {text[:80]!r}, not a point"))
            elif resolution.slot(point.at_ms) != int(field):
                found.append(Anomaly(key, f"field {field!r} holds a point of slot "
                                          f"{resolution.slot(point.at_ms)}"))  # fmt: skip
            elif now_ms - resolution.window_ms < point.at_ms <= now_ms:
                points.append(point)  # older: a slot not written again yet
        out.append(GaugeHistory(queue, sorted(points, key=lambda p: p.at_ms), tuple(found)))
    return Listing(out)
