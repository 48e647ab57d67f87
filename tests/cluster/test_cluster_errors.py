"""What a cluster in the middle of a failover raises (CLUSTERDOWN, TRYAGAIN, a slot with no
known master) is a passing outage, like a lost connection: script calls report it as
ConnectionFailed, which the worker's and the scheduler's retry loops wait out with back-off.
A cluster answering a script with a real error is still a ScriptError."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from jobqueue.errors import ConnectionFailed, ScriptError
from jobqueue.runtime.clock import FakeClock
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CANCEL
from jobqueue.store.scripts import ScriptRunner
from jobqueue.worker.daemon import until_redis_answers

CALL = CANCEL.call(PartitionKeys("default", 0), "r", 1000, "stop")


class Raising:
    """A client whose every script call (single or pipelined) raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def evalsha(self, *args: Any) -> Any:
        raise self.exc

    def pipeline(self, transaction: bool = False) -> Any:
        return self

    def execute_command(self, *args: Any) -> None:
        return None

    def execute(self, raise_on_error: bool = True) -> Any:
        raise self.exc


OUTAGES = [
    redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
    redis.exceptions.MasterDownError("MASTERDOWN Link with MASTER is down"),
    redis.exceptions.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
    redis.exceptions.SlotNotCoveredError('Slot "42" is not covered by the cluster.'),
    redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:7000."),
]


@pytest.mark.parametrize("exc", OUTAGES, ids=lambda e: type(e).__name__)
def test_a_cluster_outage_during_a_script_call_is_connection_failed(exc: BaseException) -> None:
    runner = ScriptRunner(Raising(exc))
    with pytest.raises(ConnectionFailed):
        runner.run(CALL)
    with pytest.raises(ConnectionFailed):
        runner.run_many([CALL, CALL])


def test_a_script_error_from_a_cluster_is_still_a_script_error() -> None:
    runner = ScriptRunner(Raising(redis.exceptions.ResponseError("ERR user_script:1: boom")))
    with pytest.raises(ScriptError):
        runner.run(CALL)


def test_a_redis_cluster_exception_is_translated_not_leaked() -> None:
    """redis-py's own cluster errors (no node reachable, redirected too often while a slot
    moves) are not RedisErrors: they become ConnectionFailed, which the daemons retry."""
    exc = redis.exceptions.RedisClusterException("Redis Cluster cannot be connected.")
    with pytest.raises(ConnectionFailed):
        ScriptRunner(Raising(exc)).run(CALL)


class InstantClock(FakeClock):
    """A fake clock whose waits pass at once (moving it on by their length)."""

    def wait(self, event: threading.Event, timeout: float) -> bool:
        self.advance(max(timeout, 0.0))
        return event.is_set()


@pytest.mark.parametrize("exc", OUTAGES, ids=lambda e: type(e).__name__)
def test_the_worker_waits_out_a_cluster_outage_and_carries_on(exc: BaseException) -> None:
    """The worker's retry loop (startup, reconnects): script calls retried until the cluster
    answers again, with back-off on a fake clock (no real waiting)."""
    outage = ScriptRunner(Raising(exc))
    attempts: list[int] = []

    def commit() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            outage.run_many([CALL])
        return "committed"

    assert until_redis_answers(commit, clock=InstantClock()) == "committed"
    assert len(attempts) == 3

