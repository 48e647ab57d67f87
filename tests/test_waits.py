"""Waiting for a run without polling (jobqueue.client.waits): a listener per partition reads
its event log and wakes the waiters of a run at its finishing event; where the log cannot be
trusted (a lost connection, a trim past the listener's place, the log gone, the log off) the
waiters read their records again, so a wait never misses an outcome. Each fault test forces
its situation in one MULTI/EXEC: the event is gone before any reader could see it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from counting_proxy import CountingProxy
from helpers import claim_one, listener_blocked, make_worker, running, wait_for

from jobqueue.client import waits
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.client.waits import (
    OFF,
    Arming,
    ListenerState,
    Read,
    States,
    Watch,
)
from jobqueue.errors import RunTimeout
from jobqueue.handles import AsyncRunHandle, RunHandle
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.events import Losses
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, COMPLETE, CREATE_RUN, RunSpec
from jobqueue.store.scripts import scripts

PK = PartitionKeys("default", 0)


@pytest.fixture
def jq(redis_client: Any) -> JobQueue:
    q = JobQueue(redis_client)

    @q.task
    def add(x: int, y: int) -> int:
        return x + y

    return q


def claim_due(jq: JobQueue) -> tuple[str, int]:
    """The one due run of PK, claimed: its run id and fence."""
    run = claim_one(jq.scripts, PK, owner="w", retention_ms=60_000)
    return run.run_id, run.fence


def waiting(jq: JobQueue, run_id: str, timeout: float) -> tuple[threading.Thread, list[Any]]:
    """A thread waiting on the run; its outcome (the Run, or the error) lands in the list."""
    out: list[Any] = []

    def wait() -> None:
        try:
            out.append(RunHandle(jq, run_id, "default", False).wait(timeout=timeout))
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread, out


def record_reads(client: Any) -> int:
    """HGETALLs the server has run (a waiter's read of its run's record is one)."""
    stats = client.info("commandstats").get("cmdstat_hgetall", {})
    return int(stats.get("calls", 0))


# -- the listener's decisions (no I/O) ------------------------------------------------------


def state_with(*run_ids: str) -> tuple[ListenerState, dict[str, Watch]]:
    state = ListenerState(PK)
    watches = {r: Watch(r, 0.2, threading.Event()) for r in run_ids}
    for w in watches.values():
        state.add(w)
    state.armed(Arming("stream", "5-0", info={"entries-added": 10, "last-generated-id": "5-0"}),
                0.0, first=True)
    return state, watches


def test_a_finishing_event_wakes_that_runs_waiters_only() -> None:
    state, w = state_with("a", "b")
    info = {"entries-added": 12, "last-generated-id": "7-0"}
    woken = state.read(Read([("6-0", "a", "completed"), ("7-0", "b", "claimed")], info, False,
                            False), 1.0)
    assert woken == [w["a"]] and state.pos == "7-0"


@pytest.mark.parametrize(
    "happening",
    ["lost connection", "trimmed past", "log gone", "foreign log", "rearmed"],
)
def test_where_the_log_cannot_be_trusted_every_waiter_reads_again(happening: str) -> None:
    state, w = state_with("a", "b")
    if happening == "lost connection":
        woken = state.lost()
    elif happening == "trimmed past":  # one entry added since, none found after 5-0
        info = {"entries-added": 11, "last-generated-id": "6-0"}
        woken = state.read(Read([], info, False, False), 1.0)
    elif happening == "log gone":
        woken = state.read(Read([], None, True, False), 1.0)
    elif happening == "foreign log":
        woken = state.read(Read([], None, False, True), 1.0)
    else:
        state.need_arm = True
        woken = state.armed(Arming("stream", "0-0"), 1.0, first=False)
        assert state.pos == "0-0"  # the log went back: read it from there
    assert set(map(id, woken)) == {id(w["a"]), id(w["b"])}


def test_a_sweep_every_5_s_reads_the_states_and_wakes_the_finished() -> None:
    state, w = state_with("a", "b")
    assert not state.sweep_due(4.0) and state.sweep_due(5.0)
    assert state.swept(States(False, {"b"}), 5.0) == [w["b"]]
    assert not state.sweep_due(9.0) and state.sweep_due(10.0)
    assert state.swept(States(True, set()), 10.0) == [] and state.need_arm  # turned off: arm


def test_the_sweep_comes_every_5_s_however_busy_the_log_is() -> None:
    """A finish whose event was never written (the log off for a moment, a writer whose ACL
    lacks XADD) must not hide behind other runs' events."""
    state, _ = state_with("a")
    for t in range(1, 50):
        info = {"entries-added": 10 + t, "last-generated-id": f"{5 + t}-0"}
        state.read(Read([(f"{5 + t}-0", "other", "created")], info, False, False), t / 10)
    assert state.sweep_due(5.0)


def test_a_log_found_off_is_polled_and_armed_again_once_switched_on() -> None:
    state, w = state_with("a")
    state.need_arm = True
    assert state.armed(Arming("poll", "0-0", OFF), 1.0, first=False) == [w["a"]]
    assert state.sweep_due(1.0)  # polling: every pause
    state.swept(States(True, set()), 1.1)
    assert not state.need_arm
    state.swept(States(False, set()), 1.2)
    assert state.need_arm


def test_a_foreign_log_is_polled_without_every_waiter_reading_again() -> None:
    """Foreign data (or an ACL refusal) at the log: the listener reads the watched runs'
    states, and looks at the log again every 5 s without waking the waiters for it."""
    state, w = state_with("a", "b")
    state.need_arm = True
    state.armed(Arming("poll", "0-0", "foreign data"), 1.0, first=False)
    assert state.swept(States(False, set()), 1.1) == [] and not state.need_arm
    assert state.swept(States(False, {"a"}), 3.0) == [w["a"]] and not state.need_arm
    state.swept(States(False, set()), 6.0)
    assert state.need_arm
    assert state.armed(Arming("poll", "0-0", "foreign data"), 6.1, first=False) == []


# -- the log's losses (no I/O) -----------------------------------------------------------------


def caught_up_at(added: int, last: str) -> Losses:
    losses = Losses()
    losses.caught_up({"entries-added": added, "last-generated-id": last})
    return losses


def test_entries_trimmed_before_a_read_are_a_loss() -> None:
    losses = caught_up_at(10, "5-0")
    info = {"entries-added": 12, "last-generated-id": "7-0"}
    assert losses.check(info, ["7-0"], "5-0", 1_000)  # 6-0 was added, and never read


def test_a_full_read_that_reaches_the_logs_end_still_tells_a_trim() -> None:
    losses = caught_up_at(10, "5-0")
    info = {"entries-added": 15, "last-generated-id": "10-0"}
    assert losses.check(info, ["9-0", "10-0"], "5-0", 2)  # 6-0 to 8-0 gone


def test_a_log_made_again_is_a_loss() -> None:
    losses = caught_up_at(100, "5-0")
    assert losses.check({"entries-added": 1, "last-generated-id": "6-0"}, [], "6-0", 1_000)


def test_a_log_gone_back_behind_the_readers_place_is_a_loss_told_once() -> None:
    losses = caught_up_at(10, "9-0")
    info = {"entries-added": 8, "last-generated-id": "7-0"}
    assert losses.check(info, [], "9-0", 1_000)
    assert not losses.check(info, [], "9-0", 1_000)


def test_entries_all_read_are_no_loss() -> None:
    losses = caught_up_at(10, "5-0")
    info = {"entries-added": 12, "last-generated-id": "7-0"}
    assert not losses.check(info, ["6-0", "7-0"], "5-0", 1_000)
    info = {"entries-added": 13, "last-generated-id": "8-0"}
    assert not losses.check(info, ["8-0"], "7-0", 1_000)


# -- against a server: each fault forced in one transaction --------------------------------


@pytest.mark.real_only
def test_a_wait_returns_the_moment_the_run_finishes(jq: JobQueue, redis_client: Any) -> None:
    handle = jq.enqueue("add", 1, 2)
    thread, out = waiting(jq, handle.run_id, timeout=10)
    listener_blocked(redis_client)
    run_id, fence = claim_due(jq)
    jq.scripts.run(COMPLETE.call(PK, [(run_id, fence, "3")], 60_000))
    thread.join(5)
    assert out and out[0].result == 3


@pytest.mark.real_only
def test_a_wait_reads_the_record_again_after_its_listener_lost_the_connection(
    jq: JobQueue, redis_client: Any
) -> None:
    """The run completes, its event is deleted with the log, and the listener's connection is
    killed, all at once: only the read after reconnecting can tell the waiter (the next
    sweep would come after the wait's timeout)."""
    handle = jq.enqueue("add", 1, 2)
    run_id, fence = claim_due(jq)
    thread, out = waiting(jq, handle.run_id, timeout=4)
    listener = listener_blocked(redis_client)
    pipe = redis_client.pipeline(transaction=True)
    pipe.evalsha(*_call(jq, COMPLETE.call(PK, [(run_id, fence, "3")], 60_000)))  # type: ignore[arg-type]
    pipe.delete(PK.events)
    pipe.execute_command("CLIENT", "KILL", "ID", listener)
    pipe.execute()
    thread.join(6)
    assert out and not isinstance(out[0], Exception), out
    assert out[0].result == 3


@pytest.mark.real_only
def test_a_wait_reads_the_record_again_when_its_event_was_trimmed_before_it_was_read(
    jq: JobQueue, redis_client: Any
) -> None:
    handle = jq.enqueue("add", 1, 2)
    run_id, fence = claim_due(jq)
    thread, out = waiting(jq, handle.run_id, timeout=4)
    listener_blocked(redis_client)
    pipe = redis_client.pipeline(transaction=True)
    pipe.evalsha(*_call(jq, COMPLETE.call(PK, [(run_id, fence, "3")], 60_000)))  # type: ignore[arg-type]
    pipe.xtrim(PK.events, maxlen=0, approximate=False)
    pipe.execute()
    thread.join(6)
    assert out and not isinstance(out[0], Exception), out
    assert out[0].result == 3


@pytest.mark.real_only
def test_a_wait_on_a_queue_whose_events_are_off_reads_the_record(
    jq: JobQueue, redis_client: Any
) -> None:
    jq.set_queue_events("default", enabled=False)
    handle = jq.enqueue("add", 1, 2)
    assert redis_client.xlen(PK.events) == 0
    run_id, fence = claim_due(jq)
    reads = record_reads(redis_client)
    thread, out = waiting(jq, handle.run_id, timeout=4)
    wait_for(lambda: record_reads(redis_client) > reads, what="the waiter's first read")
    jq.scripts.run(COMPLETE.call(PK, [(run_id, fence, "3")], 60_000))
    thread.join(6)
    assert out and out[0].result == 3
    assert redis_client.xlen(PK.events) == 0  # none written meanwhile


@pytest.mark.real_only
def test_a_wait_reads_the_record_again_when_the_log_was_deleted_and_made_again(
    jq: JobQueue, redis_client: Any
) -> None:
    """The run completes, the log is deleted, and another run's enqueue makes a new one, in
    one transaction, while the listener blocks: the new log's count of entries tells it
    (before the 5 s sweep, after the wait's timeout)."""
    handle = jq.enqueue("add", 1, 2)
    run_id, fence = claim_due(jq)
    reads = record_reads(redis_client)
    thread, out = waiting(jq, handle.run_id, timeout=4)
    listener_blocked(redis_client)
    wait_for(lambda: record_reads(redis_client) > reads, what="the waiter's first read")
    pipe = redis_client.pipeline(transaction=True)
    pipe.evalsha(*_call(jq, COMPLETE.call(PK, [(run_id, fence, "3")], 60_000)))  # type: ignore[arg-type]
    pipe.delete(PK.events)
    pipe.evalsha(*_call(jq, CREATE_RUN.call(PK, [RunSpec("another", "add", "[1,1]")])))  # type: ignore[arg-type]
    pipe.execute()
    thread.join(6)
    assert out and not isinstance(out[0], Exception), out
    assert out[0].result == 3


@pytest.mark.real_only
def test_a_finish_without_its_event_is_found_by_the_sweep_while_other_events_flow(
    jq: JobQueue, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log is off for the moment the run completes, and on again; other runs' events keep
    coming: the sweep still comes (SWEEP_S made short here) and finds the finish."""
    monkeypatch.setattr(waits, "SWEEP_S", 0.3)
    handle = jq.enqueue("add", 1, 2)
    run_id, fence = claim_due(jq)
    reads = record_reads(redis_client)
    thread, out = waiting(jq, handle.run_id, timeout=4)
    listener_blocked(redis_client)
    wait_for(lambda: record_reads(redis_client) > reads, what="the waiter's first read")
    jq.set_queue_events("default", enabled=False)
    jq.scripts.run(COMPLETE.call(PK, [(run_id, fence, "3")], 60_000))
    jq.set_queue_events("default", enabled=True)
    deadline = time.monotonic() + 5
    while thread.is_alive() and time.monotonic() < deadline:
        jq.scripts.run(CREATE_RUN.call(PK, [RunSpec(f"busy-{time.monotonic()}", "add", "[]")]))
        time.sleep(0.05)  # kept: the pace of the other runs' events, while the sweep is due
    thread.join(1)
    assert out and not isinstance(out[0], Exception), out
    assert out[0].result == 3


@pytest.mark.real_only
def test_the_runs_a_sweep_finds_finished_are_read_in_one_call_and_handed_to_their_waiters(
    jq: JobQueue, redis_client: Any, proxy: CountingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs complete without their events (the log off for that one transaction): the sweep
    finds them, and the listener reads their records in one read_records call for all, as
    for runs whose events it read; no waiter reads its record again by itself. (Under load
    a sweep mid-way through a backlog of unread events finds hundreds of runs finished: each
    waiter's own read after it was one HGETALL per run.)"""
    monkeypatch.setattr(waits, "SWEEP_S", 0.3)
    n = 3
    for i in range(n):
        jq.enqueue("add", i, 1)
    runs = CLAIM.parse(jq.scripts.run(CLAIM.call(PK, n, "w", 30_000, 60_000))).runs
    assert len(runs) == n
    client = JobQueue.from_url(proxy.url())
    client.register_queue("default")  # (where the runs live: no look-up by the waiters)
    reads = record_reads(redis_client)
    waiters = [waiting(client, run.run_id, timeout=10) for run in runs]
    listener_blocked(redis_client)
    # Every waiter's first read ran (at the server) before the runs complete.
    wait_for(lambda: record_reads(redis_client) >= reads + n, what="the waiters' first reads")
    assert proxy.count(b"HGETALL") == n
    pipe = redis_client.pipeline(transaction=True)
    pipe.hset(PK.events_conf, "off", "1")
    for run in runs:
        pipe.evalsha(*_call(jq, COMPLETE.call(PK, [(run.run_id, run.fence, "7")], 60_000)))  # type: ignore[arg-type]
    pipe.hdel(PK.events_conf, "off")
    pipe.execute()
    for thread, _ in waiters:
        thread.join(10)
    outs = [out for _, out in waiters]
    assert all(out and not isinstance(out[0], Exception) for out in outs), outs
    assert [out[0].result for out in outs] == [7] * n
    assert proxy.count(b"HGETALL") == n  # the reads before the waits, no more
    assert proxy.count(b"EVALSHA") >= 1  # read_records, for the three
    client.close()


@pytest.mark.real_only
def test_a_wait_after_the_client_was_closed_still_returns(
    jq: JobQueue, redis_client: Any
) -> None:
    before = jq.enqueue("add", 0, 0)  # a client that waited before: its listeners made
    run_id, fence = claim_due(jq)
    jq.scripts.run(COMPLETE.call(PK, [(run_id, fence, "0")], 60_000))
    assert before.wait(timeout=2).result == 0
    jq.close()
    handle = jq.enqueue("add", 1, 2)
    run_id, fence = claim_due(jq)
    thread, out = waiting(jq, handle.run_id, timeout=4)
    listener_blocked(redis_client)
    jq.scripts.run(COMPLETE.call(PK, [(run_id, fence, "3")], 60_000))
    thread.join(6)
    assert out and not isinstance(out[0], Exception), out
    assert out[0].result == 3


@pytest.mark.real_only
def test_a_wait_in_progress_when_the_client_is_closed_goes_on_and_returns(
    jq: JobQueue, redis_client: Any
) -> None:
    """close() marks the client's listeners closed and wakes their waiters: each registers
    with a new listener and reads its record again (the client goes on after close, as
    redis-py's does)."""
    handle = jq.enqueue("add", 1, 2)
    run_id, fence = claim_due(jq)
    reads = record_reads(redis_client)
    thread, out = waiting(jq, handle.run_id, timeout=4)
    listener_blocked(redis_client)
    wait_for(lambda: record_reads(redis_client) > reads, what="the waiter's first read")
    jq.close()
    jq.scripts.run(COMPLETE.call(PK, [(run_id, fence, "3")], 60_000))
    thread.join(6)
    assert out and not isinstance(out[0], Exception), out
    assert out[0].result == 3


def test_a_wait_times_out_saying_the_runs_state(jq: JobQueue) -> None:
    handle = jq.enqueue("add", 1, 2)
    started = time.monotonic()
    with pytest.raises(RunTimeout, match="still pending"):
        handle.wait(timeout=0.3)
    assert time.monotonic() - started < 3


def _call(jq: JobQueue, call: Any) -> tuple[Any, ...]:
    """A script call as EVALSHA's arguments (the script loaded first)."""
    sha = jq.redis.script_load(scripts()[call.script].source)
    return (sha, len(call.keys), *call.keys, *call.args)


# -- 1,000 waits at once -------------------------------------------------------------------


@pytest.fixture
def proxy(real_server: EmbeddedServer) -> Iterator[CountingProxy]:
    p = CountingProxy(real_server.socket)
    yield p
    p.close()


@pytest.mark.real_only
def test_a_thousand_concurrent_async_waits_all_return_without_polling(
    jq: JobQueue, proxy: CountingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process awaits 1,000 results while two workers drain: every result arrives, and
    the waiting client reads each record once before its wait and once more at its event,
    in one script call for all the runs whose events one read brought, and nothing more: no
    poll (a poll every 5 ms doubling to 200 ms would read them many times over).

    The counts are those of the events' path: the listener's 5 s sweep (an HGET of every
    watched run's state, then their records in one call: its own tests above) is put past
    the waits' timeout, so that none comes. With it at 5 s, whether one fell within the
    drain was the machine's speed: under load the drain took 5 to 10 s, and a sweep then
    read the states of the hundreds of runs still watched (up to 700 HGETs: over 3 * n
    commands)."""
    monkeypatch.setattr(waits, "SWEEP_S", 120.0)  # > the waits' timeout (60 s)
    n = 1_000
    handles = [jq.enqueue("add", i, 1) for i in range(n)]

    async def wait_all() -> list[Any]:
        ajq = AsyncJobQueue.from_url(proxy.url())
        try:
            await ajq.register_queue("default")
            waits = [AsyncRunHandle(ajq, h.run_id, "default", False).result(timeout=60)
                     for h in handles]
            with running(make_worker(jq, concurrency=4)), running(make_worker(jq, concurrency=4)):
                return await asyncio.gather(*waits)
        finally:
            await ajq.close()

    results = asyncio.run(wait_all())
    assert results == [i + 1 for i in range(n)]
    assert proxy.count(b"HGETALL") <= n + 20  # the read before each wait
    assert proxy.count(b"EVALSHA") < n / 10  # read_records: a call reads many records
    assert proxy.count(b"XREAD") < n  # one blocking read serves many
    assert proxy.commands_sent() < 3 * n
