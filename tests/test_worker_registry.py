"""The worker registry (``jobqueue workers``): each worker's entry says its queues and tasks;
the entry of a worker that died without withdrawing is pruned once it missed 10 heartbeats
(by the live workers) or at once when stale (``jobqueue workers prune``)."""

from __future__ import annotations

import json
from typing import Any

import redis
from click.testing import CliRunner
from helpers import make_worker, running, wait_for

from jobqueue import queries
from jobqueue.cli import main
from jobqueue.cli.common import State
from jobqueue.client.sync import JobQueue
from jobqueue.ops import workers as registry
from jobqueue.store.embedded import EmbeddedServer

LEASE_MS = 30_000


def plant(jq: JobQueue, worker_id: str, seen_ago_ms: int) -> None:
    """The entry a worker left when it was last seen ``seen_ago_ms`` ago (then killed)."""
    seen = jq.server_time_ms() - seen_ago_ms
    entry = {"id": worker_id, "host": "h", "pid": 1, "queues": ["default"], "tasks": ["t"],
             "concurrency": 1, "started_ms": seen, "last_seen_ms": seen, "in_flight": 0,
             "lease_ms": LEASE_MS}  # fmt: skip
    registry.announce(jq, worker_id, json.dumps(entry), seen, LEASE_MS)


def ids(jq: JobQueue) -> list[str]:
    return [w.id for w in queries.workers(jq)]


def test_a_workers_entry_lists_its_queues_and_tasks(redis_client: Any) -> None:
    jq = JobQueue(redis_client)

    @jq.task(queue="mail")
    def send(to: str) -> None: ...

    with running(make_worker(jq, worker_id="w-mail")):
        (info,) = wait_for(lambda: list(queries.workers(jq)), what="the entry")
    assert (info.id, info.queues, info.tasks, info.stale) == ("w-mail", ["mail"], ["send"], False)


def test_a_live_worker_prunes_the_entry_of_one_silent_for_10_heartbeats(
    redis_client: Any,
) -> None:
    jq = JobQueue(redis_client)
    plant(jq, "killed-long-ago", seen_ago_ms=10 * LEASE_MS // 3 + 1_000)
    plant(jq, "killed-just-now", seen_ago_ms=4 * LEASE_MS // 3)  # stale, not yet pruned
    with running(make_worker(jq, worker_id="alive")):
        wait_for(lambda: "killed-long-ago" not in ids(jq), what="the old entry pruned")
        assert sorted(ids(jq)) == ["alive", "killed-just-now"]
    assert ids(jq) == ["killed-just-now"]  # the live one withdrew as it stopped


def test_workers_prune_removes_every_stale_entry_now(redis_client: Any) -> None:
    jq = JobQueue(redis_client)
    plant(jq, "stale", seen_ago_ms=4 * LEASE_MS // 3)
    plant(jq, "fresh", seen_ago_ms=0)
    runner = CliRunner()
    first = runner.invoke(main, ["workers", "prune"], obj=_state(jq))
    again = runner.invoke(main, ["workers", "prune"], obj=_state(jq))
    assert (first.exit_code, first.stdout) == (0, "pruned 1 stale workers: stale\n")
    assert (again.exit_code, again.stdout) == (0, "no stale workers (nothing to do)\n")
    assert ids(jq) == ["fresh"]


def test_workers_lists_the_registry_as_before(redis_client: Any) -> None:
    jq = JobQueue(redis_client)
    plant(jq, "fresh", seen_ago_ms=0)
    for args in (["workers", "--json"], ["workers", "list", "--json"]):
        result = CliRunner().invoke(main, args, obj=_state(jq))
        assert result.exit_code == 0, result.output
        assert [w["id"] for w in json.loads(result.stdout)] == ["fresh"]


def test_workers_list_shows_each_workers_number_of_tasks(redis_client: Any) -> None:
    jq = JobQueue(redis_client)
    plant(jq, "fresh", seen_ago_ms=0)
    result = CliRunner().invoke(main, ["workers"], obj=_state(jq))
    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()[:2]
    columns = header.split()
    assert columns[:5] == ["WORKER", "HOST", "PID", "QUEUES", "TASKS"]
    assert row.split()[:5] == ["fresh", "h", "1", "default", "1"]


def _state(jq: JobQueue) -> State:
    return State(None, jq)


def test_pruning_works_on_a_client_that_answers_bytes(real_server: EmbeddedServer) -> None:
    raw = redis.Redis.from_url(real_server.url)  # no decode_responses: replies are bytes
    raw.flushall()
    jq = JobQueue(raw)
    plant(jq, "killed-long-ago", seen_ago_ms=10 * LEASE_MS // 3 + 1_000)
    assert registry.prune_silent(jq, jq.server_time_ms(), keep="alive") == ["killed-long-ago"]
    assert raw.hlen("jq:workers") == 0
