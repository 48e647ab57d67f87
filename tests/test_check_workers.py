"""``jobqueue check`` on workers and tasks: a queue whose due runs have a task that no live
worker serving the queue registers, or that no live worker serves at all, is a warning (its
runs would be handed back until they die at the end of the hand-back window)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis
from click.testing import CliRunner
from helpers import make_worker, running, wait_for

from jobqueue import queries
from jobqueue.cli import main
from jobqueue.client.sync import JobQueue
from jobqueue.policy.coverage import LiveWorker, coverage
from jobqueue.store.embedded import EmbeddedServer


def lines(checks: list[Any]) -> list[str]:
    return [c.line() for c in checks]


def test_a_queue_whose_tasks_all_have_a_live_worker_is_ok() -> None:
    got = coverage({"mail": Counter(send=3)}, [LiveWorker("w1", ("mail",), frozenset({"send"}))])
    assert lines(got) == [
        "ok    queue mail: every task of its 3 due runs seen is registered by one of its 1 "
        "live workers"
    ]


def test_a_task_no_live_worker_of_its_queue_registers_is_a_warning_naming_it() -> None:
    workers = [
        LiveWorker("w1", ("mail",), frozenset({"send"})),
        LiveWorker("w2", ("sms",), frozenset({"sync"})),  # another queue's: no help
    ]
    (check,) = coverage({"mail": Counter(send=1, sync=4)}, workers)
    assert not check.ok
    assert check.detail.startswith("queue mail: due runs of 'sync' (4) but none of its 1 live")


def test_a_queue_with_due_runs_and_no_live_worker_is_a_warning() -> None:
    (check,) = coverage({"mail": Counter(send=2)}, [LiveWorker("w", ("sms",), frozenset())])
    assert not check.ok
    assert "queue mail: 2 due runs seen and no live worker serves it" in check.detail


def test_workers_that_do_not_list_their_tasks_are_not_judged() -> None:
    (check,) = coverage({"mail": Counter(x=1)}, [LiveWorker("old", ("mail",), None)])
    assert check.ok and "not known" in check.detail


def test_a_queue_with_nothing_due_says_nothing() -> None:
    assert coverage({"mail": Counter()}, []) == []


def test_check_warns_about_a_task_seen_in_a_queue_that_no_live_worker_registers(
    real_server: EmbeddedServer,
) -> None:
    client = redis.Redis.from_url(real_server.url, decode_responses=True)
    client.flushall()
    worker_app = JobQueue(client)

    @worker_app.task(queue="mail")
    def send(to: str) -> None: ...

    producer = JobQueue(client)
    producer.declare_task("sync", queue="mail")
    producer.enqueue("sync", 1)
    # paused: the worker claims nothing, so the run stays due while check reads
    worker_app.pause_queue("mail")
    with running(make_worker(worker_app, worker_id="mail-worker")):
        wait_for(lambda: [w.id for w in queries.workers(worker_app)] == ["mail-worker"])
        result = CliRunner().invoke(main, ["--redis-url", real_server.url, "check"])
    assert result.exit_code == 1
    assert (
        "WARN  queue mail: due runs of 'sync' (1) but none of its 1 live workers registers "
        "the task" in result.stdout
    )
