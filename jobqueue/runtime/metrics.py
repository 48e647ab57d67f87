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
  in the same refresh (jobqueue.runtime.queue_gauges), for at most ``MAX_GROUP_SERIES``
  groups per queue (those with the most runs waiting and running); the others are summed
  into the ``jobqueue_groups_left_out_*`` gauges, so the series stay bounded whatever the
  number of tenants;
* scheduler fires / misses / drops / skips / conflicts: each tick's report.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from jobqueue.errors import ConfigError
from jobqueue.runtime.queue_gauges import QueueGauges

if TYPE_CHECKING:
    from jobqueue.client.sync import JobQueue
    from jobqueue.store.runs import ClaimedRun

log = logging.getLogger("jobqueue.metrics")

DEPTH_REFRESH_S = 5.0
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
        self.queues = QueueGauges(r)
        self.sched = {
            name: Counter(f"jobqueue_scheduler_{name}", text, registry=r)
            for name, text in (
                ("fires", "Fire times this scheduler turned into runs (idempotent creates)."),
                ("runs_created", "Runs this scheduler created first."),
                ("misses", "Fire times missed (late past the misfire grace), per misfire policy."),
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
        """One refresh of the queue and group gauges (the thread's body; tests call it)."""
        self.queues.refresh(jq, queues)

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
