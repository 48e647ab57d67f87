"""What the home, queues and queue pages show, from what was read (pure: no Redis call):
totals over all queues, each queue's charts, and whether a queue did anything in the hour."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jobqueue.dashboard.charts import Series, svg_chart
from jobqueue.ops.gauges import HOURS, MINUTES, GaugePoint, point_of
from jobqueue.ops.queries import PartitionStats, QueueTotals, Throughput

DAY_MS = 86_400_000


@dataclass(frozen=True)
class Overall:
    """Every queue added up. The first two are the partitions' counters (since each was
    created; a repartition folds a removed partition's into the ones left); the others are
    the indexes now."""

    processed: int  # attempts that completed (counter 'completed')
    failed: int  # attempts that raised (counter 'failed'), retried or not
    busy: int  # running: holding a lease
    enqueued: int  # pending and due now
    scheduled: int  # pending, due later (delays and retries' backoff)
    waiting: int  # workflow runs waiting for their dependencies
    dead: int  # in the dead-letter sets


def overall(per_partition: Sequence[PartitionStats]) -> Overall:
    return Overall(
        processed=sum(s.counters.get("completed", 0) for s in per_partition),
        failed=sum(s.counters.get("failed", 0) for s in per_partition),
        busy=sum(s.running for s in per_partition),
        enqueued=sum(s.due_now for s in per_partition),
        scheduled=sum(s.scheduled_later for s in per_partition),
        waiting=sum(s.waiting for s in per_partition),
        dead=sum(s.dead for s in per_partition),
    )


def is_active(current: QueueTotals, flow: Throughput | None, points: Sequence[GaugePoint]) -> bool:
    """Whether a queue did anything in the hour: runs finished or died, or runs were due or
    running at a sample or now. An idle queue's charts would be flat lines."""
    if current.due_now or current.running:
        return True
    if flow is not None and (any(flow.finished) or any(flow.dead)):
        return True
    return any(p.due_now or p.running or p.late_ms for p in points)


def _line(
    points: Sequence[GaugePoint], now: int, current: QueueTotals | None,
    value: Callable[[GaugePoint], float],
) -> list[tuple[float, float]]:  # fmt: skip
    rows = [(float(p.at_ms), value(p)) for p in points]
    if current is not None and (not rows or rows[-1][0] < now):
        rows.append((float(now), value(point_of(current, now))))  # the page's own reading
    return rows


def _gauge_charts(
    queue: str, points: Sequence[GaugePoint], now: int, current: QueueTotals | None,
    common: dict[str, Any], suffix: str, note: str,
) -> dict[str, str]:  # fmt: skip
    return {
        "depth": svg_chart(
            [
                Series("due now", _line(points, now, current, lambda p: p.due_now)),
                Series("running", _line(points, now, current, lambda p: p.running)),
            ],
            title="depth" + note,
            element_id=f"chart-depth{suffix}-{queue}",
            **common,
        ),
        "lateness": svg_chart(
            [Series("oldest due, s", _line(points, now, current, lambda p: p.late_ms / 1000))],
            title="lateness" + note,
            element_id=f"chart-lateness{suffix}-{queue}",
            **common,
        ),
    }


def hour_charts(
    current: QueueTotals, now: int, flow: Throughput | None, points: Sequence[GaugePoint]
) -> dict[str, str]:
    """The last hour: throughput per minute (from the finish times), depth and lateness
    (the minute points in Redis, ended by the page's own reading)."""
    q = current.queue
    labels = [(now - m * 60_000, f"-{m}m" if m else "now") for m in (60, 45, 30, 15, 0)]
    common: dict[str, Any] = {"x_min": now - MINUTES.window_ms, "x_max": now, "x_labels": labels}
    finished: list[tuple[float, float]] = []
    dead: list[tuple[float, float]] = []
    if flow is not None:
        # Bar i ends at its bucket's end, so the last bar sits at "now".
        ends = [flow.start_ms + (i + 1) * flow.bucket_ms for i in range(len(flow.finished))]
        finished = list(zip(ends, flow.finished, strict=True))
        dead = list(zip(ends, flow.dead, strict=True))
    charts = {
        "throughput": svg_chart(
            [Series("finished/min", finished), Series("dead/min", dead)],
            title="throughput",
            bars=True,
            element_id=f"chart-throughput-{q}",
            **common,
        ),
    }
    return charts | _gauge_charts(q, points, now, current, common, "", "")


def week_charts(queue: str, now: int, points: Sequence[GaugePoint]) -> dict[str, str]:
    """The last week: each hour's largest depth and lateness (the hour points in Redis)."""
    labels = [(now - d * DAY_MS, f"-{d}d" if d else "now") for d in range(7, -1, -1)]
    common: dict[str, Any] = {"x_min": now - HOURS.window_ms, "x_max": now, "x_labels": labels}
    return _gauge_charts(queue, points, now, None, common, "-week", ", largest per hour")
