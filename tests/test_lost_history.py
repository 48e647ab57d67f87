"""A server that lost part of its history never issues a fence it issued before; a full one
refuses a writing script whole. Real server only: restarts from an older snapshot and
maxmemory are the server's own behaviour.

Fences are at least the server clock in microseconds (lua/lib/fences.lua, next_fence): a server
restarted from an older snapshot (or a replica promoted after it lagged, see
tests/cluster/test_cluster_faults.py) has its clock ahead of every fence it lost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from helpers import LEASE_MS, PAYLOAD, claim_one, create

from jobqueue.errors import ServerRefused
from jobqueue.store.embedded import EmbeddedServer, find_server_binary
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import (
    BOUNCE,
    CANCEL,
    CLAIM,
    COMPLETE,
    CREATE_RUN,
    FAIL,
    FENCED_WRITE,
    HEARTBEAT,
    RELEASE,
    RunSpec,
)
from jobqueue.store.scripts import ScriptRunner

PK = PartitionKeys("default", 0)


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(find_server_binary()).start()
    yield srv
    srv.stop()


def restart_from_disk(srv: EmbeddedServer) -> None:
    """SIGKILL (nothing saved at exit) and start again on the same directory: the server
    loads the last snapshot it wrote."""
    assert srv.process is not None
    srv.process.kill()
    srv.process.wait(10)
    srv.process = None
    srv.socket.unlink(missing_ok=True)
    srv.start()


def test_a_restart_from_an_older_snapshot_never_reissues_a_fence(
    server: EmbeddedServer,
) -> None:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    runner = ScriptRunner(client)
    create(runner, PK, "r", now=None)
    client.save()  # the snapshot: the run pending, no fence issued yet
    held = claim_one(runner, PK, owner="w1")  # w1 holds a fence the snapshot does not know
    restart_from_disk(server)

    client = redis.Redis.from_url(server.url, decode_responses=True)
    runner = ScriptRunner(client)
    assert client.hget(PK.run("r"), "state") == "pending"  # w1's claim is lost with the crash
    taken = claim_one(runner, PK, owner="w2")
    assert taken.fence > held.fence
    # w1, alive and unaware, is refused everywhere; w2's work stands.
    beat = HEARTBEAT.call(PK, [("r", held.fence)], 1)
    assert HEARTBEAT.parse(runner.run(beat)).answers == ["fenced"]
    write = FENCED_WRITE.call(PK, "effect", held.fence, "w1", "r")
    assert FENCED_WRITE.parse(runner.run(write))[0] is False
    stale = COMPLETE.call(PK, [("r", held.fence, '"w1"')], 60_000)
    assert COMPLETE.parse(runner.run(stale))[0].status == "fenced"
    fresh = COMPLETE.call(PK, [("r", taken.fence, '"w2"')], 60_000)
    assert COMPLETE.parse(runner.run(fresh))[0].accepted
    assert client.hget(PK.run("r"), "result") == '"w2"'


WRITES = {
    "create_run": lambda held: CREATE_RUN.call(PK, [RunSpec("new", "t", PAYLOAD)]),
    "claim": lambda held: CLAIM.call(PK, 10, "w2", LEASE_MS, 60_000),
    "heartbeat": lambda held: HEARTBEAT.call(PK, [(held.run_id, held.fence)], LEASE_MS),
    "complete": lambda held: COMPLETE.call(PK, [(held.run_id, held.fence, "1")], 60_000),
    "fail": lambda held: FAIL.call(PK, held.run_id, held.fence, "boom", 1_000, 60_000),
    "release": lambda held: RELEASE.call(PK, held.run_id, held.fence),
    "bounce": lambda held: BOUNCE.call(
        PK, held.run_id, held.fence, "w1", "no task", delay_ms=1_000, delay_cap_ms=1_000,
        window_ms=3_600_000, dead_retention_ms=60_000,
    ),
    "cancel": lambda held: CANCEL.call(PK, held.run_id, 60_000, "stop"),
}


@pytest.mark.parametrize("script", sorted(WRITES))
def test_a_full_server_refuses_a_writing_script_whole_before_its_first_write(
    server: EmbeddedServer, script: str
) -> None:
    """maxmemory reached with noeviction. A claim's first write used to be a removal from the
    due index, which Redis lets through, and then its record writes went on past the limit
    (while heartbeats and commits were refused: the worst mix). The '#!lua' form of the
    scripts makes Redis refuse every writing call up front, whole."""
    client = redis.Redis.from_url(server.url, decode_responses=True)
    runner = ScriptRunner(client)
    create(runner, PK, *(f"r{i}" for i in range(20)), now=None)
    held = claim_one(runner, PK, owner="w1")
    before = {k: client.dump(k) for k in client.keys("*")}
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)  # full from now on
    try:
        with pytest.raises(ServerRefused, match="maxmemory"):
            runner.run(WRITES[script](held))
    finally:
        client.config_set("maxmemory", 0)
    assert {k: client.dump(k) for k in client.keys("*")} == before
