"""The direct lane: script calls on a per-thread connection, bypassing redis-py's command path
for speed, with the client's normal path (and its retries) as the fallback. Real server only:
the lane drives redis-py's own socket connections, which fakeredis does not use."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
from counting_proxy import CountingProxy

from jobqueue.errors import ConnectionFailed, ScriptError
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, CREATE_RUN, RunSpec
from jobqueue.store.scripts import Call, DirectLane, ScriptRunner

PK = PartitionKeys("default", 0)


@pytest.fixture
def client(real_server: EmbeddedServer) -> Iterator[Any]:
    c = redis.Redis.from_url(real_server.url, decode_responses=True)
    c.flushall()
    c.script_flush()
    yield c
    c.close()


def create(run_id: str) -> Call:
    return CREATE_RUN.call(PK, [RunSpec(run_id, "t", '{"args":[],"kwargs":{}}')])


def test_plain_redis_client_gets_a_direct_lane(client: Any) -> None:
    assert DirectLane.for_client(client) is not None


def test_fakeredis_and_cluster_like_clients_take_the_normal_path() -> None:
    assert DirectLane.for_client(fakeredis.FakeRedis()) is None
    assert DirectLane.for_client(object()) is None


def test_run_through_the_lane_creates_once_and_says_so(client: Any) -> None:
    runner = ScriptRunner(client)
    assert CREATE_RUN.parse(runner.run(create("r1"))) == [True]
    assert CREATE_RUN.parse(runner.run(create("r1"))) == [False]
    assert client.hget(PK.run("r1"), "state") == "pending"


def test_lane_recovers_noscript_after_a_script_flush(client: Any) -> None:
    runner = ScriptRunner(client)
    runner.run(create("a"))
    client.script_flush()
    assert CREATE_RUN.parse(runner.run(create("b"))) == [True]
    client.script_flush()
    assert [CREATE_RUN.parse(r) for r in runner.run_many([create("c"), create("a")])] == [
        [True],
        [False],
    ]


def test_lane_falls_back_when_its_connection_was_killed(client: Any) -> None:
    runner = ScriptRunner(client)
    runner.run(create("before"))
    # Kill every other client connection, the lane's included.
    client.client_kill_filter(skipme=True)
    assert CREATE_RUN.parse(runner.run(create("after"))) == [True]
    assert CREATE_RUN.parse(runner.run(create("again"))) == [True]
    assert client.exists(PK.run("after"), PK.run("again")) == 2


def test_pipelined_calls_after_a_killed_connection_still_run_once_each(client: Any) -> None:
    runner = ScriptRunner(client)
    runner.run(create("warm"))
    client.client_kill_filter(skipme=True)
    replies = runner.run_many([create("x"), create("y")])
    assert [CREATE_RUN.parse(r) for r in replies] == [[True], [True]]


def test_an_error_reply_in_a_pipeline_is_raised_and_the_other_calls_still_ran(
    client: Any,
) -> None:
    runner = ScriptRunner(client)
    other = PartitionKeys("other", 0)
    client.set(PK.due, "not a zset")  # create_run's ZADD on it fails with WRONGTYPE
    with pytest.raises(ScriptError, match="create_run"):
        runner.run_many(
            [create("z"), CREATE_RUN.call(other, [RunSpec("w", "t", '{"args":[],"kwargs":{}}')])]
        )
    assert client.hget(other.run("w"), "state") == "pending"


def test_each_thread_holds_its_own_connection(client: Any) -> None:
    runner = ScriptRunner(client)
    lane = runner._lane
    assert lane is not None
    barrier = threading.Barrier(4)
    seen: list[int] = []

    def work(name: str) -> None:
        runner.run(create(name))
        seen.append(id(lane._connection()))
        barrier.wait(timeout=10)  # all four alive at once: no connection was reused

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 4
    assert client.zcard(PK.due) == 4


def test_close_disconnects_the_lane_connections(client: Any) -> None:
    runner = ScriptRunner(client)
    runner.run(create("c1"))
    before = len(client.client_list())
    runner.close()
    # The server learns of a closed socket asynchronously: a CLIENT LIST on another
    # connection may still be answered first.
    deadline = time.monotonic() + 2
    while len(client.client_list()) != before - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(client.client_list()) == before - 1
    # and the runner still works afterwards (a new connection)
    assert CREATE_RUN.parse(runner.run(create("c2"))) == [True]


def test_a_call_whose_reply_timed_out_is_raised_not_sent_again(
    client: Any, real_server: EmbeddedServer
) -> None:
    """The reply comes later than the socket timeout (a server stalled by a slow script, a
    fork): the call is raised, not sent again (a re-sent claim would lease runs that nobody
    starts). Counted on the wire, through a proxy that holds the reply back until the test
    has seen the timeout: however busy the machine, the reply cannot win the race."""
    runner = ScriptRunner(client)
    specs = [RunSpec(f"r{i}", "t", '{"args":[],"kwargs":{}}') for i in range(3)]
    runner.run(CREATE_RUN.call(PK, specs))
    proxy = CountingProxy(real_server.socket)
    slow = redis.Redis.from_url(proxy.url("socket_timeout=0.3"), decode_responses=True)
    slow_runner = ScriptRunner(slow)
    slow_runner.run(CLAIM.call(PK, 0, "w", 30_000, 60_000))  # the lane is connected
    sent_before = proxy.count(b"EVALSHA")  # (and claim.lua loaded)
    proxy.hold_replies()
    try:
        with pytest.raises(ConnectionFailed, match="timed out"):
            slow_runner.run(CLAIM.call(PK, 1, "w", 30_000, 60_000))
        proxy.release_replies()
        time.sleep(0.3)  # what a re-send would still have done by now
        assert proxy.count(b"EVALSHA") == sent_before + 1  # the timed-out claim went once
        assert client.zcard(PK.leases) <= 1  # so at most one run leased
    finally:
        proxy.close()
        slow_runner.close()
        slow.close()
