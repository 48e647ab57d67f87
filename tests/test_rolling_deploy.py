"""Workers of different code on one Redis: with no queues given, a worker serves the queues its
app's tasks name, so two apps never touch each other's runs; a run of a task the worker that
claimed it has no code for (a rolling deploy: new code enqueues a task the old workers do not
know yet) is handed back, not counted as an attempt, and runs once a worker that has it comes;
it is dead only when no such worker came within the window (Settings.unknown_task_window_s)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from helpers import (
    Send,
    advance_until,
    fake_clock,
    finished,
    intercept_worker_calls,
    make_worker,
    running,
    wait_for,
)

from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConnectionFailed
from jobqueue.settings import Settings
from jobqueue.store.scripts import Call

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

# Hand-backs come back fast, and the window outlasts every test by far.
DEPLOY = Settings(unknown_task_delay_s=0.02, unknown_task_delay_cap_s=0.1)


def old_app(redis_client: Any, settings: Settings = DEPLOY) -> JobQueue:
    """The code before the deploy: one task, on the default queue."""
    jq = JobQueue(redis_client, settings=settings)

    @jq.task(queue="default")
    def send_mail(to: str) -> str:
        return f"old:{to}"

    return jq


def new_app(redis_client: Any) -> JobQueue:
    """The code after the deploy: the same task and a new one, on the same queue."""
    jq = JobQueue(redis_client, settings=DEPLOY)

    @jq.task(queue="default")
    def send_mail(to: str) -> str:
        return f"new:{to}"

    @jq.task(queue="default")
    def send_sms(to: str) -> str:
        return f"sms:{to}"

    return jq


def owners(jq: JobQueue, run_id: str) -> set[str]:
    """The workers that claimed the run, from its timeline."""
    return {
        word.removeprefix("owner=")
        for _, event in jq.get_run(run_id).timeline()
        for word in event.split()
        if word.startswith("owner=")
    }


def test_a_worker_with_no_queues_serves_the_queues_its_tasks_name(redis_client: Any) -> None:
    jq = JobQueue(redis_client)

    @jq.task(queue="sms")
    def text(to: str) -> None: ...

    @jq.task(queue="mail")
    def mail(to: str) -> None: ...

    @jq.task(queue="sms")
    def reply(to: str) -> None: ...

    assert make_worker(jq).queues == ["sms", "mail"]


def test_a_worker_of_an_app_with_no_tasks_serves_the_default_queue(redis_client: Any) -> None:
    assert make_worker(JobQueue(redis_client)).queues == ["default"]


def test_queues_given_to_the_worker_are_served_as_given(redis_client: Any) -> None:
    jq = old_app(redis_client)
    assert make_worker(jq, queues=["urgent", "default"]).queues == ["urgent", "default"]


def test_the_worker_says_at_start_which_queues_it_serves_and_why(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    jq = JobQueue(redis_client)

    @jq.task(queue="sms")
    def text(to: str) -> None: ...

    with caplog.at_level(logging.INFO, logger="jobqueue.worker"), running(make_worker(jq)) as w:
        wait_for(lambda: w.state == "running", what="the worker to start")
    (line,) = [r.getMessage() for r in caplog.records if " started: " in r.getMessage()]
    assert "queues=sms (named by its tasks) tasks=text " in line


def test_two_apps_on_one_redis_never_touch_each_others_runs(redis_client: Any) -> None:
    billing = JobQueue(redis_client, settings=DEPLOY)
    shipping = JobQueue(redis_client, settings=DEPLOY)

    @billing.task(queue="billing")
    def charge(n: int) -> str:
        return f"charged {n}"

    @shipping.task(queue="shipping")
    def ship(n: int) -> str:
        return f"shipped {n}"

    b_worker = make_worker(billing, worker_id="billing-worker")
    s_worker = make_worker(shipping, worker_id="shipping-worker")
    with running(b_worker), running(s_worker):
        charges = [charge.enqueue(i).run_id for i in range(10)]
        shipments = [ship.enqueue(i).run_id for i in range(10)]
        runs = [finished(billing, r) for r in charges + shipments]
    assert {r.state for r in runs} == {"done"}
    assert all(owners(billing, r) == {"billing-worker"} for r in charges)
    assert all(owners(billing, r) == {"shipping-worker"} for r in shipments)
    assert b_worker.stats.handed_back == s_worker.stats.handed_back == 0


def test_an_old_worker_hands_back_a_new_task_without_counting_an_attempt(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = old_app(redis_client), new_app(redis_client)
    with caplog.at_level(logging.WARNING, logger="jobqueue.worker"), running(
        make_worker(old, worker_id="old-worker")
    ) as worker:
        sms = new.resolve_task("send_sms").enqueue("+33")
        wait_for(lambda: worker.stats.handed_back >= 2, what="two hand-backs")
    run = new.get_run(sms.run_id)
    assert (run.state, run.attempt) == ("pending", 0)
    assert any(
        event.startswith("handed back") and "owner=old-worker" in event
        and "no code for task 'send_sms'" in event
        for _, event in run.timeline()
    )
    warnings = [r for r in caplog.records if r.getMessage().startswith("handed back")]
    assert warnings and all(r.levelname == "WARNING" for r in warnings)
    assert getattr(warnings[0], "run_id", None) == sms.run_id


def test_a_rolling_deploy_loses_no_run(redis_client: Any) -> None:
    """An old worker and a new producer share a queue, then a new worker joins: every run,
    of the old task and of the new one, is done once, each by a worker that has its task."""
    old, new = old_app(redis_client), new_app(redis_client)
    mail, sms = new.resolve_task("send_mail"), new.resolve_task("send_sms")
    with running(make_worker(old, worker_id="old-worker")) as old_worker:
        handles = [mail.enqueue(f"m{i}") for i in range(20)]
        handles += [sms.enqueue(f"s{i}") for i in range(20)]
        wait_for(lambda: old_worker.stats.handed_back >= 20, what="the old worker's hand-backs")
        with running(make_worker(new, worker_id="new-worker")):
            runs = {h.run_id: finished(new, h.run_id) for h in handles}
    assert {r.state for r in runs.values()} == {"done"}
    for h in handles[20:]:  # the new task's runs: handed back, then run once, by the new code
        assert runs[h.run_id].result.startswith("sms:")
        assert runs[h.run_id].attempt == 1
        assert "new-worker" in owners(new, h.run_id)
    assert {runs[h.run_id].result.split(":")[0] for h in handles[:20]} <= {"old", "new"}


def test_a_run_no_worker_has_the_task_for_is_dead_after_the_window_saying_why(
    redis_client: Any,
) -> None:
    """The default window (an hour), on a fake clock: handed back with a growing delay until
    the hour is over, then dead with a clear reason, its attempts still not counted. (The
    worker's waits for a wake-up run on real time: kept short, so that the moved clock is
    seen at once; its lease outlasts the clock's jumps, which would otherwise expire it between
    a claim and its hand-back.)"""
    old = old_app(redis_client, settings=Settings())
    clock = fake_clock(old)
    new = new_app(redis_client)
    with running(make_worker(old, clock=clock, idle_wait=0.05, lease=86_400.0)) as worker:
        handle = new.resolve_task("send_sms").enqueue("+33")
        wait_for(lambda: worker.stats.handed_back >= 1, what="the first hand-back")
        clock.advance(3_599)
        assert not new.get_run(handle.run_id).finished  # pending, or claimed to be handed back
        run = advance_until(
            clock, lambda: (r := new.get_run(handle.run_id)).finished and r, step=60,
            what="the run to be dead",
        )
    assert (run.state, run.attempt) == ("dead", 0)
    assert run.error is not None
    assert run.error.startswith("no code for task 'send_sms' in this worker (its tasks: send_mail)")
    assert run.error.endswith("the window is 3600 s)")


def test_a_hand_back_whose_reply_was_lost_and_that_buried_the_run_is_counted_dead(
    redis_client: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first hand-back reaches Redis (a window of 0: the run is buried) but its reply is
    lost; sent again, it is refused as finished at this attempt's fence: its own first copy
    landed. That is a dead run (ERROR, counted failed), not a hand-back."""
    old = old_app(
        redis_client,
        settings=Settings(unknown_task_window_s=0, unknown_task_min_hand_backs=1),
    )
    lost: list[str] = []

    def run_each(calls: list[Call], send: Send) -> list[Any]:
        replies = send(calls)
        if not lost and any(c.script == "bounce" for c in calls):
            lost.append("bounce")
            return [ConnectionFailed("reply lost") if c.script == "bounce" else r
                    for c, r in zip(calls, replies, strict=True)]  # fmt: skip
        return replies

    intercept_worker_calls(monkeypatch, run_each)
    new = new_app(redis_client)
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"), running(
        make_worker(old)
    ) as worker:
        handle = new.resolve_task("send_sms").enqueue("+33")
        run = finished(new, handle.run_id)
        wait_for(lambda: worker.stats.failed == 1, what="the dead run counted")
    assert lost == ["bounce"]
    assert run.state == "dead"
    assert worker.stats.handed_back == 0
    lines = [r for r in caplog.records if getattr(r, "run_id", None) == handle.run_id]
    assert [r.levelname for r in lines if r.getMessage().startswith(("dead", "handed"))] == [
        "ERROR"
    ]


def test_a_run_claimed_rarely_is_not_dead_before_its_minimum_of_hand_backs(
    redis_client: Any,
) -> None:
    """Past the window after two hand-backs (a long backlog between them, here a fake clock
    jump), the run is handed back again, not buried: five hand-backs are the minimum."""
    old = old_app(
        redis_client, settings=Settings(unknown_task_delay_s=1, unknown_task_delay_cap_s=1)
    )
    clock = fake_clock(old)
    new = new_app(redis_client)
    with running(make_worker(old, clock=clock, idle_wait=0.05, lease=86_400.0)) as worker:
        handle = new.resolve_task("send_sms").enqueue("+33")
        wait_for(lambda: worker.stats.handed_back >= 1, what="the first hand-back")
        clock.advance(2 * 3600)
        wait_for(lambda: worker.stats.handed_back >= 2, what="a hand-back past the window")
        assert not new.get_run(handle.run_id).finished
        run = advance_until(
            clock, lambda: (r := new.get_run(handle.run_id)).finished and r, step=5,
            what="the run to be dead",
        )
    assert run.state == "dead"
    assert worker.stats.handed_back == 4  # the fifth hand-back buried it
