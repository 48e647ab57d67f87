"""Concurrency limits of a queue (issue 21): the client API (the asyncio one in test_aio.py),
a worker that never runs more than the limit, `jobqueue queue concurrency`, and the limit as
`queues`, `top`, the dashboard and the metrics show it. Both backends. The SIGKILL test is in
test_worker_processes.py, the script-level rules in test_script_limits.py."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterable

import pytest
from click.testing import CliRunner, Result
from helpers import advance_until, make_worker, running, wait_for
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from jobqueue import Request
from jobqueue.cli import State, main
from jobqueue.cli.top_view import render
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.errors import ConfigError
from jobqueue.models import QueueLimits
from jobqueue.ops import queries
from jobqueue.runtime.clock import FakeClock
from jobqueue.runtime.metrics import Metrics, serve
from jobqueue.store.runs import ClaimedRun


def invoke(jq: JobQueue, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq))


def test_set_queue_concurrency_sets_every_partition(jq: JobQueue) -> None:
    jq = JobQueue(jq.redis, partitions={"mail": 4})
    assert jq.set_queue_concurrency("mail", 3) is True
    assert [r.concurrency_limit for r in queries.stats(jq, "mail")] == [3] * 4


def test_set_queue_concurrency_says_whether_it_changed_the_limit(jq: JobQueue) -> None:
    changes = [jq.set_queue_concurrency("mail", n) for n in (3, 3, 5, None, None)]
    assert changes == [True, False, True, True, False]
    assert [r.concurrency_limit for r in queries.stats(jq, "mail")] == [None]


@pytest.mark.parametrize("bad", [-1, 0, 1.5, True, "3", 10**7])
def test_a_limit_that_is_not_a_count_is_refused_and_nothing_is_written(
    jq: JobQueue, bad: object
) -> None:
    with pytest.raises(ConfigError):
        jq.set_queue_concurrency("mail", bad)  # type: ignore[arg-type]
    assert jq.queues() == {}


def test_a_worker_never_runs_more_than_the_limit(fast_jq: JobQueue) -> None:
    lock = threading.Lock()
    running_now, most = [0], [0]
    done: list[int] = []

    @fast_jq.task
    def busy(i: int) -> None:
        with lock:
            running_now[0] += 1
            most[0] = max(most[0], running_now[0])
        time.sleep(0.02)  # kept: the run lasts, so that runs overlap and only the cap stops more
        with lock:
            running_now[0] -= 1
            done.append(i)

    fast_jq.set_queue_concurrency("default", 2)
    fast_jq.enqueue_many(Request(busy, (i,)) for i in range(20))
    with running(make_worker(fast_jq, concurrency=8)):
        wait_for(lambda: len(done) == 20, 30, "20 runs")
    assert most[0] == 2


def test_cli_queue_concurrency_sets_and_removes_the_limit(jq: JobQueue) -> None:
    first = invoke(jq, "queue", "concurrency", "mail", "3")
    again = invoke(jq, "queue", "concurrency", "mail", "3")
    assert (first.exit_code, again.exit_code) == (0, 0)
    assert "concurrency limit 3" in first.output and "nothing to do" in again.output
    (row,) = json.loads(invoke(jq, "queues", "--json").stdout)
    assert row["concurrency_limit"] == 3
    assert "no concurrency limit" in invoke(jq, "queue", "concurrency", "mail", "none").output
    (row,) = json.loads(invoke(jq, "queues", "--json").stdout)
    assert row["concurrency_limit"] is None


@pytest.mark.parametrize("command", ["concurrency", "rate"])
@pytest.mark.parametrize("limit", ["-1", "-3", "2.5"])
def test_cli_queue_limit_refuses_what_is_not_a_count_naming_the_rule(
    jq: JobQueue, command: str, limit: str
) -> None:
    result = invoke(jq, "queue", command, "mail", limit)
    assert result.exit_code == 2
    assert f"'{limit}' is not a whole number or 'none'" in result.output
    assert jq.queues() == {}


@pytest.mark.parametrize("command", ["concurrency", "rate"])
def test_cli_queue_limit_of_zero_is_refused_pointing_at_pause(jq: JobQueue, command: str) -> None:
    result = invoke(jq, "queue", command, "mail", "0")
    assert result.exit_code == 2
    assert "from 1 to" in result.output and "pause the queue" in result.output
    assert jq.queues() == {}


def test_cli_queue_rate_none_with_a_window_is_refused(jq: JobQueue) -> None:
    result = invoke(jq, "queue", "rate", "mail", "none", "--per", "5")
    assert result.exit_code == 2 and "'none' removes the limit" in result.output
    assert jq.queues() == {}


def test_cli_queues_has_a_limit_column(jq: JobQueue) -> None:
    jq.set_queue_concurrency("mail", 7)
    lines = invoke(jq, "queues").output.splitlines()
    assert lines[0].split()[-2:] == ["LIMIT", "RATE"] and lines[1].split()[-2:] == ["7", "-"]


def test_top_shows_the_limit_after_the_queue(jq: JobQueue) -> None:
    jq.set_queue_concurrency("mail", 7)
    assert any(line.startswith("mail (max 7)") for line in render(queries.top_snapshot(jq)))


def test_dashboard_shows_the_limit(jq: JobQueue) -> None:
    jq.set_queue_concurrency("mail", 7)
    page = TestClient(create_app(jq)).get("/queues").text
    assert "at most 7 at once" in page


def test_metrics_export_the_limit(jq: JobQueue) -> None:
    jq.set_queue_concurrency("mail", 7)
    jq.register_queue("open")
    metrics = serve("worker", 0, "127.0.0.1")
    try:
        metrics.refresh_depth(jq, ["mail", "open"])
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics") as reply:
            text = reply.read().decode()
    finally:
        metrics.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("jobqueue_queue_concurrency_limit", (("queue", "mail"),))] == 7
    assert samples[("jobqueue_queue_concurrency_limit", (("queue", "open"),))] == -1


# -- rate limits ---------------------------------------------------------------------------


def test_set_queue_rate_sets_every_partition(jq: JobQueue) -> None:
    jq = JobQueue(jq.redis, partitions={"mail": 4})
    assert jq.set_queue_rate("mail", 50, per=2) is True
    rows = queries.stats(jq, "mail")
    assert [(r.rate_limit, r.rate_window_ms) for r in rows] == [(50, 2_000)] * 4


def test_set_queue_rate_says_whether_it_changed_the_limit(jq: JobQueue) -> None:
    changes = [jq.set_queue_rate("mail", n) for n in (10, 10, 20, None, None)]
    assert changes == [True, False, True, True, False]


@pytest.mark.parametrize(
    ("limit", "per"),
    [(-1, 1.0), (0, 1.0), (True, 1.0), (10, 0), (10, -1), (10, float("nan")), (10, 1e9)],
)
def test_a_rate_that_is_not_one_is_refused_and_nothing_is_written(
    jq: JobQueue, limit: int, per: float
) -> None:
    with pytest.raises(ConfigError):
        jq.set_queue_rate("mail", limit, per=per)
    assert jq.queues() == {}


def test_a_rate_margin_widens_the_window_claims_are_counted_in(jq: JobQueue) -> None:
    assert jq.set_queue_rate("mail", 20, per=1, margin=0.05) is True
    assert jq.queue_limits("mail").rate == (20, 1_050)


@pytest.mark.parametrize("margin", [-0.1, 61, float("nan"), True])
def test_a_rate_margin_out_of_range_is_refused_and_nothing_is_written(
    jq: JobQueue, margin: float
) -> None:
    with pytest.raises(ConfigError, match="margin"):
        jq.set_queue_rate("mail", 20, margin=margin)
    assert jq.queues() == {}


def test_cli_queue_rate_margin_says_the_window_it_sets(jq: JobQueue) -> None:
    result = invoke(jq, "queue", "rate", "mail", "20", "--margin", "0.05")
    assert result.exit_code == 0, result.output
    said = "queue mail: rate limit 20 per 1s (+0.05s margin: a window of 1.05s)\n"
    assert result.stdout.endswith(said)
    assert jq.queue_limits("mail").rate == (20, 1_050)


class _Claims(Metrics):
    """How many runs each claim answered took, with the (server) time it was judged at."""

    def __init__(self) -> None:
        self.taken: list[tuple[int, int]] = []

    def claimed(self, queue: str, runs: Iterable[ClaimedRun], now_ms: int) -> None:
        self.taken.append((now_ms, len(list(runs))))

    def judged_since(self, ms: int) -> list[int]:
        """The runs taken by each claim judged at ``ms`` or later (the first one only: the
        worker claims again and again)."""
        return [n for at, n in self.taken if at >= ms][:1]


def test_a_worker_starts_no_more_runs_than_the_rate_allows(
    fast_jq: JobQueue, clock: FakeClock
) -> None:
    """On a fake clock (the server judges by it too): 2 runs per 10 s, 5 runs due; within the
    first window only 2 start, and the rest once the clock has moved past it."""
    started: list[str] = []

    @fast_jq.task
    def note(name: str) -> None:
        started.append(name)

    fast_jq.set_queue_rate("default", 2, per=10)
    fast_jq.enqueue_many(Request(note, (f"r{i}",), run_id=f"r{i}") for i in range(5))
    claims = _Claims()
    # The worker's blocking waits run on real time, capped by idle_wait: short here, so that a
    # window the fake clock passed is noticed at once even on a loaded machine; its lease long
    # enough that moving the clock never expires one (a run taken back would start twice).
    with running(make_worker(fast_jq, clock=clock, idle_wait=0.2, lease=120.0, metrics=claims)):
        wait_for(lambda: len(started) == 2, 10, "the window's two runs")
        clock.advance(1)
        moved_ms = clock.now_ms()
        # The worker claims again, at the clock's new time, and is refused by the rate.
        wait_for(lambda: claims.judged_since(moved_ms), 10, "a claim at the clock's new time")
        assert claims.judged_since(moved_ms) == [0]
        assert len(started) == 2
        advance_until(clock, lambda: len(started) >= 5, step=1, timeout=30)
    assert sorted(started) == [f"r{i}" for i in range(5)]  # each once


def test_cli_queue_rate_sets_and_removes_the_limit(jq: JobQueue) -> None:
    first = invoke(jq, "queue", "rate", "mail", "50", "--per", "2")
    assert first.exit_code == 0 and "rate limit 50 per 2s" in first.output
    again = invoke(jq, "queue", "rate", "mail", "50", "--per", "2")
    assert "nothing to do" in again.output
    lines = invoke(jq, "queues").output.splitlines()
    assert lines[0].split()[-1] == "RATE" and lines[1].split()[-1] == "50/2.0s"
    assert "no rate limit" in invoke(jq, "queue", "rate", "mail", "none").output
    (row,) = json.loads(invoke(jq, "queues", "--json").stdout)
    assert (row["rate_limit"], row["rate_window_ms"]) == (None, None)


def test_top_and_dashboard_show_the_rate(jq: JobQueue) -> None:
    jq.set_queue_rate("mail", 50)
    assert any(line.startswith("mail (50/1.0s)") for line in render(queries.top_snapshot(jq)))
    assert "at most 50 per 1.0s" in TestClient(create_app(jq)).get("/queues").text


def test_metrics_export_the_rate_per_second(jq: JobQueue) -> None:
    jq.set_queue_rate("mail", 50, per=2)
    metrics = serve("worker", 0, "127.0.0.1")
    try:
        metrics.refresh_depth(jq, ["mail"])
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics") as reply:
            text = reply.read().decode()
    finally:
        metrics.close()
    assert "jobqueue_queue_rate_limit{queue=\"mail\"} 25.0" in text


def test_show_says_what_holds_a_run_back(jq: JobQueue) -> None:
    jq.declare_task("t", queue="mail")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="a"))
    jq.set_queue_concurrency("mail", 3)
    jq.set_queue_rate("mail", 50, per=2)
    line = next(x for x in invoke(jq, "show", "a").output.splitlines() if x.startswith("queue"))
    assert line.endswith("mail (partition 0) - at most 3 running at once - at most 50/2.0s claimed")


def test_queue_limits_reads_both_limits(jq: JobQueue) -> None:
    assert jq.queue_limits("mail") == QueueLimits()
    jq.set_queue_concurrency("mail", 3)
    jq.set_queue_rate("mail", 50, per=2)
    assert jq.queue_limits("mail") == QueueLimits(3, (50, 2_000))


def test_queue_limits_is_still_the_concurrency_and_rate_pair(jq: JobQueue) -> None:
    """Code written before per-key and per-task limits unpacks or compares two values."""
    assert jq.queue_limits("mail") == (None, None)
    jq.set_queue_concurrency("mail", 3)
    jq.set_queue_rate("mail", 50, per=2)
    jq.set_queue_concurrency("mail", 2, per_key=True)
    concurrency, rate = jq.queue_limits("mail")
    assert (concurrency, rate) == (3, (50, 2_000)) == jq.queue_limits("mail")
    assert jq.queue_limits("mail").key_concurrency == 2
    assert jq.queue_limits("mail") != QueueLimits(3, (50, 2_000))  # the key cap differs
