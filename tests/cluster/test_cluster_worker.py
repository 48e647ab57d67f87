"""A real Worker (in this process, its own threads) on the cluster: it drains a 16-partition
queue spread over three masters, and its round-robin claims reach every partition while one
partition is flooded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import pytest
from helpers import make_worker, running, wait_for, watch_idle_waits

from jobqueue import JobQueue, Request
from jobqueue.runtime.metrics import Metrics
from jobqueue.store.keys import partition_of
from jobqueue.store.runs import ClaimedRun


def done_count(jq: JobQueue, run_ids: list[str]) -> int:
    return sum(jq.get_run(r).state == "done" for r in run_ids)


def ids_in_partition(partition: int, count: int, partitions: int = 16) -> list[str]:
    out, i = [], 0
    while len(out) < count:
        if partition_of(f"p{partition}-{i}", partitions) == partition:
            out.append(f"p{partition}-{i}")
        i += 1
    return out


def test_a_worker_drains_a_16_partition_queue_spread_over_three_masters(
    cluster_url: str,
) -> None:
    jq = JobQueue.from_url(cluster_url, partitions={"default": 16})
    seen: list[int] = []

    @jq.task
    def double(x: int) -> int:
        seen.append(x)
        return 2 * x

    run_ids = [f"n-{i}" for i in range(300)]
    jq.enqueue_many(Request(double, (i,), run_id=r) for i, r in enumerate(run_ids))
    assert len({partition_of(r, 16) for r in run_ids}) == 16
    worker = make_worker(jq, concurrency=8, lease=None)
    with running(worker, join_timeout=20):
        wait_for(lambda: len(seen) >= 300, 30, "300 runs to execute")
        wait_for(lambda: worker.stats.completed >= 300, 10, "300 commits")
    assert sorted(seen) == list(range(300))  # each once
    assert done_count(jq, run_ids) == 300
    assert jq.get_run("n-7").result == 14
    assert (worker.stats.failed, worker.stats.fenced_out) == (0, 0)
    jq.close()


def test_round_robin_claims_reach_every_partition_while_one_is_flooded(cluster_url: str) -> None:
    jq = JobQueue.from_url(cluster_url, partitions={"default": 16})
    order: list[str] = []

    @jq.task
    def note(name: str) -> None:
        order.append(name)

    flood = ids_in_partition(0, 200)
    lonely = [ids_in_partition(p, 1)[0] for p in range(1, 16)]
    jq.enqueue_many(Request(note, (r,), run_id=r) for r in flood)  # flood first: oldest
    jq.enqueue_many(Request(note, (r,), run_id=r) for r in lonely)
    worker = make_worker(jq, concurrency=1, lease=None)
    with running(worker, join_timeout=20):
        wait_for(lambda: set(lonely) <= set(order), 30, "every partition's run")
    # One claim per free slot, starting one partition further each time: within two turns
    # of the 16 partitions, every lonely run has been served despite 200 older runs in p0.
    last_lonely = max(order.index(r) for r in lonely)
    assert last_lonely < 2 * 16, (last_lonely, order[:40])
    jq.close()


class _ClaimCalls(Metrics):
    """Counts the claim calls Redis answered (the claim loop calls ``claimed`` once each)."""

    def __init__(self) -> None:
        self.calls = 0

    def claimed(self, queue: str, runs: Iterable[ClaimedRun], now_ms: int) -> None:
        self.calls += 1


def test_an_idle_worker_on_a_cluster_looks_at_the_wake_lists_not_claims_every_partition(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its blocking wait is on one list at a time; the others' lengths are looked at in one
    pipelined round trip per master between waits: no claim until a token shows up."""
    jq = JobQueue.from_url(cluster_url, partitions={"default": 16})

    @jq.task
    def noop() -> None:
        return None

    calls = _ClaimCalls()
    waits = watch_idle_waits(monkeypatch)
    # The idle wait (8 s) is longer than the test: only tokens end a wait.
    with running(make_worker(jq, idle_wait=8.0, metrics=calls)):
        wait_for(lambda: calls.calls >= 16, what="the first claim of every partition")
        wait_for(waits.asleep, what="the worker asleep on its wake lists")
        idle_from = calls.calls
        # Kept: a window (several 0.5 s blocking waits, on several lists) with no claim.
        time.sleep(2.0)
        assert calls.calls == idle_from
        for partition in (3, 11):  # lists the worker is not blocked on, mostly
            (run_id,) = ids_in_partition(partition, 1)
            handle = jq.enqueue(noop.with_options(run_id=run_id))
            wait_for(lambda h=handle: jq.get_run(h.run_id).state == "done", timeout=5)


def test_a_paused_queue_spread_over_three_masters_hands_out_nothing_until_resumed(
    cluster_url: str,
) -> None:
    """The pause lives in each partition's slot (one key per partition, on its master), so it
    holds on every master; a second queue keeps running meanwhile."""
    jq = JobQueue.from_url(cluster_url, partitions={"held": 16, "open": 1})
    seen: list[str] = []

    @jq.task(queue="held")
    def held(name: str) -> None:
        seen.append(name)

    @jq.task(queue="open")
    def passing() -> str:
        return "ok"

    assert jq.pause_queue("held")
    run_ids = [f"h-{i}" for i in range(64)]
    jq.enqueue_many(Request(held, (r,), run_id=r) for r in run_ids)
    assert len({partition_of(r, 16) for r in run_ids}) == 16
    worker = make_worker(jq, queues=["held", "open"], concurrency=4, lease=None)
    with running(worker, join_timeout=20):
        # Each claim pass asks the 16 paused partitions first: once "open"'s run is done,
        # every one of them was asked (the worker sleeps between passes).
        jq.enqueue(passing.with_options(run_id="passing"))
        wait_for(lambda: jq.get_run("passing").state == "done", 30, "the open queue's run")
        wait_for(lambda: worker.stats.completed >= 1, 10, "its commit")
        assert seen == []
        assert jq.resume_queue("held")
        wait_for(lambda: len(seen) >= 64, 30, "the held runs after the resume")
    assert sorted(seen) == sorted(run_ids)
    jq.close()


def test_limits_hold_in_every_partition_of_a_queue_spread_over_three_masters(
    cluster_url: str,
) -> None:
    """A concurrency limit of 1 on a 4-partition queue over three masters: each partition's
    claims check the limit in its own slot, so at most one run per partition runs at once
    (at most 4 in all), whatever the worker's 16 slots."""
    jq = JobQueue.from_url(cluster_url, partitions={"default": 4})
    lock = threading.Lock()
    now: dict[int, int] = {}
    most: dict[int, int] = {}
    done: list[str] = []

    @jq.task
    def busy(name: str) -> None:
        p = partition_of(name, 4)
        with lock:
            now[p] = now.get(p, 0) + 1
            most[p] = max(most.get(p, 0), now[p])
        time.sleep(0.01)  # the work: a real duration
        with lock:
            now[p] -= 1
            done.append(name)

    assert jq.set_queue_concurrency("default", 1)
    run_ids = [f"c-{i}" for i in range(80)]
    jq.enqueue_many(Request(busy, (r,), run_id=r) for r in run_ids)
    assert len({partition_of(r, 4) for r in run_ids}) == 4
    with running(make_worker(jq, concurrency=16, lease=None), join_timeout=20):
        wait_for(lambda: len(done) >= 80, 60, "80 runs")
    assert most == {0: 1, 1: 1, 2: 1, 3: 1}
    jq.close()
