"""The last hour of queue depth and lateness, sampled by the dashboard process.

Redis keeps no time series of gauges (how many runs are due, how late the oldest is): the
indexes hold only the present. Throughput needs no sampler (``queries.throughput`` counts
the done and dead indexes, scored by finish time), but depth and lateness do: every
``every_s`` seconds the dashboard reads ``queries.stats`` (the CLI's function) and keeps one
point per queue in a ring bounded to the window. The ring lives in memory: it starts empty
when the dashboard starts and costs nothing in Redis. Page loads record too (they read the
same stats anyway), at most one point per ``every_s``.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

from jobqueue.client import queries
from jobqueue.client.sync import JobQueue


@dataclass(frozen=True)
class Sample:
    at_ms: int  # server time
    totals: dict[str, queries.QueueTotals]


# Seconds between samples unless `jobqueue dashboard --sample-every` says otherwise.
DEFAULT_SAMPLE_EVERY_S = 10.0


class Sampler:
    def __init__(self, every_s: float = DEFAULT_SAMPLE_EVERY_S, window_s: float = 3600.0) -> None:
        self.every_ms = int(every_s * 1000)
        self.window_ms = int(window_s * 1000)
        self._ring: deque[Sample] = deque(maxlen=math.ceil(window_s / every_s) + 1)
        self._lock = threading.Lock()  # the loop and page threads both record

    def record(self, at_ms: int, totals: list[queries.QueueTotals]) -> bool:
        """Keep a point unless the last one is younger than ``every_s``; True if kept."""
        with self._lock:
            if self._ring and at_ms - self._ring[-1].at_ms < self.every_ms:
                return False
            self._ring.append(Sample(at_ms, {t.queue: t for t in totals}))
            return True

    def sample(self, jq: JobQueue) -> bool:
        now = jq.server_time_ms()
        return self.record(now, queries.queue_totals(queries.stats(jq)))

    def samples(self, now_ms: int) -> list[Sample]:
        with self._lock:
            return [s for s in self._ring if now_ms - s.at_ms <= self.window_ms]

    def _rows(
        self, queue: str, now_ms: int, current: queries.QueueTotals | None
    ) -> list[tuple[int, queries.QueueTotals]]:
        rows = [(s.at_ms, s.totals[queue]) for s in self.samples(now_ms) if queue in s.totals]
        if current is not None and (not rows or rows[-1][0] < now_ms):
            rows.append((now_ms, current))  # the page's own reading ends the line at "now"
        return rows

    def depth(
        self, queue: str, now_ms: int, current: queries.QueueTotals | None = None
    ) -> list[tuple[float, float]]:
        """(ms, runs due now) points; a queue absent from a sample had no partitions yet."""
        return [(t, row.due_now) for t, row in self._rows(queue, now_ms, current)]

    def running(
        self, queue: str, now_ms: int, current: queries.QueueTotals | None = None
    ) -> list[tuple[float, float]]:
        return [(t, row.running) for t, row in self._rows(queue, now_ms, current)]

    def lateness_s(
        self, queue: str, now_ms: int, current: queries.QueueTotals | None = None
    ) -> list[tuple[float, float]]:
        """(ms, seconds the oldest due run has waited past its due time; 0 when none)."""
        return [
            (t, (row.oldest_due_age_ms or 0) / 1000)
            for t, row in self._rows(queue, now_ms, current)
        ]
