"""The test mode: ``jobqueue.testing.run_due`` runs what is due in this process through the
real scripts, and ``jobqueue worker --burst`` drains what is due, then exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from jobqueue import JobQueue
from jobqueue.cli import State, main
from jobqueue.errors import Fatal
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.testing import run_due


def test_run_due_runs_what_is_due_and_returns_the_counts(jq: JobQueue) -> None:
    @jq.task
    def add(a: int, b: int) -> int:
        return a + b

    handles = [add.enqueue(i, 1) for i in range(3)]
    stats = run_due(jq)
    assert (stats.claimed, stats.completed) == (3, 3)
    assert [h.refresh().result for h in handles] == [1, 2, 3]


def test_run_due_leaves_a_delayed_run_pending(jq: JobQueue) -> None:
    @jq.task
    def t() -> None: ...

    later = t.with_options(delay=3600).enqueue()
    assert run_due(jq).claimed == 0
    assert later.refresh().state == "pending"


def test_run_due_fails_a_raising_task_as_production_does(jq: JobQueue) -> None:
    @jq.task(max_attempts=1)
    def broken() -> None:
        raise Fatal("no such customer")

    handle = broken.enqueue()
    run_due(jq)
    run = handle.refresh()
    assert run.state == "dead" and "no such customer" in (run.error or "")


def test_run_due_serves_the_queues_it_is_given(jq: JobQueue) -> None:
    @jq.task
    def t() -> str:
        return "ok"

    elsewhere = t.with_options(queue="other").enqueue()
    here = t.enqueue()
    run_due(jq, ["other"])
    assert (elsewhere.refresh().state, here.refresh().state) == ("done", "pending")


def test_run_due_serves_by_default_every_queue_the_apps_tasks_name(jq: JobQueue) -> None:
    @jq.task(queue="sms")
    def text() -> str:
        return "sent"

    @jq.task
    def plain() -> str:
        return "ok"

    handles = [text.enqueue(), plain.enqueue()]
    stats = run_due(jq)
    assert stats.completed == 2
    assert [h.refresh().state for h in handles] == ["done", "done"]


def test_run_due_returns_leaving_a_run_of_a_paused_queue_pending(jq: JobQueue) -> None:
    @jq.task
    def t() -> str:
        return "ok"

    jq.pause_queue("default")
    handle = t.enqueue()
    assert run_due(jq).claimed == 0
    assert handle.refresh().state == "pending"


def test_run_due_runs_async_tasks(jq: JobQueue) -> None:
    @jq.task
    async def double(x: int) -> int:
        return 2 * x

    handle = double.enqueue(21)
    run_due(jq)
    assert handle.refresh().result == 42


def test_run_due_on_an_empty_queue_returns_at_once(jq: JobQueue) -> None:
    assert run_due(jq).claimed == 0


APP = '''
from jobqueue import JobQueue
jq = JobQueue()

@jq.task
def add(a: int, b: int) -> int:
    return a + b
'''


def test_worker_burst_drains_what_is_due_then_exits_0(
    real_server: EmbeddedServer, tmp_path: Path
) -> None:
    (tmp_path / "burst_app.py").write_text(APP)
    jq = JobQueue.from_url(real_server.url)
    jq.redis.flushall()
    jq.declare_task("add")
    handles = [jq.enqueue("add", i, 1) for i in range(5)]
    done = subprocess.run(
        [sys.executable, "-m", "jobqueue.cli", "--redis-url", real_server.url, "worker",
         "--app", "burst_app:jq", "--burst"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert [h.refresh().result for h in handles] == [1, 2, 3, 4, 5]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), obj=State(None, None))


def test_worker_burst_refuses_several_processes() -> None:
    result = invoke("worker", "--app", "x:jq", "--burst", "--processes", "2")
    assert result.exit_code == 2 and "--processes 1" in result.stderr


def test_worker_reload_restarts_the_same_command_without_reload_on_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import watchfiles

    seen: dict[str, Any] = {}

    def run_process(path: str, *, target: str, target_type: str, watch_filter: Any) -> int:
        seen.update(path=path, target=target, target_type=target_type, watch_filter=watch_filter)
        return 0

    monkeypatch.setattr(watchfiles, "run_process", run_process)
    monkeypatch.setattr(sys, "argv", ["jobqueue", "worker", "--app", "m:jq", "--reload"])
    result = invoke("worker", "--app", "m:jq", "--reload")
    assert result.exit_code == 0, result.stderr
    assert seen["target"].endswith("-m jobqueue.cli worker --app m:jq")
    assert seen["target_type"] == "command"


def test_worker_reload_restarts_on_python_files_not_on_a_log_written_beside_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import watchfiles

    seen: dict[str, Any] = {}

    def run_process(path: str, *, watch_filter: Any, **_: Any) -> int:
        seen["watch_filter"] = watch_filter
        return 0

    monkeypatch.setattr(watchfiles, "run_process", run_process)
    monkeypatch.setattr(sys, "argv", ["jobqueue", "worker", "--app", "m:jq", "--reload"])
    assert invoke("worker", "--app", "m:jq", "--reload").exit_code == 0
    restarts = seen["watch_filter"]
    assert restarts(watchfiles.Change.modified, "/app/myapp.py")
    assert not restarts(watchfiles.Change.modified, "/app/worker.log")


def test_worker_reload_with_burst_is_refused() -> None:
    result = invoke("worker", "--app", "m:jq", "--reload", "--burst")
    assert result.exit_code == 2 and "--burst" in result.stderr

