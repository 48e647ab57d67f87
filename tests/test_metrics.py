"""Prometheus metrics (``--metrics-port``): each test serves a private registry over HTTP on
127.0.0.1 (any free port), lets a real worker or scheduler work, scrapes ``/metrics`` and
checks the values. In-process daemons run on both backends; the CLI test is a real process
on the real server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import fake_clock, make_worker, running, wait_for
from prometheus_client.parser import text_string_to_metric_families

from jobqueue.cli import main
from jobqueue.client.sync import JobQueue
from jobqueue.context import RunContext
from jobqueue.errors import Fatal
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.runtime import queue_gauges
from jobqueue.runtime.metrics import NO_METRICS, PrometheusMetrics, serve
from jobqueue.settings import Settings
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.runs import CLAIM

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

ROOT = Path(__file__).resolve().parents[1]
FAST = Settings(backoff_base_s=0.02, backoff_cap_s=0.05)
S = 1000

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int | None) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def metrics() -> Iterator[PrometheusMetrics]:
    served = serve("worker", 0, "127.0.0.1")
    yield served
    served.close()


@pytest.fixture
def fast_jq(redis_client: Any) -> JobQueue:
    return JobQueue(redis_client, settings=FAST)


def test_worker_counts_claims_completions_failures_retries_deaths_and_fenced_commits(
    fast_jq: JobQueue, metrics: PrometheusMetrics
) -> None:
    attempts: dict[str, int] = {}
    started = threading.Event()

    @fast_jq.task
    def add(a: int, b: int) -> int:
        return a + b

    @fast_jq.task(max_attempts=3)
    def flaky_once(key: str) -> str:
        attempts[key] = attempts.get(key, 0) + 1
        if attempts[key] == 1:
            raise ValueError("first attempt fails")
        return "ok"

    @fast_jq.task
    def hopeless() -> None:
        raise Fatal("no retry can fix this")

    @fast_jq.task
    def cancelled_midway(ctx: RunContext) -> str:
        started.set()
        ctx.cancelled.wait(5)  # returns once the refused heartbeat has told us
        return "discarded"

    clock = fake_clock(fast_jq)
    worker = make_worker(fast_jq, lease=0.3, grace=2, metrics=metrics, clock=clock)
    with running(worker):
        ids = [fast_jq.enqueue(add, i, 1).run_id for i in range(3)]
        flaky = fast_jq.enqueue(flaky_once, "k").run_id
        ids.append(flaky)
        ids.append(fast_jq.enqueue(hopeless).run_id)
        victim = fast_jq.enqueue(cancelled_midway).run_id
        assert started.wait(5)
        fast_jq.cancel(victim, reason="operator")
        clock.advance(0.1)  # the next heartbeat (a third of the lease on) is refused
        wait_for(lambda: worker.stats.rejected_commits, what="the refused commit")
        wait_for(
            lambda: ((r := fast_jq.get_run(flaky)).attempt == 1 and r.state == "pending")
            or r.finished,
            what="the first attempt's retry",
        )
        clock.advance(0.05)  # the retry is due (backoff at most 50 ms)
        wait_for(lambda: all(fast_jq.get_run(r).finished for r in ids), what="runs to finish")

    metrics.refresh_depth(fast_jq, ["default"])
    got = scrape(metrics.port)
    q = {"queue": "default"}
    # 3 add + 2 flaky_once attempts + hopeless + cancelled_midway
    assert value(got, "jobqueue_runs_claimed_total", **q) == 7
    assert value(got, "jobqueue_runs_completed_total", **q) == 4
    assert value(got, "jobqueue_runs_failed_total", **q) == 2
    assert value(got, "jobqueue_runs_retried_total", **q) == 1
    assert value(got, "jobqueue_runs_dead_total", **q) == 1
    assert value(got, "jobqueue_commits_rejected_total", reason="cancelled", **q) == 1
    assert value(got, "jobqueue_leases_lost_total", reason="cancelled", **q) == 1
    assert value(got, "jobqueue_start_lateness_seconds_count", **q) == 7
    assert value(got, "jobqueue_heartbeat_seconds_count") >= 1
    assert value(got, "jobqueue_queue_runs", state="dead", **q) == 1
    assert value(got, "jobqueue_queue_runs", state="running", **q) == 0
    assert value(got, "jobqueue_daemon", daemon="worker") == 1


def test_start_lateness_is_claim_time_minus_due_time_on_the_server_clock(
    jq: JobQueue, metrics: PrometheusMetrics
) -> None:
    jq.declare_task("t")
    pk = jq.keys_for("default", "late")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="late"))
    due = int(jq.redis.zscore(pk.due, "late"))
    claim = CLAIM.parse(jq.scripts.run(CLAIM.call(pk, 1, "w", 1000, 1000, now=due + 7000)))
    metrics.claimed("default", claim.runs, claim.now_ms)
    got = scrape(metrics.port)
    assert value(got, "jobqueue_start_lateness_seconds_sum", queue="default") == 7.0
    assert value(got, "jobqueue_start_lateness_seconds_bucket", queue="default", le="5.0") == 0
    assert value(got, "jobqueue_start_lateness_seconds_bucket", queue="default", le="10.0") == 1


def test_queue_depth_and_lease_expiries_come_from_the_queue_stats(
    jq: JobQueue, metrics: PrometheusMetrics
) -> None:
    jq.declare_task("t")
    pk = jq.keys_for("default", "a")
    for run_id in ("a", "b", "c"):
        jq.enqueue(jq.resolve_task("t").with_options(run_id=run_id))
    jq.enqueue(jq.resolve_task("t").with_options(run_id="later", delay=3600))
    now = jq.server_time_ms()
    # Claim one run with a 1 ms lease, then claim again after it expired: one expiry.
    jq.scripts.run(CLAIM.call(pk, 1, "w1", 1, 1000, now=now))
    jq.scripts.run(CLAIM.call(pk, 1, "w2", 60_000, 1000, now=now + 10))
    metrics.refresh_depth(jq, ["default"])
    got = scrape(metrics.port)
    q = {"queue": "default"}
    assert value(got, "jobqueue_queue_runs", state="due", **q) == 2
    assert value(got, "jobqueue_queue_runs", state="running", **q) == 1
    assert value(got, "jobqueue_queue_runs", state="dead", **q) == 0
    assert value(got, "jobqueue_queue_lease_expiries", **q) == 1


def test_queue_depth_counts_the_workflow_runs_waiting_on_others(
    jq: JobQueue, metrics: PrometheusMetrics
) -> None:
    step = jq.declare_task("step")
    jq.chain(step.s(), step.s(), step.s())
    metrics.refresh_depth(jq, ["default"])
    got = scrape(metrics.port)
    assert value(got, "jobqueue_queue_runs", state="waiting", queue="default") == 2
    assert value(got, "jobqueue_queue_runs", state="due", queue="default") == 1


def in_group(jq: JobQueue, group: str, *run_ids: str) -> None:
    for run_id in run_ids:
        jq.enqueue(jq.resolve_task("t").with_options(run_id=run_id, limit_key=group))


def group_series(samples: Samples, queue: str = "default") -> set[str]:
    """The groups of ``queue`` that have series of their own."""
    return {dict(labels)["group"] for (name, labels) in samples
            if name == "jobqueue_group_served" and dict(labels)["queue"] == queue}  # fmt: skip


def test_group_gauges_count_each_groups_runs_waiting_running_and_served(
    jq: JobQueue, metrics: PrometheusMetrics
) -> None:
    jq.declare_task("t")
    jq.set_fair_shares("default")
    in_group(jq, "a", "a1", "a2", "a3")
    in_group(jq, "b", "b1")
    jq.scripts.run(CLAIM.call(jq.keys_for("default", "a1"), 1, "w1", 60_000, 1000))
    metrics.refresh_depth(jq, ["default"])
    got = scrape(metrics.port)
    a, b = {"queue": "default", "group": "a"}, {"queue": "default", "group": "b"}
    assert value(got, "jobqueue_group_runs", state="waiting", **a) == 2
    assert value(got, "jobqueue_group_runs", state="running", **a) == 1
    assert value(got, "jobqueue_group_served", **a) == 1
    assert value(got, "jobqueue_group_runs", state="waiting", **b) == 1
    assert value(got, "jobqueue_group_served", **b) == 0
    assert value(got, "jobqueue_groups", queue="default") == 2


def test_a_queue_without_fair_shares_exports_no_group_series(
    jq: JobQueue, metrics: PrometheusMetrics
) -> None:
    jq.declare_task("t")
    jq.set_group("default", "a", weight=2)  # a group's settings, fair shares never on
    in_group(jq, "a", "a1")
    metrics.refresh_depth(jq, ["default"])
    got = scrape(metrics.port)
    assert not [name for (name, _) in got if name.startswith("jobqueue_group")]


def test_turning_fair_shares_off_removes_the_queues_group_series(
    jq: JobQueue, metrics: PrometheusMetrics
) -> None:
    jq.declare_task("t")
    jq.set_fair_shares("default")
    in_group(jq, "a", "a1")
    metrics.refresh_depth(jq, ["default"])
    assert group_series(scrape(metrics.port)) == {"a"}
    jq.set_fair_shares("default", False)
    metrics.refresh_depth(jq, ["default"])
    got = scrape(metrics.port)
    assert not [name for (name, _) in got if name.startswith("jobqueue_group")]


def test_groups_beyond_the_busiest_are_summed_into_the_left_out_gauges(
    jq: JobQueue, metrics: PrometheusMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_gauges, "MAX_GROUP_SERIES", 2)
    jq.declare_task("t")
    jq.set_fair_shares("default")
    in_group(jq, "busy", "b1", "b2", "b3")
    in_group(jq, "middle", "m1", "m2")
    in_group(jq, "quiet", "q1")
    in_group(jq, "quieter", "r1")
    metrics.refresh_depth(jq, ["default"])
    got = scrape(metrics.port)
    assert group_series(got) == {"busy", "middle"}
    assert value(got, "jobqueue_groups", queue="default") == 4
    assert value(got, "jobqueue_groups_left_out_runs", queue="default", state="waiting") == 2


def test_a_group_no_longer_among_the_busiest_loses_its_series(
    jq: JobQueue, metrics: PrometheusMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_gauges, "MAX_GROUP_SERIES", 1)
    jq.declare_task("t")
    jq.set_fair_shares("default")
    in_group(jq, "first", "f1")
    metrics.refresh_depth(jq, ["default"])
    assert group_series(scrape(metrics.port)) == {"first"}
    in_group(jq, "second", "s1", "s2")
    metrics.refresh_depth(jq, ["default"])
    got = scrape(metrics.port)
    assert group_series(got) == {"second"}
    assert ("jobqueue_group_runs", (("group", "first"), ("queue", "default"),
                                    ("state", "waiting"))) not in got  # fmt: skip


def test_scheduler_counts_fires_misses_and_drops(jq: JobQueue) -> None:
    metrics = serve("scheduler", 0, "127.0.0.1")
    try:
        # Every 60 s, last fired at 120 s, scheduler down until 370 s: 180, 240, 300 and 360
        # are late; fire-all:2 fires the last two and drops the others.
        jq.schedule("report", "report_task", every=60, misfire="fire-all:2", now=120 * S)
        jq.schedule("skipper", "report_task", every=60, misfire="skip", now=120 * S)
        sched = Scheduler(
            jq, SchedulerConfig(lookahead=0), install_signal_handlers=False, metrics=metrics
        )
        report = sched.tick(now=370 * S)
        got = scrape(metrics.port)
    finally:
        metrics.close()
    assert report.runs_created == 2
    assert value(got, "jobqueue_scheduler_fires_total") == 2
    assert value(got, "jobqueue_scheduler_runs_created_total") == 2
    assert value(got, "jobqueue_scheduler_drops_total") == 2
    assert value(got, "jobqueue_scheduler_misses_total") == report.missed >= 4 + 2
    assert value(got, "jobqueue_daemon", daemon="scheduler") == 1


def test_metrics_off_is_a_no_op_that_serves_nothing(jq: JobQueue) -> None:
    jq.schedule("j", "t", every=60, now=0)
    sched = Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False)
    assert sched.metrics is NO_METRICS
    assert sched.tick(now=60 * S).runs_created == 1


def test_two_registries_in_one_process_count_separately() -> None:
    a, b = serve("worker", 0, "127.0.0.1"), serve("worker", 0, "127.0.0.1")
    try:
        a.committed("q", ok=True, accepted=True, status="done")
        assert value(scrape(a.port), "jobqueue_runs_completed_total", queue="q") == 1
        assert value(scrape(b.port), "jobqueue_runs_completed_total", queue="q") == 0
    finally:
        a.close()
        b.close()


def test_metrics_port_without_prometheus_client_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, real_server: EmbeddedServer
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    monkeypatch.chdir(ROOT / "docker")
    result = CliRunner().invoke(
        main,
        ["--redis-url", real_server.url, "--log-level", "WARNING", "scheduler", "--app",
         "example_app:jq",
         "--metrics-port", "0"],
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --metrics-port needs prometheus-client: pip install prometheus-client "
        "(the metrics extra of jobqueue-redis)"
    ]


def test_metrics_port_with_several_worker_processes_is_refused_before_any_starts() -> None:
    result = CliRunner().invoke(
        main, ["worker", "--app", "example_app:jq", "--processes", "2", "--metrics-port", "0"]
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --metrics-port serves one process: use it with --processes 1"
    ]


def test_worker_process_serves_metrics_on_its_metrics_port(real_server: EmbeddedServer) -> None:
    jq = JobQueue.from_url(real_server.url)
    jq.redis.flushall()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "docker"), str(ROOT)])}
    env.pop("JOBQUEUE_REDIS_URL", None)
    cmd = [sys.executable, "-m", "jobqueue.cli", "--redis-url", real_server.url, "worker",
           "--app", "example_app:jq", "--metrics-port", "0", "--grace", "1"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        port = None
        while port is None:
            line = proc.stderr.readline()
            assert line, "worker exited before serving metrics"
            if match := re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line):
                port = int(match.group(1))
        jq.declare_task("send_welcome_email")
        handle = jq.enqueue("send_welcome_email", 1, address="a@example.com")
        assert handle.wait(timeout=10).state == "done"
        got = wait_for(
            lambda: (s := scrape(port))
            and value(s, "jobqueue_runs_completed_total", queue="default") == 1
            and s,
            what="the completion to be counted",
        )
        assert value(got, "jobqueue_runs_claimed_total", queue="default") == 1
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0
