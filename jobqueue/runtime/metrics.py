"""Prometheus metrics for the worker and scheduler daemons (``--metrics-port``).

The daemons call a tiny interface (:class:`Metrics`); with metrics off they hold
:data:`NO_METRICS`, whose methods do nothing, so the daemons stay thin and never test a flag.
:func:`serve` builds the real thing on a per-process ``CollectorRegistry`` (not the global one:
tests run several daemons in one process) and starts prometheus-client's HTTP server.

``prometheus-client`` is the optional extra ``metrics``; it is imported only by :func:`serve`.

What is counted where:

* runs claimed, start lateness (claim time - due, both from the server clock): the claim reply;
* completed, failed, retried, dead, rejected commits (fenced out): the commit replies;
* leases lost: heartbeats refused (fenced, cancelled, ...) as this worker observed them;
* lease expiries: ``claim.lua`` does not say which claimed runs were reclaimed from an expired
  lease; it counts them in each partition's ``stats`` hash, which the queue-depth refresh
  exports (``jobqueue_queue_lease_expiries``, all workers together);
* runs per task and outcome, and their duration (the code's start to its end): the commit
  replies, with what the executor measured;
* queue depth (due now / running / dead / waiting, per queue), whether a queue is paused and its
  limits: :func:`jobqueue.queries.stats`, refreshed every few seconds by a daemon thread
  (never on the scrape path, which must stay fast), only in the daemon started with
  ``--queue-gauges``: the values are the queue's, whoever reads
  them, so one exporter is enough (several would be summed into a multiple of the truth);
* per group of a queue with fair shares on (runs waiting, running, served): ``jq.groups``,
  in the same refresh, for at most :data:`MAX_GROUP_SERIES` groups per queue (those with the
  most runs waiting and running); the others are summed into the ``jobqueue_groups_left_out_*``
  gauges, so the series stay bounded whatever the number of tenants;
* scheduler fires / misses / drops / skips / conflicts: each tick's report.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from jobqueue.errors import ConfigError, JobQueueError

if TYPE_CHECKING:
    from jobqueue.client.sync import JobQueue
    from jobqueue.store.runs import ClaimedRun

log = logging.getLogger("jobqueue.metrics")

DEPTH_REFRESH_S = 5.0
# The most groups of one queue exported each with series of their own (the busiest: most runs
# waiting and running); the others are summed into the jobqueue_groups_left_out_* gauges.
MAX_GROUP_SERIES = 100
# Distinct anomalies logged by one process (beyond: silence, so a flood cannot fill a disk).
MAX_LOGGED_ANOMALIES = 1000
# Lateness from 1 ms to 1 h: a healthy queue starts runs within milliseconds, a backlog or
# a stopped fleet shows up in the upper buckets.
LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
HEARTBEAT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
# Task durations from 1 ms to 1 h.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                    900, 3600)


class TickLike(Protocol):
    """The fields of ``recurring.firing.TickReport`` that are exported."""

    runs_requested: int
    runs_created: int
    missed: int
    skipped: int
    dropped: int
    conflicts: int


class Metrics:
    """The interface the daemons call. This base class records nothing (metrics off)."""

    def claimed(self, queue: str, runs: Iterable[ClaimedRun], now_ms: int) -> None:
        """Runs one claim call returned, claimed at server time ``now_ms``."""

    def committed(
        self, queue: str, ok: bool, accepted: bool, status: str, task: str = "",
        seconds: float = 0.0,
    ) -> None:
        """One commit reply: ``ok`` is what the worker sent (complete vs fail), ``status``
        what the script answered ('done', 'retry', 'dead' or the refusal reason); ``task``
        the run's task and ``seconds`` how long its code ran (one call per run: this is the
        worker's hot path)."""

    def handed_back(self, queue: str, task: str) -> None:
        """A run of a task this worker has no code for was handed back (not a failure)."""

    def lease_lost(self, queue: str, reason: str) -> None:
        """A heartbeat of this worker was refused."""

    def heartbeat(self, seconds: float) -> None:
        """Round trip of one pipelined heartbeat of every lease held."""

    def scheduler_tick(self, report: TickLike) -> None:
        """What one scheduler tick did."""

    def watch_queues(self, jq: JobQueue, queues: Callable[[], Iterable[str]]) -> None:
        """Refresh the queue-depth gauges of ``queues()`` every few seconds."""

    def close(self) -> None:
        """Stop the HTTP server and the refresh thread."""


NO_METRICS = Metrics()


class PrometheusMetrics(Metrics):
    """Metrics recorded in a private registry; :func:`serve` exposes it over HTTP."""

    def __init__(self, daemon: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.port: int | None = None
        self._server: Any = None
        self._stop = threading.Event()
        self._logged: set[str] = set()
        q = ["queue"]
        self.runs_claimed = Counter("jobqueue_runs_claimed", "Runs claimed.", q, registry=r)
        self.runs_completed = Counter(
            "jobqueue_runs_completed", "Runs completed (commit accepted).", q, registry=r
        )
        self.runs_failed = Counter(
            "jobqueue_runs_failed",
            "Runs failed (failure accepted: retried or dead).",
            q,
            registry=r,
        )
        self.runs_retried = Counter(
            "jobqueue_runs_retried", "Failed runs scheduled for another attempt.", q, registry=r
        )
        self.runs_dead = Counter(
            "jobqueue_runs_dead", "Failed runs dead-lettered by this worker.", q, registry=r
        )
        self.runs_handed_back = Counter(
            "jobqueue_runs_handed_back",
            "Runs of a task this worker has no code for, handed back (not counted as "
            "attempts; a rolling deploy, or two apps on one queue).",
            [*q, "task"],
            registry=r,
        )
        self.commits_rejected = Counter(
            "jobqueue_commits_rejected",
            "Commits refused by the fence (fenced out, cancelled, finished).",
            [*q, "reason"],
            registry=r,
        )
        self.leases_lost = Counter(
            "jobqueue_leases_lost",
            "Heartbeats of this worker refused (lease taken over, cancelled, ...).",
            [*q, "reason"],
            registry=r,
        )
        self.task_runs = Counter(
            "jobqueue_task_runs",
            "Runs finished by this worker, per task and outcome (done, retry, dead, rejected).",
            [*q, "task", "outcome"],
            registry=r,
        )
        self.task_duration = Histogram(
            "jobqueue_task_duration_seconds",
            "How long each run's code ran, per task and outcome.",
            [*q, "task", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.heartbeat_seconds = Histogram(
            "jobqueue_heartbeat_seconds",
            "Round trip of one pipelined heartbeat of every lease held.",
            buckets=HEARTBEAT_BUCKETS,
            registry=r,
        )
        self.start_lateness = Histogram(
            "jobqueue_start_lateness_seconds",
            "Claim time minus due time of each run claimed (server clock).",
            q,
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.queue_runs = Gauge(
            "jobqueue_queue_runs",
            "Runs per queue and state: due (due now, not started), running, dead, waiting "
            "(workflow runs whose dependencies have not all finished).",
            [*q, "state"],
            registry=r,
        )
        self.queue_lease_expiries = Gauge(
            "jobqueue_queue_lease_expiries",
            "Leases found expired by claim.lua since the queue was created (all workers).",
            q,
            registry=r,
        )
        self.queue_paused = Gauge(
            "jobqueue_queue_paused",
            "Partitions of the queue that are paused (jobqueue queue pause): 0 while it runs.",
            q,
            registry=r,
        )
        self.queue_concurrency_limit = Gauge(
            "jobqueue_queue_concurrency_limit",
            "The most runs of the queue running at once per partition; -1: no limit.",
            q,
            registry=r,
        )
        self.queue_held_back = Gauge(
            "jobqueue_queue_held_back",
            "Due runs of the queue held back (parked) by a full per-key or per-task cap.",
            q,
            registry=r,
        )
        self.queue_rate_limit = Gauge(
            "jobqueue_queue_rate_limit",
            "The queue's rate limit per partition, in claims per second; -1: no limit.",
            q,
            registry=r,
        )
        g = [*q, "group"]  # a run's group is its limit_key; '' for the runs without one
        self.group_runs = Gauge(
            "jobqueue_group_runs",
            "Runs per group of a queue with fair shares on, and state: waiting (in the "
            "group's line), running (leased).",
            [*g, "state"],
            registry=r,
        )
        self.group_served = Gauge(
            "jobqueue_group_served",
            "Runs claimed from the group while fair shares were on (all workers).",
            g,
            registry=r,
        )
        self.groups = Gauge(
            "jobqueue_groups",
            "Groups of a queue with fair shares on (those with settings, runs in line or "
            "runs served), exported or left out.",
            q,
            registry=r,
        )
        self.groups_left_out_runs = Gauge(
            "jobqueue_groups_left_out_runs",
            f"Runs of the groups beyond the {MAX_GROUP_SERIES} busiest of a queue (not "
            "exported each on its own), summed, per state: waiting, running.",
            [*q, "state"],
            registry=r,
        )
        self.groups_left_out_served = Gauge(
            "jobqueue_groups_left_out_served",
            f"Runs served of the groups beyond the {MAX_GROUP_SERIES} busiest of a queue, "
            "summed.",
            q,
            registry=r,
        )
        # What refresh_groups exported last, per queue: the series to remove when a group
        # leaves the exported ones or fair shares go off.
        self._group_series: dict[str, set[str]] = {}
        self.sched = {
            name: Counter(f"jobqueue_scheduler_{name}", text, registry=r)
            for name, text in (
                ("fires", "Fire times this scheduler turned into runs (idempotent creates)."),
                ("runs_created", "Runs this scheduler created first."),
                ("misses", "Fire times missed (late past the grace), per misfire policy."),
                ("drops", "Late fire times dropped by the fire-all cap."),
                ("overlap_skips", "Fire times skipped by the overlap policy."),
                ("conflicts", "Advances lost to another scheduler instance."),
            )
        }
        self.info = Gauge(
            "jobqueue_daemon", "1, labelled with the daemon kind.", ["daemon"], registry=r
        )
        self.info.labels(daemon).set(1)

    # -- worker -----------------------------------------------------------------------------

    def claimed(self, queue: str, runs: Iterable[ClaimedRun], now_ms: int) -> None:
        n = 0
        lateness = self.start_lateness.labels(queue)
        for run in runs:
            n += 1
            lateness.observe(max(now_ms - run.due_ms, 0) / 1000)
        if n:
            self.runs_claimed.labels(queue).inc(n)

    def committed(
        self, queue: str, ok: bool, accepted: bool, status: str, task: str = "",
        seconds: float = 0.0,
    ) -> None:
        if not accepted:
            self.commits_rejected.labels(queue, status).inc()
            outcome = "rejected"
        elif ok:
            self.runs_completed.labels(queue).inc()
            outcome = "done"
        else:
            self.runs_failed.labels(queue).inc()
            if status == "retry":
                self.runs_retried.labels(queue).inc()
            elif status == "dead":
                self.runs_dead.labels(queue).inc()
            outcome = status if status in ("retry", "dead") else "failed"
        self.task_runs.labels(queue, task, outcome).inc()
        self.task_duration.labels(queue, task, outcome).observe(seconds)

    def handed_back(self, queue: str, task: str) -> None:
        self.runs_handed_back.labels(queue, task).inc()

    def lease_lost(self, queue: str, reason: str) -> None:
        self.leases_lost.labels(queue, reason).inc()

    def heartbeat(self, seconds: float) -> None:
        self.heartbeat_seconds.observe(seconds)

    # -- scheduler --------------------------------------------------------------------------

    def scheduler_tick(self, report: TickLike) -> None:
        for name, value in (
            ("fires", report.runs_requested),
            ("runs_created", report.runs_created),
            ("misses", report.missed),
            ("drops", report.dropped),
            ("overlap_skips", report.skipped),
            ("conflicts", report.conflicts),
        ):
            if value:
                self.sched[name].inc(value)

    # -- queue depth ------------------------------------------------------------------------

    def refresh_depth(self, jq: JobQueue, queues: Iterable[str]) -> None:
        """One refresh of the depth gauges (the thread's body; tests call it directly).

        Foreign or corrupt data is logged (each finding once per process, not every 5 s) and
        counted as 0 where it stands; a queue that cannot be read at all keeps its last
        values, and the other queues are still refreshed."""
        from jobqueue.client.queries import all_anomalies, stats

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
            self.queue_held_back.labels(queue).set(sum(p.held_back for p in parts))
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

    def watch_queues(self, jq: JobQueue, queues: Callable[[], Iterable[str]]) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.refresh_depth(jq, list(queues()))
                except Exception as exc:  # Redis down: keep the last values, try again
                    log.warning("queue depth refresh failed (%s)", exc)
                self._stop.wait(DEPTH_REFRESH_S)

        threading.Thread(target=loop, name="jq-metrics-depth", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def serve(daemon: str, port: int, host: str = "127.0.0.1") -> PrometheusMetrics:
    """Start serving ``/metrics`` on host:port (port 0: any free port, see ``.port``)."""
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError(
            "--metrics-port needs prometheus-client: pip install prometheus-client "
            "(the metrics extra of jobqueue-redis)"
        ) from None
    metrics = PrometheusMetrics(daemon)
    try:
        server, _thread = prometheus_client.start_http_server(
            port, addr=host, registry=metrics.registry
        )
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    metrics._server = server
    metrics.port = int(server.server_port)
    log.info("metrics on http://%s:%d/metrics", host, metrics.port)
    return metrics


def for_daemon(
    daemon: str,
    port: int | None,
    host: str,
    jq: JobQueue,
    queues: Callable[[], Iterable[str]],
    queue_gauges: bool = False,
) -> Metrics:
    """What the CLI hands a daemon: :data:`NO_METRICS` without a port, else a served
    registry; with ``queue_gauges`` its queue-depth gauges follow ``queues()``."""
    if port is None:
        if queue_gauges:
            raise ConfigError("--queue-gauges exports on --metrics-port: give both")
        return NO_METRICS
    metrics = serve(daemon, port, host)
    if queue_gauges:
        metrics.watch_queues(jq, queues)
    return metrics
