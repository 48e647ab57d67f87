"""Per-key and per-task concurrency caps and per-key rates of a queue (issue 21): the run
option limit_key, the client API, a worker that never runs more than a key's cap, the CLI,
and what `show`, `queues`, the dashboard and the metrics say of parked runs. Both backends.
The script-level rules are in test_script_key_limits.py, the SIGKILL test in
test_worker_processes.py."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import claim, ids, make_worker, running, wait_for
from starlette.testclient import TestClient

from jobqueue import Dedupe, Request
from jobqueue.cli import State, main
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.errors import ConfigError
from jobqueue.models import QueueLimits
from jobqueue.ops import queries
from jobqueue.runtime.metrics import serve
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.scripts import ScriptRunner


def invoke(jq: JobQueue, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq))


def claimed_ids(jq: JobQueue, queue: str, limit: int = 10) -> list[str]:
    """Claim up to ``limit`` runs of ``queue`` (partition 0); their run ids."""
    pk = PartitionKeys(queue, 0)
    return ids(claim(ScriptRunner(jq.redis), pk, None, limit, retention_ms=3_600_000))


def parked_setup(jq: JobQueue) -> None:
    """Queue mail, one run per key at once; runs a and b of key customer:1: b is parked."""
    jq.declare_task("t", queue="mail")
    jq.set_queue_concurrency("mail", 1, per_key=True)
    for run_id in ("a", "b"):
        jq.enqueue(jq.resolve_task("t").with_options(run_id=run_id, limit_key="customer:1"))
    assert claimed_ids(jq, "mail") == ["a"]


# -- the run option ----------------------------------------------------------------------------


def test_a_run_keeps_its_limit_key(jq: JobQueue) -> None:
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="a", limit_key="customer:42"))
    assert jq.get_run("a").limit_key == "customer:42"


def test_a_run_without_a_limit_key_has_none(jq: JobQueue) -> None:
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="a"))
    assert jq.get_run("a").limit_key is None
    assert "limit_key" not in jq.redis.hgetall(PartitionKeys("default", 0).run("a"))


def test_enqueue_many_takes_the_limit_key_of_each_request(jq: JobQueue) -> None:
    jq.declare_task("t")
    jq.enqueue_many([Request("t", run_id="a", limit_key="k1"), Request("t", run_id="b")])
    assert (jq.get_run("a").limit_key, jq.get_run("b").limit_key) == ("k1", None)


@pytest.mark.parametrize("bad", ["", "x" * 257, "a\nb", 42])
def test_a_limit_key_that_is_not_sane_text_is_refused(jq: JobQueue, bad: Any) -> None:
    jq.declare_task("t")
    with pytest.raises(ConfigError):
        jq.enqueue(jq.resolve_task("t").with_options(limit_key=bad))
    assert jq.queues() == {}


def test_cli_enqueue_takes_a_limit_key(jq: JobQueue) -> None:
    result = invoke(jq, "enqueue", "t", "--run-id", "a", "--limit-key", "customer:7")
    assert result.exit_code == 0, result.output
    assert jq.get_run("a").limit_key == "customer:7"


# -- setting and reading the limits ------------------------------------------------------------


def test_queue_limits_reads_the_per_key_and_per_task_limits(jq: JobQueue) -> None:
    jq.set_queue_concurrency("mail", 3, per_key=True)
    jq.set_queue_rate("mail", 10, per=2, per_key=True)
    jq.set_queue_concurrency("mail", 2, task="export")
    assert jq.queue_limits("mail") == QueueLimits(None, None, 3, (10, 2_000), {"export": 2})


def test_none_removes_a_per_key_or_per_task_limit(jq: JobQueue) -> None:
    jq.set_queue_concurrency("mail", 3, per_key=True)
    jq.set_queue_concurrency("mail", 2, task="export")
    jq.set_queue_rate("mail", 10, per_key=True)
    changes = [
        jq.set_queue_concurrency("mail", None, per_key=True),
        jq.set_queue_concurrency("mail", None, task="export"),
        jq.set_queue_rate("mail", None, per_key=True),
    ]
    assert changes == [True, True, True]
    assert jq.queue_limits("mail") == QueueLimits()


@pytest.mark.parametrize(
    "kwargs",
    [{"per_key": True, "task": "x"}, {"task": ""}, {"per_key": True, "limit": 10_001}],
)
def test_a_cap_that_is_not_one_is_refused(jq: JobQueue, kwargs: dict[str, Any]) -> None:
    options = dict(kwargs)
    limit = options.pop("limit", 3)
    with pytest.raises(ConfigError):
        jq.set_queue_concurrency("mail", limit, **options)
    assert jq.queues() == {}


def test_cli_sets_the_per_key_and_per_task_limits(jq: JobQueue) -> None:
    outputs = [
        invoke(jq, "queue", "concurrency", "mail", "3", "--per-key").output,
        invoke(jq, "queue", "concurrency", "mail", "2", "--task", "export").output,
        invoke(jq, "queue", "rate", "mail", "5", "--per", "2", "--per-key").output,
    ]
    assert outputs[0].splitlines()[-1] == "queue mail: per-key concurrency limit 3"
    assert outputs[1].splitlines()[-1] == "queue mail: task export concurrency limit 2"
    assert outputs[2].splitlines()[-1] == "queue mail: per-key rate limit 5 per 2s"
    assert jq.queue_limits("mail") == QueueLimits(None, None, 3, (5, 2_000), {"export": 2})


def test_cli_refuses_per_key_and_task_together(jq: JobQueue) -> None:
    result = invoke(jq, "queue", "concurrency", "mail", "3", "--per-key", "--task", "x")
    assert result.exit_code == 2
    assert jq.queues() == {}


# -- a worker ----------------------------------------------------------------------------------


def test_a_worker_never_runs_more_than_a_keys_cap(fast_jq: JobQueue) -> None:
    lock = threading.Lock()
    running_now: dict[str, int] = {}
    most: dict[str, int] = {}
    done: list[int] = []

    @fast_jq.task
    def busy(i: int, key: str) -> None:
        with lock:
            running_now[key] = running_now.get(key, 0) + 1
            most[key] = max(most.get(key, 0), running_now[key])
        time.sleep(0.02)  # kept: the run lasts, so that runs overlap and only the cap stops more
        with lock:
            running_now[key] -= 1
            done.append(i)

    fast_jq.set_queue_concurrency("default", 2, per_key=True)
    fast_jq.enqueue_many(
        Request(busy, (i, f"k{i % 2}"), limit_key=f"k{i % 2}") for i in range(20)
    )
    with running(make_worker(fast_jq, concurrency=8)):
        wait_for(lambda: len(done) == 20, 30, "20 runs")
    assert most == {"k0": 2, "k1": 2}


# -- what shows it -----------------------------------------------------------------------------


def test_show_says_a_run_is_parked(jq: JobQueue) -> None:
    parked_setup(jq)
    lines = [" ".join(line.split()) for line in invoke(jq, "show", "b").output.splitlines()]
    assert "limit key customer:1" in lines
    assert "parked waiting for a slot of key:customer:1" in lines
    assert any(line.endswith("at most 1 running at once per key") for line in lines)


def test_show_json_has_the_limit_key_and_the_group(jq: JobQueue) -> None:
    parked_setup(jq)
    shown = json.loads(invoke(jq, "show", "b", "--json").output)
    assert (shown["limit_key"], shown["parked"]) == ("customer:1", "key:customer:1")


def test_queues_counts_the_parked_runs(jq: JobQueue) -> None:
    parked_setup(jq)
    assert [s.parked for s in queries.stats(jq, "mail")] == [1]
    header, row = invoke(jq, "queues").output.splitlines()[:2]
    assert header.split()[-4:] == ["PARKED", "KEY/TASK", "LIMIT", "RATE"]
    assert row.split()[-5:] == ["1", "key", "1", "-", "-"]


def test_the_dashboard_shows_the_parked_runs_and_the_caps(jq: JobQueue) -> None:
    parked_setup(jq)
    client = TestClient(create_app(jq))
    page = client.get("/queues").text
    assert "1 parked by a full cap" in page and "at most 1 per key at once" in page
    assert "waiting for a slot of key:customer:1" in client.get("/run?id=b&queue=mail").text


def test_the_metrics_export_the_parked_runs(jq: JobQueue) -> None:
    parked_setup(jq)
    metrics = serve("worker", 0, "127.0.0.1")
    try:
        metrics.refresh_depth(jq, ["mail"])
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics") as reply:
            text = reply.read().decode()
    finally:
        metrics.close()
    assert 'jobqueue_queue_parked{queue="mail"} 1.0' in text


def test_a_deduplicated_enqueue_keeps_its_limit_key(jq: JobQueue) -> None:
    jq.declare_task("t")
    handle = jq.enqueue(
        jq.resolve_task("t").with_options(dedupe=Dedupe("d1"), limit_key="customer:9")
    )
    assert jq.get_run(handle.run_id).limit_key == "customer:9"
