"""Real scheduler processes against one real Redis server (bounded to ~20 s): three
``jobqueue scheduler`` processes for 200 jobs firing every second; one is killed with SIGKILL
mid-run. Every fire time gets exactly one run: no gap, no duplicate, counted once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from jobqueue.client.sync import JobQueue
from jobqueue.policy.cron import parse_fire_instant
from jobqueue.store.embedded import EmbeddedServer

JOBS = 200
RUN_SECONDS = 12.0
KILL_AFTER = 5.0

pytestmark = pytest.mark.slow

APP = "from jobqueue import JobQueue\n\njq = JobQueue.from_url()\n"


def start_scheduler(url: str, cwd: Path) -> subprocess.Popen[bytes]:
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [
        sys.executable,
        "-m",
        "jobqueue.cli",
        "--redis-url",
        url,
        "--log-level",
        "WARNING",
        "scheduler",
        "--app",
        "sched_app:jq",
        "--lookahead",
        "2",
        "--interval",
        "0.1",
    ]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_three_scheduler_processes_one_killed_create_every_fire_exactly_once(
    real_server: EmbeddedServer, tmp_path: Path
) -> None:
    client: Any = redis.Redis.from_url(real_server.url, decode_responses=True)
    client.flushall()
    (tmp_path / "sched_app.py").write_text(APP)
    jq = JobQueue(client)
    for i in range(JOBS):
        jq.schedule(f"job-{i}", "tick", every=1, misfire="fire-all")
    # Creating 200 schedules can straddle a second boundary, so each job's first fire is its own.
    first_fire = {i.job_id: i.next_fire_ms for i in jq.list_schedules()}
    assert all(first_fire.values())

    procs = [start_scheduler(real_server.url, tmp_path) for _ in range(3)]
    try:
        time.sleep(KILL_AFTER)
        victim = procs[0]
        victim.send_signal(signal.SIGKILL)  # mid-run, possibly between create and advance
        victim.wait(timeout=10)
        time.sleep(RUN_SECONDS - KILL_AFTER)
    finally:
        for p in procs[1:]:
            p.send_signal(signal.SIGTERM)
        for p in procs[1:]:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    for p in procs[1:]:
        assert p.returncode == 0, p.stderr.read().decode() if p.stderr else ""

    stopped_ms = jq.server_time_ms()
    runs: dict[str, list[int]] = {}
    keys = list(client.scan_iter(match="jq:{default#0}:run:*", count=10_000))
    for key in keys:
        job, _, when = key.split(":run:", 1)[1].rpartition("@")
        runs.setdefault(job, []).append(parse_fire_instant(when))
    assert set(runs) == {f"job-{i}" for i in range(JOBS)}
    total = 0
    for job, fires in runs.items():
        fires.sort()
        # No gap: one run per second from the first fire on, up to (at least) the stop.
        assert fires[0] == first_fire[job], job
        assert fires == list(range(fires[0], fires[-1] + 1, 1000)), job
        assert fires[-1] >= stopped_ms - 3000, job
        total += len(fires)
    # No duplicate: each run was created once (SET NX) and each fire counted once.
    assert int(client.hget("jq:{default#0}:stats", "created")) == total == len(keys)
    assert sum(i.state.fired for i in jq.list_schedules()) == total
    assert total >= JOBS * (RUN_SECONDS - 1)
    client.close()


def test_scheduler_process_retrying_its_start_up_exits_0_on_sigterm(tmp_path: Path) -> None:
    """Redis refuses writes (OOM) from the start: the scheduler keeps retrying its start-up
    (one warning line per attempt, no traceback) and a SIGTERM meanwhile is a clean exit."""
    server = EmbeddedServer().start()
    try:
        admin: Any = redis.Redis.from_url(server.url, decode_responses=True)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        (tmp_path / "sched_app.py").write_text(APP)
        proc = start_scheduler(server.url, tmp_path)
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline().decode()  # bounded: the first attempt fails at once
            assert "start-up failed (OutOfMemoryError" in line, line
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err.decode()
        assert b"Traceback" not in err
    finally:
        server.stop()


def test_sigusr1_prints_every_threads_stack_and_the_scheduler_runs_on(
    real_server: EmbeddedServer, tmp_path: Path
) -> None:
    """What an operator does with a daemon that seems stuck: `kill -USR1 PID`."""
    (tmp_path / "sched_app.py").write_text(APP)
    proc = start_scheduler(real_server.url, tmp_path)
    try:
        time.sleep(1.0)  # started (imports done, handlers installed)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert proc.poll() is None, "SIGUSR1 ended the scheduler"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "Current thread" in text or "Thread 0x" in text, text
    assert "scheduler/daemon.py" in text, text  # the main thread's loop, among the stacks
