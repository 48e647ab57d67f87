"""What one frame of ``jobqueue top`` says: a pure function from a snapshot to text lines.

No terminal, no Redis here (the loop is ``jobqueue.cli.top``), so a frame can be tested from a
snapshot built by hand and a dashboard could reuse the same summary.
"""

from __future__ import annotations

from jobqueue.cli.format import abs_time, duration, table_lines, when
from jobqueue.cli.format import rate as rate_text
from jobqueue.ops.queries import QueueTotals, TopSnapshot, queue_totals

SHOWN_ANOMALIES = 3


def completion_rate(snap: TopSnapshot, previous: TopSnapshot | None) -> float | None:
    """Runs completed per second between two frames (from the partitions' counters), or None
    without an earlier frame; a counter that went down (stats reset) gives None too."""
    if previous is None or snap.now_ms <= previous.now_ms:
        return None
    now = sum(s.counters.get("completed", 0) for s in snap.stats)
    before = sum(s.counters.get("completed", 0) for s in previous.stats)
    if now < before:
        return None
    return (now - before) * 1000 / (snap.now_ms - previous.now_ms)


def _queue_cell(r: QueueTotals) -> str:
    """The queue's name with its flow control: paused, concurrency and rate limits."""
    text = r.queue + (" (paused)" if r.paused_partitions else "")
    if r.concurrency_limit is not None:
        text += f" (max {r.concurrency_limit})"
    if r.rate_limit is not None:
        text += f" ({rate_text(r.rate_limit, r.rate_window_ms)})"
    return text


def render(
    snap: TopSnapshot,
    *,
    width: int = 120,
    height: int = 40,
    previous: TopSnapshot | None = None,
    interval: float | None = None,
) -> list[str]:
    """The frame for ``snap``, at most ``height`` lines of at most ``width`` characters."""
    rows = queue_totals(snap.stats)  # per queue, as the dashboard shows them
    stale = sum(w.stale for w in snap.workers)
    refresh = f"  every {interval:g}s" if interval else ""
    header = (
        f"jobqueue top  {abs_time(snap.now_ms)} UTC (server){refresh}  "
        f"workers {len(snap.workers)}" + (f" ({stale} STALE)" if stale else "") + "  q: quit"
    )
    per_minute = sum(r.done_last_minute for r in rows)
    per_hour = sum(r.done_last_hour for r in rows)
    rate = completion_rate(snap, previous)
    throughput = f"throughput  done {per_minute:,}/min ({per_minute / 60:.1f}/s), {per_hour:,}/h"
    if rate is not None:
        throughput += f"; now {rate:.1f}/s"
    ages = [r for r in rows if r.oldest_due_age_ms is not None]
    latest = max(ages, key=lambda r: r.oldest_due_age_ms or 0) if ages else None
    lateness = "lateness    nothing due"
    if latest is not None and latest.oldest_due_age_ms is not None:
        lateness = (
            f"lateness    oldest due {duration(latest.oldest_due_age_ms)} late "
            f"(queue {latest.queue}, due {abs_time(snap.now_ms - latest.oldest_due_age_ms)})"
        )
    totals = (
        f"totals      due now {sum(r.due_now for r in rows):,}  "
        f"later {sum(r.scheduled_later for r in rows):,}  "
        f"running {sum(r.running for r in rows):,}  "
        f"expired {sum(r.expired_leases for r in rows):,}  dead {sum(r.dead for r in rows):,}  "
        f"waiting {sum(r.waiting for r in rows):,}"
    )
    lines = [header, throughput, lateness, totals]
    # Foreign data in Redis is said in the frame (stderr would tear the screen): a few lines.
    for anomaly in snap.anomalies[:SHOWN_ANOMALIES]:
        lines.append(f"anomaly     {anomaly}")
    if len(snap.anomalies) > SHOWN_ANOMALIES:
        more = len(snap.anomalies) - SHOWN_ANOMALIES
        lines.append(f"anomaly     ... and {more} more (`jobqueue top --json` lists them all)")
    lines.append("")
    if rows:
        lines += table_lines(
            [
                [
                    _queue_cell(r),
                    r.partitions,
                    r.due_now,
                    r.scheduled_later,
                    r.running,
                    r.expired_leases,
                    r.dead,
                    r.done_last_minute,
                    r.done_last_hour,
                    duration(r.oldest_due_age_ms),
                ]
                for r in rows
            ],
            [
                "QUEUE",
                "PARTS",
                "DUE NOW",
                "LATER",
                "RUNNING",
                "EXPIRED",
                "DEAD",
                "DONE/1M",
                "DONE/1H",
                "OLDEST DUE",
            ],
        )
    else:
        lines.append("no queues yet")
    lines += ["", "leases with least time left"]
    if snap.leases:
        lines += table_lines(
            [
                [
                    lease.run_id,
                    lease.queue,
                    lease.task,
                    lease.owner,
                    lease.fence,
                    lease.attempt,
                    duration(lease.remaining_ms) + (" EXPIRED" if lease.expired else ""),
                    when(lease.lease_until_ms, snap.now_ms),
                ]
                for lease in snap.leases
            ],
            ["RUN", "QUEUE", "TASK", "OWNER", "FENCE", "ATTEMPT", "LEFT", "LEASE UNTIL (UTC)"],
        )
    else:
        lines.append("no leases")
    return [line[:width] for line in lines[:height]]
