"""`jobqueue schedules ...`: what list/show print matches the store, mutating commands say
what they did and are idempotent; `schedule` stays as a hidden alias."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from jobqueue.cli import State, main
from jobqueue.client.sync import JobQueue
from jobqueue.recurring.definitions import JobState
from jobqueue.store.embedded import EmbeddedServer

JOBQUEUE = str(Path(sys.executable).parent / "jobqueue")
S = 1000


def invoke(jq: JobQueue, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq), input=input)


def as_json(jq: JobQueue, *args: str) -> Any:
    result = invoke(jq, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def with_counters(jq: JobQueue, job_id: str, state: JobState) -> None:
    """Counters as the scheduler's advance script keeps them (JobState's own text form)."""
    jq.redis.hset(jq.recurring.keys(job_id).state, job_id, state.text())


def make_jobs(jq: JobQueue) -> int:
    """Two jobs with different policies and counters; returns the server time used (ms)."""
    now = jq.server_time_ms()
    jq.schedule("hourly", "report", cron="0 * * * *", misfire="fire-all:2", jitter=30,
                overlap="forbid", now=now)
    jq.schedule("every-5m", "ping", every=300, misfire="skip", now=now)
    with_counters(jq, "hourly", JobState(fired=7, missed=3, skipped=2, dropped=1,
                                         last_fire_ms=now - 600 * S, through_ms=now))
    return now


def test_list_shows_next_and_last_fire_policies_jitter_and_counters(jq: JobQueue) -> None:
    now = make_jobs(jq)
    listed = {j["job_id"]: j for j in as_json(jq, "schedules", "list")}
    hourly = listed["hourly"]
    assert hourly["next_fire_ms"] == jq.get_schedule("hourly").next_fire_ms  # type: ignore[union-attr]
    assert now < hourly["next_fire_ms"] <= now + 3600 * S
    assert hourly["last_fire_ms"] == now - 600 * S
    policies = (hourly["misfire"], hourly["overlap"], hourly["jitter_s"])
    assert policies == ("fire-all:2", "forbid", 30)
    assert (hourly["fired"], hourly["missed"], hourly["skipped_by_overlap"],
            hourly["dropped_by_cap"]) == (7, 3, 2, 1)
    assert listed["every-5m"]["last_fire_ms"] is None
    assert (listed["every-5m"]["every_s"], listed["every-5m"]["misfire"]) == (300, "skip")


def test_list_table_has_relative_and_absolute_fire_times(jq: JobQueue) -> None:
    make_jobs(jq)
    result = invoke(jq, "schedules", "list")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    for column in ("NEXT FIRE (UTC)", "LAST FIRED (UTC)", "MISFIRE", "OVERLAP", "JITTER",
                   "FIRED", "MISSED", "SKIPPED", "DROPPED"):
        assert column in header
    hourly = next(r for r in rows if r.startswith("hourly"))
    assert "(10m00s ago)" in hourly and "(in " in hourly
    assert hourly.split()[-4:] == ["7", "3", "2", "1"]
    # aligned: every row starts its NEXT FIRE cell where the header does
    start = header.index("NEXT FIRE")
    assert all(r[start - 2 : start] == "  " and r[start] == "2" for r in rows)


def test_a_run_created_ahead_is_the_next_fire_and_the_last_fired_is_in_the_past(
    jq: JobQueue,
) -> None:
    """The schedulers create runs up to a lookahead early: the fire whose run exists but is
    not due yet is shown as the next fire (run created), not as the last fire."""
    now = jq.server_time_ms()
    jq.schedule("minutely", "ping", every=60, now=now)
    ahead = (now // 60_000 + 1) * 60_000  # the next whole minute, its run created already
    with_counters(jq, "minutely", JobState(fired=3, last_fire_ms=ahead, through_ms=ahead))
    (job,) = as_json(jq, "schedules", "list")
    assert (job["next_due_ms"], job["next_due_created"]) == (ahead, True)
    assert job["last_fired_ms"] == ahead - 60_000
    header, row = invoke(jq, "schedules", "list").stdout.splitlines()
    cell = row[header.index("NEXT FIRE") : header.index("LAST FIRED")]
    assert cell.strip().endswith("), run created") and "(in " in cell
    cell = row[header.index("LAST FIRED") : header.index("  FIRED")]
    assert cell.strip().endswith(" ago)")


def test_bare_schedules_lists_the_jobs(jq: JobQueue) -> None:
    make_jobs(jq)
    result = invoke(jq, "schedules")
    assert result.exit_code == 0 and "hourly" in result.stdout and "every-5m" in result.stdout


def test_show_json_is_the_list_entry_and_human_show_names_each_counter(jq: JobQueue) -> None:
    make_jobs(jq)
    shown = as_json(jq, "schedules", "show", "hourly")
    (listed,) = [j for j in as_json(jq, "schedules", "list") if j["job_id"] == "hourly"]
    assert shown == listed
    text = invoke(jq, "schedules", "show", "hourly").stdout
    for line in ("missed          3 (misfire policy)", "skipped         2 (overlap policy)",
                 "dropped         1 (fire-all cap)", "overlap policy  forbid"):
        assert line in text


def test_pause_and_resume_say_what_they_did_and_are_idempotent(jq: JobQueue) -> None:
    make_jobs(jq)
    first = invoke(jq, "schedules", "pause", "hourly")
    assert first.exit_code == 0 and first.stdout.startswith("paused hourly")
    assert as_json(jq, "schedules", "show", "hourly")["paused"] is True
    again = invoke(jq, "schedules", "pause", "hourly")
    assert again.exit_code == 0
    assert again.stdout.strip() == "hourly is already paused (nothing to do)"
    resumed = invoke(jq, "schedules", "resume", "hourly")
    assert resumed.exit_code == 0 and resumed.stdout.startswith("resumed hourly")
    assert as_json(jq, "schedules", "show", "hourly")["next_fire_ms"] is not None
    again = invoke(jq, "schedules", "resume", "hourly")
    assert again.exit_code == 0 and "is not paused (nothing to do)" in again.stdout


def test_remove_asks_first_then_a_second_remove_is_refused(jq: JobQueue) -> None:
    make_jobs(jq)
    declined = invoke(jq, "schedules", "remove", "hourly", input="n\n")
    assert declined.exit_code == 1 and jq.get_schedule("hourly") is not None
    removed = invoke(jq, "schedules", "remove", "hourly", "--yes")
    assert removed.exit_code == 0 and removed.stdout.startswith("removed hourly")
    assert jq.get_schedule("hourly") is None
    again = invoke(jq, "schedules", "remove", "hourly", "--yes")
    assert again.exit_code == 1 and "no recurring job 'hourly'" in again.stderr


def test_trigger_creates_a_run_now_and_leaves_the_schedule(jq: JobQueue) -> None:
    make_jobs(jq)
    before = as_json(jq, "schedules", "show", "every-5m")
    created = as_json(jq, "schedules", "trigger", "every-5m")
    assert created["created"] is True and created["run_id"].startswith("every-5m@manual-")
    assert jq.get_run(created["run_id"]).state == "pending"
    assert as_json(jq, "schedules", "show", "every-5m") == before


def test_backfill_creates_each_fire_time_once_across_chunks(jq: JobQueue) -> None:
    jq.schedule("minutely", "report", every=60)
    args = ["schedules", "backfill", "minutely", "--start", "2026-01-01T00:00Z",
            "--end", "2026-01-01T20:00Z"]
    first = as_json(jq, *args)
    assert first == {"fire_times": 1201, "created": 1201, "existed": 0}  # > 2 chunks of 500
    due = jq.redis.zrange(jq.keys_for("default", "minutely@x").due, 0, -1)
    assert len(due) == 1201
    assert {"minutely@2026-01-01T00:00:00Z", "minutely@2026-01-01T08:20:00Z",
            "minutely@2026-01-01T08:19:00Z", "minutely@2026-01-01T20:00:00Z"} <= set(due)
    assert as_json(jq, *args) == {"fire_times": 1201, "created": 0, "existed": 1201}


def test_backfill_with_an_end_after_now_is_one_line_exit_2_and_writes_nothing(
    jq: JobQueue,
) -> None:
    jq.schedule("minutely", "report", every=60)
    now = jq.server_time_ms()
    start = datetime.fromtimestamp((now - 600 * S) / 1000, UTC).isoformat()
    end = datetime.fromtimestamp((now + 600 * S) / 1000, UTC).isoformat()  # 10 min ahead
    result = invoke(jq, "schedules", "backfill", "minutely", "--start", start, "--end", end)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: backfill of 'minutely': end ")
    assert "is after the server's now" in result.stderr and result.stderr.count("\n") == 1
    assert jq.redis.zcard(jq.keys_for("default", "minutely@x").due) == 0


def test_unknown_job_is_refused_with_exit_1(jq: JobQueue) -> None:
    for command in ("show", "pause", "resume", "trigger"):
        result = invoke(jq, "schedules", command, "nope")
        assert result.exit_code == 1, command
        assert result.stderr.startswith("error: no recurring job 'nope'"), command


def test_schedule_is_a_hidden_alias_of_schedules(jq: JobQueue) -> None:
    make_jobs(jq)
    assert as_json(jq, "schedule", "list") == as_json(jq, "schedules", "list")
    assert invoke(jq, "schedule", "pause", "hourly").stdout.startswith("paused hourly")
    listed = CliRunner().invoke(main, ["--help"]).stdout
    assert "  schedules " in listed and "  schedule " not in listed


def test_schedules_commands_in_a_real_subprocess(real_server: EmbeddedServer) -> None:
    redis.Redis.from_url(real_server.url).flushall()
    base = [JOBQUEUE, "--redis-url", real_server.url, "schedules"]

    def run(*args: str) -> str:
        return subprocess.run([*base, *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout

    assert run("add", "nightly", "report", "--cron", "0 3 * * *", "--jitter", "60").startswith(
        "scheduled nightly")
    assert "paused nightly" in run("pause", "nightly")
    (job,) = json.loads(run("list", "--json"))
    assert (job["job_id"], job["paused"], job["jitter_s"], job["next_fire_ms"]) == (
        "nightly", True, 60, None)


@pytest.mark.parametrize(
    "option", [("--jitter", "inf"), ("--jitter", "nan"), ("--every", "inf"), ("--every", "nan")]
)
def test_add_refuses_a_jitter_or_interval_that_is_not_finite(
    jq: JobQueue, option: tuple[str, str]
) -> None:
    every = [] if option[0] == "--every" else ["--every", "60"]
    result = invoke(jq, "schedules", "add", "j", "t", *every, *option)
    assert result.exit_code == 2, result.output
    assert "is not a finite number" in result.output and "Traceback" not in result.output
    assert jq.get_schedule("j") is None


SCHEDULED_APP = """
from jobqueue import JobQueue
jq = JobQueue.from_url()

@jq.task
def report(region: str) -> None: ...
"""


@pytest.fixture
def report_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "report_app.py").write_text(SCHEDULED_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "report_app", raising=False)
    yield "report_app:jq"
    sys.modules.pop("report_app", None)


def add(url: str, *args: str) -> Result:
    return CliRunner().invoke(
        main, ["--redis-url", url, "schedules", "add", "nightly", *args, "--every", "3600"]
    )


def test_schedules_add_with_app_refuses_a_task_the_app_does_not_have(
    real_server: EmbeddedServer, report_app: str
) -> None:
    redis.Redis.from_url(real_server.url).flushall()
    result = add(real_server.url, "nosuch_task", "--app", report_app)
    assert result.exit_code == 1
    assert "task 'nosuch_task' is not registered in report_app:jq" in result.stderr
    assert JobQueue.from_url(real_server.url).get_schedule("nightly") is None


def test_schedules_add_with_app_refuses_arguments_that_do_not_fit_the_task(
    real_server: EmbeddedServer, report_app: str
) -> None:
    redis.Redis.from_url(real_server.url).flushall()
    result = add(real_server.url, "report", "--app", report_app, "--args", "[1, 2]")
    assert result.exit_code == 2
    assert "arguments do not fit task report" in result.stderr
    assert JobQueue.from_url(real_server.url).get_schedule("nightly") is None


def test_schedules_add_with_app_writes_a_task_it_has(
    real_server: EmbeddedServer, report_app: str
) -> None:
    redis.Redis.from_url(real_server.url).flushall()
    result = add(real_server.url, "report", "--app", report_app, "--args", '["eu"]')
    assert result.exit_code == 0, result.output
    assert "note:" not in result.stderr


def test_schedules_add_without_app_says_the_task_is_not_checked(
    real_server: EmbeddedServer,
) -> None:
    redis.Redis.from_url(real_server.url).flushall()
    result = add(real_server.url, "nosuch_task")
    assert result.exit_code == 0
    assert result.stderr.startswith("note: task 'nosuch_task' and its arguments were not checked")
