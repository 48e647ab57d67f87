"""A failed attempt's traceback: bounded by Settings (newest frames and bytes kept), stored
with the attempt's history entry by fail.lua, and shown by the run model, ``show``, ``dead
list --json``, ``runs --json`` and the dashboard's run page. Entries written without one (older
records) read as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from helpers import finished, make_worker, running
from starlette.testclient import TestClient

from jobqueue.cli import main
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.errors import ConfigError
from jobqueue.models import Run
from jobqueue.runtime.tracebacks import TRUNCATED, format_traceback
from jobqueue.settings import Settings
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.runs import CLAIM, FAIL

TB = 'Traceback (most recent call last):\n  File "app.py", line 3, in job\nValueError: boom'


def raised(depth: int, message: str = "boom") -> BaseException:
    def dive(n: int) -> None:
        if n == 0:
            raise ValueError(message)
        dive(n - 1)

    try:
        dive(depth)
    except ValueError as exc:
        return exc
    raise AssertionError("unreachable")


def fail_one(jq: JobQueue, run_id: str, *, retry_ms: int | None, traceback: str) -> None:
    keys = jq.keys_for("default", run_id)
    (claimed,) = CLAIM.parse(jq.scripts.run(CLAIM.call(keys, 1, "w-1", 30_000, 60_000))).runs
    assert claimed.run_id == run_id
    jq.scripts.run(
        FAIL.call(keys, run_id, claimed.fence, "ValueError: boom", retry_ms, 60_000,
                  traceback=traceback)
    )


# -- formatting ----------------------------------------------------------------------------


def test_the_traceback_keeps_the_newest_frames_up_to_max_frames() -> None:
    text = format_traceback(raised(depth=20), max_frames=3, max_bytes=65536)
    assert text.count('  File "') == 3
    assert "raise ValueError(message)" in text  # the frame that raised is kept
    assert text.endswith("ValueError: boom")


def test_the_traceback_keeps_the_newest_bytes_up_to_max_bytes() -> None:
    text = format_traceback(raised(depth=2, message="x" * 1000), max_frames=100, max_bytes=600)
    assert len(text.encode()) == 600
    assert text == TRUNCATED + "x" * (600 - len(TRUNCATED))


def test_the_traceback_cut_never_splits_a_character() -> None:
    text = format_traceback(raised(depth=5, message="é" * 400), max_frames=100, max_bytes=301)
    assert len(text.encode()) <= 301
    assert text.endswith("é")


def test_max_bytes_zero_keeps_no_traceback() -> None:
    assert format_traceback(raised(depth=1), max_frames=10, max_bytes=0) == ""


def test_a_chained_exception_keeps_its_cause() -> None:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as exc:
        text = format_traceback(exc, max_frames=10, max_bytes=65536)
    assert "KeyError: 'inner'" in text and text.endswith("RuntimeError: outer")


@pytest.mark.parametrize(
    "fields", [{"traceback_max_frames": 0}, {"traceback_max_bytes": -1},
               {"traceback_max_bytes": 65537}]
)
def test_settings_refuse_traceback_bounds_out_of_range(fields: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        Settings(**fields)


# -- storage and the run model -------------------------------------------------------------


def test_fail_keeps_the_traceback_with_the_retry_entry(jq: JobQueue) -> None:
    jq.declare_task("report", max_attempts=2)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    fail_one(jq, "r1", retry_ms=0, traceback=TB)
    run = jq.get_run("r1")
    assert [(t["attempt"], t["traceback"]) for t in run.tracebacks] == [(1, TB)]
    assert run.traceback == TB
    (event,) = [e for _, e in run.timeline() if e.startswith("failed")]
    assert "Traceback" not in event and event.endswith(": ValueError: boom")


def test_fail_keeps_the_traceback_with_the_dead_entry(jq: JobQueue) -> None:
    jq.declare_task("report", max_attempts=1)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    fail_one(jq, "r1", retry_ms=None, traceback=TB)
    run = jq.get_run("r1")
    assert run.state == "dead"
    assert [(t["attempt"], t["traceback"]) for t in run.tracebacks] == [(1, TB)]


def test_a_fail_without_traceback_adds_none(jq: JobQueue) -> None:
    jq.declare_task("report", max_attempts=1)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    fail_one(jq, "r1", retry_ms=None, traceback="")
    run = jq.get_run("r1")
    assert (run.tracebacks, run.traceback) == ([], None)


def test_an_older_history_entry_without_traceback_reads_as_before() -> None:
    line = "1700000000000 failed fence=7 attempt=1 owner=w retry at 1700000001000: boom"
    run = Run.from_hash("r1", 0, {"state": "pending", "created": "1699999999000"}, [line])
    assert run.timeline()[-1] == (1700000000000, line.partition(" ")[2])
    assert run.tracebacks == [] and run.to_dict()["tracebacks"] == []


def test_the_worker_stores_one_traceback_per_failed_attempt(fast_jq: JobQueue) -> None:
    @fast_jq.task(max_attempts=2, backoff=0.01, backoff_cap=0.01)
    def explode() -> None:
        raise ValueError("kaboom")

    with running(make_worker(fast_jq)):
        run = finished(fast_jq, fast_jq.enqueue(explode).run_id)
    assert [t["attempt"] for t in run.tracebacks] == [1, 2]
    for kept in run.tracebacks:
        assert kept["traceback"].startswith("Traceback (most recent call last):")
        assert "in explode" in kept["traceback"]
        assert kept["traceback"].endswith("ValueError: kaboom")


def test_the_worker_bounds_the_traceback_by_its_settings(redis_client: Any) -> None:
    jq = JobQueue(redis_client, settings=Settings(traceback_max_frames=1))

    @jq.task(max_attempts=1)
    def explode() -> None:
        def inner() -> None:
            raise ValueError("deep")

        inner()

    with running(make_worker(jq)):
        run = finished(jq, jq.enqueue(explode).run_id)
    assert run.traceback is not None
    assert run.traceback.count('  File "') == 1 and "in inner" in run.traceback


# -- what operators see --------------------------------------------------------------------


@pytest.fixture
def url(real_server: EmbeddedServer) -> str:
    redis.Redis.from_url(real_server.url).flushall()
    return real_server.url


@pytest.fixture
def dead_r1(url: str) -> JobQueue:
    jq = JobQueue.from_url(url)
    jq.declare_task("report", max_attempts=1)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    fail_one(jq, "r1", retry_ms=None, traceback=TB)
    return jq


def cli(url: str, *args: str) -> str:
    result = CliRunner().invoke(main, ["--redis-url", url, *args])
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_show_prints_each_kept_traceback(dead_r1: JobQueue, url: str) -> None:
    out = cli(url, "show", "r1")
    assert "traceback of attempt 1:\n  Traceback (most recent call last):\n" in out
    assert '    File "app.py", line 3, in job\n  ValueError: boom\n' in out


def test_show_json_dead_list_json_and_runs_json_carry_the_tracebacks(
    dead_r1: JobQueue, url: str
) -> None:
    shown = json.loads(cli(url, "show", "r1", "--json"))
    (dead,) = json.loads(cli(url, "dead", "list", "--json"))
    (listed,) = json.loads(cli(url, "runs", "--state", "dead", "--json"))
    for out in (shown, dead, listed):
        assert [(t["attempt"], t["traceback"]) for t in out["tracebacks"]] == [(1, TB)]


def test_the_run_page_shows_the_traceback_escaped(jq: JobQueue) -> None:
    jq.declare_task("report", max_attempts=1)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    fail_one(jq, "r1", retry_ms=None, traceback=TB + "\n<b>x</b>")
    page = TestClient(create_app(jq)).get("/run?id=r1").text
    assert '<details class="traceback"><summary>traceback</summary><pre>Traceback' in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page


def test_a_bound_smaller_than_the_cut_mark_keeps_only_the_newest_bytes() -> None:
    text = format_traceback(raised(depth=1, message="tail"), max_frames=10, max_bytes=10)
    assert text == "Error: tail"[-10:]

