"""The queue-depth and group gauges of the Prometheus metrics (``--queue-gauges``): refreshed
every few seconds from ``jobqueue.ops.queries.stats`` and ``jq.groups`` by one daemon's
thread, never on the scrape path. Foreign or corrupt data found is logged once per finding."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from jobqueue.errors import JobQueueError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from jobqueue.client.sync import JobQueue

log = logging.getLogger("jobqueue.metrics")

# The most groups of one queue exported each with series of their own (the busiest: most runs
# waiting and running); the others are summed into the jobqueue_groups_left_out_* gauges.
MAX_GROUP_SERIES = 100
# Distinct anomalies logged by one process (beyond: silence, so a flood cannot fill a disk).
MAX_LOGGED_ANOMALIES = 1000


class QueueGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Gauge

        q = ["queue"]
        self._logged: set[str] = set()
        self.queue_runs = Gauge(
            "jobqueue_queue_runs",
            "Runs per queue and state: due (due now, not started), running, dead, waiting "
            "(workflow runs whose dependencies have not all finished).",
            [*q, "state"],
            registry=registry,
        )
        self.queue_lease_expiries = Gauge(
            "jobqueue_queue_lease_expiries",
            "Leases found expired by claim.lua since the queue was created (all workers).",
            q,
            registry=registry,
        )
        self.queue_paused = Gauge(
            "jobqueue_queue_paused",
            "Partitions of the queue that are paused (jobqueue queue pause): 0 while it runs.",
            q,
            registry=registry,
        )
        self.queue_concurrency_limit = Gauge(
            "jobqueue_queue_concurrency_limit",
            "The most runs of the queue running at once per partition; -1: no limit.",
            q,
            registry=registry,
        )
        self.queue_parked = Gauge(
            "jobqueue_queue_parked",
            "Due runs of the queue parked by a full per-key or per-task cap.",
            q,
            registry=registry,
        )
        self.queue_rate_limit = Gauge(
            "jobqueue_queue_rate_limit",
            "The queue's rate limit per partition, in claims per second; -1: no limit.",
            q,
            registry=registry,
        )
        g = [*q, "group"]  # a run's group is its limit_key; '' for the runs without one
        self.group_runs = Gauge(
            "jobqueue_group_runs",
            "Runs per group of a queue with fair shares on, and state: waiting (in the "
            "group's line), running (leased).",
            [*g, "state"],
            registry=registry,
        )
        self.group_served = Gauge(
            "jobqueue_group_served",
            "Runs claimed from the group while fair shares were on (all workers).",
            g,
            registry=registry,
        )
        self.groups = Gauge(
            "jobqueue_groups",
            "Groups of a queue with fair shares on (those with settings, runs in line or "
            "runs served), exported or left out.",
            q,
            registry=registry,
        )
        self.groups_left_out_runs = Gauge(
            "jobqueue_groups_left_out_runs",
            f"Runs of the groups beyond the {MAX_GROUP_SERIES} busiest of a queue (not "
            "exported each on its own), summed, per state: waiting, running.",
            [*q, "state"],
            registry=registry,
        )
        self.groups_left_out_served = Gauge(
            "jobqueue_groups_left_out_served",
            f"Runs served of the groups beyond the {MAX_GROUP_SERIES} busiest of a queue, "
            "summed.",
            q,
            registry=registry,
        )
        # What refresh_groups exported last, per queue: the series to remove when a group
        # leaves the exported ones or fair shares go off.
        self._group_series: dict[str, set[str]] = {}
    def refresh(self, jq: JobQueue, queues: Iterable[str]) -> None:
        """One refresh of the gauges.

        Foreign or corrupt data is logged (each finding once per process, not every 5 s) and
        counted as 0 where it stands; a queue that cannot be read at all keeps its last
        values, and the other queues are still refreshed."""
        from jobqueue.ops.queries import all_anomalies, stats

        for queue in queues:
            try:
                parts = stats(jq, queue)
            except JobQueueError as exc:  # e.g. no longer in jq:queues
                self._anomaly(f"queue {queue!r}: {exc}")
                continue
            for anomaly in all_anomalies(parts):
                self._anomaly(str(anomaly))
            if not parts:  # its partition count is not usable: nothing to count
                continue
            due = sum(p.due_now for p in parts)
            running = sum(p.running for p in parts)
            dead = sum(p.dead for p in parts)
            waiting = sum(p.waiting for p in parts)
            expired = sum(p.counters.get("lease_expired", 0) for p in parts)
            for state, value in (
                ("due", due), ("running", running), ("dead", dead), ("waiting", waiting)
            ):
                self.queue_runs.labels(queue, state).set(value)
            self.queue_lease_expiries.labels(queue).set(expired)
            self.queue_paused.labels(queue).set(sum(p.paused for p in parts))
            self.queue_parked.labels(queue).set(sum(p.parked for p in parts))
            limits = [p.concurrency_limit for p in parts if p.concurrency_limit is not None]
            self.queue_concurrency_limit.labels(queue).set(max(limits, default=-1))
            first = parts[0]
            per_s = (
                -1.0
                if first.rate_limit is None or not first.rate_window_ms
                else first.rate_limit * 1000 / first.rate_window_ms
            )
            self.queue_rate_limit.labels(queue).set(per_s)
            self.refresh_groups(jq, queue)

    def refresh_groups(self, jq: JobQueue, queue: str) -> None:
        """The group gauges of one queue: read only while fair shares are on (one HGET
        otherwise); a queue whose fair shares went off loses its group series."""
        from jobqueue.client.groups import busiest, read_fair

        fair, found = jq.run_steps(read_fair(jq, queue))
        for anomaly in found:
            self._anomaly(str(anomaly))
        if not fair:
            self._drop_groups(queue, set())
            return
        groups = jq.groups(queue)
        for anomaly in [*groups.anomalies, *(a for g in groups for a in g.anomalies)]:
            self._anomaly(str(anomaly))
        shown, rest = busiest(groups, MAX_GROUP_SERIES)
        for group in shown:
            self.group_runs.labels(queue, group.name, "waiting").set(group.waiting)
            self.group_runs.labels(queue, group.name, "running").set(group.running)
            self.group_served.labels(queue, group.name).set(group.served)
        self._drop_groups(queue, {group.name for group in shown})
        self._group_series[queue] = {group.name for group in shown}
        self.groups.labels(queue).set(len(groups))
        self.groups_left_out_runs.labels(queue, "waiting").set(sum(g.waiting for g in rest))
        self.groups_left_out_runs.labels(queue, "running").set(sum(g.running for g in rest))
        self.groups_left_out_served.labels(queue).set(sum(g.served for g in rest))

    def _drop_groups(self, queue: str, keep: set[str]) -> None:
        """Remove the group series of ``queue`` not in ``keep`` (all of them, and the
        queue's group totals, when ``keep`` is empty: fair shares off)."""
        had = self._group_series.pop(queue, None)
        if had is None:
            return
        for name in had - keep:
            for state in ("waiting", "running"):
                self.group_runs.remove(queue, name, state)
            self.group_served.remove(queue, name)
        if not keep:
            self.groups.remove(queue)
            for state in ("waiting", "running"):
                self.groups_left_out_runs.remove(queue, state)
            self.groups_left_out_served.remove(queue)

    def _anomaly(self, text: str) -> None:
        """Log a finding once: the refresh runs every few seconds, the log is read by people."""
        if text not in self._logged and len(self._logged) < MAX_LOGGED_ANOMALIES:
            self._logged.add(text)
            log.warning("queue depth: %s", text)
