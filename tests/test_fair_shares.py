"""Fair shares between groups (claim.lua's ring): with fair shares on, claims serve a queue's
groups (a run's group is its limit_key) in weighted turns, priority first within a group.
The bound of docs/guarantees.md: while a group g has a due run that no cap, rate or pause
holds back, at most sum over the other groups j of (ceil(w_j / w_g) + 1) runs of other groups
are claimed in its partition before one of g's. Explicit clock throughout."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import LEASE_MS, PAYLOAD, claim, create_new, ids

from jobqueue import GroupFull, JobQueue, RunNotFound
from jobqueue.errors import ScriptError
from jobqueue.store.admin import SET_LIMIT
from jobqueue.store.groups import GROUP_SET
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import (
    BOUNCE,
    CANCEL,
    CLAIM,
    COMPLETE,
    CREATE_RUN,
    DEDUPE,
    FAIL,
    RELEASE,
    REQUEUE,
    RunSpec,
)
from jobqueue.store.scripts import Script, ScriptRunner, scripts

RETENTION = 3_600_000


def create_in_group(
    runner: ScriptRunner, pk: PartitionKeys, group: str, *run_ids: str, now: int = 0,
    priority: int = 0, delay: int = 0, attempts: int = 3,
) -> None:
    """Runs of the group (limit key) ``group``."""
    create_new(runner, pk, *run_ids, now=now, limit_key=group, priority=priority,
               delay_ms=delay, max_attempts=attempts)


def fair(runner: ScriptRunner, pk: PartitionKeys, on: bool = True) -> None:
    runner.run(GROUP_SET.call(pk, on, now=0))


def group(runner: ScriptRunner, pk: PartitionKeys, name: str, **settings: Any) -> None:
    runner.run(GROUP_SET.call(pk, None, name, now=0, **settings))


def served_groups(runner: ScriptRunner, pk: PartitionKeys, claims: int, now: int) -> list[str]:
    """The group (run id prefix before '-') of each run taken by ``claims`` claims of one."""
    out = []
    for i in range(claims):
        out += [r.split("-")[0] for r in ids(claim(runner, pk, now=now + i, limit=1))]
    return out


@pytest.fixture
def on(runner: ScriptRunner, pk: PartitionKeys) -> Iterator[None]:
    fair(runner, pk)
    yield


# -- turns -----------------------------------------------------------------------------------


@pytest.mark.usefixtures("on")
def test_a_group_that_floods_does_not_delay_a_new_groups_run(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_in_group(runner, pk, "a", *[f"a-{i}" for i in range(500)], now=0)
    assert served_groups(runner, pk, 3, now=1_000) == ["a", "a", "a"]
    create_in_group(runner, pk, "b", "b-0", now=2_000)
    # one other group with due runs: b is served within 1 + 1 claims
    assert "b" in served_groups(runner, pk, 2, now=3_000)


@pytest.mark.usefixtures("on")
def test_groups_of_equal_weight_are_served_in_turn(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    for g in "abc":
        create_in_group(runner, pk, g, *[f"{g}-{i}" for i in range(20)], now=0)
    got = served_groups(runner, pk, 30, now=1_000)
    assert Counter(got) == {"a": 10, "b": 10, "c": 10}
    for start in range(0, 30, 3):
        assert sorted(got[start : start + 3]) == ["a", "b", "c"]


@pytest.mark.usefixtures("on")
@pytest.mark.parametrize("limit", [1, 7])
def test_weights_give_each_group_its_share_of_claims(
    runner: ScriptRunner, pk: PartitionKeys, limit: int
) -> None:
    group(runner, pk, "a", weight=3)
    create_in_group(runner, pk, "a", *[f"a-{i}" for i in range(400)], now=0)
    create_in_group(runner, pk, "b", *[f"b-{i}" for i in range(400)], now=0)
    got: list[str] = []
    now = 1_000
    while len(got) < 200:
        got += [r.split("-")[0] for r in ids(claim(runner, pk, now=now, limit=limit))]
        now += 1
    shares = Counter(got[:200])
    assert abs(shares["a"] - 150) <= 1 and abs(shares["b"] - 50) <= 1


@pytest.mark.usefixtures("on")
def test_runs_without_a_limit_key_form_a_group_of_their_own(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_in_group(runner, pk, "a", *[f"a-{i}" for i in range(50)], now=0)
    create_in_group(runner, pk, "", "none-0", now=10)
    assert "none" in served_groups(runner, pk, 2, now=1_000)


@pytest.mark.usefixtures("on")
def test_the_bound_holds_under_random_weights_arrivals_and_batches(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    """Model check of the stated bound: between a group's arrival (or its previous claim)
    and its next claim, while it has due runs all along, other groups' claims number at
    most sum_j (ceil(w_j / w_g) + 1)."""
    rng = random.Random(7)
    names = [f"g{i}" for i in range(6)]
    weights = {g: rng.choice([1, 1, 2, 3, 5]) for g in names}
    for g, w in weights.items():
        group(runner, pk, g, weight=w)
    waiting: Counter[str] = Counter()
    others_since: dict[str, int] = {}  # claims of other groups while g had due runs
    made = 0
    now = 1_000
    for _ in range(400):
        now += 1
        if rng.random() < 0.5:
            g = rng.choice(names)
            n = rng.randint(1, 5)
            create_in_group(runner, pk, g, *[f"{g}-{made + i}" for i in range(n)], now=now)
            made += n
            if waiting[g] == 0:
                others_since[g] = 0
            waiting[g] += n
        for run_id in ids(claim(runner, pk, now=now, limit=rng.randint(1, 4))):
            g = run_id.split("-")[0]
            waiting[g] -= 1
            others_since[g] = 0
            for h in names:
                if h != g and waiting[h] > 0:
                    others_since[h] += 1
                    bound = sum(
                        math.ceil(weights[j] / weights[h]) + 1 for j in names if j != h
                    )
                    assert others_since[h] <= bound, (h, others_since[h], bound)
    assert made > 300


# -- within a group ---------------------------------------------------------------------------


@pytest.mark.usefixtures("on")
def test_priority_orders_the_runs_within_a_group_not_across_groups(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_in_group(runner, pk, "a", "a-low", now=0)
    create_in_group(runner, pk, "a", "a-high", now=1, priority=9)
    create_in_group(runner, pk, "b", "b-low", now=2)
    got = [ids(claim(runner, pk, now=1_000 + i, limit=1)) for i in range(3)]
    assert got[0] == ["a-high"]  # a's turn first (its name), its highest priority first
    assert got[1] == ["b-low"]  # then b's turn, before a's lower priority run
    assert got[2] == ["a-low"]


@pytest.mark.usefixtures("on")
def test_a_group_whose_runs_are_not_due_yet_waits_without_holding_up_the_others(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_in_group(runner, pk, "a", "a-0", now=0, delay=10_000)
    create_in_group(runner, pk, "b", "b-0", "b-1", now=0)
    assert ids(claim(runner, pk, now=1_000, limit=5)) == ["b-0", "b-1"]
    assert ids(claim(runner, pk, now=5_000, limit=1)) == []
    assert ids(claim(runner, pk, now=10_000, limit=1)) == ["a-0"]


@pytest.mark.usefixtures("on")
def test_a_retried_run_goes_back_to_its_group(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_in_group(runner, pk, "a", "a-0", now=0)
    (run,) = claim(runner, pk, now=1_000, limit=1).runs
    runner.run(FAIL.call(pk, run.run_id, run.fence, "boom", 100, RETENTION, now=1_100))
    assert ids(claim(runner, pk, now=2_000, limit=1)) == ["a-0"]


# A run put back in line (released, requeued, handed back, enqueued or replaced under a
# deduplication key) goes to its group's queue in the same call, as a retry does: the next
# claim serves it even while another group's 100 earlier runs fill the head of the due set
# (adopting it would need it among the due set's first entries).
FLOOD = [f"f-{i}" for i in range(100)]


def put_back(runner: ScriptRunner, pk: PartitionKeys, how: str) -> None:
    """b-0 put back in line at 2_000 by ``how``, behind the 100 runs of group f due at 0."""
    if how in ("release", "bounce"):
        create_in_group(runner, pk, "b", "b-0", now=0)
        create_in_group(runner, pk, "f", *FLOOD, now=0)
        (run,) = claim(runner, pk, now=1_000, limit=1).runs  # b's turn first (its name)
        assert run.run_id == "b-0"
        if how == "release":
            runner.run(RELEASE.call(pk, "b-0", run.fence, now=2_000))
        else:
            runner.run(BOUNCE.call(pk, "b-0", run.fence, "w1", "no code", delay_ms=0,
                                   delay_cap_ms=0, window_ms=60_000,
                                   dead_retention_ms=RETENTION, now=2_000))
    elif how == "requeue":
        create_in_group(runner, pk, "b", "b-0", now=0)
        create_in_group(runner, pk, "f", *FLOOD, now=0)
        runner.run(CANCEL.call(pk, "b-0", RETENTION, "no", now=500))
        assert ids(claim(runner, pk, now=1_000, limit=1)) == ["f-0"]  # (b's stale entry passed)
        assert REQUEUE.parse(runner.run(REQUEUE.call(pk, "b-0", now=2_000))).changed
    else:  # dedupe, creating b-0 (or replacing it, due in an hour until then)
        if how == "dedupe-replace":
            spec = RunSpec("b-0", "t", PAYLOAD, limit_key="b", delay_ms=3_600_000)
            runner.run(DEDUPE.call(pk, spec, "k", "debounce", None, now=0))
        create_in_group(runner, pk, "f", *FLOOD, now=0)
        spec = RunSpec("b-new" if how == "dedupe-replace" else "b-0", "t", PAYLOAD,
                       limit_key="b")
        reply = runner.run(DEDUPE.call(pk, spec, "k", "debounce", None, now=2_000))
        assert DEDUPE.parse(reply).run_id == "b-0"


@pytest.mark.usefixtures("on")
@pytest.mark.parametrize("how", ["release", "requeue", "bounce", "dedupe-create",
                                 "dedupe-replace"])
def test_a_run_put_back_in_line_is_served_at_the_next_claim_behind_a_flood(
    runner: ScriptRunner, pk: PartitionKeys, how: str
) -> None:
    put_back(runner, pk, how)
    assert "b-0" in ids(claim(runner, pk, now=3_000, limit=2))


# -- pause, max_size, caps ----------------------------------------------------------------------


@pytest.mark.usefixtures("on")
def test_a_paused_group_is_passed_over_until_resumed(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    group(runner, pk, "a", paused=True)
    create_in_group(runner, pk, "a", "a-0", now=0)
    create_in_group(runner, pk, "b", "b-0", now=0)
    assert ids(claim(runner, pk, now=1_000, limit=5)) == ["b-0"]
    assert ids(claim(runner, pk, now=2_000, limit=5)) == []
    group(runner, pk, "a", paused=False)
    assert ids(claim(runner, pk, now=3_000, limit=5)) == ["a-0"]


def test_max_size_refuses_an_enqueue_past_it_and_creates_nothing(jq: JobQueue) -> None:
    @jq.task
    def t() -> None: ...

    tenant = t.with_options(limit_key="tenant")
    jq.set_fair_shares("default")
    jq.set_group("default", "tenant", max_size=2)
    jq.enqueue(tenant)
    jq.enqueue(tenant)
    with pytest.raises(GroupFull, match=r"group tenant .* max_size is 2"):
        jq.enqueue(tenant.with_options(run_id="third"))
    with pytest.raises(RunNotFound):
        jq.get_run("third")
    jq.enqueue(t.with_options(limit_key="other"))  # another group has room
    (info,) = [g for g in jq.groups("default") if g.name == "tenant"]
    assert (info.max_size, info.waiting) == (2, 2)


def test_a_cancelled_run_no_longer_counts_against_its_groups_max_size(jq: JobQueue) -> None:
    @jq.task
    def t() -> None: ...

    tenant = t.with_options(limit_key="tenant")
    jq.set_fair_shares("default")
    jq.set_group("default", "tenant", max_size=2)
    first = jq.enqueue(tenant)
    jq.enqueue(tenant)
    jq.cancel(first.run_id)
    jq.enqueue(tenant.with_options(run_id="third"))
    (info,) = [g for g in jq.groups("default") if g.name == "tenant"]
    assert (info.max_size, info.waiting) == (2, 2)
    assert jq.get_run("third").state == "pending"


def test_group_settings_are_read_back_summed_over_partitions(redis_client: Any) -> None:
    jq = JobQueue(redis_client, partitions={"wide": 4})

    @jq.task(queue="wide")
    def t() -> None: ...

    jq.set_fair_shares("wide")
    jq.set_group("wide", "a", weight=3)
    jq.pause_group("wide", "b")
    for i in range(8):
        jq.enqueue(t.with_options(limit_key="a", run_id=f"a{i}"))
    assert jq.fair_shares("wide")
    got = {g.name: g for g in jq.groups("wide")}
    assert (got["a"].weight, got["a"].waiting, got["a"].paused) == (3, 8, False)
    assert got["b"].paused


@pytest.mark.usefixtures("on")
def test_a_group_at_its_key_cap_waits_and_comes_back_when_a_slot_frees(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    runner.run(SET_LIMIT.call(pk, "key_concurrency", 1, now=0))
    create_in_group(runner, pk, "a", "a-0", "a-1", "a-2", now=0)
    create_in_group(runner, pk, "b", "b-0", "b-1", now=0)
    first = claim(runner, pk, now=1_000, limit=10)
    assert sorted(ids(first)) == ["a-0", "b-0"]  # one slot per key; the rest wait in line
    a0 = next(r for r in first.runs if r.run_id == "a-0")
    runner.run(COMPLETE.call(pk, [("a-0", a0.fence, "1")], RETENTION, now=1_100))
    assert ids(claim(runner, pk, now=1_200, limit=10)) == ["a-1"]


def test_runs_enqueued_before_fair_shares_were_on_are_adopted_and_served(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_in_group(runner, pk, "a", *[f"a-{i}" for i in range(5)], now=0)
    create_in_group(runner, pk, "b", "b-0", now=1)
    fair(runner, pk)
    taken: list[str] = []
    for i in range(10):
        taken += ids(claim(runner, pk, now=1_000 + i, limit=1))
    assert sorted(taken) == sorted([*[f"a-{i}" for i in range(5)], "b-0"])


def test_with_fair_shares_off_claims_go_in_due_order(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    fair(runner, pk)
    create_in_group(runner, pk, "a", "a-0", "a-1", now=0)
    create_in_group(runner, pk, "b", "b-0", now=1)
    fair(runner, pk, on=False)
    assert ids(claim(runner, pk, now=1_000, limit=5)) == ["a-0", "a-1", "b-0"]


# -- the ring's failure modes -------------------------------------------------------------------


def adopted_later(runner: ScriptRunner, pk: PartitionKeys, group_: str, run_id: str,
                  now: int) -> None:
    """A run of ``group_`` put in line without its group's queue (as a workflow's release or
    code older than groups does): created while fair shares are off."""
    fair(runner, pk, on=False)
    create_in_group(runner, pk, group_, run_id, now=now)
    fair(runner, pk)


@pytest.mark.usefixtures("on")
def test_a_run_adopted_into_a_group_the_ring_found_empty_is_served(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_in_group(runner, pk, "a", "a-0", now=0)
    # a stays in the ring, its queue empty
    assert ids(claim(runner, pk, now=1_000, limit=1)) == ["a-0"]
    adopted_later(runner, pk, "a", "a-1", now=1_100)
    got: list[str] = []
    for i in range(3):  # (the claim that found a empty adopted a-1: a must stay in the ring)
        got += ids(claim(runner, pk, now=2_000 + i, limit=1))
    assert got == ["a-1"]


@pytest.mark.usefixtures("on")
def test_an_adopted_run_does_not_wait_for_its_groups_later_runs(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_in_group(runner, pk, "a", "a-0", now=0)
    create_in_group(runner, pk, "a", "a-next-week", now=0, delay=7 * 86_400_000)
    assert ids(claim(runner, pk, now=1_000, limit=1)) == ["a-0"]
    adopted_later(runner, pk, "a", "a-1", now=1_100)
    got: list[str] = []
    for i in range(3):  # (the claim that adopted a-1 found a's next run a week away)
        got += ids(claim(runner, pk, now=2_000 + i, limit=1))
    assert got == ["a-1"]


@pytest.mark.usefixtures("on")
def test_a_run_whose_id_came_back_in_another_group_is_served(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_in_group(runner, pk, "a", "x", now=0)
    runner.run(CANCEL.call(pk, "x", 1, "no", now=10))
    runner.client.delete(pk.prefix + "run:x")  # its record expired; the ring has not passed it
    adopted_later(runner, pk, "b", "x", now=20)
    got: list[str] = []
    for i in range(3):
        got += ids(claim(runner, pk, now=1_000 + i, limit=1))
    assert got == ["x"]


@pytest.mark.usefixtures("on")
@pytest.mark.parametrize("held", ["paused", "at-its-cap"])
def test_a_claim_with_only_full_groups_due_does_not_ask_to_be_called_at_once(
    runner: ScriptRunner, pk: PartitionKeys, held: str
) -> None:
    if held == "paused":
        group(runner, pk, "a", paused=True)
    else:
        runner.run(SET_LIMIT.call(pk, "key_concurrency", 1, now=0))
    create_in_group(runner, pk, "a", *[f"a-{i}" for i in range(100)], now=0)
    claim(runner, pk, now=1_000, limit=1)
    claim(runner, pk, now=1_001, limit=1)
    again = claim(runner, pk, now=1_002, limit=1)
    # (a worker told next_wake = now claims again at once, over and over)
    assert again.runs == [] and again.next_wake_ms != 1_002


@pytest.mark.usefixtures("on")
def test_a_claim_that_looked_at_full_groups_only_wakes_for_the_ready_groups_behind(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    names = [f"g{i:02}" for i in range(65)] + ["z"]
    for g in names:
        create_in_group(runner, pk, g, *[f"{g}-{i}" for i in range(10)], now=0)
    taken = ids(claim(runner, pk, now=1_000, limit=64)) + ids(claim(runner, pk, now=1_001, limit=2))
    assert sorted(r.split("-")[0] for r in taken) == sorted(names)  # every group once
    runner.client.zadd(pk.gready, dict.fromkeys(names, 5_000_000))  # (all at one pass)
    for g in names[:-1]:
        group(runner, pk, g, paused=True)
    # a claim of one looks at 65 ready groups (its limit + 64), all paused: z is behind them
    first = claim(runner, pk, now=1_200, limit=1)
    assert first.runs == [] and first.next_wake_ms == 1_200
    assert ids(claim(runner, pk, now=1_201, limit=1))[0].startswith("z-")


@pytest.mark.usefixtures("on")
def test_a_run_due_after_the_prio_spans_end_is_claimed(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    due = 2**43 + 5_000  # the year 2248: a default-priority score past 10 * 2^43
    spec = RunSpec("a-0", "t", PAYLOAD, limit_key="a", due_at_ms=due)
    assert CREATE_RUN.parse(runner.run(CREATE_RUN.call(pk, [spec], now=0))) == [True]
    assert ids(claim(runner, pk, now=due - 1, limit=1)) == []
    assert ids(claim(runner, pk, now=due, limit=1)) == ["a-0"]


@pytest.mark.usefixtures("on")
def test_a_served_count_holding_garbage_is_reset_not_a_failed_claim(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_in_group(runner, pk, "a", "a-0", now=0)
    runner.client.hset(pk.gserved, "a", "garbage")
    assert ids(claim(runner, pk, now=1_000, limit=1)) == ["a-0"]
    assert runner.client.hget(pk.gserved, "a") == "1"


@pytest.mark.usefixtures("on")
def test_a_foreign_pass_does_not_keep_the_ring_on_one_group(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    for g in "ab":
        create_in_group(runner, pk, g, *[f"{g}-{i}" for i in range(10)], now=0)
    assert served_groups(runner, pk, 2, now=1_000) == ["a", "b"]
    runner.client.zadd(pk.gready, {"a": float("-inf")})
    got = Counter(served_groups(runner, pk, 6, now=2_000))
    assert got["b"] >= 2 and got["a"] >= 2  # (a rejoins at the virtual time: one turn early)


# A claim's phase 2 never writes a key it emptied (on a node migrating the slot, a write to a
# missing key is refused half-way): checked by a claim whose every redis.call goes through a
# guard that refuses any command on a key an earlier command of the call emptied.
EMPTIED_GUARD = """
local jq_emptied = {}
local JQ_REMOVES = {ZREM = true, HDEL = true, SREM = true, ZREMRANGEBYSCORE = true, DEL = true}
local function jq_call(command, key, ...)
  if key == nil then return redis.call(command) end
  if jq_emptied[key] then
    error('jobqueue test: ' .. command .. ' on ' .. key .. ', which this call emptied')
  end
  local reply = redis.call(command, key, ...)
  if JQ_REMOVES[string.upper(command)] and redis.call('EXISTS', key) == 0 then
    jq_emptied[key] = true
  end
  return reply
end
"""


def guard_emptied_keys(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    good = scripts()[name]
    plain = EMPTIED_GUARD + good.plain.replace("redis.call(", "jq_call(")
    source = good.source.split("\n", 1)[0] + "\n" + plain
    monkeypatch.setitem(scripts(), name, Script(
        name, source, hashlib.sha1(source.encode()).hexdigest(),
        plain, hashlib.sha1(plain.encode()).hexdigest(),
    ))


@pytest.mark.usefixtures("on")
def test_a_claim_that_unparks_into_a_group_it_found_empty_writes_no_key_it_emptied(
    runner: ScriptRunner, pk: PartitionKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner.run(SET_LIMIT.call(pk, "task:t", 1, now=0))
    once = RunSpec("a-0", "t", PAYLOAD, limit_key="a", max_attempts=1)
    assert CREATE_RUN.parse(runner.run(CREATE_RUN.call(pk, [once], now=0))) == [True]
    assert ids(claim(runner, pk, now=1_000, limit=1)) == ["a-0"]  # holds task t's one slot
    create_in_group(runner, pk, "a", "a-1", now=1_100)
    assert ids(claim(runner, pk, now=1_200, limit=1)) == []  # a-1 parked: t is full
    create_in_group(runner, pk, "a", "a-2", now=1_300)
    runner.run(CANCEL.call(pk, "a-2", RETENTION, "no", now=1_400))  # stale in a's queue
    guard_emptied_keys("claim", monkeypatch)
    # a-0's lease expired on its last attempt: buried, its slot goes to a-1 (unparked into a),
    # while the ring drops a-2, the last entry of a's queue and of gof, and finds a empty
    assert ids(claim(runner, pk, now=1_000 + LEASE_MS + 1, limit=1)) == []
    assert ids(claim(runner, pk, now=1_000 + LEASE_MS + 2, limit=1)) == ["a-1"]


@pytest.mark.usefixtures("on")
def test_a_run_without_a_limit_key_over_a_full_task_cap_is_parked_not_a_failed_claim(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    runner.run(SET_LIMIT.call(pk, "task:t", 1, now=0))
    create_new(runner, pk, "x-0", "x-1", now=0)  # group '' (no limit_key), task t
    (held,) = claim(runner, pk, now=1_000, limit=1).runs  # holds task t's one slot
    assert ids(claim(runner, pk, now=1_100, limit=1)) == []  # the other waits: t is full
    runner.run(COMPLETE.call(pk, [(held.run_id, held.fence, "1")], RETENTION, now=1_200))
    assert len(claim(runner, pk, now=1_300, limit=1).runs) == 1


@pytest.mark.usefixtures("on")
def test_a_claim_parks_a_bounded_number_of_runs_over_a_task_cap_and_each_is_served_once(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """300 runs of one group under a full task cap of 1: one claim parks no more than the
    entries it may look at (256: a claim stays short, the others wait for later calls), and
    as the slot frees, every run is claimed exactly once."""
    runner.run(SET_LIMIT.call(pk, "task:t", 1, now=0))
    made = [f"x-{i:03d}" for i in range(300)]
    create_new(runner, pk, *made, now=0)
    (held,) = claim(runner, pk, now=1_000, limit=1).runs
    assert ids(claim(runner, pk, now=1_001, limit=1)) == []
    assert 0 < redis_client.zcard(pk.parked) <= 256
    served = [held.run_id]
    now = 1_002
    while len(served) < len(made) and now < 10_000:
        now += 1
        runner.run(COMPLETE.call(pk, [(held.run_id, held.fence, "1")], RETENTION, now=now))
        got = claim(runner, pk, now=now + 1, limit=1).runs
        while not got and now < 10_000:  # (a claim that only parked: the next goes on)
            now += 1
            got = claim(runner, pk, now=now + 1, limit=1).runs
        if got:
            (held,) = got
            served.append(held.run_id)
    assert sorted(served) == made


def test_an_enqueue_under_a_deduplication_key_respects_its_groups_max_size(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    fair(runner, pk)
    group(runner, pk, "b", max_size=1)
    create_in_group(runner, pk, "b", "b-0", now=0)
    spec = RunSpec("b-1", "t", PAYLOAD, limit_key="b")
    with pytest.raises(GroupFull, match=r"group b .* max_size is 1"):
        runner.run(DEDUPE.call(pk, spec, "k", "throttle", None, now=10))
    assert not runner.client.exists(pk.prefix + "run:b-1")


# Foreign data in a key of the ring refuses the call whole, before any write, in every script
# that puts a run in line or serves the ring.
def ring_call(runner: ScriptRunner, pk: PartitionKeys, script: str) -> Any:
    """The state before ``script``'s call (fair shares on, group a), and the call."""
    fair(runner, pk)
    if script == "create_run":
        return CREATE_RUN.call(pk, [RunSpec("a-0", "t", PAYLOAD, limit_key="a")], now=100)
    if script == "dedupe":
        return DEDUPE.call(pk, RunSpec("a-0", "t", PAYLOAD, limit_key="a"), "k", "throttle",
                           None, now=100)
    create_in_group(runner, pk, "a", "a-0", "a-1", now=0)
    create_in_group(runner, pk, "b", "b-0", now=0)
    if script == "cancel":
        return CANCEL.call(pk, "a-0", RETENTION, "no", now=100)
    if script == "claim":
        claim(runner, pk, now=50, limit=1)  # (gready, gpass, gserved, gvt exist)
        return CLAIM.call(pk, 2, "w1", LEASE_MS, RETENTION, now=100)
    if script == "requeue":
        runner.run(CANCEL.call(pk, "a-0", RETENTION, "no", now=50))
        claim(runner, pk, now=60, limit=1)
        return REQUEUE.call(pk, "a-0", now=100)
    (run,) = claim(runner, pk, now=50, limit=1).runs
    assert run.run_id == "a-0"
    if script == "release":
        return RELEASE.call(pk, "a-0", run.fence, now=100)
    if script == "fail":
        return FAIL.call(pk, "a-0", run.fence, "boom", 10, RETENTION, now=100)
    return BOUNCE.call(pk, "a-0", run.fence, "w1", "no code", delay_ms=10, delay_cap_ms=10,
                       window_ms=60_000, dead_retention_ms=RETENTION, now=100)


def snapshot(client: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in client.keys("*"):
        kind = client.type(key)
        read = {"string": client.get, "list": lambda k: client.lrange(k, 0, -1),
                "set": client.smembers, "hash": client.hgetall,
                "zset": lambda k: client.zrange(k, 0, -1, withscores=True)}.get(kind)
        out[key] = (kind, read(key) if read else None)
    return out


RING_KEYS = ["gconf", "gq:a", "gof", "gwait"]
RING_CASES = [(s, k) for s in ("create_run", "dedupe", "release", "requeue", "fail", "bounce")
              for k in RING_KEYS]
RING_CASES += [("cancel", k) for k in ["gq:a", "gof"]]
RING_CASES += [("claim", k) for k in [*RING_KEYS, "gready", "gpass", "gserved", "gvt"]]


@pytest.mark.parametrize(("script", "key"), RING_CASES, ids=[f"{s}-{k}" for s, k in RING_CASES])
def test_foreign_data_in_a_ring_key_refuses_the_call_whole(
    runner: ScriptRunner, pk: PartitionKeys, script: str, key: str
) -> None:
    call = ring_call(runner, pk, script)
    full = pk.prefix + key
    runner.client.delete(full)
    runner.client.sadd(full, "garbage")  # (a type no script writes there)
    before = snapshot(runner.client)
    with pytest.raises(ScriptError, match=r"holds (foreign data|a set)"):
        runner.run(call)
    assert snapshot(runner.client) == before


# -- the checks are not vacuous ------------------------------------------------------------------

MUTANTS = {
    # the ring ignores weights: every group advances its pass by the same step
    "weight-ignored": ("g.pass = g.pass + math.floor(GROUP_STEP / g.weight)",
                       "g.pass = g.pass + GROUP_STEP"),
    # the ring serves the group of highest pass: a flooding group keeps its turn
    "group-skipped": ("(not g or c.pass < g.pass or (c.pass == g.pass and c.name < g.name))",
                      "(not g or c.pass > g.pass or (c.pass == g.pass and c.name < g.name))"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_fair_share_checks_catch_a_broken_claim(
    mutant: str, runner: ScriptRunner, pk: PartitionKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = MUTANTS[mutant]
    good = scripts()["claim"]
    source, plain = good.source.replace(old, new), good.plain.replace(old, new)
    assert source != good.source
    monkeypatch.setitem(scripts(), "claim", Script(
        "claim", source, hashlib.sha1(source.encode()).hexdigest(),
        plain, hashlib.sha1(plain.encode()).hexdigest(),
    ))
    fair(runner, pk)
    checks = (test_weights_give_each_group_its_share_of_claims,
              test_the_bound_holds_under_random_weights_arrivals_and_batches)
    failed = 0
    for check in checks:
        runner.client.flushall()
        fair(runner, pk)
        try:
            if check is test_weights_give_each_group_its_share_of_claims:
                check(runner, pk, 1)  # type: ignore[call-arg]
            else:
                check(runner, pk)  # type: ignore[call-arg]
        except AssertionError:
            failed += 1
    assert failed >= 1


# -- the CLI ----------------------------------------------------------------------------------


def test_the_cli_turns_fair_shares_on_sets_a_group_and_lists_it(jq: JobQueue) -> None:
    from click.testing import CliRunner

    from jobqueue.cli import State, main

    def invoke(*args: str) -> str:
        result = CliRunner().invoke(main, list(args), obj=State(None, jq))
        assert result.exit_code == 0, result.output
        return result.output

    @jq.task
    def t() -> None: ...

    assert "fair shares on" in invoke("groups", "fair", "default", "on")
    assert "set" in invoke("groups", "set", "default", "acme", "--weight", "4")
    assert "paused" in invoke("groups", "pause", "default", "acme")
    jq.enqueue(t.with_options(limit_key="acme"))
    listing = invoke("groups", "list", "default")
    assert "fair shares on" in listing
    row = next(line for line in listing.splitlines() if line.startswith("acme"))
    assert row.split() == ["acme", "4", "-", "yes", "1", "0", "0"]
    assert "resumed" in invoke("groups", "resume", "default", "acme")
    bad = CliRunner().invoke(main, ["groups", "set", "default", "acme", "--weight", "0"],
                             obj=State(None, jq))
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_a_run_adopted_into_a_group_that_a_claim_just_emptied_is_served(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    """One claim takes the group's last run from its queue and, in the same call, adopts a
    run of that group put back without its group (here: created before fair shares): the
    group must stay in the ring."""
    create_in_group(runner, pk, "a", "a-old", now=0)  # not in a's queue: fair shares were off
    fair(runner, pk)
    create_in_group(runner, pk, "a", "a-new", now=10)
    assert ids(claim(runner, pk, now=1_000, limit=2)) == ["a-new"]  # and a-old adopted
    assert ids(claim(runner, pk, now=1_001, limit=1)) == ["a-old"]


@pytest.mark.parametrize("seed", range(6))
def test_random_groups_caps_pauses_and_failures_lose_no_run_and_break_no_cap(
    runner: ScriptRunner, pk: PartitionKeys, seed: int
) -> None:
    """A random mix, with fair shares turned on part-way: runs in groups and without one,
    delayed and with priorities; claims of random sizes; completions, failures (retried)
    and lease expiries; a per-key cap; groups paused and resumed. No run is held by two
    claims at once, no group runs more than its cap, and once everything is resumed every
    run is claimed and completed: none is stranded out of the ring. (A paused group's run
    whose lease expired is still taken back: pausing holds the runs in line, not those
    already started.)"""
    rng = random.Random(seed)
    runner.run(SET_LIMIT.call(pk, "key_concurrency", 2, now=0))
    names = ["a", "b", "c", ""]
    made: list[str] = []
    held: dict[str, tuple[int, str]] = {}  # run id -> (fence, group)
    done: set[str] = set()
    paused: set[str] = set()
    orphaned: set[str] = set()
    now = 1_000
    for step in range(300):
        now += rng.randint(1, 400)
        if step == 40:
            fair(runner, pk)
        roll = rng.random()
        if roll < 0.3:
            g = rng.choice(names)
            run_id = f"{g or 'none'}-{len(made)}"
            create_in_group(runner, pk, g, run_id, now=now, priority=rng.choice([0, 0, 5]),
                   delay=rng.choice([0, 0, 2_000]), attempts=1_000)  # never dead-lettered
            made.append(run_id)
        elif roll < 0.35:
            g = rng.choice(names)
            group(runner, pk, g, paused=g not in paused)
            paused ^= {g}
        else:
            for r in claim(runner, pk, now=now, limit=rng.randint(1, 4)).runs:
                g = r.run_id.split("-")[0]
                assert r.run_id not in held, r.run_id
                if step > 40 and r.run_id not in orphaned:
                    assert g.replace("none", "") not in paused, r.run_id
                held[r.run_id] = (r.fence, g)
                if g != "none":
                    assert sum(1 for _, h in held.values() if h == g) <= 2
            for run_id, (fence, _) in list(held.items()):
                fate = rng.random()
                if fate < 0.4:
                    runner.run(COMPLETE.call(pk, [(run_id, fence, "1")], RETENTION, now=now))
                    done.add(run_id)
                    del held[run_id]
                elif fate < 0.5:
                    runner.run(FAIL.call(pk, run_id, fence, "boom", 10, RETENTION, now=now))
                    del held[run_id]
                elif fate < 0.55:
                    del held[run_id]  # its worker died: the lease expires, a claim retakes it
                    orphaned.add(run_id)
    for g in paused:
        group(runner, pk, g, paused=False)
    for _ in range(2_000):
        if done == set(made):
            break
        now += LEASE_MS + 1
        held.clear()  # every lease has expired by now
        for r in claim(runner, pk, now=now, limit=8).runs:
            runner.run(COMPLETE.call(pk, [(r.run_id, r.fence, "1")], RETENTION, now=now))
            done.add(r.run_id)
    assert done == set(made), sorted(set(made) - done)


@pytest.mark.usefixtures("on")
def test_a_group_queue_full_of_cancelled_runs_is_walked_a_bounded_part_per_claim(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """1,000 runs of a cancelled (gone from the due set) at the head of its queue: one claim
    looks at no more than a bounded number of them (the script stays short), and the run
    behind them is still reached by later claims."""
    create_in_group(runner, pk, "a", *[f"a-{i}" for i in range(1_000)], now=0)
    create_in_group(runner, pk, "a", "a-live", now=1)
    redis_client.zrem(pk.due, *[f"a-{i}" for i in range(1_000)])  # as old cancels leave them
    calls, got = 0, []
    while not got and calls < 20:
        calls += 1
        got = ids(claim(runner, pk, now=1_000 + calls, limit=1))
    assert got == ["a-live"]
    assert calls >= 1_000 // 256  # a bounded walk per claim, not all at once
