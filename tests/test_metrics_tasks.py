"""Per-task metrics (runs per task and outcome, a duration histogram), and the queue gauges
exported only by the daemon started with --queue-gauges."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import fake_clock, finished, make_worker, running, wait_for
from test_metrics import scrape, value

from jobqueue.cli import main
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError
from jobqueue.runtime.metrics import NO_METRICS, PrometheusMetrics, for_daemon, serve
from jobqueue.settings import Settings
from jobqueue.store.embedded import EmbeddedServer

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def metrics() -> Iterator[PrometheusMetrics]:
    served = serve("worker", 0, "127.0.0.1")
    yield served
    served.close()


def test_runs_are_counted_per_task_and_outcome_with_their_duration(
    redis_client: Any, metrics: PrometheusMetrics
) -> None:
    jq = JobQueue(redis_client, settings=Settings(backoff_base_s=0.01, backoff_cap_s=0.01))

    @jq.task
    def ok() -> int:
        return 1

    @jq.task(max_attempts=2)
    def bad() -> None:
        raise ValueError("boom")

    with running(make_worker(jq, metrics=metrics)):
        for _ in range(2):
            finished(jq, jq.enqueue(ok).run_id)
        finished(jq, jq.enqueue(bad).run_id)
    got = scrape(metrics.port)
    q = {"queue": "default"}
    assert value(got, "jobqueue_task_runs_total", task="ok", outcome="done", **q) == 2
    assert value(got, "jobqueue_task_runs_total", task="bad", outcome="retry", **q) == 1
    assert value(got, "jobqueue_task_runs_total", task="bad", outcome="dead", **q) == 1
    assert value(got, "jobqueue_task_duration_seconds_count", task="ok", outcome="done",
                 **q) == 2
    assert value(got, "jobqueue_task_duration_seconds_bucket", task="ok", outcome="done",
                 le="+Inf", **q) == 2


def test_the_duration_is_how_long_the_code_ran(jq: JobQueue, metrics: PrometheusMetrics) -> None:
    clock = fake_clock(jq)

    @jq.task
    def slow() -> None:
        clock.advance(7)  # the code "runs" 7 s of the worker's clock

    with running(make_worker(jq, metrics=metrics, clock=clock)):
        finished(jq, jq.enqueue(slow).run_id)
    got = scrape(metrics.port)
    labels = {"queue": "default", "task": "slow", "outcome": "done"}
    assert value(got, "jobqueue_task_duration_seconds_sum", **labels) == 7.0
    assert value(got, "jobqueue_task_duration_seconds_bucket", le="5.0", **labels) == 0
    assert value(got, "jobqueue_task_duration_seconds_bucket", le="10.0", **labels) == 1


def test_queue_gauges_only_with_queue_gauges(jq: JobQueue) -> None:
    jq.declare_task("t")
    jq.enqueue("t")
    plain = for_daemon("worker", 0, "127.0.0.1", jq, lambda: ["default"])
    exporter = for_daemon("worker", 0, "127.0.0.1", jq, lambda: ["default"], queue_gauges=True)
    try:
        assert isinstance(plain, PrometheusMetrics) and isinstance(exporter, PrometheusMetrics)
        assert not any(name == "jobqueue_queue_runs" for name, _ in scrape(plain.port))
        got = _scraped_when(exporter, lambda s: value(s, "jobqueue_queue_runs", queue="default",
                                                       state="due") == 1)
        assert value(got, "jobqueue_queue_runs", queue="default", state="due") == 1
    finally:
        plain.close()
        exporter.close()


def _scraped_when(metrics: PrometheusMetrics, ok: Any) -> Any:
    return wait_for(lambda: (s := scrape(metrics.port)) and ok(s) and s,
                    what="the first refresh of the queue gauges")


def test_queue_gauges_without_a_metrics_port_are_refused(jq: JobQueue) -> None:
    assert for_daemon("worker", None, "127.0.0.1", jq, lambda: []) is NO_METRICS
    with pytest.raises(ConfigError, match="--queue-gauges"):
        for_daemon("worker", None, "127.0.0.1", jq, lambda: [], queue_gauges=True)
    result = CliRunner().invoke(main, ["worker", "--app", "example_app:jq", "--queue-gauges"])
    assert result.exit_code == 2
    assert "--queue-gauges exports on --metrics-port: give both" in result.output


def test_a_scheduler_process_with_queue_gauges_exports_them(
    real_server: EmbeddedServer,
) -> None:
    jq = JobQueue.from_url(real_server.url)
    jq.redis.flushall()
    jq.declare_task("send_welcome_email")
    jq.enqueue("send_welcome_email", 1, address="a@example.com")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "docker"), str(ROOT)])}
    env.pop("JOBQUEUE_REDIS_URL", None)
    cmd = [sys.executable, "-m", "jobqueue.cli", "--redis-url", real_server.url, "scheduler",
           "--metrics-port", "0", "--queue-gauges", "--misfire-grace", "1"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        port = None
        while port is None:
            line = proc.stderr.readline()
            assert line, "scheduler exited before serving metrics"
            if match := re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line):
                port = int(match.group(1))
        got = wait_for(lambda: (s := scrape(port))
                       and value(s, "jobqueue_queue_runs", queue="default", state="due") == 1
                       and s, what="the queue gauges")
        assert value(got, "jobqueue_daemon", daemon="scheduler") == 1
    finally:
        proc.terminate()
        proc.wait(10)
