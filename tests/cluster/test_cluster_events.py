"""Event logs on a real cluster: a follower of a queue spread over the three masters reads
every partition's log (one slot per command: a pipelined read of each, then a short blocking
read of one in turn), resuming from a cursor; a wait goes on through a failover of the run's
master (its listener's connection fails, it arms again on the promoted replica and the waiter
reads the record)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from cluster_launcher import Cluster
from helpers import listener_blocked, wait_for
from redis.crc import key_slot

from jobqueue import JobQueue, Request
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.store.runs import CLAIM, COMPLETE


def test_a_follower_reads_every_partition_of_a_queue_over_the_masters(cjq: JobQueue) -> None:
    @cjq.task
    def t(i: int = 0) -> None: ...

    ids = [f"e{i}" for i in range(48)]
    stream = cjq.events("default", block=0.5)
    start = stream.start()
    cjq.enqueue_many(Request(t, (i,), run_id=r) for i, r in enumerate(ids))
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < len(ids):
        assert time.monotonic() < deadline, len(got)
        got += stream.read_batch()
    assert sorted(ev.run_id for ev in got) == sorted(ids)
    slots = {key_slot(cjq.keys_for("default", ev.run_id).events.encode()) for ev in got}
    assert len(slots) == 16  # every partition's log, wherever its master is
    middle = got[20]
    rest = list(cjq.events("default", since=middle.cursor, follow=False))
    assert sorted(ev.run_id for ev in rest) == sorted(ev.run_id for ev in got[21:])
    assert start  # (the follower's first cursor: every partition at its end)


def test_the_asyncio_client_follows_a_queue_on_the_cluster(cluster_url: str) -> None:
    jq = JobQueue.from_url(cluster_url, partitions={"default": 16})

    @jq.task
    def t() -> None: ...

    async def follow() -> list[str]:
        ajq = AsyncJobQueue.from_url(cluster_url, tasks=jq, partitions={"default": 16})
        try:
            out: list[str] = []
            async for ev in ajq.events("default", since=0, block=0.5):
                out.append(ev.run_id)
                if len(out) == 8:
                    break
            return out
        finally:
            await ajq.close()

    jq.enqueue_many(Request(t, (), run_id=f"a{i}") for i in range(8))
    try:
        assert sorted(asyncio.run(follow())) == sorted(f"a{i}" for i in range(8))
    finally:
        jq.close()


def test_a_wait_returns_through_a_failover_of_its_runs_master(
    cluster_url: str, cluster: Cluster
) -> None:
    jq = JobQueue.from_url(cluster_url, partitions={"default": 16})

    @jq.task
    def t() -> int:
        return 1

    handle = jq.enqueue(t.with_options(run_id="waited"))
    keys = jq.keys_for("default", "waited")
    cluster.wait_replicated()
    slot = key_slot(keys.events.encode())
    victim = cluster.master_of_slot(slot)
    heir = cluster.replica_of(victim)
    out: list[Any] = []

    def wait() -> None:
        try:
            out.append(handle.wait(timeout=60))
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    try:
        thread.start()
        with victim.client() as c:
            listener_blocked(c)  # its listener armed on the doomed master
        victim.kill()
        wait_for(lambda: cluster.serves(heir.port, slot), 30, "the replica to be promoted",
                 interval=0.05)

        def complete() -> bool:
            (run,) = CLAIM.parse(jq.scripts.run(CLAIM.call(keys, 1, "w", 30_000, 60_000))).runs
            jq.scripts.run(COMPLETE.call(keys, [(run.run_id, run.fence, "1")], 60_000))
            return True

        # The run completed on the promoted replica, by hand (no worker needed).
        wait_for(complete, 30, "the run completed on the promoted replica", interval=0.2,
                 retrying=(Exception,))
        thread.join(30)
        assert out and not isinstance(out[0], Exception), out
        assert out[0].state == "done" and out[0].result == 1
    finally:
        jq.close()
        cluster.restore(victim)
