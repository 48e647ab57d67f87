"""Schedules declared in code (``@jq.task(cron=...)``, ``schedules=[...]``,
``jq.declare_schedule``): validated at declaration with nothing written, synced by the
scheduler at start (upsert: unchanged keeps its next fire, changed applies from the next
fire), and pruned only on request and only when they came from code."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from click.testing import CliRunner

from jobqueue.cli import main
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError, RecurringError
from jobqueue.policy.cron import parse_fire_instant
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.recurring.definitions import ORIGIN_CODE

S = 1000


def app(redis_client: Any = None) -> JobQueue:
    """A fresh app (what a new deployment of the code is), on the same Redis."""
    return JobQueue(redis_client) if redis_client is not None else JobQueue()


def fires(redis_client: Any, job_id: str) -> list[int]:
    out = []
    for key in redis_client.scan_iter(match=f"jq:{{*}}:run:{job_id}@*"):
        out.append(parse_fire_instant(key.rsplit("@", 1)[1]) // S)
    return sorted(out)


def tick(jq: JobQueue, now_s: int) -> None:
    Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False).tick(now=now_s * S)


# -- declaring (no Redis involved) ------------------------------------------------------------


def test_task_decorator_with_cron_declares_a_schedule_named_after_the_task() -> None:
    jq = app()

    @jq.task(cron="0 * * * *", tz="Europe/Paris", jitter=30, overlap="forbid")
    def report() -> None: ...

    (defn,) = jq.declared_schedules
    assert (defn.job_id, defn.task, defn.cron, defn.tz) == (
        "report",
        "report",
        "0 * * * *",
        "Europe/Paris",
    )
    assert (defn.jitter_ms, defn.overlap, defn.origin) == (30 * S, "forbid", ORIGIN_CODE)


def test_task_decorator_with_schedules_declares_each_with_its_id() -> None:
    jq = app()

    @jq.task(
        schedules=[{"id": "hourly", "cron": "0 * * * *"}, {"id": "fast", "every": 10, "args": [1]}]
    )
    def ping(n: int = 0) -> None: ...

    assert [(d.job_id, d.cron, d.every_ms, d.args) for d in jq.declared_schedules] == [
        ("hourly", "0 * * * *", None, ()),
        ("fast", None, 10 * S, (1,)),
    ]


def test_declare_schedule_adds_to_the_apps_schedule_list() -> None:
    jq = app()
    jq.declare_task("nightly")
    jq.declare_schedule("nightly-report", "nightly", cron="30 1 * * *", misfire="skip")
    assert [(d.job_id, d.misfire) for d in jq.declared_schedules] == [("nightly-report", "skip")]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "0 * * * *", "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"cron": "* * * * *", "jitter": 60}, "must be shorter than the schedule's period"),
        ({"every": 60, "misfire": "sometimes"}, "unknown misfire policy 'sometimes'"),
        ({"every": 60, "overlap": "queue"}, "unknown overlap policy 'queue'"),
        ({"every": 60, "colour": "red"}, "unknown schedule option(s) colour"),
    ],
)
def test_invalid_declaration_raises_at_declaration_and_writes_nothing(
    redis_client: Any, options: dict[str, Any], message: str
) -> None:
    jq = app(redis_client)
    jq.declare_task("t")
    with pytest.raises(RecurringError, match=message.replace("(", r"\(").replace(")", r"\)")):
        jq.declare_schedule("j", "t", **options)
    with pytest.raises(RecurringError, match="must be shorter"):

        @jq.task(every=10, jitter=10)
        def late() -> None: ...

    assert jq.declared_schedules == []
    assert redis_client.keys("*") == []


def test_several_schedules_of_a_task_need_ids() -> None:
    jq = app()
    with pytest.raises(RecurringError, match="give each an 'id'"):

        @jq.task(cron="0 * * * *", schedules=[{"every": 60}])
        def twice() -> None: ...


def test_the_same_job_id_declared_twice_is_refused() -> None:
    jq = app()
    jq.declare_task("t")
    jq.declare_schedule("j", "t", every=60)
    with pytest.raises(RecurringError, match="declared twice"):
        jq.declare_schedule("j", "t", every=30)


def test_a_task_whose_schedule_is_refused_is_not_registered_and_can_be_fixed() -> None:
    jq = app()
    with pytest.raises(RecurringError, match="never fires"):

        @jq.task(cron="0 0 31 2 *")
        def x1() -> None: ...

    assert "x1" not in jq.registry and jq.declared_schedules == []

    @jq.task(cron="0 0 28 2 *")
    def x1() -> None: ...  # the corrected declaration, as after an edit

    assert "x1" in jq.registry
    assert [d.job_id for d in jq.declared_schedules] == ["x1"]


def test_a_task_refused_by_the_registry_declares_none_of_its_schedules() -> None:
    jq = app()

    @jq.task(name="report")
    def first() -> None: ...

    with pytest.raises(ConfigError, match="already registered to another function"):

        @jq.task(name="report", every=60)
        def second() -> None: ...

    assert jq.declared_schedules == [] and jq.registry.get("report").func is first.func


def test_one_refused_schedule_of_a_task_declares_none_of_the_others() -> None:
    jq = app()
    with pytest.raises(RecurringError, match="unknown time zone"):

        @jq.task(
            schedules=[
                {"id": "ok", "every": 60},
                {"id": "bad", "cron": "0 * * * *", "tz": "Mars/Olympus"},
            ]
        )
        def ping() -> None: ...

    assert jq.declared_schedules == [] and "ping" not in jq.registry


# -- syncing ----------------------------------------------------------------------------------


def test_sync_creates_the_declared_schedules_marked_as_from_code(redis_client: Any) -> None:
    jq = app(redis_client)
    jq.declare_task("t")
    jq.declare_schedule("j", "t", every=60)
    report = jq.recurring.sync(jq.declared_schedules, now=0)
    info = jq.get_schedule("j")
    assert report.created == ["j"]
    assert info is not None and info.definition.origin == ORIGIN_CODE
    assert info.next_fire_ms == 60 * S


def test_sync_of_an_unchanged_declaration_writes_nothing_and_keeps_the_next_fire(
    redis_client: Any,
) -> None:
    first = app(redis_client)
    first.declare_task("t")
    first.declare_schedule("j", "t", every=60)
    first.recurring.sync(first.declared_schedules, now=0)
    tick(first, 60)
    tick(first, 120)
    again = app(redis_client)  # the same code, restarted
    again.declare_task("t")
    again.declare_schedule("j", "t", every=60)
    report = again.recurring.sync(again.declared_schedules, now=130 * S)
    info = again.get_schedule("j")
    assert report.unchanged == ["j"] and report.updated == []
    assert info is not None and info.next_fire_ms == 180 * S and info.state.fired == 2


def test_a_changed_declaration_applies_from_the_next_fire_without_duplicate_or_drop(
    redis_client: Any,
) -> None:
    first = app(redis_client)
    first.declare_task("t")
    first.declare_schedule("j", "t", every=60)
    first.recurring.sync(first.declared_schedules, now=0)
    tick(first, 60)
    tick(first, 120)
    changed = app(redis_client)
    changed.declare_task("t")
    changed.declare_schedule("j", "t", every=30)
    report = changed.recurring.sync(changed.declared_schedules, now=130 * S)
    for t in (150, 180, 210):
        tick(changed, t)
    assert report.updated == ["j"]
    assert fires(redis_client, "j") == [60, 120, 150, 180, 210]


def test_prune_removes_only_code_declared_schedules_no_longer_declared(
    redis_client: Any,
) -> None:
    old = app(redis_client)
    old.declare_task("t")
    old.declare_schedule("kept", "t", every=60)
    old.declare_schedule("dropped", "t", every=60)
    old.declare_schedule("redefined", "t", every=60)
    old.recurring.sync(old.declared_schedules, now=0)
    old.schedule("runtime", "t", every=60, now=0)  # added at run time, never pruned
    old.schedule("redefined", "t", every=120, now=0)  # taken over at run time
    new = app(redis_client)
    new.declare_task("t")
    new.declare_schedule("kept", "t", every=60)
    without = new.recurring.sync(new.declared_schedules, now=10 * S)
    assert without.removed == [] and new.get_schedule("dropped") is not None
    report = new.recurring.sync(new.declared_schedules, prune=True, now=10 * S)
    assert report.removed == ["dropped"]
    assert sorted(i.job_id for i in new.list_schedules()) == ["kept", "redefined", "runtime"]


def test_scheduler_syncs_at_start_and_logs_what_it_pruned(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    old = app(redis_client)
    old.declare_task("t")
    old.declare_schedule("gone", "t", every=3600)
    old.recurring.sync(old.declared_schedules)
    new = app(redis_client)

    @new.task(every=3600)
    def hourly() -> None: ...

    daemon = Scheduler(
        new, SchedulerConfig(prune=True, interval=0.01), install_signal_handlers=False
    )
    with caplog.at_level(logging.INFO, logger="jobqueue.scheduler"):
        assert daemon.run(max_ticks=1) == 0
    assert [i.job_id for i in new.list_schedules()] == ["hourly"]
    assert "declared recurring job gone removed (no longer declared in code)" in caplog.text


def test_cli_scheduler_prune_without_an_app_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["scheduler", "--prune"])
    assert result.exit_code == 2
    assert "--prune needs --app" in result.output


NIGHTLY = {"cron": "30 1 * * *", "tz": "America/New_York", "jitter": 60, "overlap": "forbid"}


def test_a_declaration_with_the_id_of_a_runtime_schedule_is_ignored_with_a_warning(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ops = app(redis_client)
    ops.schedule("nightly-report", "send_report", **NIGHTLY)  # at run time (no registry)
    before = ops.get_schedule("nightly-report")
    code = app(redis_client)
    code.declare_task("send_report")
    code.declare_schedule("nightly-report", "send_report", cron="0 3 * * *", misfire="skip")
    daemon = Scheduler(code, SchedulerConfig(interval=0.01), install_signal_handlers=False)
    with caplog.at_level(logging.INFO, logger="jobqueue.scheduler"):
        assert daemon.run(max_ticks=1) == 0
    after = code.get_schedule("nightly-report")
    assert before is not None and after is not None
    assert after.definition == before.definition and after.definition.origin == ""
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "nightly-report is a runtime schedule (jq.schedule / CLI): the declaration in code is "
        "ignored; remove one of them"
    ]
    assert "declared recurring job nightly-report" not in caplog.text  # not "updated"
    assert "0 created, 0 updated, 0 unchanged, 0 removed, 1 ignored" in caplog.text


def test_prune_never_removes_a_runtime_schedule_a_declaration_once_shared_its_id(
    redis_client: Any,
) -> None:
    ops = app(redis_client)
    ops.schedule("nightly-report", "send_report", **NIGHTLY)
    first = app(redis_client)
    first.declare_task("send_report")
    first.declare_schedule("nightly-report", "send_report", every=3600)
    Scheduler(first, SchedulerConfig(interval=0.01), install_signal_handlers=False).run(max_ticks=1)
    other = app(redis_client)  # a later deployment that declares nothing of the kind
    other.declare_task("t")
    other.declare_schedule("kept", "t", every=60)
    report = other.recurring.sync(other.declared_schedules, prune=True)
    info = other.get_schedule("nightly-report")
    assert report.removed == []
    assert info is not None and (info.definition.origin, info.definition.tz) == (
        "",
        "America/New_York",
    )


def test_a_runtime_schedule_created_between_syncs_read_and_write_is_not_taken_over(
    redis_client: Any,
) -> None:
    jq = app(redis_client)
    jq.declare_task("t")
    jq.declare_schedule("j", "t", every=60)
    store = jq.recurring
    real_get = store.get

    def get_then_race(job_id: str) -> Any:
        info = real_get(job_id)  # read: no schedule yet
        jq.schedule(job_id, "t", every=600, now=0)  # then jq.schedule elsewhere
        return info

    store.get = get_then_race  # type: ignore[method-assign]
    report = store.sync(jq.declared_schedules, now=0)
    store.get = real_get  # type: ignore[method-assign]
    info = jq.get_schedule("j")
    assert report.ignored == ["j"] and report.created == []
    assert info is not None and (info.definition.origin, info.definition.every_ms) == ("", 600 * S)
