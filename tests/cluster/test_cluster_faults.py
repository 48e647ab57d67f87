"""The guarantees on a real Redis Cluster when its nodes fail (docs/guarantees.md, "On Redis
Cluster"): a replica promoted while it lagged never reissues a fence its lost history issued;
a claim whose reply timed out is not sent again; one master down does not stop the workers on
the others. Each test drives the scripts or a worker against the session cluster and restores
it (every master with a live replica) before the next test."""

from __future__ import annotations

import itertools
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis
from cluster_launcher import Cluster, Node
from helpers import FAILING_OVER, LEASE_MS, claim_one, create, wait_for
from redis.crc import key_slot
from server_stall import stall

from jobqueue import JobQueue, Request
from jobqueue.errors import ConnectionFailed, Fatal, JobQueueError
from jobqueue.ops import queries as inspect
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.store.connection import sync_client
from jobqueue.store.keys import PartitionKeys, partition_of, queue_partition
from jobqueue.store.runs import (
    CLAIM,
    COMPLETE,
    FENCED_WRITE,
    HEARTBEAT,
)
from jobqueue.store.scripts import ScriptRunner, scripts
from jobqueue.worker.daemon import Worker

T = TypeVar("T")


def eventually(call: Callable[[], T], timeout: float = 30.0, what: str = "") -> T:
    """call() once it stops failing: a cluster that lost a master answers again after its
    failover (jobqueue's clients never re-send; callers retry, as the daemons do)."""
    answer: list[T] = []

    def answered() -> bool:
        answer.append(call())
        return True

    wait_for(answered, timeout, what or str(call), 0.1, retrying=FAILING_OVER)
    return answer[0]


def server_ms_past(node: Node, ms: int, timeout: float = 10.0) -> None:
    """Until the node's clock (the one that stamps what it does) reads past ``ms``."""

    def now_ms() -> int:
        with node.client() as c:
            seconds, micros = c.time()
        return int(seconds) * 1000 + int(micros) // 1000

    wait_for(lambda: now_ms() > ms, timeout, f"{node.address}'s clock past {ms}", 0.05)


@pytest.fixture
def runner(cluster_url: str) -> Iterator[ScriptRunner]:
    client = sync_client(cluster_url)
    yield ScriptRunner(client)
    client.close()


def test_a_replica_promoted_while_it_lagged_never_reissues_a_fence(
    cluster: Cluster, runner: ScriptRunner
) -> None:
    """Replication is asynchronous: a claim the master acknowledged may never reach its
    replica. The replica is cut off (stopped), w1 claims on the master, the master dies, the
    replica takes over without that claim: its fence counter and the record are behind. Its
    next fence must still be above w1's, so w1 (alive, stalled) is refused everywhere."""
    pk = PartitionKeys("lagging", 0)
    create(runner, pk, "r", now=None)
    slot = key_slot(pk.due.encode())
    master = cluster.master_of_slot(slot)
    replica = cluster.replica_of(master)
    cluster.wait_replicated()
    assert replica.process is not None
    # The replication link is cut: the replica stopped (it cannot reconnect), then its link
    # closed by the master (nothing written from now on reaches it, not even its socket).
    replica.process.send_signal(signal.SIGSTOP)
    try:  # whatever happens, the replica is let go (a stopped node breaks the next tests)
        with master.client() as c:
            # "slave": the type name redis-py 6.1 (the floor) accepts as well as newer ones
            assert c.client_kill_filter(_type="slave") == 1
        held = claim_one(runner, pk, owner="w1")  # acknowledged by the master alone
        master.kill()
    finally:
        replica.process.send_signal(signal.SIGCONT)
    try:
        with replica.client() as c:  # the lagging replica takes over (no vote needed)
            eventually(lambda: c.execute_command("CLUSTER", "FAILOVER", "TAKEOVER"), 10)
        eventually(lambda: cluster.serves(replica.port, slot) or _raise(), 30, "the takeover")
        # The promoted node never saw w1's claim: the run is pending there, and claimed again.
        taken = eventually(
            lambda: claim_one(runner, pk, owner="w2"), 30, "a claim on the new master"
        )
        assert taken.fence > held.fence
        stale_beat = runner.run(HEARTBEAT.call(pk, [("r", held.fence)], LEASE_MS))
        assert HEARTBEAT.parse(stale_beat).answers == ["fenced"]
        write = FENCED_WRITE.call(pk, "effect", held.fence, "w1", "r")
        assert FENCED_WRITE.parse(runner.run(write))[0] is False
        stale = COMPLETE.call(pk, [("r", held.fence, '"w1"')], 60_000)
        assert COMPLETE.parse(runner.run(stale))[0].status == "fenced"
        fresh = COMPLETE.call(pk, [("r", taken.fence, '"w2"')], 60_000)
        assert COMPLETE.parse(runner.run(fresh))[0].accepted
    finally:
        cluster.restore(master)


def _raise() -> bool:
    raise redis.exceptions.ConnectionError("not yet")


def test_a_claim_whose_reply_timed_out_is_not_sent_again_by_the_cluster_client(
    cluster: Cluster, cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster client's own retry (above its nodes' connections) re-sends a command after
    a timeout by default; a re-sent claim leases runs that nobody starts. Counted where the
    command leaves the client: the claim goes out once."""
    client = sync_client(cluster_url + "?socket_timeout=0.3")
    runner = ScriptRunner(client)
    pk = PartitionKeys("timeouts", 0)
    create(runner, pk, *(f"r{i}" for i in range(3)), now=None)
    runner.run(CLAIM.call(pk, 0, "w", LEASE_MS, 60_000))  # claim.lua is loaded
    claim_sha = scripts()["claim"].sha
    sent: list[int] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        packed = b"".join(command) if isinstance(command, list) else command
        if claim_sha.encode() in packed:
            sent.append(1)
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    node = cluster.master_of_slot(key_slot(pk.due.encode()))
    busy = stall(f"redis://127.0.0.1:{node.port}", 3.0)  # ten timeouts long
    try:
        with pytest.raises(ConnectionFailed, match=r"timed out|Timeout"):
            runner.run(CLAIM.call(pk, 1, "w", LEASE_MS, 60_000))
    finally:
        busy.join(10)
        client.close()
    time.sleep(0.3)  # kept: a window in which a re-send would have come
    assert len(sent) == 1


def test_one_master_down_does_not_stop_the_workers_on_the_others(
    cluster: Cluster, cluster_url: str
) -> None:
    """A worker on a 16-partition queue spread over three masters; one master is killed. The
    partitions of the two others keep completing runs at once (bound: within 3 s of the
    kill, both surviving masters have completed runs; before, one failing partition aborted
    every claim pass and commits and heartbeats went in one pipeline across all masters, and
    nothing completed anywhere for 12 s). After the failover every run is done."""
    jq = JobQueue.from_url(cluster_url, partitions={"default": 16})

    @jq.task
    def work(i: int) -> int:
        time.sleep(0.02)  # the work: a real duration
        return i

    handles = jq.enqueue_many(Request(work, (i,)) for i in range(1200))
    cluster.wait_replicated()
    victim = cluster.master_nodes()[0]
    survivors = [n for n in cluster.master_nodes() if n.port != victim.port]
    worker = Worker(jq, concurrency=8, lease=5, grace=5, install_signal_handlers=False)
    thread = threading.Thread(target=worker.run, name="faults-worker", daemon=True)
    thread.start()
    try:
        eventually(lambda: worker.stats.completed >= 100 or _raise(), 30, "the first runs")
        with survivors[0].client() as c:
            seconds, micros = c.time()
        killed_ms = seconds * 1000 + micros // 1000
        victim.kill()
        for node in survivors:  # the bound is on the masters' clocks
            server_ms_past(node, killed_ms + 3_000)
        finished_after: dict[int, int] = {}
        for node in survivors:
            with node.client() as c:
                for p in range(16):
                    pk = queue_partition("default", p, 16, True)
                    if cluster.serves(node.port, key_slot(pk.due.encode())):
                        finished_after[node.port] = finished_after.get(node.port, 0) + int(
                            c.zcount(pk.done, killed_ms, killed_ms + 3_000)
                        )
        assert all(finished_after.get(n.port, 0) > 0 for n in survivors), finished_after

        def all_done() -> bool:
            pipe = jq.redis.pipeline(transaction=False)
            for h in handles:
                pipe.hget(jq.keys_for("default", h.run_id).run(h.run_id), "state")
            return all(state == "done" for state in pipe.execute()) or _raise()

        eventually(all_done, 90, "every run done after the failover")
    finally:
        worker.stop()
        thread.join(30)
        jq.close()
        cluster.restore(victim)
    assert not thread.is_alive()


def migrate_slot(cluster: Cluster, slot: int, target: Node, pause: float = 0.003) -> int:
    """Move one slot the way `redis-cli --cluster reshard` does, key by key, slowly: SETSLOT
    IMPORTING and MIGRATING, MIGRATE of every key, SETSLOT NODE everywhere. The order is the
    one that hurts (any tool may produce it): run records and histories first, in random
    order, the partition's index keys last, so that scripts still run on the source while
    the records they name are gone. Returns the keys moved."""
    source = cluster.master_of_slot(slot)
    source_id, target_id = cluster.node_id(source), cluster.node_id(target)
    moved = 0
    with source.client() as src, target.client() as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100_000):
            random.shuffle(keys)
            keys.sort(key=lambda k: ":run:" not in k and ":hist:" not in k)
            for key in keys:
                # REPLACE: a key the target created meanwhile (a refused script does not)
                # must not stop the move.
                src.execute_command(
                    "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "REPLACE", "KEYS", key
                )
                moved += 1
                time.sleep(pause)  # kept: a slow move, key by key
        for node in cluster.master_nodes():
            with node.client() as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    return moved


def test_a_slot_migration_under_workers_a_scheduler_and_producers_loses_no_run(
    cluster: Cluster, cluster_url: str
) -> None:
    """A queue partition's slot and the scheduler partition's slot move to another master
    while two workers, a scheduler and a producer run. Before, scripts read run records they
    did not declare and a migrated record made them abort after their first writes: runs were
    left pending with no index entry, or leased to nobody (7 of 5,590 lost). Now a script
    that meets a moved key refuses before writing (TRYAGAIN), the daemons retry, and every
    run enqueued or fired ends done."""
    jq = JobQueue.from_url(cluster_url, partitions={"default": 4})
    runs_of: dict[str, int] = {}
    lock = threading.Lock()

    @jq.task
    def work(tag: str) -> str:
        time.sleep(0.03)  # a backlog that lasts the whole move
        with lock:
            runs_of[tag] = runs_of.get(tag, 0) + 1
        return tag

    @jq.task(max_attempts=1)
    def doomed() -> None:
        raise Fatal("dead on purpose")

    @jq.task
    def slow() -> None:
        time.sleep(6)  # kept: it holds its lease throughout the move

    for j in range(6):
        jq.schedule(f"tick-{j}", work, every=1, args=[f"tick-{j}"], misfire="fire-all")

    # Every index key of the moving partition exists while it moves (a dead run, a run that
    # holds its lease throughout): a claim's declared keys are then all on the source, and
    # it runs there while the records it reads are gone.
    doomed_ids = [f"doomed-{p}" for p in range(40)]
    jq.enqueue_many(Request(doomed, run_id=r) for r in doomed_ids)
    holders = [r for r in (f"hold-{i}" for i in range(200)) if partition_of(r, 4) == 0][:2]
    jq.enqueue_many(Request(slow, run_id=r) for r in holders)
    enqueued = [h.run_id for h in jq.enqueue_many(Request(work, (f"a{i}",)) for i in range(1500))]
    scheduler = Scheduler(jq, SchedulerConfig(interval=0.2), install_signal_handlers=False)
    workers = [
        Worker(jq, concurrency=8, lease=5, grace=5, install_signal_handlers=False)
        for _ in range(2)
    ]
    stop_producing = threading.Event()

    def produce() -> None:
        i = 0
        while not stop_producing.is_set():
            batch = [f"late-{i + k}" for k in range(10)]  # one create call per partition
            try:
                jq.enqueue_many(Request(work, (r,), run_id=r) for r in batch)
            except JobQueueError:
                continue  # refused for now (the slot is moving): the same run ids again
            enqueued.extend(batch)
            i += 10
            time.sleep(0.01)  # kept: the producer's pace

    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    threads.append(threading.Thread(target=scheduler.run, daemon=True))
    producer = threading.Thread(target=produce, daemon=True)
    for t in [*threads, producer]:
        t.start()
    pk_slot = key_slot(PartitionKeys("default", 0).due.encode())
    sched_slot = key_slot(b"{sched#0}")
    try:
        # The move starts under load: runs done, fires created, the producer producing.
        wait_for(lambda: any(t.startswith("tick-") for t in list(runs_of))
                 and len(enqueued) > 1500 and sum(runs_of.values()) >= 50, 30,
                 "the workers, the scheduler and the producer at work", 0.05)
        for slot in (pk_slot, sched_slot):
            source = cluster.master_of_slot(slot)
            target = next(n for n in cluster.master_nodes() if n.port != source.port)
            assert migrate_slot(cluster, slot, target) > 0
        time.sleep(1.0)  # kept: a window of work on the moved slots before the producer stops
        stop_producing.set()
        producer.join(10)
        scheduler.stop()
        threads[-1].join(20)  # its last tick may still be creating fires
        assert not threads[-1].is_alive()
        stopped_ms = time.time() * 1000
        # A listing taken while runs move between indexes may show a run twice or not at all
        # (docs: ops.listing); with claims paused and the last leases ended, nothing moves.
        jq.pause_queue("default")
        wait_for(lambda: not inspect.leases(jq, "default"), 30, "the runs in flight ended")
        # Every fire of every recurring job was created once: no gap in its fire times. Fires
        # created a lookahead early are still pending; the ones due by now must all run.
        fires: list[str] = []
        for j in range(6):
            created = sorted(
                (r.scheduled_for_ms or 0, r.run_id)
                for r in inspect.runs(jq, job=f"tick-{j}", limit=1000)
            )
            assert created, f"tick-{j} never fired"
            gaps = [(a, b - a) for (a, _), (b, _) in itertools.pairwise(created) if b - a != 1000]
            assert not gaps, (j, gaps)
            fires += [run_id for at, run_id in created if at <= stopped_ms]
        jq.resume_queue("default")

        def every_run_done() -> bool:
            pipe = jq.redis.pipeline(transaction=False)
            for run_id in [*enqueued, *holders, *fires]:
                pipe.hget(jq.keys_for("default", run_id).run(run_id), "state")
            states = pipe.execute()
            return all(s == "done" for s in states) or _raise()

        eventually(every_run_done, 90, "every enqueued run and every fire due done")
        orphans = sum(
            int(jq.redis.zcard(jq.partition_keys("default", p).orphans)) for p in range(4)
        )
        assert orphans == 0
        assert len(enqueued) > 1500
    finally:
        stop_producing.set()
        scheduler.stop()
        for w in workers:
            w.stop()
        for t in threads:
            t.join(20)
        jq.close()
    assert all(not t.is_alive() for t in threads)


def test_one_master_down_does_not_stop_the_scheduler_firing_on_the_others(
    cluster: Cluster, cluster_url: str
) -> None:
    """48 jobs firing every second into a 16-partition queue spread over three masters; a
    master that serves queue partitions (not the scheduler's own) is killed. Before, a batch
    of creates went in one pipeline across masters and failed whole: no job advanced, nothing
    new was created anywhere. Bound: within 3 s of the kill, every surviving master holds
    runs whose fire time is at least 1 s after the kill (the lookahead is 0.2 s, so they were
    created after it)."""
    jq = JobQueue.from_url(cluster_url, partitions={"default": 16})
    jq.declare_task("t")
    for j in range(48):
        jq.schedule(f"beat-{j}", "t", every=1)
    scheduler = Scheduler(
        jq, SchedulerConfig(interval=0.2, lookahead=0.2), install_signal_handlers=False
    )
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    sched_master = cluster.master_of_slot(key_slot(b"{sched#0}"))
    victim = next(n for n in cluster.master_nodes() if n.port != sched_master.port)
    survivors = [n for n in cluster.master_nodes() if n.port != victim.port]
    try:
        # The scheduler at work before the kill: a fire of every job created.
        wait_for(lambda: all(i.state.fired for i in jq.list_schedules()), 30,
                 "a fire of every job", 0.05)
        with sched_master.client() as c:
            seconds, micros = c.time()
        killed_ms = seconds * 1000 + micros // 1000
        victim.kill()
        for node in survivors:  # the bound is on the masters' clocks
            server_ms_past(node, killed_ms + 3_000)
        fired_after: dict[int, int] = {}
        for node in survivors:
            with node.client() as c:
                for p in range(16):
                    pk = queue_partition("default", p, 16, True)
                    if cluster.serves(node.port, key_slot(pk.due.encode())):
                        fired_after[node.port] = fired_after.get(node.port, 0) + int(
                            c.zcount(pk.due, killed_ms + 1000, "+inf")
                        )
        assert all(fired_after.get(n.port, 0) > 0 for n in survivors), fired_after
    finally:
        scheduler.stop()
        thread.join(20)
        jq.close()
        cluster.restore(victim)
    assert not thread.is_alive()
