"""The worker's line per finished run (INFO: task, queue, run id, fence, attempt, duration,
outcome), and task output under JSON logs: what a task prints becomes a log line, so the
stream stays one JSON object per line."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis
from helpers import finished, make_worker, running

from jobqueue.client.sync import JobQueue
from jobqueue.context import RunContext, bind, unbind
from jobqueue.runtime.logs import JsonFormatter, TaskOutput, capture_task_output
from jobqueue.store.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parents[1]


def finished_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "jobqueue.worker" and r.getMessage().startswith(("done ", "failed "))]


def test_each_finished_run_is_one_line_with_task_queue_duration_and_outcome(
    fast_jq: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    @fast_jq.task(queue="mail")
    def ok() -> int:
        return 1

    @fast_jq.task(max_attempts=2, backoff=0.01, backoff_cap=0.01)
    def bad() -> None:
        raise ValueError("boom")

    with caplog.at_level(logging.INFO, logger="jobqueue.worker"), running(
        make_worker(fast_jq, queues=["default", "mail"])
    ):
        good = finished(fast_jq, fast_jq.enqueue(ok).run_id)
        dead = finished(fast_jq, fast_jq.enqueue(bad).run_id)
    # this test's runs only: a worker thread another test left behind may log meanwhile
    lines = [r for r in finished_lines(caplog)
             if getattr(r, "run_id", None) in (good.run_id, dead.run_id)]
    assert [(r.levelname, r.run_id, r.outcome) for r in lines] == [  # type: ignore[attr-defined]
        ("INFO", good.run_id, "done"), ("WARNING", dead.run_id, "retry"),
        ("ERROR", dead.run_id, "dead")]
    done = lines[0]
    assert (done.task, done.queue, done.fence, done.attempt) == (  # type: ignore[attr-defined]
        "ok", "mail", good.fence, 1)
    assert done.duration_ms >= 0  # type: ignore[attr-defined]
    assert done.getMessage().startswith(
        f"done run_id={good.run_id} fence={good.fence} attempt=1 task=ok queue=mail in ")
    assert "-> dead: ValueError: boom" in lines[2].getMessage()


def failing_attempt_lines(
    jq: JobQueue, caplog: pytest.LogCaptureFixture, level: int
) -> list[logging.LogRecord]:
    """The lines of a task failing twice (a retry, then dead), logged at ``level``."""

    @jq.task(max_attempts=2, backoff=0.01, backoff_cap=0.01)
    def flaky_export() -> None:
        raise ConnectionResetError("peer went away")

    with caplog.at_level(level, logger="jobqueue.worker"), running(make_worker(jq)):
        dead = finished(jq, jq.enqueue(flaky_export).run_id)
    return [r for r in finished_lines(caplog) if getattr(r, "run_id", None) == dead.run_id]


def test_a_failed_attempt_is_logged_with_its_traceback_at_warning_and_error_when_dead(
    fast_jq: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    retry, dead = failing_attempt_lines(fast_jq, caplog, logging.INFO)
    assert (retry.levelname, dead.levelname) == ("WARNING", "ERROR")
    for line in (retry, dead):
        assert line.exc_text is not None
        assert "Traceback (most recent call last)" in line.exc_text
        assert 'raise ConnectionResetError("peer went away")' in line.exc_text


def test_failed_attempts_are_logged_under_a_warning_log_level(
    fast_jq: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    lines = failing_attempt_lines(fast_jq, caplog, logging.WARNING)
    assert [r.outcome for r in lines] == ["retry", "dead"]  # type: ignore[attr-defined]


def test_a_failed_attempt_s_traceback_is_the_exc_field_in_json_and_follows_the_text_line(
    fast_jq: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    _, dead = failing_attempt_lines(fast_jq, caplog, logging.INFO)
    data = json.loads(JsonFormatter().format(dead))
    assert data["level"] == "ERROR"
    assert "ConnectionResetError: peer went away" in data["exc"]
    text = logging.Formatter("%(levelname)s %(message)s").format(dead)
    head, tail = text.split("\n", 1)
    assert head.startswith("ERROR failed run_id=") and "-> dead" in head
    assert tail.startswith("Traceback (most recent call last)")


def test_the_json_line_of_a_finished_run_has_its_fields() -> None:
    rec = logging.LogRecord("jobqueue.worker", logging.INFO, __file__, 1, "done", None, None)
    rec.__dict__.update(run_id="r", fence=3, attempt=1, task="t", queue="q", outcome="done",
                        duration_ms=12.5)
    data = json.loads(JsonFormatter().format(rec))
    assert {k: data[k] for k in ("task", "queue", "outcome", "duration_ms")} == {
        "task": "t", "queue": "q", "outcome": "done", "duration_ms": 12.5}


# -- task output -----------------------------------------------------------------------------


def test_task_output_logs_each_line_with_the_run_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = TaskOutput(io.StringIO(), "stdout", logging.INFO)
    ctx = RunContext("r1", 7, 2, 3, "t", "q", "", None)
    token = bind(ctx)
    try:
        with caplog.at_level(logging.INFO, logger="jobqueue.task"):
            out.write("first line\nsecond ")
            out.write("line\nunfinished")
            out.flush()
    finally:
        unbind(token)
    got = [(r.getMessage(), r.stream, r.run_id, r.fence, r.task)  # type: ignore[attr-defined]
           for r in caplog.records]
    assert got == [("first line", "stdout", "r1", 7, "t"), ("second line", "stdout", "r1", 7, "t"),
                   ("unfinished", "stdout", "r1", 7, "t")]


def test_task_output_outside_a_run_is_logged_without_run_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = TaskOutput(io.StringIO(), "stderr", logging.WARNING)
    with caplog.at_level(logging.INFO, logger="jobqueue.task"):
        out.write("hello\n")
    (rec,) = caplog.records
    assert (rec.levelname, rec.getMessage(), hasattr(rec, "run_id")) == ("WARNING", "hello", False)


def test_capture_task_output_replaces_and_restores_stdout_and_stderr() -> None:
    before = sys.stdout, sys.stderr
    restore = capture_task_output()
    try:
        assert isinstance(sys.stdout, TaskOutput) and isinstance(sys.stderr, TaskOutput)
    finally:
        restore()
    assert (sys.stdout, sys.stderr) == before


def test_a_json_worker_process_logs_what_tasks_print_as_json_lines(
    real_server: EmbeddedServer, tmp_path: Path
) -> None:
    redis.Redis.from_url(real_server.url).flushall()
    (tmp_path / "printing_app.py").write_text(textwrap.dedent("""
        import sys
        from jobqueue import JobQueue

        jq = JobQueue.from_url()

        @jq.task
        def chatty(n: int) -> int:
            print("working on", n)
            print("a warning", file=sys.stderr)
            return n
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    cmd = [sys.executable, "-m", "jobqueue.cli", "--redis-url", real_server.url,
           "--log-format", "json", "worker", "--app", "printing_app:jq", "--grace", "1"]
    jq = JobQueue.from_url(real_server.url)
    jq.declare_task("chatty")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        handle = jq.enqueue("chatty", 5)
        assert handle.wait(timeout=10).state == "done"
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and out == ""
    lines = [json.loads(line) for line in err.splitlines()]  # every line is one JSON object
    printed = {(x["msg"], x["stream"], x["level"], x["run_id"], x["task"])
               for x in lines if x["logger"] == "jobqueue.task"}
    assert printed == {("working on 5", "stdout", "INFO", handle.run_id, "chatty"),
                       ("a warning", "stderr", "WARNING", handle.run_id, "chatty")}
    (done,) = [x for x in lines if x["msg"].startswith("done ")]
    assert (done["outcome"], done["task"], done["queue"]) == ("done", "chatty", "default")



def test_task_output_is_a_writable_text_stream_that_is_not_a_terminal() -> None:
    out = TaskOutput(io.StringIO(), "stdout", logging.INFO)
    assert (out.writable(), out.isatty(), out.encoding) == (True, False, "utf-8")
