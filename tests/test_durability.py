"""Settings.durable_replicas / durable_fsync: an enqueue returns only once the run is on the
replicas asked for (WAIT, on the connection that wrote it), else NotDurable; a worker's claims
wait the same way. Real servers only: a master and a replica of its own (fakeredis has no
replication)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from jobqueue import JobQueue, Settings
from jobqueue.errors import ConfigError, NotDurable
from jobqueue.store.embedded import EmbeddedServer, find_server_binary
from jobqueue.worker.daemon import Worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def master_and_replica() -> Iterator[tuple[EmbeddedServer, EmbeddedServer]]:
    port = free_port()
    master = EmbeddedServer(
        find_server_binary(), extra_args=("--port", str(port), "--repl-diskless-sync-delay", "0")
    ).start()
    replica = EmbeddedServer(
        find_server_binary(), extra_args=("--replicaof", "127.0.0.1", str(port))
    ).start()
    probe = redis.Redis.from_url(master.url)
    try:
        for _ in range(1000):  # until the replica's first sync is done
            if (probe.info("replication").get("slave0") or {}).get("state") == "online":
                break
            threading.Event().wait(0.01)
        else:
            raise AssertionError("the replica never came online")
        yield master, replica
    finally:
        probe.close()
        if replica.process is not None:
            replica.process.send_signal(signal.SIGCONT)
        replica.stop()
        master.stop()


def durable(url: str, **settings: object) -> JobQueue:
    return JobQueue.from_url(url, settings=Settings(durable_replicas=1, **settings))  # type: ignore[arg-type]


def test_a_durable_enqueue_returns_once_a_replica_has_the_run(
    master_and_replica: tuple[EmbeddedServer, EmbeddedServer],
) -> None:
    master, replica = master_and_replica
    jq = durable(master.url)
    jq.declare_task("t")
    handle = jq.enqueue(jq.resolve_task("t").with_options(run_id="kept"), 1)
    assert handle.created
    key = jq.keys_for("default", "kept").run("kept")
    assert redis.Redis.from_url(replica.url).hget(key, "state") == b"pending"


def test_a_durable_enqueue_many_waits_for_every_run(
    master_and_replica: tuple[EmbeddedServer, EmbeddedServer],
) -> None:
    master, replica = master_and_replica
    jq = JobQueue.from_url(
        master.url, settings=Settings(durable_replicas=1), partitions={"default": 4}
    )
    jq.declare_task("t")
    from jobqueue import Request

    handles = jq.enqueue_many(Request("t", (i,)) for i in range(50))
    copy = redis.Redis.from_url(replica.url)
    for h in handles:
        assert copy.exists(jq.keys_for("default", h.run_id).run(h.run_id))


def test_an_enqueue_no_replica_acknowledges_raises_not_durable_and_can_be_sent_again(
    master_and_replica: tuple[EmbeddedServer, EmbeddedServer],
) -> None:
    master, replica = master_and_replica
    jq = durable(master.url, durable_timeout_s=0.3)
    jq.declare_task("t")
    assert replica.process is not None
    replica.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(NotDurable, match="not acknowledged by 1 replica"):
            jq.enqueue(jq.resolve_task("t").with_options(run_id="maybe-lost"), 1)
    finally:
        replica.process.send_signal(signal.SIGCONT)
    assert jq.get_run("maybe-lost").state == "pending"  # written on the master all the same
    # Sent again from another connection, which never wrote the run: it is acknowledged only
    # once the replica has it.
    patient = durable(master.url, durable_timeout_s=10)
    patient.declare_task("t")
    assert replica.process is not None
    replica.process.send_signal(signal.SIGSTOP)
    resumed = threading.Timer(0.5, replica.process.send_signal, (signal.SIGCONT,))
    resumed.start()
    started = time.monotonic()
    again = patient.enqueue(
        patient.resolve_task("t").with_options(run_id="maybe-lost"), 1
    )  # idempotent: nothing written twice
    assert time.monotonic() - started >= 0.4, "acknowledged before the replica could have it"
    assert not again.created
    key = jq.keys_for("default", "maybe-lost").run("maybe-lost")
    assert redis.Redis.from_url(replica.url).hget(key, "state") == b"pending"


def test_durable_fsync_on_a_server_without_an_aof_is_a_configuration_error(
    master_and_replica: tuple[EmbeddedServer, EmbeddedServer],
) -> None:
    """WAITAOF needs Redis >= 7.2 and an AOF: either way, a clear error, not a silent pass."""
    master, _ = master_and_replica
    jq = durable(master.url, durable_fsync=True)
    jq.declare_task("t")
    with pytest.raises(ConfigError, match="WAITAOF"):
        jq.enqueue("t", 1)


def test_a_worker_with_durable_claims_completes_its_runs(
    master_and_replica: tuple[EmbeddedServer, EmbeddedServer],
) -> None:
    master, replica = master_and_replica
    jq = durable(master.url)

    @jq.task
    def double(x: int) -> int:
        return 2 * x

    handles = [jq.enqueue(double, i) for i in range(20)]
    worker = Worker(jq, concurrency=4, install_signal_handlers=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        runs = [h.wait(timeout=20) for h in handles]
    finally:
        worker.stop()
        thread.join(20)
    assert [r.result for r in runs] == [2 * i for i in range(20)]
    copy = redis.Redis.from_url(replica.url)
    owners = {copy.hget(jq.keys_for("default", h.run_id).run(h.run_id), "owner") for h in handles}
    assert owners == {worker.id.encode()}  # the claims reached the replica
