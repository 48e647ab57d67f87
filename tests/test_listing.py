"""Run listings are exact: a page ends at its limit, at the end of the listing, or at its scan
budget with a cursor to go on, never short without saying so; following the cursors lists
every run that stayed put once; each page says how many runs the listing holds."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest

from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError
from jobqueue.ops import queries
from jobqueue.ops.listing import RunQuery, iter_runs, runs_page
from jobqueue.store.pages import INDEX_PAGE
from jobqueue.store.runs import CLAIM, COMPLETE, FAIL
from jobqueue.store.scripts import ScriptRunner

MIN = 60_000
DAY = 24 * 60 * MIN


def enqueue(jq: JobQueue, ids: Iterable[str], task: str = "report", queue: str = "default"
            ) -> None:
    jq.enqueue_many([Request(task, run_id=rid, queue=queue) for rid in ids])


def finish(jq: JobQueue, ids: list[str], at_ms: int, *, fail: bool = False,
           queue: str = "default", task: str = "report", error: str = "boom") -> None:
    """Create runs and finish them at ``at_ms`` (done, or dead with ``error``). The claim
    takes the oldest due runs: call it while no other run is due."""
    enqueue(jq, ids, task, queue)
    for keys in {jq.keys_for(queue, rid) for rid in ids}:
        claimed = CLAIM.parse(jq.scripts.run(CLAIM.call(keys, len(ids), "w", 30_000, DAY)))
        for r in claimed.runs:
            if fail:
                jq.scripts.run(FAIL.call(keys, r.run_id, r.fence, error, None, DAY, at_ms))
            else:
                jq.scripts.run(COMPLETE.call(keys, [(r.run_id, r.fence, "null")], DAY, at_ms))


def every_page(jq: JobQueue, query: RunQuery, limit: int, **kw: Any) -> list[str]:
    """The run ids of every page, in order, following the cursors."""
    seen: list[str] = []
    cursor = None
    for _ in range(2_000):
        page = runs_page(jq, query, cursor=cursor, limit=limit, **kw)
        seen += [r.run_id for r in page]
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor
    raise AssertionError("the cursors never reached the end")


@pytest.fixture
def jq(jq: JobQueue) -> JobQueue:
    jq.declare_task("report", max_attempts=1)
    jq.declare_task("mail", max_attempts=1)
    return jq


@pytest.fixture
def wide(redis_client: Any) -> JobQueue:
    """Two queues of 4 partitions each."""
    q = JobQueue(redis_client, partitions={"default": 4, "other": 4})
    q.declare_task("report", max_attempts=1)
    return q


# -- the index page script -----------------------------------------------------------------


def page_of(runner: ScriptRunner, key: str, order: str, after: tuple[str, str] | None = None,
            count: int = 1000, **kw: Any) -> list[str]:
    page = INDEX_PAGE.parse(runner.run(INDEX_PAGE.call(key, order, after=after, count=count,
                                                       **kw)))
    assert page is not None
    return [m for m, _ in page.entries]


def test_an_index_page_goes_on_after_a_place_whose_run_left(
    runner: ScriptRunner, redis_client: Any
) -> None:
    redis_client.zadd("ix", {f"r{i:03d}": i // 10 for i in range(100)})  # ties of ten
    redis_client.zrem("ix", "r045")
    assert page_of(runner, "ix", "asc", ("4", "r045"), 3) == ["r046", "r047", "r048"]
    assert page_of(runner, "ix", "desc", ("4", "r045"), 3) == ["r044", "r043", "r042"]


def test_an_index_page_goes_on_after_a_place_that_is_still_there(
    runner: ScriptRunner, redis_client: Any
) -> None:
    redis_client.zadd("ix", {f"r{i:03d}": i // 10 for i in range(100)})
    assert page_of(runner, "ix", "asc", ("4", "r045"), 2) == ["r046", "r047"]
    assert page_of(runner, "ix", "asc", ("4", "r045"), 2, inclusive=True) == ["r045", "r046"]
    assert page_of(runner, "ix", "desc", ("4", "r045"), 2) == ["r044", "r043"]


def test_an_index_page_orders_members_bytewise_as_redis_does(
    runner: ScriptRunner, redis_client: Any
) -> None:
    names = ["B", "a", "é", "Z", "_", "ab", "a0"]
    redis_client.zadd("ix", dict.fromkeys(names, 7))
    for gone in names:
        redis_client.zrem("ix", gone)
        expected = sorted((n for n in names if n.encode() > gone.encode()), key=str.encode)
        assert page_of(runner, "ix", "asc", ("7", gone)) == expected
        redis_client.zadd("ix", {gone: 7})


def test_an_index_page_counts_and_keeps_to_its_score_range(
    runner: ScriptRunner, redis_client: Any
) -> None:
    redis_client.zadd("ix", {f"r{i}": i for i in range(10)})
    page = INDEX_PAGE.parse(runner.run(INDEX_PAGE.call("ix", "desc", "3", "6", count=2)))
    assert page is not None and page.in_range == 4
    assert [m for m, _ in page.entries] == ["r6", "r5"]
    assert page_of(runner, "ix", "asc", ("4", "r4"), low="3", high="6") == ["r5", "r6"]


def test_an_index_of_another_type_gives_no_page(runner: ScriptRunner, redis_client: Any) -> None:
    redis_client.set("ix", "foreign")
    assert INDEX_PAGE.parse(runner.run(INDEX_PAGE.call("ix", "asc"))) is None


# -- listings ----------------------------------------------------------------------------------


def test_a_cancelled_run_behind_many_done_runs_is_listed(jq: JobQueue) -> None:
    enqueue(jq, ["c1"])
    jq.cancel("c1")
    finish(jq, [f"d{i}" for i in range(60)], jq.server_time_ms() + MIN)  # newer
    page = queries.runs(jq, state="cancelled", limit=1)
    assert [r.run_id for r in page] == ["c1"]


def test_the_runs_of_a_job_are_listed_however_many_other_runs_finished_since(
    jq: JobQueue,
) -> None:
    now = jq.server_time_ms()
    finish(jq, [f"heartbeat@{i}" for i in range(5)], now - MIN)
    finish(jq, [f"other@{i}" for i in range(200)], now)
    page = queries.runs(jq, state="done", job="heartbeat", limit=3)
    assert len(page) == 3 and all(r.run_id.startswith("heartbeat@") for r in page)
    assert every_page(jq, RunQuery(state="done", job="heartbeat"), 3) == [
        f"heartbeat@{i}" for i in reversed(range(5))  # newest first; a tie: by id, reversed
    ]


def test_following_the_cursors_lists_every_run_once_across_partitions_queues_and_ties(
    wide: JobQueue,
) -> None:
    at = wide.server_time_ms()
    ids = [f"r{i:03d}" for i in range(120)]
    finish(wide, ids, at)  # one finish time for all: every entry ties
    finish(wide, ids[:30], at, queue="other")  # the same ids in another queue
    listed = every_page(wide, RunQuery(state="done"), limit=7)
    assert len(listed) == 150 and set(listed) == set(ids)
    assert sorted(listed) == sorted(ids + ids[:30])


@pytest.mark.parametrize("seed", range(4))
def test_runs_that_stay_put_are_listed_once_while_others_come_and_go(
    wide: JobQueue, seed: int
) -> None:
    rng = random.Random(seed)
    order = rng.choice(["asc", "desc"])
    now = wide.server_time_ms()
    stay = [(rng.choice(["default", "other"]), f"s{i:03d}") for i in range(90)]
    leave = [(rng.choice(["default", "other"]), f"l{i:03d}") for i in range(40)]
    for group in range(0, 130, 10):  # ten runs a finish time: ties within each
        for queue, rid in (stay + leave)[group : group + 10]:
            finish(wide, [rid], now - rng.randint(0, 4), queue=queue)
    listed: list[tuple[str, str]] = []
    cursor = None
    for added in range(1_000):  # far more pages than runs: a cursor that stops moving fails
        page = runs_page(wide, RunQuery(state="done", order=order), cursor=cursor,
                         limit=rng.randint(1, 9))
        listed += [(r.queue, r.run_id) for r in page]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        if leave:  # a run leaves the index, one that may or may not be listed yet
            queue, rid = leave.pop(rng.randrange(len(leave)))
            wide.requeue(rid, queue=queue, force=True)
        finish(wide, [f"n{added:03d}"], now - rng.randint(0, 4), queue="other")
    else:
        raise AssertionError("the cursors never reached the end")
    assert Counter(listed[i] for i in range(len(listed)) if listed[i] in set(stay)) == (
        Counter(stay)
    )


def test_following_the_cursors_goes_through_every_state_in_turn(jq: JobQueue) -> None:
    now = jq.server_time_ms()
    finish(jq, ["done1", "done2"], now)
    finish(jq, ["dead1"], now, fail=True)
    enqueue(jq, ["pending1", "pending2", "running1"])
    keys = jq.keys_for("default", "running1")
    jq.scripts.run(CLAIM.call(keys, 1, "w", 30_000, DAY))
    listed = every_page(jq, RunQuery(), limit=2)
    assert sorted(listed) == ["dead1", "done1", "done2", "pending1", "pending2", "running1"]
    states = [jq.get_run(rid).state for rid in listed]
    assert states == ["running", "pending", "pending", "dead", "done", "done"]


def test_a_run_that_leaves_between_pages_does_not_lose_the_place(jq: JobQueue) -> None:
    at = jq.server_time_ms()
    ids = [f"r{i:02d}" for i in range(20)]
    finish(jq, ids, at)
    first = runs_page(jq, RunQuery(state="done", order="asc"), limit=5)
    assert [r.run_id for r in first] == ids[:5]
    jq.requeue("r04", force=True)  # the place's own run is no longer in the done index
    assert first.next_cursor is not None
    second = runs_page(jq, RunQuery(state="done", order="asc"), cursor=first.next_cursor,
                       limit=5)
    assert [r.run_id for r in second] == ids[5:10]


def test_a_selective_filter_ends_a_page_at_its_scan_budget_and_says_so(jq: JobQueue) -> None:
    now = jq.server_time_ms()
    finish(jq, ["wanted"], now - MIN, task="mail")
    finish(jq, [f"d{i}" for i in range(50)], now)
    page = runs_page(jq, RunQuery(task="mail"), limit=10, scan_limit=20)
    assert list(page) == [] and page.scanned == 20 and page.next_cursor is not None
    assert page.total == 51 and not page.total_exact
    assert "at most 51" in page.summary() and "more on the next page" in page.summary()
    assert every_page(jq, RunQuery(task="mail"), limit=10, scan_limit=20) == ["wanted"]


def test_a_page_counts_the_whole_listing(jq: JobQueue) -> None:
    now = jq.server_time_ms()
    finish(jq, [f"x{i}" for i in range(12)], now, fail=True)
    page = runs_page(jq, RunQuery(state="dead"), limit=5)
    assert len(page) == 5 and page.total == 12 and page.total_exact
    last = runs_page(jq, RunQuery(state="dead"), limit=5, cursor=page.next_cursor)
    assert last.total == 12
    assert page.summary().startswith("5 shown of 12")


def test_the_last_page_has_no_cursor(jq: JobQueue) -> None:
    finish(jq, ["a", "b"], jq.server_time_ms(), fail=True)
    page = runs_page(jq, RunQuery(state="dead"), limit=2)
    assert len(page) == 2 and page.next_cursor is None
    assert page.summary().endswith("the end")


def test_a_time_range_bounds_the_time_the_listing_is_sorted_by(jq: JobQueue) -> None:
    now = jq.server_time_ms()
    finish(jq, ["old"], now - 3 * MIN, fail=True)
    finish(jq, ["mid"], now - 2 * MIN, fail=True)
    finish(jq, ["new"], now - MIN, fail=True)
    query = RunQuery(state="dead", since_ms=now - 2 * MIN, until_ms=now - MIN)
    page = runs_page(jq, query)
    assert [r.run_id for r in page] == ["new", "mid"] and page.total == 2


def test_error_task_and_prefix_filters_all_hold(jq: JobQueue) -> None:
    now = jq.server_time_ms()
    finish(jq, ["a-1", "a-2"], now, fail=True, error="Timeout talking to SMTP")
    finish(jq, ["b-1"], now, fail=True, error="KeyError: 'x'")
    finish(jq, ["a-3"], now, fail=True, task="mail", error="timeout again")
    ids = sorted(r.run_id for r in runs_page(jq, RunQuery(state="dead", error="TIMEOUT")))
    assert ids == ["a-1", "a-2", "a-3"]
    ids = sorted(r.run_id for r in runs_page(jq, RunQuery(error="timeout", task="report")))
    assert ids == ["a-1", "a-2"]
    assert [r.run_id for r in runs_page(jq, RunQuery(prefix="b-"))] == ["b-1"]


def test_the_order_can_be_turned(jq: JobQueue) -> None:
    now = jq.server_time_ms()
    for i in range(3):
        finish(jq, [f"r{i}"], now + i, fail=True)
    assert [r.run_id for r in runs_page(jq, RunQuery(state="dead"))] == ["r2", "r1", "r0"]
    assert [r.run_id for r in runs_page(jq, RunQuery(state="dead", order="asc"))] == [
        "r0", "r1", "r2"
    ]


def test_iter_runs_gives_every_run_of_a_filter(jq: JobQueue) -> None:
    finish(jq, [f"r{i}" for i in range(25)], jq.server_time_ms(), fail=True)
    assert len(list(iter_runs(jq, RunQuery(state="dead"), page_size=4))) == 25


@pytest.mark.parametrize(
    "cursor",
    ["", "nonsense", "c1.", "c1.!!!", "c1." + "A" * 5000, "c1.WyJkdWUiXQ",  # ["due"]
     "c1.WyJub3BlIiwiMSIsInIiLCJxIl0"],  # ["nope","1","r","q"]
)
def test_a_cursor_no_page_gave_is_refused_with_a_clear_error(jq: JobQueue, cursor: str) -> None:
    with pytest.raises(ConfigError, match="not a listing cursor"):
        runs_page(jq, RunQuery(), cursor=cursor)


def test_a_cursor_of_another_listing_is_refused(jq: JobQueue) -> None:
    finish(jq, ["a", "b"], jq.server_time_ms(), fail=True)
    cursor = runs_page(jq, RunQuery(state="dead"), limit=1).next_cursor
    with pytest.raises(ConfigError, match="another listing"):
        runs_page(jq, RunQuery(state="pending"), cursor=cursor)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (RunQuery(state="sleeping"), "unknown state"),
        (RunQuery(order="up"), "order is"),
        (RunQuery(state="running", order="desc"), "oldest first only"),
        (RunQuery(since_ms=5, until_ms=4), "since is after until"),
    ],
)
def test_a_query_that_cannot_be_answered_is_refused(
    jq: JobQueue, query: RunQuery, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        runs_page(jq, query)


def test_a_part_of_a_run_id_finds_every_run_that_holds_it(jq: JobQueue) -> None:
    finish(jq, ["invoice-42", "receipt-7", "old-invoice"], jq.server_time_ms(), fail=True)
    page = runs_page(jq, RunQuery(contains="invoice"))
    assert sorted(r.run_id for r in page) == ["invoice-42", "old-invoice"]
    assert not page.total_exact


def test_a_run_whose_history_holds_another_type_is_listed_with_the_anomaly(
    jq: JobQueue, redis_client: Any
) -> None:
    finish(jq, ["a", "b"], jq.server_time_ms(), fail=True)
    keys = jq.keys_for("default", "a")
    redis_client.delete(keys.history("a"))
    redis_client.set(keys.history("a"), "foreign")
    page = runs_page(jq, RunQuery(state="dead"))
    assert sorted(r.run_id for r in page) == ["a", "b"]
    (a,) = [r for r in page if r.run_id == "a"]
    assert any("holds another type" in str(x) for x in a.anomalies)
