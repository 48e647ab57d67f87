"""Short sync tasks run on the claim loop's own thread ("jq-claim"), once measured short in the
pool; a run that is long there sends its task back to the pool, and one that is stuck never
stops the worker from claiming (jobqueue.worker.inline)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from helpers import Exited, finished, make_worker, running, wait_for

from jobqueue import Request
from jobqueue.client.sync import JobQueue
from jobqueue.worker.inline import (
    INLINE_AFTER,
    INLINE_BUDGET_S,
    INLINE_MAX_S,
    PROBE_MAX_S,
    RETRY_AFTER_RUNS,
    STAY_MAX_WAIT_S,
    TAKE_OVER_S,
    InlineLane,
    TaskSpeeds,
)

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

WAIT_S = 30.0  # a bound for what must happen, never reached when it does


def _lane_name() -> str:
    return threading.current_thread().name.split("-")[1]  # "claim" or "task"


def _enqueue(jq: JobQueue, task: Any, n: int, first: int = 0) -> list[str]:
    return [h.run_id for h in jq.enqueue_many([Request(task, (i,)) for i in range(first, n)])]


def _drained(jq: JobQueue, run_ids: list[str]) -> None:
    for run_id in run_ids:
        assert finished(jq, run_id, WAIT_S).state == "done"


def _until_inline(jq: JobQueue, task: Any, lanes: list[str]) -> None:
    """Runs of ``task`` (which appends its lane to ``lanes``) until one ran inline: on a
    loaded machine a task may leave the lane and come back later."""
    first = 0
    for _ in range(40):
        _drained(jq, _enqueue(jq, task, first + INLINE_AFTER, first))
        first += INLINE_AFTER
        if lanes and lanes[-1] == "claim":
            return
    raise AssertionError(f"{task} never ran inline")


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


def test_a_task_whose_runs_turn_long_goes_back_to_the_pool(fast_jq: JobQueue) -> None:
    lanes: list[str] = []
    slow_from = threading.Event()

    @fast_jq.task
    def sometimes_slow(i: int) -> None:
        lanes.append(_lane_name())
        if slow_from.is_set():
            time.sleep(INLINE_MAX_S * 5)

    with running(make_worker(fast_jq, concurrency=4)):
        _until_inline(fast_jq, sometimes_slow, lanes)
        slow_from.set()
        lanes.clear()
        _drained(fast_jq, _enqueue(fast_jq, sometimes_slow, 4 * INLINE_AFTER))
    # Its usual inline run reaches the bound after a few long runs; in the pool it stays
    # (it would try the lane again only after RETRY_AFTER_RUNS more).
    assert 1 <= lanes.count("claim") <= INLINE_AFTER
    assert lanes[-INLINE_AFTER:] == ["task"] * INLINE_AFTER


def test_a_stuck_inline_run_holds_one_slot_and_the_worker_claims_on(fast_jq: JobQueue) -> None:
    release = threading.Event()
    stuck_on: list[str] = []

    lanes: list[str] = []

    @fast_jq.task
    def mostly_short(i: int) -> None:
        lanes.append(_lane_name())
        if i == -1:
            stuck_on.append(_lane_name())
            release.wait(WAIT_S)

    try:
        with running(make_worker(fast_jq, concurrency=4)):
            _until_inline(fast_jq, mostly_short, lanes)
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


def test_a_run_finished_inline_before_a_stuck_one_in_the_same_go_is_committed(
    fast_jq: JobQueue,
) -> None:
    release = threading.Event()
    stuck_on: list[str] = []

    lanes: list[str] = []

    @fast_jq.task
    def mostly_short(i: int) -> None:
        lanes.append(_lane_name())
        if i == -1:
            stuck_on.append(_lane_name())
            release.wait(WAIT_S)

    try:
        with running(make_worker(fast_jq, concurrency=4)):
            _until_inline(fast_jq, mostly_short, lanes)
            quick, stuck = [
                h.run_id
                for h in fast_jq.enqueue_many(
                    [Request(mostly_short, (1,)), Request(mostly_short, (-1,))]
                )
            ]
            wait_for(lambda: stuck_on, WAIT_S, "the stuck run to start")
            assert finished(fast_jq, quick, WAIT_S).state == "done"
            assert fast_jq.get_run(stuck).state == "running"
    finally:
        release.set()


def test_a_stop_while_an_inline_run_is_stuck_drains_within_the_grace_period(
    fast_jq: JobQueue,
) -> None:
    release = threading.Event()
    stuck_on: list[str] = []

    lanes: list[str] = []

    @fast_jq.task
    def mostly_short(i: int) -> None:
        lanes.append(_lane_name())
        if i == -1:
            stuck_on.append(_lane_name())
            release.wait(WAIT_S)

    worker = make_worker(fast_jq, concurrency=4, grace=0.5)
    exited = Exited(worker)
    try:
        wait_for(lambda: worker.state == "running", WAIT_S, "the worker to start")
        _until_inline(fast_jq, mostly_short, lanes)
        stuck = fast_jq.enqueue(mostly_short, -1).run_id
        wait_for(lambda: stuck_on, WAIT_S, "the stuck run to start")
        _drained(fast_jq, _enqueue(fast_jq, mostly_short, 8, 1))  # claimed by the new thread
        worker.stop()
        code = exited.join(WAIT_S)
        assert (code, fast_jq.get_run(stuck).state) == (0, "pending")  # released at the grace
    finally:
        release.set()
    assert stuck_on == ["claim"]


def test_worker_run_returns_only_when_the_claim_loop_has_ended(
    fast_jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stuck inline run that ends just as the keeper gives its thread up (before the new
    claim loop thread starts) ends that thread, not the worker."""
    release = threading.Event()
    stuck_on: list[str] = []
    given_up = InlineLane.stuck

    def run_ends_meanwhile(lane: InlineLane) -> bool:
        found = given_up(lane)
        if found:
            release.set()
            time.sleep(0.3)  # the stuck run returns before the claim loop is taken over
        return found

    monkeypatch.setattr(InlineLane, "stuck", run_ends_meanwhile)

    lanes: list[str] = []

    @fast_jq.task
    def mostly_short(i: int) -> None:
        lanes.append(_lane_name())
        if i == -1:
            stuck_on.append(_lane_name())
            release.wait(WAIT_S)

    worker = make_worker(fast_jq, concurrency=4)
    exited = Exited(worker)
    try:
        wait_for(lambda: worker.state == "running", WAIT_S, "the worker to start")
        _until_inline(fast_jq, mostly_short, lanes)
        fast_jq.enqueue(mostly_short, -1)
        wait_for(lambda: stuck_on, WAIT_S, "the stuck run to start")
        wait_for(release.is_set, WAIT_S, "the keeper to give the thread up")
        _drained(fast_jq, _enqueue(fast_jq, mostly_short, 8, 1))
        assert (exited.thread.is_alive(), worker.state) == (True, "running")
    finally:
        release.set()
        worker.stop()
        assert exited.join(WAIT_S) == 0
    assert stuck_on == ["claim"]


# -- the lane on its own -------------------------------------------------------------------


def _inline_speeds() -> TaskSpeeds:
    """Speeds by which tasks "t" and "u" run inline."""
    speeds = TaskSpeeds()
    for _ in range(INLINE_AFTER):
        speeds.record("t", 0.0)
        speeds.record("u", 0.0)
    return speeds


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


def test_a_few_long_inline_runs_in_a_row_leave_the_task_inline() -> None:
    """They are often the GIL held by the committer meanwhile, or the thread preempted by
    another process, not the task."""
    speeds = _inline_speeds()
    for _ in range(3):
        speeds.ran_inline("t", INLINE_MAX_S / 20, 0.0)
    for _ in range(3):
        speeds.ran_inline("t", INLINE_MAX_S * 3, STAY_MAX_WAIT_S * 6)
    assert speeds.inline("t")
    for _ in range(30):
        speeds.ran_inline("t", INLINE_MAX_S * 3, 0.0)
    assert not speeds.inline("t")


def test_a_task_clearly_long_in_the_pool_stays_there() -> None:
    speeds = TaskSpeeds()
    for _ in range(4 * INLINE_AFTER):
        speeds.record("t", PROBE_MAX_S * 2)
    assert not speeds.inline("t")


def test_inline_runs_that_wait_in_a_row_send_the_task_back_to_the_pool() -> None:
    speeds = TaskSpeeds()
    for _ in range(INLINE_AFTER):
        speeds.record("t", INLINE_MAX_S / 10)
    for _ in range(60):
        speeds.ran_inline("t", INLINE_MAX_S * 0.9, STAY_MAX_WAIT_S * 1.5)  # short, but waits
    assert not speeds.inline("t")


def test_a_task_that_left_the_lane_tries_it_again_later_each_time() -> None:
    speeds = TaskSpeeds()
    for _ in range(INLINE_AFTER):
        speeds.record("t", INLINE_MAX_S / 10)
    waited = []
    for _ in range(2):
        while speeds.inline("t"):
            speeds.ran_inline("t", INLINE_MAX_S * 2, 0.0)
        runs = 0
        while not speeds.inline("t"):
            speeds.record("t", INLINE_MAX_S / 10)
            runs += 1
        waited.append(runs)
    assert waited == [RETRY_AFTER_RUNS * 2, RETRY_AFTER_RUNS * 4]


def test_gil_waits_in_the_pool_do_not_keep_a_short_task_out_of_the_lane() -> None:
    """A run's wall time in the pool includes its waits for the GIL: a few long ones among
    short ones leave the task's usual time short."""
    speeds = TaskSpeeds()
    for i in range(4 * INLINE_AFTER):
        speeds.record("t", PROBE_MAX_S * 5 if i % 4 == 0 else INLINE_MAX_S / 10)
    assert speeds.inline("t")


def test_one_go_of_inline_work_is_bounded_and_the_rest_goes_to_the_pool() -> None:
    out, speeds = Outcomes(), _inline_speeds()
    lane = InlineLane(out.finish, out.to_pool, speeds)
    n = 20
    for i in range(n):
        lane.add("t", (i, time.sleep, (INLINE_BUDGET_S / 4,)))
    assert lane.run()
    assert out.done == list(range(len(out.done)))
    assert out.pooled == list(range(len(out.done), n))
    assert 1 <= len(out.done) < n


def test_a_stuck_inline_run_gives_its_thread_up_and_its_queue_to_the_pool() -> None:
    out, speeds = Outcomes(), _inline_speeds()
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


def test_outcomes_a_stuck_go_holds_are_handed_on_when_it_is_given_up() -> None:
    out, speeds = Outcomes(), _inline_speeds()
    lane = InlineLane(out.finish, out.to_pool, speeds)
    release = threading.Event()
    lane.add("t", ("quick", lambda: None, ()))
    lane.add("t", ("stuck", release.wait, (WAIT_S,)))
    thread = threading.Thread(target=lane.run)
    thread.start()
    try:
        wait_for(lane.stuck, WAIT_S, "the keeper to see the stuck run")
        assert out.done == ["quick"]
    finally:
        release.set()
        thread.join(WAIT_S)
    assert out.done == ["quick", "stuck"]


def test_a_given_up_thread_returning_does_not_hide_the_next_threads_stuck_run() -> None:
    out, speeds = Outcomes(), _inline_speeds()
    lane = InlineLane(out.finish, out.to_pool, speeds)
    first, second, second_in = threading.Event(), threading.Event(), threading.Event()
    lane.add("t", ("first", first.wait, (WAIT_S,)))
    a = threading.Thread(target=lane.run)
    a.start()
    b = threading.Thread(target=lane.run)
    try:
        wait_for(lane.stuck, WAIT_S, "the first thread to be given up")

        def second_job() -> None:
            second_in.set()
            second.wait(WAIT_S)

        lane.add("u", ("second", second_job, ()))  # ("t" went back to the pool)
        b.start()
        assert second_in.wait(WAIT_S)
        first.set()
        a.join(WAIT_S)  # ends while the second thread's run goes on
        wait_for(lane.stuck, WAIT_S, "the second thread's stuck run to be seen")
    finally:
        first.set()
        second.set()
        a.join(WAIT_S)
        if b.is_alive():
            b.join(WAIT_S)
    assert sorted(out.done) == ["first", "second"]


_INTERRUPTED = """
import os, signal, threading, time
import fakeredis
from jobqueue import JobQueue, Worker
jq = JobQueue(fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True))
@jq.task
def t(i: int) -> int:
    return i
worker = Worker(jq, concurrency=2, install_signal_handlers=False)
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    worker.run()
except KeyboardInterrupt:
    pass
def claim_threads():
    return sorted(x.name for x in threading.enumerate() if x.name == "jq-claim")
deadline = time.monotonic() + 10
while claim_threads() and time.monotonic() < deadline:
    time.sleep(0.05)
print(claim_threads())
run_id = jq.enqueue(t, 1).run_id
time.sleep(1.0)
print(jq.get_run(run_id).state)
"""


def test_an_interrupt_out_of_worker_run_stops_the_claim_loop() -> None:
    """Ctrl-C in an embedding process without the worker's signal handlers: nothing keeps
    claiming once Worker.run has raised (a claim loop left behind would lease runs it can
    neither heartbeat nor commit)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED], capture_output=True, text=True, timeout=WAIT_S
    )
    assert out.stdout.split() == ["[]", "pending"], out.stderr[-2000:]
