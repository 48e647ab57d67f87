"""Scheduler partitions owned by leases (issue 16): N schedulers share the K scheduler partitions
(each owns about K/N, so the herd is read and created once, not N times), a scheduler that
stops ticking loses its partitions when its leases expire, one that joins gets its fair share,
and a stale owner (paused past its lease) is fenced: its advance is refused and a hand-over
neither doubles nor loses a fire. Explicit clocks, both backends."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from script_calls import Advance, advance_groups

from jobqueue.cli import State, main
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.ops.scheduler_checks import checks as scheduler_checks
from jobqueue.policy.cron import parse_fire_instant
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.recurring.definitions import ENV_SCHED_PARTITIONS
from jobqueue.recurring.membership import read_members, read_owners
from jobqueue.recurring.registry import SCHEDULERS_KEY, members_steps, owners_steps
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.schedules import ADVANCE, SCHED_LEASE, Moved

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

S = 1000
K = 8
LEASE = 5.0  # s: the default partition lease


@pytest.fixture(autouse=True)
def k_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SCHED_PARTITIONS, str(K))


def one_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SCHED_PARTITIONS, "1")


def store(redis_client: Any) -> JobQueue:
    return JobQueue(redis_client)


def scheduler(redis_client: Any, name: str, lookahead: float = 0, **kw: Any) -> Scheduler:
    jq = store(redis_client)
    return Scheduler(
        jq, SchedulerConfig(lookahead=lookahead, **kw), install_signal_handlers=False,
        scheduler_id=name,
    )


def herd(jq: JobQueue, n: int, every: int = 60) -> None:
    for i in range(n):
        jq.schedule(f"job-{i}", "t", every=every, misfire="fire-all", now=0)


def owned(schedulers: list[Scheduler]) -> dict[str, list[int]]:
    return {s.id: [k.partition for k in s.ownership.owned()] for s in schedulers}


def fires(redis_client: Any) -> Counter[tuple[str, int]]:
    """(job, fire second) -> run records."""
    out: Counter[tuple[str, int]] = Counter()
    for key in redis_client.scan_iter(match="jq:{*}:run:*"):
        job, _, when = key.split(":run:", 1)[1].rpartition("@")
        out[(job, parse_fire_instant(when) // S)] += 1
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_n_schedulers_split_the_partitions_each_owned_once(redis_client: Any, n: int) -> None:
    schedulers = [scheduler(redis_client, f"s-{i}") for i in range(n)]
    for t in (1, 2, 3):  # the first tick of each sees the others only once they registered
        for s in schedulers:
            s.tick(now=t * S)
    got = owned(schedulers)
    every = sorted(p for parts in got.values() for p in parts)
    assert every == list(range(K))  # each partition owned, by exactly one scheduler
    share = -(-K // n)
    assert all(len(parts) <= share for parts in got.values()), got
    assert all(parts for parts in got.values()), got


@pytest.mark.parametrize("n", [1, 2, 4])
def test_the_herd_is_read_and_created_once_whatever_the_number_of_schedulers(
    redis_client: Any, n: int
) -> None:
    jq = store(redis_client)
    herd(jq, 400)
    schedulers = [scheduler(redis_client, f"s-{i}") for i in range(n)]
    for t in (57, 58, 59):  # ticking every second: settled before the herd falls due
        for s in schedulers:
            s.tick(now=t * S)
    reports = [s.tick(now=60 * S) for s in schedulers]
    assert sum(r.due_jobs for r in reports) == 400  # read once in all: 1x the herd
    assert sum(r.runs_requested for r in reports) == 400  # one create request per run
    assert sum(r.runs_created for r in reports) == 400
    assert sum(r.advanced for r in reports) == 400 and sum(r.conflicts for r in reports) == 0
    if n > 1:  # and the work is shared: nobody does it all
        assert max(r.due_jobs for r in reports) < 400
    assert set(fires(redis_client).values()) == {1}


def test_a_scheduler_that_stops_ticking_loses_its_partitions_when_its_leases_expire(
    redis_client: Any,
) -> None:
    a, b = scheduler(redis_client, "a"), scheduler(redis_client, "b")
    for t in (1, 2, 3):
        a.tick(now=t * S)
        b.tick(now=t * S)
    assert len(owned([b])["b"]) == K // 2
    b.tick(now=3 * S + int(LEASE * S) - 1)  # a's leases still run: b keeps its share
    assert len(owned([b])["b"]) == K // 2
    b.tick(now=4 * S + int(LEASE * S))  # a's leases and registry entry expired
    assert owned([b])["b"] == list(range(K))


def test_a_scheduler_that_joins_gets_its_fair_share_from_those_holding_more(
    redis_client: Any,
) -> None:
    a = scheduler(redis_client, "a")
    a.tick(now=1 * S)
    assert owned([a])["a"] == list(range(K))
    b, c = scheduler(redis_client, "b"), scheduler(redis_client, "c")
    for t in (2, 3, 4):
        for s in (a, b, c):
            s.tick(now=t * S)
    got = owned([a, b, c])
    assert sorted(len(p) for p in got.values()) == [2, 3, 3]  # ceil(8 / 3) = 3 at most
    assert sorted(p for parts in got.values() for p in parts) == list(range(K))


def test_a_stopped_scheduler_hands_its_partitions_over_at_once(redis_client: Any) -> None:
    a, b = scheduler(redis_client, "a"), scheduler(redis_client, "b")
    for t in (1, 2):
        a.tick(now=t * S)
        b.tick(now=t * S)
    a.close()  # what run() does when it stops (SIGTERM)
    assert "a" not in redis_client.hkeys(SCHEDULERS_KEY)
    b.tick(now=3 * S)  # not a lease later
    assert owned([b])["b"] == list(range(K))


def test_a_partition_handed_over_mid_tick_is_neither_doubled_nor_lost(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old owner reads and creates at 60 s, then stalls past its lease; the new owner
    takes over at 70 s and fires the same jobs (their next fire never moved); the old
    owner's advance when it wakes is refused (fenced), so the next fire is moved once and
    the counters count each fire once."""
    one_partition(monkeypatch)
    jq = store(redis_client)
    herd(jq, 50)
    old, new = scheduler(redis_client, "old"), scheduler(redis_client, "new")
    (sk,) = jq.recurring.all_keys()
    batch = old.fire(sk, 60 * S)  # read, planned, created; then it stalls
    assert batch.report.runs_created == 50
    report = new.tick(now=70 * S)  # old's lease (5 s) has expired
    assert report.partitions == 1 and report.runs_requested == 50 and report.runs_created == 0
    assert report.advanced == 50
    old.advance(batch)  # wakes up: fenced out
    assert (batch.report.advanced, batch.report.fenced, batch.report.conflicts) == (0, 50, 50)
    for i in range(50):
        info = jq.get_schedule(f"job-{i}")
        assert info is not None and info.next_fire_ms == 120 * S and info.state.fired == 1
    new.tick(now=120 * S)
    expected = {(f"job-{i}", t): 1 for i in range(50) for t in (60, 120)}
    assert fires(redis_client) == Counter(expected)


def test_an_advance_with_a_stale_token_moves_nothing(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_partition(monkeypatch)
    jq = store(redis_client)
    jq.schedule("j", "t", every=60, now=0)
    (sk,) = jq.recurring.all_keys()
    runner = jq.scripts
    first = SCHED_LEASE.parse(runner.run(SCHED_LEASE.call(sk, "a", "acquire", 5_000, now=60 * S)))
    second = SCHED_LEASE.parse(runner.run(SCHED_LEASE.call(sk, "b", "acquire", 5_000, now=66 * S)))
    assert first.held and second.held and second.token > first.token
    moves = advance_groups(
        [Advance("j", 60 * S, 120 * S, fired=1, last_fire_ms=60 * S, through_ms=60 * S)]
    )
    stale = runner.run(ADVANCE.call(sk, moves, now=66 * S, token=first.token))
    assert ADVANCE.parse(stale) == [Moved.FENCED]
    info = jq.get_schedule("j")
    assert info is not None and info.next_fire_ms == 60 * S and info.state.fired == 0
    fresh = runner.run(ADVANCE.call(sk, moves, now=66 * S, token=second.token))
    assert ADVANCE.parse(fresh) == [Moved.ADVANCED]


def test_a_lease_is_renewed_only_with_its_token_and_taken_only_once_expired(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_partition(monkeypatch)
    jq = store(redis_client)
    jq.recurring.record_partitions()
    (sk,) = jq.recurring.all_keys()

    def call(who: str, action: str, now_s: int, token: int | None = None) -> Any:
        reply = jq.scripts.run(SCHED_LEASE.call(sk, who, action, 5_000, token, now=now_s * S))
        return SCHED_LEASE.parse(reply)

    a = call("a", "acquire", 10)
    assert (a.held, a.owner, a.until_ms) == (True, "a", 15 * S)
    assert not call("b", "acquire", 14).held  # a's lease runs
    assert not call("b", "renew", 14, a.token).held  # b does not hold it, whatever the token
    assert not call("a", "renew", 14, a.token + 1).held  # a wrong token renews nothing
    assert call("a", "renew", 14, a.token).until_ms == 19 * S
    b = call("b", "acquire", 20)  # expired: b takes it, with a greater token
    assert b.held and b.token > a.token
    assert not call("a", "renew", 21, a.token).held  # too late for a
    assert call("b", "release", 22, b.token).owner == ""
    c = call("c", "acquire", 22)  # released: free at once
    assert c.held and c.token > b.token


def test_membership_and_ownership_are_visible_to_operators(redis_client: Any) -> None:
    a, b = scheduler(redis_client, "a"), scheduler(redis_client, "b")
    for t in (1, 2, 3):
        a.tick(now=t * S)
        b.tick(now=t * S)
    members = read_members(a.jq, now_ms=3 * S)
    assert [m.id for m in members] == ["a", "b"] and all(m.live for m in members)
    assert sorted(p for m in members for p in m.partitions) == list(range(K))
    owners = read_owners(a.jq, a.store.all_keys())
    assert Counter(o.owner for o in owners) == Counter({"a": K // 2, "b": K // 2})
    mine = {o.partition for o in owners if o.owner == "a"}
    assert mine == set(next(m.partitions for m in members if m.id == "a"))


def test_an_async_client_reads_the_registry_and_the_leases_alike(
    redis_client: Any, real_server: EmbeddedServer
) -> None:
    """The reads are steps (recurring.registry): an AsyncJobQueue drives the same ones."""
    a, b = scheduler(redis_client, "a"), scheduler(redis_client, "b")
    for t in (1, 2, 3):
        a.tick(now=t * S)
        b.tick(now=t * S)
    keys = a.store.all_keys()

    async def read() -> tuple[Any, Any]:
        aio = AsyncJobQueue(redis.asyncio.Redis.from_url(real_server.url, decode_responses=True))
        try:
            return (await aio.run_steps(members_steps(3 * S)),
                    await aio.run_steps(owners_steps(keys)))  # fmt: skip
        finally:
            await aio.close()

    members, owners = asyncio.run(read())
    assert [m.id for m in members] == ["a", "b"]
    assert members == read_members(a.jq, now_ms=3 * S)
    assert owners == read_owners(a.jq, keys)


# -- what operators see ------------------------------------------------------------------------


def invoke(jq: JobQueue, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq))


def two_schedulers_ticking(redis_client: Any) -> list[Scheduler]:
    """Two schedulers on the server's clock, ticked until they share the partitions; their
    leases long enough that a slow machine between two steps of a test cannot end them. Their
    lookahead is the default (60 s): `check` looks for herds in windows of the lookahead,
    and one of 0 s made it count jobs in 14,000 windows of each partition."""
    schedulers = [
        scheduler(redis_client, name, lookahead=60, partition_lease=300) for name in "ab"
    ]
    for _ in range(3):
        for s in schedulers:
            s.tick()
    return schedulers


def test_schedules_partitions_shows_each_partitions_owner_and_each_scheduler(
    redis_client: Any,
) -> None:
    jq = store(redis_client)
    herd(jq, 40)
    two_schedulers_ticking(redis_client)
    result = invoke(jq, "schedules", "partitions", "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert [p["partition"] for p in found["partitions"]] == list(range(K))
    assert Counter(p["owner"] for p in found["partitions"]) == Counter({"a": 4, "b": 4})
    assert sum(p["jobs"] for p in found["partitions"]) == 40
    assert {s["id"]: len(s["partitions"]) for s in found["schedulers"]} == {"a": 4, "b": 4}
    assert all(s["live"] for s in found["schedulers"])
    table = invoke(jq, "schedules", "partitions")
    assert table.exit_code == 0 and table.stderr == ""
    assert table.stdout.splitlines()[0].split() == ["PART", "JOBS", "OWNER", "LEASE", "LEFT"]
    assert "SCHEDULER  PARTITIONS" in table.stdout


def test_check_says_which_partitions_have_no_owner_while_schedulers_run(redis_client: Any) -> None:
    jq = store(redis_client)
    herd(jq, 40)
    a, _ = two_schedulers_ticking(redis_client)
    (line,) = [c for c in scheduler_checks(jq) if c.name == "schedulers"]
    assert line.ok and "2 scheduler(s) share 8 scheduler partition(s)" in line.detail
    lost = a.ownership.owned()[0]
    redis_client.delete(lost.owner)  # its lease gone: nobody owns it until the next tick
    (line,) = [c for c in scheduler_checks(jq) if c.name == "schedulers"]
    assert not line.ok
    assert f"scheduler partition(s) {lost.partition} of 8 have no owner" in line.detail
    result = invoke(jq, "check", "--json")
    assert result.exit_code == 1
    lines = json.loads(result.stdout)
    assert any(c["name"] == "schedulers" and c["status"] == "warn" for c in lines)
    listed = invoke(jq, "schedules", "partitions")
    assert f"partition(s) {lost.partition} have no owner while 2 scheduler(s) run" in listed.stderr


def test_check_says_nothing_of_schedulers_where_there_are_no_recurring_jobs(
    redis_client: Any,
) -> None:
    assert scheduler_checks(JobQueue(redis_client)) == []
