"""Logs: human-readable text by default, ``--log-format json`` for machines (one object per
line; run_id, fence and attempt on every line about a run); URL passwords never appear."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis

from jobqueue.client.sync import JobQueue
from jobqueue.runtime.logs import TEXT_FORMAT, JsonFormatter, RedactingFilter, run_fields
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.runs import ClaimedRun

ROOT = Path(__file__).resolve().parents[1]


def record(msg: str, *args: Any, **extra: Any) -> logging.LogRecord:
    rec = logging.LogRecord("jobqueue.worker", logging.WARNING, __file__, 1, msg, args, None)
    rec.__dict__.update(extra)
    return rec


def test_json_line_has_ts_level_logger_msg_and_the_run_fields() -> None:
    run = ClaimedRun("r-1", 3, 2, 5, "t", "[]", 0, 0, "r-1", None, 0)
    line = JsonFormatter().format(record("fenced out: run_id=%s", "r-1", **run_fields(run)))
    data = json.loads(line)
    assert data["level"] == "WARNING" and data["logger"] == "jobqueue.worker"
    assert data["msg"] == "fenced out: run_id=r-1"
    assert (data["run_id"], data["fence"], data["attempt"]) == ("r-1", 3, 2)
    assert data["ts"].endswith("+00:00") and "T" in data["ts"]


def test_json_line_about_no_run_has_no_run_fields() -> None:
    data = json.loads(JsonFormatter().format(record("worker started")))
    assert set(data) == {"ts", "level", "logger", "msg"}


def test_text_format_is_one_readable_line() -> None:
    line = logging.Formatter(TEXT_FORMAT).format(record("claimed run_id=%s", "r-9"))
    assert line.endswith(" WARNING jobqueue.worker: claimed run_id=r-9")
    assert "{" not in line


def test_passwords_in_urls_are_masked_whatever_the_message() -> None:
    rec = record("cannot reach %s", "redis://app:hunter2@db:6379/0")
    assert RedactingFilter().filter(rec)
    assert rec.getMessage() == "cannot reach redis://app:***@db:6379/0"


def test_json_worker_process_logs_run_fields_on_every_run_line_and_never_the_password(
    real_server: EmbeddedServer, tmp_path: Path
) -> None:
    admin = redis.Redis.from_url(real_server.url, decode_responses=True)
    admin.flushall()
    password = "s3cret-pw-for-logs"
    admin.acl_setuser("logtest", enabled=True, passwords=[f"+{password}"], keys=["*"],
                      channels=["*"], commands=["+@all"])
    socket_path = real_server.url.removeprefix("unix://")
    url = f"unix://logtest:{password}@{socket_path}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "docker"), str(ROOT)])}
    env.pop("JOBQUEUE_REDIS_URL", None)
    cmd = [sys.executable, "-m", "jobqueue.cli", "--redis-url", url, "--log-format", "json",
           "--log-level", "DEBUG", "worker", "--app", "example_app:jq", "--grace", "1"]
    log_path = tmp_path / "worker.log"
    jq = JobQueue.from_url(real_server.url)
    jq.declare_task("send_welcome_email")
    try:
        with log_path.open("w") as err:
            proc = subprocess.Popen(cmd, env=env, stderr=err)
            try:
                good = jq.enqueue("send_welcome_email", 1, address="a@example.com")
                bad = jq.enqueue("send_welcome_email", 2, address="not-an-address")
                assert good.wait(timeout=10).state == "done"
                assert bad.wait(timeout=10).state == "dead"
            finally:
                # A graceful stop: the drain waits for every slot, freed only after the
                # commit's log line is written.
                proc.terminate()
                proc.wait(10)
        assert proc.returncode == 0
    finally:
        admin.acl_deluser("logtest")
        admin.close()
    text = log_path.read_text()
    assert password not in text
    lines = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
    assert all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    run_lines = [line for line in lines if "run_id=" in line["msg"]]
    for line in run_lines:
        assert f"run_id={line['run_id']} fence={line['fence']} attempt={line['attempt']}" in (
            line["msg"]
        )
    by_run = {(line["run_id"], line["msg"].split()[0]) for line in run_lines}
    assert {(good.run_id, "claimed"), (good.run_id, "done")} <= by_run
    assert {(bad.run_id, "claimed"), (bad.run_id, "failed")} <= by_run
    connected = [line["msg"] for line in lines if line["msg"].startswith("connected to")]
    assert connected == [f"connected to unix://logtest:***@{socket_path}"]
