"""The first six invariants of docs/design.md, each shown by tests that fail if it breaks.

1. A run id is created at most once, whatever the number of schedulers.
2. At most one completion of a run is accepted, and only with the current fence.
3. No run is lost: a run whose worker dies is claimed again after its lease expires.
4. Time that decides comes from one clock, the Redis server's.
5. Every script touches keys of one hash slot only.
6. Payloads are JSON; nothing is ever unpickled or imported from a string.
"""

from __future__ import annotations

import ast
import pickle
import random
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from fence_rule import fence_issued
from helpers import LEASE_MS, PAYLOAD, claim, create, until_call
from redis.crc import key_slot
from script_calls import Advance, advance_groups

from jobqueue import JobQueue, PayloadError, Request, UnknownTask
from jobqueue.client.flows import add_to_flow_steps, create_flow
from jobqueue.client.relay import settle_staged_steps, tidy_flows_steps
from jobqueue.payload import decode_payload
from jobqueue.store.admin import PAUSE, PURGE, REPAIR, SET_LIMIT
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.exact import GLOBAL_LIMIT, PERMIT_SETTLE, PERMIT_TAKE, ExactKeys
from jobqueue.store.groups import GROUP_SET
from jobqueue.store.keys import QUEUES_KEY, PartitionKeys, SchedKeys
from jobqueue.store.pages import INDEX_PAGE
from jobqueue.store.runs import (
    BOUNCE,
    CANCEL,
    CLAIM,
    COMPLETE,
    CREATE_RUN,
    FAIL,
    FENCED_WRITE,
    HEARTBEAT,
    PROGRESS,
    READ_RECORDS,
    RELEASE,
    REQUEUE,
    ClaimedRun,
    Outcome,
    RunSpec,
)
from jobqueue.store.schedules import ADVANCE, SCHED_DEFINE, SCHED_DUE, SCHED_LEASE
from jobqueue.store.scripts import SCRIPT_NAMES, Call, ScriptRunner
from jobqueue.tasks import Dedupe
from jobqueue.workflows.canvas import group_graph

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

ROOT = Path(__file__).resolve().parents[1]
RETENTION = 3_600_000


def sibling_client(redis_client: Any, backend: str, request: pytest.FixtureRequest) -> Any:
    """Another connection to the same server (what another process or thread would have)."""
    if backend == "fake":
        server = redis_client.connection_pool.connection_kwargs["server"]
        return fakeredis.FakeRedis(server=server, decode_responses=True)
    real: EmbeddedServer = request.getfixturevalue("real_server")
    return redis.Redis.from_url(real.url, decode_responses=True)


def race(n: int, action: Callable[[int], Any]) -> list[Any]:
    """Run action(i) in n threads released together by a barrier; return results in order."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = action(i)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    return results


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def complete(runner: ScriptRunner, pk: PartitionKeys, run_id: str, fence: int, now: int | None,
             result: str = "null") -> Outcome:
    call = COMPLETE.call(pk, [(run_id, fence, result)], RETENTION, now=now)
    (outcome,) = COMPLETE.parse(runner.run(call))
    return outcome


# == 1. created at most once ==================================================================


def test_inv1_eight_threads_racing_on_one_run_id_create_it_once(
    redis_client: Any, backend: str, request: pytest.FixtureRequest
) -> None:
    for round_ in range(3):
        run_id = f"report@{round_}"
        clients = [sibling_client(redis_client, backend, request) for _ in range(8)]
        queues = []
        for c in clients:
            jq = JobQueue(c)
            jq.declare_task("report")
            queues.append(jq)
        handles = race(8, lambda i, run_id=run_id, queues=queues: queues[i].enqueue(
            queues[i].resolve_task("report").with_options(run_id=run_id), i))
        assert sum(h.created for h in handles) == 1
        winner = next(i for i, h in enumerate(handles) if h.created)
        pk = PartitionKeys("default", 0)
        assert redis_client.hget(pk.stats, "created") == str(round_ + 1)
        assert redis_client.zcard(pk.due) == round_ + 1
        assert JobQueue(redis_client).get_run(run_id).args == [winner]
        for c in clients:
            c.close()


def test_inv1_eight_threads_racing_scripts_without_a_clock_create_once(
    redis_client: Any, backend: str, request: pytest.FixtureRequest
) -> None:
    """The scheduler path: the same batch of runs (several ids) from 8 schedulers at once."""
    pk = PartitionKeys("default", 0)
    ids = [f"job-{k}@60" for k in range(5)]
    runners = [ScriptRunner(sibling_client(redis_client, backend, request)) for _ in range(8)]

    def schedule(i: int) -> list[bool]:
        specs = [RunSpec(r, "t", PAYLOAD) for r in (ids if i % 2 else ids[::-1])]
        created = CREATE_RUN.parse(runners[i].run(CREATE_RUN.call(pk, specs)))
        return created if i % 2 else created[::-1]

    results = race(8, schedule)
    for k in range(len(ids)):
        assert sum(r[k] for r in results) == 1, k
    assert redis_client.hget(pk.stats, "created") == str(len(ids))
    assert redis_client.zcard(pk.due) == len(ids)


RACER = textwrap.dedent(
    """
    import sys, redis
    from jobqueue import JobQueue
    url, run_id, who = sys.argv[1], sys.argv[2], sys.argv[3]
    control = redis.Redis.from_url(url, decode_responses=True, socket_timeout=90)
    jq = JobQueue.from_url(url)
    jq.declare_task("report")
    jq.register_queue("default")
    jq.scripts.load()
    control.rpush("race:ready", who)
    assert control.blpop("race:go", timeout=60) is not None
    handle = jq.enqueue(jq.resolve_task("report").with_options(run_id=run_id), who)
    print("CREATED" if handle.created else "EXISTS", flush=True)
    """
)


@pytest.mark.slow
def test_inv1_eight_processes_racing_on_one_run_id_create_it_once(
    real_server: EmbeddedServer,
) -> None:
    # BLPOP waits longer than redis-py's default 5 s socket timeout while the children start
    client = redis.Redis.from_url(real_server.url, decode_responses=True, socket_timeout=90)
    client.flushall()
    run_id = f"nightly@{uuid.uuid4().hex}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, real_server.url, run_id, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for i in range(8)
    ]
    try:
        ready, deadline = 0, time.monotonic() + 60
        while ready < 8:
            assert time.monotonic() < deadline, "the racers did not start"
            crashed = [p.communicate()[1] for p in procs if p.poll() not in (None, 0)]
            assert not crashed, crashed
            ready += client.blpop("race:ready", timeout=1) is not None
        client.rpush("race:go", *["go"] * 8)
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * 8, [err for _, err in outputs]
    answers = [out.strip() for out, _ in outputs]
    assert sorted(answers) == ["CREATED"] + ["EXISTS"] * 7
    winner = answers.index("CREATED")
    run = JobQueue(client).get_run(run_id)
    assert run.args == [str(winner)]
    assert client.hget(PartitionKeys("default", 0).stats, "created") == "1"
    client.flushall()
    client.close()


# == 2. at most one accepted completion, only with the current fence ===========================


@pytest.mark.parametrize("stale_first", [True, False])
def test_inv2_after_reclaim_only_the_current_fence_completes(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, stale_first: bool
) -> None:
    create(runner, pk, "a")
    (w1,) = claim(runner, pk, now=0, owner="w1").runs
    assert claim(runner, pk, now=LEASE_MS - 1, owner="w2").runs == []
    (w2,) = claim(runner, pk, now=LEASE_MS, owner="w2").runs
    assert w2.fence == fence_issued(LEASE_MS, after=w1.fence) > w1.fence
    order = [(w1, '"from w1"'), (w2, '"from w2"')]
    if not stale_first:
        order.reverse()
    outcomes = {c.fence: complete(runner, pk, "a", c.fence, now=LEASE_MS + 10, result=res)
                for c, res in order}
    assert [f for f, o in outcomes.items() if o.accepted] == [w2.fence]
    assert outcomes[w1.fence].status in ("fenced", "finished")
    assert outcomes[w1.fence].current_fence == w2.fence
    assert redis_client.hget(pk.run("a"), "result") == '"from w2"'
    assert redis_client.hget(pk.stats, "completed") == "1"
    again = complete(runner, pk, "a", w2.fence, now=LEASE_MS + 20, result='"again"')
    assert (again.accepted, again.status) == (False, "finished")
    assert redis_client.hget(pk.run("a"), "result") == '"from w2"'


def test_inv2_stale_holder_cannot_fail_or_release_the_new_holders_run(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a")
    (w1,) = claim(runner, pk, now=0, owner="w1").runs
    (w2,) = claim(runner, pk, now=LEASE_MS, owner="w2").runs
    failed = runner.run(FAIL.call(pk, "a", w1.fence, "late", None, RETENTION, now=LEASE_MS + 1))
    assert not FAIL.parse(failed).accepted
    assert not RELEASE.parse(runner.run(RELEASE.call(pk, "a", w1.fence, now=LEASE_MS + 1))).accepted
    assert redis_client.hget(pk.run("a"), "state") == "running"
    assert complete(runner, pk, "a", w2.fence, now=LEASE_MS + 2).accepted


@pytest.mark.parametrize("how", ["lease-expiry", "release", "fail-retry", "cancel-requeue"])
def test_inv2_every_way_of_losing_a_run_fences_out_the_old_holder(
    runner: ScriptRunner, pk: PartitionKeys, how: str
) -> None:
    create(runner, pk, "a")
    (old,) = claim(runner, pk, now=0, owner="old").runs
    if how == "release":
        runner.run(RELEASE.call(pk, "a", old.fence, now=10))
    elif how == "fail-retry":
        runner.run(FAIL.call(pk, "a", old.fence, "x", 0, RETENTION, now=10))
    elif how == "cancel-requeue":
        runner.run(CANCEL.call(pk, "a", RETENTION, "x", now=10))
        runner.run(REQUEUE.call(pk, "a", now=11))
    (new,) = claim(runner, pk, now=LEASE_MS, owner="new").runs
    assert new.fence > old.fence
    assert not complete(runner, pk, "a", old.fence, now=LEASE_MS + 1).accepted
    assert complete(runner, pk, "a", new.fence, now=LEASE_MS + 2).accepted
    assert not complete(runner, pk, "a", new.fence, now=LEASE_MS + 3).accepted


def test_inv2_eight_threads_completing_with_the_current_fence_are_accepted_once(
    redis_client: Any, backend: str, request: pytest.FixtureRequest, pk: PartitionKeys
) -> None:
    runner = ScriptRunner(redis_client)
    for k in range(3):
        run_id = f"r{k}"
        create(runner, pk, run_id)
        (c,) = claim(runner, pk, now=None, limit=1).runs
        runners = [ScriptRunner(sibling_client(redis_client, backend, request)) for _ in range(8)]

        def commit(i: int, c: ClaimedRun = c, runners: list[ScriptRunner] = runners
                   ) -> Outcome:
            if i % 3 == 2:  # a few of them try to fail it instead: still one winner
                call = FAIL.call(pk, c.run_id, c.fence, f"e{i}", None, RETENTION)
                return FAIL.parse(runners[i].run(call))
            return complete(runners[i], pk, c.run_id, c.fence, now=None, result=str(i))

        outcomes = race(8, commit)
        assert sum(o.accepted for o in outcomes) == 1
        assert {o.status for o in outcomes if not o.accepted} == {"finished"}


def test_inv2_random_interleavings_never_accept_two_completions(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """Several workers with stale and current fences, random clocks and operations."""
    for seed in range(4):
        rng = random.Random(seed)
        run_ids = [f"s{seed}-{i}" for i in range(4)]
        for r in run_ids:
            create(runner, pk, r, now=0, max_attempts=50)
        held: list[tuple[str, int]] = []
        accepted: dict[str, int] = {}
        now = 0
        for _ in range(60):
            now += rng.choice([1, 500, LEASE_MS // 2, LEASE_MS])
            op = rng.random()
            if op < 0.35 or not held:
                held += [(c.run_id, c.fence) for c in claim(runner, pk, now=now, limit=2).runs]
                continue
            run_id, fence = rng.choice(held)
            current = int(redis_client.hget(pk.run(run_id), "fence"))
            state = redis_client.hget(pk.run(run_id), "state")
            if op < 0.7:
                outcome = complete(runner, pk, run_id, fence, now=now)
                if outcome.accepted:
                    assert fence == current and state == "running"
                    accepted[run_id] = accepted.get(run_id, 0) + 1
            elif op < 0.8:
                runner.run(FAIL.call(pk, run_id, fence, "x", 100, RETENTION, now=now))
            elif op < 0.9:
                runner.run(RELEASE.call(pk, run_id, fence, now=now))
            else:
                runner.run(HEARTBEAT.call(pk, [(run_id, fence)], LEASE_MS, now=now))
        assert all(n == 1 for n in accepted.values()), accepted
        assert accepted, "the random walk should complete something"
        done = [r for r in run_ids if redis_client.hget(pk.run(r), "state") == "done"]
        assert sorted(done) == sorted(accepted)


# == 3. no run is lost ========================================================================


def test_inv3_a_claimed_run_whose_worker_never_heartbeats_is_claimed_again(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a", now=1_000)
    (first,) = claim(runner, pk, now=1_000, owner="dies").runs
    assert claim(runner, pk, now=1_000 + LEASE_MS - 1, owner="w2").runs == []
    (again,) = claim(runner, pk, now=1_000 + LEASE_MS, owner="w2").runs
    assert (again.run_id, again.attempt, again.fence) == (
        "a", 2, fence_issued(1_000 + LEASE_MS, after=first.fence)
    )
    assert complete(runner, pk, "a", again.fence, now=1_000 + LEASE_MS + 1).accepted


def test_inv3_a_worker_that_dies_after_heartbeating_loses_its_runs_after_the_last_lease(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a")
    (c,) = claim(runner, pk, now=0, owner="dies").runs
    runner.run(HEARTBEAT.call(pk, [("a", c.fence)], LEASE_MS, now=20_000))
    assert claim(runner, pk, now=20_000 + LEASE_MS - 1, owner="w2").runs == []
    assert [r.run_id for r in claim(runner, pk, now=20_000 + LEASE_MS, owner="w2").runs] == ["a"]


def test_inv3_every_run_of_a_dead_worker_is_recovered(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    specs = [RunSpec(f"r{i}", "t", PAYLOAD) for i in range(25)]
    runner.run(CREATE_RUN.call(pk, specs, now=0))
    taken: list[str] = []
    while batch := claim(runner, pk, now=0, owner="dies", limit=10).runs:
        taken += [r.run_id for r in batch]
    assert len(taken) == 25
    recovered: dict[str, ClaimedRun] = {}
    while batch := claim(runner, pk, now=LEASE_MS, owner="w2", limit=10).runs:
        recovered.update({r.run_id: r for r in batch})
    assert sorted(recovered) == sorted(taken)
    for r in recovered.values():
        assert complete(runner, pk, r.run_id, r.fence, now=LEASE_MS + 1).accepted
    assert redis_client.zcard(pk.done) == 25
    assert redis_client.zcard(pk.leases) == 0


def test_inv3_a_run_past_its_attempts_is_dead_lettered_not_dropped(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a", max_attempts=1)
    claim(runner, pk, now=0, owner="dies")
    assert claim(runner, pk, now=LEASE_MS).runs == []
    assert redis_client.zscore(pk.dead, "a") == LEASE_MS
    assert "lease expired" in redis_client.hget(pk.run("a"), "error")
    assert REQUEUE.parse(runner.run(REQUEUE.call(pk, "a", now=LEASE_MS + 1))) == (
        True, "dead"
    )
    assert [r.run_id for r in claim(runner, pk, now=LEASE_MS + 1).runs] == ["a"]


def test_inv3_an_enqueued_run_whose_worker_dies_runs_again(jq: JobQueue) -> None:
    jq.declare_task("job", lease=5)
    jq.enqueue(jq.resolve_task("job").with_options(run_id="x"), 1)
    pk = jq.keys_for("default", "x")
    started = server_ms(jq.redis)
    (c,) = claim(jq.scripts, pk, now=started, owner="dies").runs
    assert c.lease_until_ms == started + 5_000
    (again,) = claim(jq.scripts, pk, now=started + 5_000, owner="w2").runs
    assert again.fence == fence_issued(started + 5_000, after=c.fence)
    assert jq.get_run("x").owner == "w2"


# == 4. one clock =============================================================================


def record_script_calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Every Call any ScriptRunner sends from now on, in order (the calls still run)."""
    calls: list[Call] = []
    # run_many and run_each send their pipelines through run_many_replies.
    original_run, original_many = ScriptRunner.run, ScriptRunner.run_many_replies

    def run(self: ScriptRunner, call: Call) -> Any:
        calls.append(call)
        return original_run(self, call)

    def run_many_replies(self: ScriptRunner, batch: Any) -> list[Any]:
        calls.extend(batch)
        return original_many(self, batch)

    monkeypatch.setattr(ScriptRunner, "run", run)
    monkeypatch.setattr(ScriptRunner, "run_many_replies", run_many_replies)
    return calls


def test_inv4_client_calls_never_pass_a_python_clock(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = record_script_calls(monkeypatch)
    jq = JobQueue(redis_client, partitions={"default": 3})
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="one", delay=10), 1)
    jq.enqueue_many(Request("t", (i,), run_id=f"j{i}@1") for i in range(6))
    jq.cancel("one")
    jq.requeue("one")
    assert {c.script for c in calls} >= {"create_run", "cancel", "requeue"}
    assert all(c.args[0] == "" for c in calls), [c.args[0] for c in calls]


def test_inv4_enqueued_times_come_from_redis_time(jq: JobQueue, redis_client: Any) -> None:
    jq.declare_task("t")
    lo = server_ms(redis_client)
    jq.enqueue(jq.resolve_task("t").with_options(run_id="now"))
    jq.enqueue(jq.resolve_task("t").with_options(run_id="later", delay=2.5))
    hi = server_ms(redis_client)
    for run_id, offset in (("now", 0), ("later", 2_500)):
        run = jq.get_run(run_id)
        assert run.created_ms is not None and run.due_ms is not None
        assert lo <= run.created_ms <= hi
        assert run.due_ms == run.created_ms + offset


@pytest.fixture
def real_client(real_server: EmbeddedServer) -> Iterator[Any]:
    client = redis.Redis.from_url(real_server.url, decode_responses=True)
    client.flushall()
    yield client
    client.flushall()
    client.close()


def test_inv4_a_wrong_python_clock_changes_nothing(
    real_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real server only: fakeredis's TIME *is* the Python clock, so it could not tell."""
    y2000 = 946_684_800.0
    monkeypatch.setattr(time, "time", lambda: y2000)
    monkeypatch.setattr(time, "time_ns", lambda: int(y2000 * 1e9))
    assert time.time() == y2000
    jq = JobQueue(real_client)
    jq.declare_task("t", lease=10)
    lo = server_ms(real_client)
    assert lo > (y2000 + 365 * 86_400) * 1000  # the server does not share our fake clock
    jq.enqueue(jq.resolve_task("t").with_options(run_id="a", delay=60))
    jq.enqueue(jq.resolve_task("t").with_options(run_id="b"))
    pk = jq.keys_for("default", "a")
    result = claim(jq.scripts, pk, now=None, owner="w")
    hi = server_ms(real_client)
    a, b = jq.get_run("a"), jq.get_run("b")
    assert a.created_ms is not None and b.created_ms is not None
    assert lo <= a.created_ms <= b.created_ms <= hi
    assert a.due_ms == a.created_ms + 60_000
    assert lo <= result.now_ms <= hi
    assert [r.run_id for r in result.runs] == ["b"]  # "a" is not due for a minute of server time
    assert lo + 10_000 <= result.runs[0].lease_until_ms <= hi + 10_000
    assert result.next_wake_ms == result.runs[0].lease_until_ms  # before a's due time
    assert result.next_wake_ms < a.due_ms


# == 5. one hash slot per script ===============================================================


def slots_of_call(call: Call) -> set[int]:
    """The slots of the call's KEYS and of every key prefix it passes as an argument."""
    slots = {key_slot(k.encode()) for k in call.keys}
    for arg in call.args:
        if isinstance(arg, str) and arg.startswith("jq:"):
            slots.add(key_slot((arg + "run:probe").encode()))
    return slots


def lifecycle(runner: ScriptRunner, jq: JobQueue, run_ids: list[str]) -> None:
    """Every script, for runs spread over the partitions of 'default' (and one other queue)."""
    jq.enqueue_many(Request("t", (i,), run_id=r) for i, r in enumerate(run_ids))
    jq.enqueue(jq.resolve_task("t").with_options(run_id="elsewhere", queue="other"))
    for key in ("user:1", "user:2", "user:3"):  # dedupe.lua, then a second time: throttled
        for _ in range(2):
            jq.enqueue(jq.resolve_task("t").with_options(dedupe=Dedupe(key)), key)
    for p in jq.all_partition_keys("default"):
        got = claim(runner, p, now=None, owner="w1", limit=100).runs
        HEARTBEAT.parse(runner.run(HEARTBEAT.call(p, [(c.run_id, c.fence) for c in got], LEASE_MS)))
        for i, c in enumerate(got):
            runner.run(FENCED_WRITE.call(p, f"res-{c.run_id}", c.fence, "v", c.run_id))
            runner.run(PROGRESS.call(p, c.run_id, c.fence, 50, "half"))
            if i % 4 == 0:
                runner.run(COMPLETE.call(p, [(c.run_id, c.fence, "1")], RETENTION))
            elif i % 4 == 1:
                runner.run(FAIL.call(p, c.run_id, c.fence, "boom", None, RETENTION))
            elif i % 4 == 2 and i % 8 == 2:
                runner.run(RELEASE.call(p, c.run_id, c.fence))
            elif i % 4 == 2:  # a worker without the task hands it back
                runner.run(BOUNCE.call(
                    p, c.run_id, c.fence, "w1", "no task", delay_ms=1, delay_cap_ms=1,
                    window_ms=RETENTION, dead_retention_ms=RETENTION,
                ))
            else:
                runner.run(CANCEL.call(p, c.run_id, RETENTION, "stop"))
        for i, c in enumerate(got):
            if i % 4 in (0, 3):
                runner.run(REQUEUE.call(p, c.run_id))
        dead = [c.run_id for i, c in enumerate(got) if i % 4 == 1]
        runner.run(PURGE.call(p, [*dead, "never-existed"]))
        if got:  # what a waiting client's listener reads at finishing events
            runner.run(READ_RECORDS.call(p, [*(c.run_id for c in got), "never-existed"]))
        # what a listing reads: a page of each index, after a place whose run left
        for index in (p.due, p.leases, p.waiting, p.dead, p.done):
            runner.run(INDEX_PAGE.call(index, "desc", after=("1", "gone"), count=5))
        runner.run(REPAIR.call(p, [c.run_id for c in got]))
        runner.run(PAUSE.call(p, True))
        runner.run(PAUSE.call(p, False))
        runner.run(SET_LIMIT.call(p, "concurrency", 2))
        runner.run(CLAIM.call(p, 10, "w", LEASE_MS, RETENTION))
        runner.run(SET_LIMIT.call(p, "concurrency", None))
        runner.run(SET_LIMIT.call(p, "rate", "1 60000"))
        runner.run(CLAIM.call(p, 10, "w", LEASE_MS, RETENTION))
        runner.run(SET_LIMIT.call(p, "rate", None))
        # fair shares: the ring's keys (group_set, then create and claim through groups)
        runner.run(GROUP_SET.call(p, True, "tenant", 2))
        runner.run(CREATE_RUN.call(p, [RunSpec(f"fair-{p.partition}", "t", "{}",
                                               limit_key="tenant")]))
        runner.run(CLAIM.call(p, 10, "w", LEASE_MS, RETENTION))
        runner.run(GROUP_SET.call(p, False))
    # exact limits: the permits of the queue, in the limit's own slot
    exact = ExactKeys("default")
    runner.run(GLOBAL_LIMIT.call(exact, "concurrency", 5))
    runner.run(GLOBAL_LIMIT.call(exact, "rate", "10 1000"))
    runner.run(PERMIT_TAKE.call(exact, 2, 30_000, "tok"))
    runner.run(PERMIT_SETTLE.call(exact, 30_000, [("tok:1", "p|r|1")], ["tok:2"], ["p|r|1"]))
    runner.run(PERMIT_SETTLE.call(exact, 30_000, returns=["p|r|1"]))
    jq.cancel("elsewhere")
    jq.requeue("elsewhere")
    flow(runner, jq)
    buffered_job(jq)  # before sched_lifecycle: its bare definitions are not runnable
    sched_lifecycle(runner)


def flow(runner: ScriptRunner, jq: JobQueue) -> None:
    """The workflow scripts: a step over the partitions waiting on six others and on an older
    run (flow_create, attach), and on a seventh one of them adds (extend), all of them
    finished and relayed (deliver, relayed)."""
    t = jq.resolve_task("t")
    older = jq.enqueue(t.with_options(run_id="older"))
    steps = {f"h{i}": t.s(i) for i in range(6)}
    jq.workflow({**steps, "last": t.s().after(*steps, older)}, flow_id="flow")
    jq.run_steps(add_to_flow_steps(jq, "flow:h0", "default", [("flow:h0+1", t.s(7))]))
    jq.run_steps(tidy_flows_steps(jq, jq.all_partition_keys("default")))  # (flow_tidy)
    for p in jq.all_partition_keys("default"):
        got = claim(runner, p, now=None, owner="w1", limit=100).runs
        runner.run(COMPLETE.call(p, [(c.run_id, c.fence, "1") for c in got], RETENTION))
    assert jq.relay("default") > 0
    # a staged workflow whose creator died before its commit, rolled back (flow_abort)
    dying = create_flow(jq, group_graph([t.s(i) for i in range(6)]), "dying")
    assert jq.run_steps(until_call(dying, "flow_commit")) is not None
    for p in jq.all_partition_keys("default"):
        jq.run_steps(settle_staged_steps(jq, p, 0))


def buffered_job(jq: JobQueue) -> None:
    """The scheduler's overlap scripts: a buffer-one job whose second run is held while the
    first is pending, then released once it completes, and its held entry forgotten
    (sched_create, sched_release, sched_unhold; explicit clock, server-side scripts)."""
    from jobqueue.recurring.config import SchedulerConfig
    from jobqueue.recurring.daemon import Scheduler

    s = 1000
    jq.schedule("buffered", "t", every=60, overlap="buffer-one", now=0)
    scheduler = Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False)
    scheduler.tick(now=60 * s)
    scheduler.tick(now=120 * s)  # the 60 s run is still pending: the 120 s run is held
    pk = jq.keys_for("default", "buffered@x")
    for run in CLAIM.parse(
        jq.scripts.run(CLAIM.call(pk, 10, "w", 30_000, 3_600_000, now=121 * s))
    ).runs:
        jq.scripts.run(COMPLETE.call(pk, [(run.run_id, run.fence, "1")], 3_600_000, now=122 * s))
    for now in (130, 180, 240):
        scheduler.tick(now=now * s)


def sched_lifecycle(runner: ScriptRunner) -> None:
    """The recurring-job scripts, on three scheduler partitions."""
    for k in range(3):
        sk = SchedKeys(k)
        job, definition = f"job-{k}", '{"task":"t","every":60}'
        assert SCHED_DEFINE.parse(runner.run(SCHED_DEFINE.call(
            sk, job, expected_definition=None, expected_next_ms=None, definition=definition,
            next_ms=60_000)))
        due = SCHED_DUE.parse(runner.run(SCHED_DUE.call(sk, 0, 10, now=60_000)))
        assert [j for segment in due.segments for j in segment.jobs] == [job]
        acquire = SCHED_LEASE.call(sk, "s", "acquire", 5_000, now=60_000)
        lease = SCHED_LEASE.parse(runner.run(acquire))
        move = Advance(job, 60_000, 120_000, fired=1, last_fire_ms=60_000, through_ms=60_000)
        call = ADVANCE.call(sk, advance_groups([move]), now=60_000, token=lease.token)
        assert ADVANCE.parse(runner.run(call)) == [True]
        assert SCHED_DEFINE.parse(runner.run(SCHED_DEFINE.call(
            sk, f"gone-{k}", expected_definition=None, expected_next_ms=None,
            definition=definition, next_ms=None)))
        assert SCHED_DEFINE.parse(runner.run(SCHED_DEFINE.call(
            sk, f"gone-{k}", expected_definition=definition, expected_next_ms=None,
            definition=None, next_ms=None)))


RUN_IDS = [f"job-{i}@{t}" for i in range(6) for t in (1, 2)] + ["{x}", "a}{b", "c@{d}"]


def test_inv5_every_script_call_names_keys_of_one_slot(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = record_script_calls(monkeypatch)
    jq = JobQueue(redis_client, partitions={"default": 4})
    jq.declare_task("t")
    lifecycle(ScriptRunner(redis_client), jq, RUN_IDS)
    assert {c.script for c in calls} == set(SCRIPT_NAMES)
    for call in calls:
        assert len(slots_of_call(call)) == 1, call
    assert len({next(iter(slots_of_call(c))) for c in calls}) >= 4


def test_inv5_every_stored_key_carries_its_partitions_hash_tag(redis_client: Any) -> None:
    jq = JobQueue(redis_client, partitions={"default": 4})
    jq.declare_task("t")
    lifecycle(ScriptRunner(redis_client), jq, RUN_IDS)
    # Partitions 1-3 of a queue (and of the scheduler store) are placed by a tag suffix; a
    # queue's exact limits have a tag of their own.
    tag = re.compile(
        r"^jq:(\{(?:default#[0-3]|other#0|sched#[0-2])(?:~[0-9A-Za-z]{3})?\}|\{default#exact\}):"
    )
    keys = list(redis_client.scan_iter("*"))
    assert len(keys) > 40
    used = set()
    for key in keys:
        # global: plain single-key commands only
        if key in (QUEUES_KEY, "jq:sched:config", "jq:schedulers"):
            continue
        m = tag.match(key)
        assert m, key
        assert key_slot(key.encode()) == key_slot(m.group(1)[1:-1].encode()), key
        used.add(m.group(1))
    assert len(used) == 9


def test_inv5_keys_touched_inside_each_script_share_one_slot(real_client: Any) -> None:
    """Real server only: keyspace notifications name every key each script writes, including
    the ones it builds from the prefix (run:, hist:), which no KEYS list shows."""
    runner = ScriptRunner(real_client)
    jq = JobQueue(real_client, partitions={"default": 4})
    jq.declare_task("t")
    jq.register_queue("default")
    jq.register_queue("other")
    runner.load()
    real_client.config_set("notify-keyspace-events", "KA")
    pubsub = real_client.pubsub()
    pubsub.psubscribe("__keyspace@0__:*")
    pubsub.subscribe("jq-test-marker")
    for _ in range(2):
        pubsub.get_message(timeout=1)  # the subscribe confirmations
    touched: list[tuple[Call, set[str]]] = []
    original_run = ScriptRunner.run

    def drain(n: int) -> set[str]:
        real_client.publish("jq-test-marker", str(n))
        keys: set[str] = set()
        while True:
            msg = pubsub.get_message(timeout=5)
            assert msg is not None, "keyspace notification stream stalled"
            if msg["type"] == "message" and msg["data"] == str(n):
                return keys
            # Not "expired"/"evicted": the server's own clock removes keys (a rate's grants
            # have a TTL) whatever script happens to run meanwhile.
            if msg["type"] == "pmessage" and msg["data"] not in ("expired", "evicted"):
                keys.add(msg["channel"].split(":", 1)[1])

    def run(self: ScriptRunner, call: Call) -> Any:
        drain(-1)
        reply = original_run(self, call)
        touched.append((call, drain(len(touched))))
        return reply

    def run_many_replies(self: ScriptRunner, batch: Any) -> list[Any]:
        return [run(self, c) for c in batch]  # one at a time, so each write is attributed

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ScriptRunner, "run", run)
            mp.setattr(ScriptRunner, "run_many_replies", run_many_replies)
            lifecycle(runner, jq, RUN_IDS)
    finally:
        real_client.config_set("notify-keyspace-events", "")
        pubsub.close()
    assert {c.script for c, _ in touched} == set(SCRIPT_NAMES)
    assert sum(len(keys) for _, keys in touched) > 50
    for call, keys in touched:
        expected = key_slot(call.keys[0].encode())
        assert {key_slot(k.encode()) for k in keys} <= {expected}, (call.script, keys)


# == 6. JSON only =============================================================================


@pytest.fixture
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("something tried to unpickle")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)


class Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("unpickled!",))


@pytest.mark.usefixtures("no_unpickling")
def test_inv6_a_pickled_payload_is_never_unpickled(
    jq: JobQueue, redis_client: Any, pk: PartitionKeys
) -> None:
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="victim"), 1)
    pickled = pickle.dumps(Boom(), protocol=0).decode("ascii")
    redis_client.hset(pk.run("victim"), "payload", pickled)
    run = jq.get_run("victim")
    assert run.payload == pickled
    with pytest.raises(PayloadError):
        _ = run.args
    with pytest.raises(PayloadError):
        _ = run.kwargs
    with pytest.raises(PayloadError):
        decode_payload(pickled)
    assert run.to_dict()["payload"] == pickled
    (claimed,) = claim(jq.scripts, pk, now=None).runs
    assert claimed.payload == pickled  # handed over as text; decoding it is the JSON decoder's job


@pytest.mark.usefixtures("no_unpickling")
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_inv6_decode_payload_refuses_pickle_bytes_of_every_protocol(protocol: int) -> None:
    data = pickle.dumps({"args": [1], "kwargs": {}}, protocol=protocol)
    with pytest.raises(PayloadError):
        decode_payload(data)  # type: ignore[arg-type]
    with pytest.raises(PayloadError):
        decode_payload(data.decode("latin-1"))


@pytest.mark.parametrize(
    "name", ["os.system", "os:system", "builtins.eval", "subprocess.Popen", "jobqueue.store.runs"]
)
def test_inv6_a_task_name_is_only_resolved_through_the_registry(jq: JobQueue, name: str) -> None:
    jq.declare_task("known")
    with pytest.raises(UnknownTask):
        jq.resolve_task(name)
    with pytest.raises(UnknownTask):
        jq.enqueue(name, 1)


# What turns bytes or text into objects or code: deserialisers and eval/exec ...
DESERIALISERS = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
                 "jsonpickle"}
EVALUATORS = {"eval", "exec", "compile"}
# ... and what turns a name into imported code.
IMPORTERS = {"importlib", "runpy", "pydoc", "pkgutil"}
IMPORT_CALLS = {"__import__", "import_module"}


def forbidden_uses(source: str, modules: set[str], names: set[str]) -> list[str]:
    """Imports of ``modules``; uses of ``names`` as a bare name (``eval(...)``, ``f = eval``) or
    an attribute (``builtins.eval``, ``importlib.import_module``). ``compile`` counts only
    bare, so ``re.compile`` is fine."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in modules]
        elif isinstance(node, ast.ImportFrom):
            if node.module and node.module.split(".")[0] in modules:
                found.append(node.module)
        elif isinstance(node, ast.Name) and node.id in names:
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in names - {"compile"}:
            found.append(f".{node.attr}")
    return found


def test_inv6_the_scanner_catches_what_it_looks_for() -> None:
    for bad in ("import pickle", "from marshal import loads", "import shelve as s",
                "x = eval('1')", "exec('pass')", "f = eval", "builtins.eval(x)",
                "compile('1', 'f', 'eval')"):
        assert forbidden_uses(bad, DESERIALISERS, EVALUATORS), bad
    for bad in ("import importlib.util", "from importlib import import_module",
                "m = __import__('os')", "mod.import_module(name)", "builtins.__import__('x')"):
        assert forbidden_uses(bad, IMPORTERS, IMPORT_CALLS), bad
    fine = "client.evalsha(sha, 0)\nimport json\nexecute = 1\nre.compile('x')\nself.locate(r)"
    assert forbidden_uses(fine, DESERIALISERS | IMPORTERS, EVALUATORS | IMPORT_CALLS) == []


def scan(modules: set[str], names: set[str]) -> dict[str, list[str]]:
    files = sorted((ROOT / "jobqueue").rglob("*.py"))
    assert len(files) > 5
    return {
        str(f.relative_to(ROOT)): uses
        for f in files
        if (uses := forbidden_uses(f.read_text(), modules, names))
    }


def test_inv6_no_jobqueue_module_unpickles_or_evaluates_code() -> None:
    assert scan(DESERIALISERS, EVALUATORS) == {}


def test_inv6_no_jobqueue_module_imports_code_by_name() -> None:
    """No importlib & co: task names come only from the registry the worker was given.

    The one import of a name from outside is ``jobqueue worker --app module:attr``, in
    cli/common.py's load_app: the operator's own command line naming the app that holds that
    registry (like ``celery -A``); nothing stored in Redis or sent by a user reaches it. The
    others are lazy loaders of jobqueue's own modules from fixed tables (``import jobqueue``
    and ``jobqueue --help`` import no client): every entry is one of jobqueue's modules. Any
    other use fails this test."""
    import jobqueue
    from jobqueue.cli.root import COMMANDS

    found = scan(IMPORTERS, IMPORT_CALLS)
    assert set(found) == {"jobqueue/cli/common.py", "jobqueue/__init__.py", "jobqueue/cli/root.py"}
    for path in found:
        assert (ROOT / path).read_text().count("import_module(") == 1, path
    common = (ROOT / "jobqueue" / "cli" / "common.py").read_text()
    load_app = common[common.index("def load_app("):]
    assert "importlib.import_module(" in load_app[: load_app.index("\ndef ")]
    init = (ROOT / "jobqueue" / "__init__.py").read_text()
    assert "importlib.import_module(home)" in init and "home = _HOMES.get(name)" in init
    assert all(home.startswith("jobqueue.") for home in jobqueue._HOMES.values())
    root = (ROOT / "jobqueue" / "cli" / "root.py").read_text()
    assert "importlib.import_module(found[0])" in root and "found = COMMANDS.get(" in root
    assert all(module.startswith("jobqueue.cli.") for module, _, _ in COMMANDS.values())


def test_inv6_no_lua_script_evaluates_a_string() -> None:
    scripts = sorted((ROOT / "lua").glob("*.lua"))
    assert len(scripts) >= len(SCRIPT_NAMES)
    bad = re.compile(r"\b(loadstring|dofile|loadfile|require|setfenv)\b|\bload\s*\(")
    offenders = {s.name: bad.findall(s.read_text()) for s in scripts if bad.search(s.read_text())}
    assert offenders == {}
