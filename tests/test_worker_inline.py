"""Short sync tasks run on the claim loop's own thread ("jq-claim"), once measured short in the
pool; a run that is long there sends its task back to the pool, and one that is stuck never
stops the worker from claiming (jobqueue.worker.inline)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from helpers import finished, make_worker, running, wait_for

from jobqueue import Request
from jobqueue.client.sync import JobQueue
from jobqueue.worker.inline import (
    INLINE_AFTER,
    INLINE_BUDGET_S,
    INLINE_MAX_S,
    TAKE_OVER_S,
    InlineLane,
    TaskSpeeds,
)

WAIT_S = 30.0  # a bound for what must happen, never reached when it does


def _lane_name() -> str:
    return threading.current_thread().name.split("-")[1]  # "claim" or "task"


def _enqueue(jq: JobQueue, task: Any, n: int, first: int = 0) -> list[str]:
    return [h.run_id for h in jq.enqueue_many([Request(task, (i,)) for i in range(first, n)])]


def _drained(jq: JobQueue, run_ids: list[str]) -> None:
    for run_id in run_ids:
        assert finished(jq, run_id, WAIT_S).state == "done"


# -- in a worker ---------------------------------------------------------------------------


def test_a_short_sync_task_runs_on_the_claim_loop_once_measured(fast_jq: JobQueue) -> None:
    ran: list[str] = []  # (list.append is atomic: the pool's threads append too)

    @fast_jq.task
    def short(i: int) -> int:
        ran.append(_lane_name())
        return i

    with running(make_worker(fast_jq, concurrency=8)):
        _drained(fast_jq, _enqueue(fast_jq, short, 4 * INLINE_AFTER))
        _drained(fast_jq, _enqueue(fast_jq, short, 8 * INLINE_AFTER, 4 * INLINE_AFTER))
    lanes = Counter(ran)
    assert lanes["task"] >= INLINE_AFTER  # measured in the pool first
    assert lanes["claim"] > 0
    assert lanes["claim"] + lanes["task"] == 8 * INLINE_AFTER


def test_a_long_run_sends_its_task_back_to_the_pool(fast_jq: JobQueue) -> None:
    lanes: list[str] = []
    slow_from = threading.Event()

    @fast_jq.task
    def sometimes_slow(i: int) -> None:
        lanes.append(_lane_name())
        if slow_from.is_set():
            time.sleep(INLINE_MAX_S * 3)

    with running(make_worker(fast_jq, concurrency=4)):
        _drained(fast_jq, _enqueue(fast_jq, sometimes_slow, 8 * INLINE_AFTER))
        assert "claim" in lanes  # inline by now
        slow_from.set()
        lanes.clear()
        _drained(fast_jq, _enqueue(fast_jq, sometimes_slow, 4 * INLINE_AFTER))
    # The first slow run inline sends the task back; measured slow there, it stays.
    assert lanes.count("claim") <= 4  # a claim's worth at most, run before it knew
    assert lanes[-INLINE_AFTER:] == ["task"] * INLINE_AFTER


def test_a_stuck_inline_run_holds_one_slot_and_the_worker_claims_on(fast_jq: JobQueue) -> None:
    release = threading.Event()
    stuck_on: list[str] = []

    @fast_jq.task
    def mostly_short(i: int) -> None:
        if i == -1:
            stuck_on.append(_lane_name())
            release.wait(WAIT_S)

    try:
        with running(make_worker(fast_jq, concurrency=4)):
            _drained(fast_jq, _enqueue(fast_jq, mostly_short, 4 * INLINE_AFTER))
            stuck = fast_jq.enqueue(mostly_short, -1).run_id
            wait_for(lambda: stuck_on, WAIT_S, "the stuck run to start")
            # Claimed and run while the stuck run still holds its thread.
            _drained(fast_jq, _enqueue(fast_jq, mostly_short, 2 * INLINE_AFTER))
            assert fast_jq.get_run(stuck).state == "running"
            release.set()
            assert finished(fast_jq, stuck, WAIT_S).state == "done"
    finally:
        release.set()
    assert stuck_on == ["claim"]  # it did run inline


# -- the lane on its own -------------------------------------------------------------------


class Outcomes:
    def __init__(self) -> None:
        self.done: list[Any] = []
        self.pooled: list[Any] = []

    def finish(self, token: Any, value: Any, error: BaseException | None) -> None:
        self.done.append(token)

    def to_pool(self, token: Any, fn: Any, args: tuple[Any, ...]) -> None:
        self.pooled.append(token)


def test_a_task_is_inline_only_once_its_usual_run_is_measured_short() -> None:
    speeds = TaskSpeeds()
    for _ in range(INLINE_AFTER - 1):
        speeds.record("t", INLINE_MAX_S / 10)
    assert not speeds.inline("t")
    speeds.record("t", INLINE_MAX_S / 10)
    assert speeds.inline("t")
    assert not speeds.inline("other")


def test_gil_waits_in_the_pool_do_not_keep_a_short_task_out_of_the_lane() -> None:
    """A run's wall time in the pool includes its waits for the GIL: a few long ones among
    short ones leave the task's usual time short."""
    speeds = TaskSpeeds()
    for i in range(4 * INLINE_AFTER):
        speeds.record("t", INLINE_MAX_S * 5 if i % 4 == 0 else INLINE_MAX_S / 10)
    assert speeds.inline("t")


def test_one_go_of_inline_work_is_bounded_and_the_rest_goes_to_the_pool() -> None:
    out, speeds = Outcomes(), TaskSpeeds()
    lane = InlineLane(out.finish, out.to_pool, speeds)
    n = 20
    for i in range(n):
        lane.add("t", (i, time.sleep, (INLINE_BUDGET_S / 4,)))
    assert lane.run()
    assert out.done == list(range(len(out.done)))
    assert out.pooled == list(range(len(out.done), n))
    assert 1 <= len(out.done) < n


def test_a_stuck_inline_run_gives_its_thread_up_and_its_queue_to_the_pool() -> None:
    out, speeds = Outcomes(), TaskSpeeds()
    for _ in range(INLINE_AFTER):
        speeds.record("t", 0.0)
    lane = InlineLane(out.finish, out.to_pool, speeds)
    release = threading.Event()
    lane.add("t", ("stuck", release.wait, (WAIT_S,)))
    lane.add("t", ("behind", lambda: None, ()))
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(lane.run()))
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not lane.stuck() and time.monotonic() < deadline:  # the keeper's tick
        time.sleep(TAKE_OVER_S / 5)
    assert out.pooled == ["behind"]
    assert not speeds.inline("t")
    assert not lane.stuck()  # once
    release.set()
    thread.join(WAIT_S)
    assert (result, out.done) == ([False], ["stuck"])
